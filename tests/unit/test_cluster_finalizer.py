"""The kubelet's final delete (`cluster/finalizer.py`) and the mirror pods (`cluster/mirror.py`)
against the test API server: a real connection, API source and status sync, the in-memory
runtime, and a small view of the kubelet (its desired pods and its workers' states)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pykubelet.api.model import (
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStatus,
    Pod,
    PodStatus,
)
from pykubelet.api.static import CONFIG_HASH, CONFIG_MIRROR, CONFIG_SOURCE
from pykubelet.client.kubeapi import KubeApi
from pykubelet.cluster.connection import ApiConnection
from pykubelet.cluster.finalizer import FinalDeletes
from pykubelet.cluster.mirror import MirrorPods
from pykubelet.cluster.node import NodeAgent
from pykubelet.common.events import EventRecorder
from pykubelet.common.machine import MachineFacts
from pykubelet.config.apiserver import ApiSource
from pykubelet.config.types import FILE_SOURCE, Op, PodUpdate
from pykubelet.kubelet.pod_store import PodStore, PodView
from pykubelet.pod.workers import WorkerState
from pykubelet.runtime.base import ContainerConfig, RuntimeContainer
from pykubelet.status.patcher import StatusSync, Target
from tests.fakes import FakeRuntime
from tests.fixtures.apiserver import ApiServer

Obj = dict[str, Any]
T = TypeVar("T")
NODE = "n1"


async def eventually(what: str, check: Callable[[], T | None], within: float = 5.0) -> T:
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.005)


def api_pod(name: str, grace: int = 30) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "9"]}],
        },
    }


def container_status(state: ContainerState) -> PodStatus:
    running = state.running is not None
    return PodStatus(
        phase="Running" if running else "Failed",
        host_ip="192.0.2.10",
        container_statuses=[ContainerStatus(name="c", state=state, ready=running)],
    )


RUNNING = container_status(ContainerState(running=ContainerStateRunning()))
KILLED = container_status(
    ContainerState(terminated=ContainerStateTerminated(exit_code=143, reason="Error"))
)


class KubeletView:
    """What the cluster layer reads of the kubelet: its desired pods, its workers' states."""

    def __init__(self) -> None:
        self.store = PodStore()
        self.states: dict[str, WorkerState] = {}

    @property
    def pods(self) -> PodView:
        return self.store

    def worker_state(self, uid: str) -> WorkerState | None:
        return self.states.get(uid)


