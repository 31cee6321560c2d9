"""File systems in the stats sample (pykubelet/stats/storage.py): the collector over a real
--root-dir in tmp_path and a runtime that reports writable layers, the Summary API's fs fields,
the eviction ranking by the kubelet's podDiskUsage (writable layers, logs, local volumes), and
the local-storage eviction for `limits.ephemeral-storage`."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pykubelet.api.model import Pod, PodStatus
from pykubelet.common.events import EventRecorder
from pykubelet.kubelet.eviction_policy import (
    PodUsage,
    pod_disk_usage,
    rank,
    storage_limit_message,
)
from pykubelet.kubelet.housekeeping import Housekeeping
from pykubelet.kubelet.pod_store import PodStore
from pykubelet.pod.volumes import Exceeded
from pykubelet.pod.workers import UpdateType
from pykubelet.runtime.base import (
    ContainerStorage,
    GcImage,
    ImageFsStats,
    ImageFsUsage,
    RuntimeContainer,
    RuntimeFailure,
    RuntimePod,
)
from pykubelet.server.stats import summary
from pykubelet.stats.cgroupfs import CgroupFs
from pykubelet.stats.collector import StatsCollector
from pykubelet.stats.types import ContainerStats, FsStats, NodeStats, PodStats, VolumeStats
from pykubelet.status.manager import StatusManager
from tests.fakes.runtime import FakeRuntime
from tests.unit.test_stats import container, runtime_pod, v1_container, v1_tree

MiB = 1 << 20
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


class Images:
    def __init__(self, path: str) -> None:
        self.path = path

    async def list_images(self) -> list[GcImage]:
        return []

    async def remove_image(self, image: GcImage) -> None:
        return None

    async def image_fs_usage(self) -> ImageFsUsage:
        raise RuntimeFailure("not used")

    async def image_fs_stats(self) -> ImageFsStats:
        return ImageFsStats(self.path, used_bytes=300 * MiB, inodes_used=1000)


class Engine:
    """The runtime as the collector sees it: its pods and what they keep on disk."""

    def __init__(self, pods: list[RuntimePod], storage: dict[str, ContainerStorage]) -> None:
        self.pods = pods
        self.storage = storage
        self.images: Images | None = None
        self.asked = 0

    async def list_pods(self) -> list[RuntimePod]:
        return self.pods

    async def container_storage(
        self, containers: list[RuntimeContainer]
    ) -> dict[str, ContainerStorage]:
        self.asked += 1
        return {c.id: self.storage[c.id] for c in containers if c.id in self.storage}

    def image_service(self) -> Images | None:
        return self.images


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


async def test_the_sample_has_the_nodes_pods_and_containers_file_systems(tmp_path: Path) -> None:
    proc, cg = v1_tree(tmp_path / "machine")
    v1_container(proc, cg, 42, "/kubepods/c1", "/kubepods/c1")
    root = tmp_path / "root"
    _file(root / "pods" / "u1" / "volumes" / "kubernetes.io~empty-dir" / "scratch" / "f", MiB)
    _file(root / "pods" / "u1" / "etc-hosts", 100)
    logs = root / "logs" / "main"
    _file(logs / "0.log", 64 * 1024)
    _file(logs / "0.log.20250102-030405", 64 * 1024)
    storage = {"c1": ContainerStorage(20 * MiB, 7, log_paths=(str(logs),))}
    engine = Engine([runtime_pod(container(42))], storage)
    engine.images = Images(str(tmp_path))
    collector = StatsCollector(
        engine, "n1", fs=CgroupFs(proc), root_dir=root, storage=engine, period=10
    )
    stats = await collector.sample()
    st = os.statvfs(root)
    assert stats.fs is not None and stats.fs.capacity_bytes == st.f_blocks * st.f_frsize
    assert stats.fs.available_bytes is not None and stats.fs.used_bytes is not None
    assert stats.image_fs is not None and stats.image_fs.used_bytes == 300 * MiB
    assert stats.image_fs.inodes_used == 1000 and stats.image_fs.capacity_bytes
    (pod,) = stats.pods
    (c,) = pod.containers
    assert c.rootfs is not None and (c.rootfs.used_bytes, c.rootfs.inodes_used) == (20 * MiB, 7)
    assert c.rootfs.capacity_bytes == stats.image_fs.capacity_bytes  # the image file system's
    assert c.logs is not None and c.logs.used_bytes is not None
    assert c.logs.used_bytes >= 128 * 1024 and c.logs.inodes_used == 2  # the two files
    (volume,) = pod.volumes
    assert (volume.name, volume.plugin) == ("scratch", "kubernetes.io~empty-dir")
    assert volume.fs.used_bytes is not None and volume.fs.used_bytes >= MiB
    eph = pod.ephemeral_storage
    assert eph is not None and eph.used_bytes is not None
    assert eph.used_bytes >= 20 * MiB + c.logs.used_bytes + volume.fs.used_bytes + 100
    assert eph.capacity_bytes == stats.fs.capacity_bytes

    # Between periods a sample carries the last measurement; storage=True measures again.
    await collector.sample()
    assert engine.asked == 1
    engine.storage = {"c1": ContainerStorage(30 * MiB)}
    again = await collector.sample(storage=True)
    rootfs = again.pods[0].containers[0].rootfs
    assert engine.asked == 2 and rootfs is not None and rootfs.used_bytes == 30 * MiB

    # A pod started since the last measurement has none yet (not 0: eviction measures it).
    v1_container(proc, cg, 43, "/kubepods/c2", "/kubepods/c2")
    engine.pods.append(runtime_pod(container(43, cid="c2", pod_uid="u2"), uid="u2", name="new"))
    between = await collector.sample(storage=False)
    assert [p.ephemeral_storage is None for p in between.pods] == [False, True]

    body = summary(again)
    node = body["node"]
    assert set(node["fs"]) >= {"availableBytes", "capacityBytes", "usedBytes", "time"}
    assert node["runtime"]["imageFs"]["usedBytes"] == 300 * MiB
    (pod_body,) = body["pods"]
    assert pod_body["volume"][0]["name"] == "scratch"
    assert pod_body["volume"][0]["usedBytes"] >= MiB
    assert pod_body["ephemeral-storage"]["usedBytes"] >= 30 * MiB
    assert pod_body["containers"][0]["rootfs"]["usedBytes"] == 30 * MiB
    only = summary(again, only_cpu_and_memory=True)
    assert "fs" not in only["node"] and "ephemeral-storage" not in only["pods"][0]


async def test_a_runtime_that_cannot_measure_leaves_the_rootfs_out(tmp_path: Path) -> None:
    proc, cg = v1_tree(tmp_path / "machine")
    v1_container(proc, cg, 42, "/kubepods/c1", "/kubepods/c1")

    class Failing(Engine):
        async def container_storage(
            self, containers: list[RuntimeContainer]
        ) -> dict[str, ContainerStorage]:
            raise RuntimeFailure("engine gone")

    engine = Failing([runtime_pod(container(42))], {})
    collector = StatsCollector(
        engine, "n1", fs=CgroupFs(proc), root_dir=tmp_path / "root", storage=engine
    )
    (tmp_path / "root").mkdir()
    stats = await collector.sample()
    assert stats.errors == ()  # CPU and memory are still served
    assert stats.fs is not None and stats.image_fs is None
    (c,) = stats.pods[0].containers
    assert c.rootfs is None and c.logs is None


def _fs(used: int) -> FsStats:
    return FsStats(T0, used_bytes=used, inodes_used=1)


def _pod(name: str, volumes: list[dict[str, Any]]) -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main", "image": "i"}], "volumes": volumes},
        }
    )


def _stats(pod: Pod, rootfs: int, logs: int, volumes: dict[str, int]) -> PodStats:
    main = ContainerStats("main", "c", T0, None, None, rootfs=_fs(rootfs), logs=_fs(logs))
    vols = tuple(VolumeStats(n, "p", _fs(u)) for n, u in volumes.items())
    return PodStats(pod.uid, pod.metadata.name, "default", T0, (main,), None, None, vols)


def test_the_disk_ranking_counts_writable_layers_logs_and_local_volumes() -> None:
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "ram", "emptyDir": {"medium": "Memory"}},
        {"name": "conf", "configMap": {"name": "c"}},
        {"name": "token", "secret": {"secretName": "s"}},
    ]
    layer, logs, local = _pod("layer", volumes), _pod("logs", volumes), _pod("local", volumes)
    usage = {
        # 50 MiB in its writable layer only: what the directories under --root-dir never show.
        layer.uid: pod_disk_usage(layer, _stats(layer, 50 * MiB, MiB, {})),
        logs.uid: pod_disk_usage(logs, _stats(logs, 0, 30 * MiB, {})),
        # In-memory emptyDirs and Secrets are not the node's disk: 80 MiB there do not count.
        local.uid: pod_disk_usage(
            local, _stats(local, 0, 0, {"ram": 80 * MiB, "token": 80 * MiB, "conf": 10 * MiB})
        ),
    }
    assert usage[layer.uid] == PodUsage(disk=51 * MiB, inodes=2)
    assert usage[local.uid].disk == 10 * MiB
    ranked = rank("ephemeral-storage", [local, logs, layer], usage)
    assert [p.metadata.name for p in ranked] == ["layer", "logs", "local"]


# --- the kubelet's local-storage eviction for limits.ephemeral-storage ----------------------


def _limited(name: str, limits: list[str | None], init: str | None = None) -> Pod:
    def one(n: str, limit: str | None) -> dict[str, Any]:
        resources = {"limits": {"ephemeral-storage": limit}} if limit else {}
        return {"name": n, "image": "i", "resources": resources}

    spec: dict[str, Any] = {"containers": [one(f"c{i}", x) for i, x in enumerate(limits)]}
    if init is not None:
        spec["initContainers"] = [one("setup", init)]
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": spec,
        }
    )


def _usage(pod: Pod, containers: dict[str, tuple[int, int]], total: int) -> PodStats:
    stats = tuple(
        ContainerStats(n, n, T0, None, None, rootfs=_fs(r), logs=_fs(lg))
        for n, (r, lg) in containers.items()
    )
    return PodStats(pod.uid, pod.metadata.name, "default", T0, stats, None, None, (), _fs(total))


def test_ephemeral_storage_limits_as_the_kubelets_local_storage_eviction() -> None:
    pod = _limited("p", ["20Mi", "10Mi"])
    # Each container within its own limit, the pod (volumes, etc-hosts too) above the sum.
    under = {"c0": (15 * MiB, MiB), "c1": (5 * MiB, 0)}
    assert storage_limit_message(pod, _usage(pod, under, 30 * MiB)) is None
    assert storage_limit_message(pod, _usage(pod, under, 31 * MiB)) == (
        "Pod ephemeral local storage usage exceeds the total limit of containers 30Mi. "
    )
    # A container's writable layer and logs above its own limit.
    over = {"c0": (1 * MiB, 0), "c1": (9 * MiB, 2 * MiB)}
    assert storage_limit_message(pod, _usage(pod, over, 12 * MiB)) == (
        'Container c1 exceeded its local ephemeral storage limit "10Mi". '
    )
    # Without limits, nothing; an init container's larger limit is the pod's.
    free = _limited("free", [None])
    assert storage_limit_message(free, _usage(free, {"c0": (90 * MiB, 0)}, 99 * MiB)) is None
    init = _limited("init", ["1Mi"], init="1Gi")
    assert storage_limit_message(init, _usage(init, {}, 500 * MiB)) is None


class _Latest:
    def __init__(self, stats: NodeStats) -> None:
        self.stats = stats

    def latest(self) -> NodeStats | None:
        return self.stats


class _Volumes:
    async def pod_uids(self) -> list[str]:
        return []

    async def teardown(self, uid: str) -> None:
        return None

    async def over_limit(self, pod: Pod) -> list[Exceeded]:
        return []


class _Workers:
    def __init__(self) -> None:
        self.killed: list[str] = []

    def is_known(self, uid: str) -> bool:
        return True

    def forget_finished(self, desired: set[str]) -> None:
        return None

    def update_pod(self, update: UpdateType, pod: Pod | None, *args: Any, **kw: Any) -> None:
        assert update is UpdateType.KILL and pod is not None
        self.killed.append(pod.metadata.name)


async def test_housekeeping_evicts_a_pod_above_its_ephemeral_storage_limit() -> None:
    store, statuses, recorder, workers = PodStore(), StatusManager(), EventRecorder(), _Workers()
    hog, fine = _limited("hog", ["10Mi", "10Mi"]), _limited("fine", ["10Mi"])
    for pod in (hog, fine):
        store.put(pod)
        statuses.set(pod.uid, PodStatus(phase="Running"))
    pods = (
        _usage(hog, {"c0": (11 * MiB, 0), "c1": (0, 0)}, 12 * MiB),
        _usage(fine, {"c0": (MiB, 0)}, MiB),
    )
    latest = _Latest(NodeStats("n", T0, T0, None, None, pods))
    housekeeping = Housekeeping(
        FakeRuntime(started=True),
        store,
        workers,
        _Volumes(),
        statuses,
        recorder,
        is_rejected=lambda uid: False,
        stats=latest,
    )
    await housekeeping._evict_over_limit()
    assert workers.killed == ["hog"]
    status = statuses.get(hog.uid)
    assert status is not None and (status.phase, status.reason) == ("Failed", "Evicted")
    assert status.message == 'Container c0 exceeded its local ephemeral storage limit "10Mi". '
    assert [e.reason for e in recorder.events()] == ["Evicted"]
    fine_status = statuses.get(fine.uid)
    assert fine_status is not None and fine_status.phase == "Running"