@dataclass
class Cluster:
    server: ApiServer
    kubeconfig: Path
    connection: ApiConnection
    runtime: FakeRuntime = field(default_factory=lambda: FakeRuntime(started=True))
    kubelet: KubeletView = field(default_factory=KubeletView)
    pushed: list[PodUpdate] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _source: ApiSource | None = None
    _statuses: StatusSync | None = None
    _finalizer: FinalDeletes | None = None

    @property
    def api(self) -> KubeApi:
        assert self.connection.api is not None
        return self.connection.api

    @property
    def source(self) -> ApiSource:
        assert self._source is not None, "start() first"
        return self._source

    @property
    def statuses(self) -> StatusSync:
        assert self._statuses is not None, "start() first"
        return self._statuses

    @property
    def finalizer(self) -> FinalDeletes:
        assert self._finalizer is not None, "start() first"
        return self._finalizer

    async def start(self) -> None:
        """The API source (listed and watching), the status sync and the final deletes, wired
        as cluster.py wires them."""
        self._source = ApiSource(NODE, self.pushed.append, EventRecorder(), watch_timeout=(5, 10))
        self._statuses = StatusSync(self._target, batch_delay=0.01)
        self._finalizer = FinalDeletes(
            self.connection, self.source, self.statuses, self.kubelet, self.runtime, period=0.01
        )
        self.source.add_listener(
            lambda: self.statuses.retarget(p.uid for p in self.kubelet.pods.static())
        )
        self.tasks.append(asyncio.create_task(self.source.run(self.api)))
        await asyncio.wait_for(self.source.synced.wait(), 5)

    def _target(self, uid: str) -> Target | None:
        obj = self.source.api_object(uid)
        if obj is None:
            return None
        meta = obj["metadata"]
        return Target(meta["namespace"], meta["name"], meta["uid"], obj.get("status") or {})

    async def create(self, obj: Obj) -> str:
        created = await asyncio.to_thread(self.server.create, "pods", obj)
        return str(created["metadata"]["uid"])

    async def delete(self, name: str, grace: int | None = None) -> None:
        await asyncio.to_thread(self.server.delete, "pods", name, "default", grace)

    def get(self, name: str) -> Obj | None:
        return self.server.get("pods", name)

    async def pushed_pod(self, uid: str) -> Pod:
        """The pod as the API source handed it to the kubelet."""

        def find() -> Pod | None:
            last = self.pushed[-1] if self.pushed else None
            assert last is None or last.op is Op.SET
            return next((p for p in last.pods if p.uid == uid), None) if last else None

        return await eventually(f"pod {uid} pushed", find)

    async def run(self, uid: str) -> tuple[Pod, RuntimeContainer]:
        """As the kubelet does with a pod the source pushed: its worker syncs it, the runtime
        runs its container, its status goes to the API server."""
        pod = await self.pushed_pod(uid)
        self.kubelet.store.put(pod)
        self.kubelet.states[uid] = WorkerState.SYNCING
        sandbox = await self.runtime.run_sandbox(pod)
        config = ContainerConfig(
            name="c",
            image="busybox:1.36",
            command=["sleep", "9"],
            args=[],
            env=[],
            working_dir=None,
            attempt=0,
            spec_hash="h",
            image_pull_policy="IfNotPresent",
        )
        container = await self.runtime.start_container(pod, sandbox, config)
        self.statuses.on_status(uid, RUNNING)
        assert await self.statuses.flush(self.api, [uid])
        return pod, container

    async def terminate(self, pod: Pod, container: RuntimeContainer) -> None:
        """As the pod worker terminates a pod: stop its containers, compute its last status,
        tell the terminated listeners."""
        self.kubelet.states[pod.uid] = WorkerState.TERMINATING
        await self.runtime.stop_container(container, 30)
        self.statuses.on_status(pod.uid, KILLED)
        self.kubelet.states[pod.uid] = WorkerState.TERMINATED
        await self.finalizer.on_terminated(pod.uid, pod)

    def requests(self, name: str, *methods: str) -> list[tuple[str, str, dict[str, str]]]:
        """The server's log of the requests (of those methods) about pod `name` and its
        status, in order: (method, path, query)."""
        return [
            (r.method, r.path, r.query)
            for r in self.server.requests()
            if (not methods or r.method in methods) and f"/pods/{name}" in r.path
        ]


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer(bookmark_interval=0.5)
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
async def cluster(server: ApiServer, tmp_path: Path) -> AsyncIterator[Cluster]:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    connection = ApiConnection(kubeconfig, NODE)
    await asyncio.wait_for(connection.run(), 5)
    cluster = Cluster(server, kubeconfig, connection)
    yield cluster
    if cluster._finalizer is not None:
        await cluster.finalizer.close()
    for task in cluster.tasks:
        task.cancel()
    await asyncio.gather(*cluster.tasks, return_exceptions=True)
    await connection.close()


@contextlib.asynccontextmanager
async def watching(cluster: Cluster) -> AsyncIterator[list[Obj]]:
    """The pod events a `kubectl get pods -w` would see, from now on."""
    events: list[Obj] = []
    api = await KubeApi.connect(cluster.kubeconfig, NODE)
    version = str(cluster.server.resource_version())

    async def watch() -> None:
        async for event in api.watch_pods(f"spec.nodeName={NODE}", version, 30):
            if event["type"] != "BOOKMARK":
                events.append(event)

    task = asyncio.create_task(watch())
    try:
        yield events
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


# --- the final delete ---------------------------------------------------------------------------


async def test_a_terminated_pod_is_deleted_after_its_last_status(cluster: Cluster) -> None:
    await cluster.start()
    uid = await cluster.create(api_pod("p"))
    pod, container = await cluster.run(uid)
    async with watching(cluster) as events:
        await cluster.delete("p")  # kubectl delete: 30 s to terminate
        await eventually("seen deleting", lambda: uid in cluster.source.deleting())
        await cluster.finalizer.sweep()  # it runs: nothing to do yet
        assert cluster.get("p") is not None and cluster.finalizer.count == 0

        await cluster.terminate(pod, container)
        await eventually("gone from the API server", lambda: cluster.get("p") is None)
        await eventually("the watch saw it go", lambda: events and events[-1]["type"] == "DELETED")

    # Its last status went first, then the delete: immediate, and for this UID only (the
    # precondition, in the body: see the next test).
    path = "/api/v1/namespaces/default/pods/p"
    assert cluster.requests("p", "PATCH", "DELETE") == [
        ("PATCH", f"{path}/status", {}),  # Running
        ("PATCH", f"{path}/status", {}),  # Failed, its container killed
        ("DELETE", path, {"gracePeriodSeconds": "0"}),
    ]
    final = events[-1]["object"]
    assert final["metadata"]["uid"] == uid
    assert final["status"]["phase"] == "Failed"
    (status,) = final["status"]["containerStatuses"]
    assert status["state"]["terminated"] == {"exitCode": 143, "reason": "Error"}
    assert cluster.finalizer.count == 1
    # Once is enough: a later sweep or listener call sends nothing more.
    before = len(cluster.server.requests())
    await cluster.finalizer.sweep()
    await cluster.finalizer.on_terminated(uid, pod)
    await asyncio.sleep(0.02)
    assert len(cluster.server.requests()) == before


async def test_the_uid_precondition_spares_a_pod_recreated_under_the_name(
    cluster: Cluster,
) -> None:
    await cluster.start()
    uid = await cluster.create(api_pod("p"))
    pod, container = await cluster.run(uid)
    await cluster.delete("p")
    await eventually("seen deleting", lambda: uid in cluster.source.deleting())
    await cluster.runtime.stop_container(container, 30)
    cluster.kubelet.states[uid] = WorkerState.TERMINATED
    # Someone else removes it and creates another pod "p" before our final delete goes out
    # (the source has not heard yet: the calls block this loop).
    cluster.server.delete("pods", "p", "default", 0)
    new = cluster.server.create("pods", api_pod("p"))
    await cluster.finalizer.on_terminated(uid, pod)
    await eventually("the delete sent", lambda: len(cluster.requests("p", "DELETE")) == 1)
    await asyncio.sleep(0.05)
    survivor = cluster.get("p")
    assert survivor is not None and survivor["metadata"]["uid"] == new["metadata"]["uid"]
    assert "deletionTimestamp" not in survivor["metadata"]


async def test_a_pod_still_running_is_not_deleted(cluster: Cluster) -> None:
    await cluster.start()
    uid = await cluster.create(api_pod("p"))
    pod, container = await cluster.run(uid)
    await cluster.delete("p")
    await eventually("seen deleting", lambda: uid in cluster.source.deleting())
    # Its worker is still at it, or has let go while a container still runs (a straggler),
    # or no worker has it yet (the agent just restarted) while the runtime runs it.
    for state in (WorkerState.SYNCING, WorkerState.TERMINATING, WorkerState.TERMINATED, None):
        if state is None:
            cluster.kubelet.states.pop(uid)
        else:
            cluster.kubelet.states[uid] = state
        await cluster.finalizer.sweep()
        assert cluster.get("p") is not None, state
    assert not cluster.requests("p", "DELETE")
    # A container that is created, not yet running, counts as running too.
    cluster.runtime.behave("late", stays_created=True)
    late = ContainerConfig(
        name="late",
        image="busybox:1.36",
        command=["true"],
        args=[],
        env=[],
        working_dir=None,
        attempt=0,
        spec_hash="h",
        image_pull_policy="IfNotPresent",
    )
    sandbox = await cluster.runtime.run_sandbox(pod)
    created = await cluster.runtime.start_container(pod, sandbox, late)
    await cluster.runtime.stop_container(container, 30)
    await cluster.finalizer.sweep()
    assert cluster.get("p") is not None

    # Everything stopped: the sweep deletes it (the termination ended while we were away).
    await cluster.runtime.stop_container(created, 30)
    await cluster.finalizer.sweep()
    assert cluster.get("p") is None
    assert cluster.finalizer.count == 1


async def test_a_pod_that_never_ran_here_is_deleted_by_the_sweep(cluster: Cluster) -> None:
    uid = await cluster.create(api_pod("never"))
    await cluster.delete("never")  # deleted before this agent saw it
    await cluster.start()
    assert uid in cluster.source.deleting()
    assert all(uid not in {p.uid for p in u.pods} for u in cluster.pushed)  # not run
    task = asyncio.create_task(cluster.finalizer.run(cluster.api))
    cluster.tasks.append(task)
    await eventually("deleted", lambda: cluster.get("never") is None)
    assert cluster.requests("never", "DELETE")[-1][2] == {"gracePeriodSeconds": "0"}


async def test_a_failed_final_delete_is_retried_by_the_sweep(cluster: Cluster) -> None:
    await cluster.start()
    uid = await cluster.create(api_pod("p"))
    pod, container = await cluster.run(uid)
    await cluster.delete("p")
    await eventually("seen deleting", lambda: uid in cluster.source.deleting())
    await cluster.runtime.stop_container(container, 30)
    cluster.statuses.on_status(uid, KILLED)
    assert await cluster.statuses.flush(
        cluster.api, [uid]
    )  # nothing pending: the next is the delete
    cluster.kubelet.states[uid] = WorkerState.TERMINATED
    cluster.server.fail_next(500)
    await cluster.finalizer.on_terminated(uid, pod)
    await eventually("the delete tried", lambda: len(cluster.requests("p", "DELETE")) == 1)
    await asyncio.sleep(0.02)
    assert cluster.get("p") is not None and cluster.finalizer.count == 0
    await cluster.finalizer.sweep()
    assert cluster.get("p") is None and cluster.finalizer.count == 1


async def test_the_sweep_forgets_statuses_of_pods_gone_everywhere(cluster: Cluster) -> None:
    await cluster.start()
    api_uid = await cluster.create(api_pod("p"))
    await cluster.pushed_pod(api_uid)
    static = Pod.model_validate(
        {"metadata": {"name": "s", "namespace": "default", "uid": "static-uid"}, "spec": {}}
    )
    cluster.kubelet.store.put(static)
    cluster.kubelet.states["stopping-uid"] = WorkerState.TERMINATING
    for uid in (api_uid, "static-uid", "stopping-uid", "gone-uid"):
        cluster.statuses.on_status(uid, RUNNING)
    await cluster.finalizer.sweep()
    # The API's pod, a pod a source has, a pod a worker still terminates stay; the rest goes.
    assert sorted(cluster.statuses.known()) == sorted([api_uid, "static-uid", "stopping-uid"])

    # The API pod removed everywhere: its status goes at the next sweep.
    await cluster.delete("p", 0)
    await eventually("the source saw it go", lambda: cluster.source.api_object(api_uid) is None)
    cluster.kubelet.states.pop("stopping-uid")
    await cluster.finalizer.sweep()
    assert cluster.statuses.known() == ["static-uid"]


# --- mirror pods --------------------------------------------------------------------------------

FACTS = MachineFacts(4, 1 << 22, 1 << 36, "n1", "m", "b", "s", "6.1", "Test", "amd64")


def static_pod(name: str, config_hash: str) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": config_hash,
                "labels": {"app": name},
                "annotations": {CONFIG_SOURCE: FILE_SOURCE, CONFIG_HASH: config_hash},
            },
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox:1.36"}]},
        }
    )


def mirrors(cluster: Cluster) -> dict[str, Obj]:
    return {
        o["metadata"]["name"]: o
        for o in cluster.server.list("pods")
        if CONFIG_MIRROR in (o["metadata"].get("annotations") or {})
    }


async def test_mirror_pods_follow_the_static_pods(cluster: Cluster) -> None:
    await cluster.start()
    node = NodeAgent(
        NODE,
        host_ip="192.0.2.10",
        max_pods=110,
        runtime_name="fake",
        facts=FACTS,
        health_problems=list,
    )
    node.node_uid = "node-uid"
    mirror = MirrorPods(cluster.kubelet.pods, cluster.source, node, NODE, period=0.01)
    web = static_pod("web", "hash-1")
    cluster.kubelet.store.put(web)
    # A pod of the API server's that has a static pod's name is someone's: left alone.
    theirs = await cluster.create(api_pod("db"))
    cluster.kubelet.store.put(static_pod("db", "hash-db"))
    await eventually("db seen", lambda: cluster.source.has_pod(("default", "db")))

    await mirror.reconcile(cluster.api)
    created = await eventually("the mirror of web", lambda: mirrors(cluster).get("web"))
    meta = created["metadata"]
    assert meta["annotations"][CONFIG_MIRROR] == "hash-1"
    assert meta["labels"] == {"app": "web"}
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid", "controller": True}
    ]
    assert created["spec"]["nodeName"] == NODE
    db = cluster.get("db")
    assert db is not None and db["metadata"]["uid"] == theirs and "db" not in mirrors(cluster)
    await eventually("the watch has it", lambda: ("default", "web") in cluster.source.mirror_pods())
    assert mirror.mirror_of(web.uid) is not None

    # Reconciling again changes nothing.
    await mirror.reconcile(cluster.api)
    assert mirror.creates == 1 and mirror.deletes == 0

    # The manifest changed (a new hash): the old mirror is deleted, then a new one is made.
    changed = static_pod("web", "hash-2")
    cluster.kubelet.store.remove(web.uid)
    cluster.kubelet.store.put(changed)
    assert mirror.mirror_of(changed.uid) is None  # the mirror shows the old manifest

    async def replaced() -> Obj | None:
        await mirror.reconcile(cluster.api)
        obj = cluster.source.mirror_pods().get(("default", "web"))  # as the watch shows it
        return obj if obj and obj["metadata"]["annotations"][CONFIG_MIRROR] == "hash-2" else None

    await eventually_async("the new mirror", replaced)
    # (A mirror deleted before the watch showed it is made again only after 10 s: here the
    # next reconcile sees it, as the source's listener would have it run.)
    await mirror.reconcile(cluster.api)
    assert mirror.deletes == 1 and mirror.creates == 2
    assert [q for _, _, q in cluster.requests("web", "DELETE")] == [{"gracePeriodSeconds": "0"}]

    # Someone deletes the mirror: it comes back. The static pod goes: so does its mirror.
    await cluster.delete("web", 0)

    async def back() -> Obj | None:
        await mirror.reconcile(cluster.api)
        return mirrors(cluster).get("web")

    await eventually_async("recreated", back)
    cluster.kubelet.store.remove(changed.uid)

    async def gone() -> bool:
        await mirror.reconcile(cluster.api)
        return "web" not in mirrors(cluster)

    await eventually_async("the mirror removed", gone)
    assert cluster.get("db") is not None


async def eventually_async(what: str, check: Callable[[], Any], within: float = 5.0) -> Any:
    """As `eventually`, for a check that awaits (a reconcile, then a look)."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)
