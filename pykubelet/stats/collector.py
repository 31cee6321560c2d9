"""The stats collector: every `period` (10 s, as cAdvisor's housekeeping) it samples the node and
each running container the runtime reports, and keeps the latest sample for its readers
(`StatsView.latest()`).

- The runtime is asked on the event loop (`list_pods()`); every file is read in one thread call
  (`cgroupfs.CgroupFs`), never on the loop.
- A container is sampled by its main process (`RuntimeContainer.pid`), so every backend that
  fills `pid` is measured without knowing which it is; a container without one is left out.
- Rates (`usage_nano_cores`) are over the window since the previous sample of the same
  container ID (a restarted container starts a new series) and of the node.
- CPU counters never go down: where a container's CPU is the sum over its processes (see
  `cgroupfs`), a process reaped outside the container takes its CPU time with it; the counter
  keeps what was counted, as a cgroup's does, so a rate is never negative.
- Each pod keeps a short history (`history(uid)`: the last `HISTORY_SAMPLES`, 5 minutes at
  10 s), dropped when the pod is no longer sampled.
- A pod's usage is the sum of its running containers' (the kubelet reads the pod's cgroup; the
  difference is the pause container and processes outside any container).
- File systems (given a root dir and a storage source: `storage.py`): the node's, the image
  file system, each container's writable layer and logs, each pod's volumes, and the pod's
  ephemeral storage (the kubelet's calcEphemeralStorage: its containers' writable layers and
  logs, its volumes, the files kept for it). Measured once per period, not per sample: a sample
  in between (eviction's) carries the last measurement; `sample(storage=True)` measures now.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple, Protocol

from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod
from pykubelet.stats.cgroupfs import CgroupFs, Reading
from pykubelet.stats.history import UsageHistories
from pykubelet.stats.storage import StorageReading, StorageSampler, StorageSource, usage_on
from pykubelet.stats.types import (
    ContainerStats,
    CpuUsage,
    FsStats,
    MemoryUsage,
    NodeStats,
    PodStats,
    UsagePoint,
    VolumeStats,
)

log = logging.getLogger(__name__)

DEFAULT_PERIOD = 10.0
HISTORY_SAMPLES = 30  # 5 minutes at the default period


class PodLister(Protocol):
    """What the collector needs of the runtime."""

    async def list_pods(self) -> list[RuntimePod]: ...


class _Last(NamedTuple):
    # A tuple: one is made per container, every sample.
    at: float
    cpu_ns: int  # as reported (never lower than before)
    offset: int  # CPU time of processes no longer counted, kept in the counter


class _PodStorage(NamedTuple):
    container_ids: tuple[str, ...]  # the containers its ephemeral storage counts
    volumes: tuple[VolumeStats, ...]
    ephemeral: FsStats


def _time(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


class StatsCollector:
    """Samples on a period; `latest()` is the read-only view (`StatsView`)."""

    def __init__(
        self,
        runtime: PodLister,
        node_name: str,
        period: float = DEFAULT_PERIOD,
        fs: CgroupFs | None = None,
        *,
        root_dir: Path | None = None,
        storage: StorageSource | None = None,
        storage_period: float | None = None,
    ) -> None:
        self._runtime = runtime
        self._storage = (
            StorageSampler(
                root_dir, storage, period if storage_period is None else storage_period, period
            )
            if root_dir is not None and storage is not None
            else None
        )
        self.node_name = node_name
        self.period = period
        self._fs = fs if fs is not None else CgroupFs()
        self._latest: NodeStats | None = None
        self._last: dict[str, _Last] = {}  # container ID (node: "") -> its last CPU reading
        self._boot: float | None = None
        self._history = UsageHistories(HISTORY_SAMPLES)
        self._failing = False
        self._sampled_at: float | None = None  # the event loop's time a sample last began
        self._taking: asyncio.Future[NodeStats | None] | None = None  # the sample under way
        # Each pod's part of the latest storage reading (`_pod_storage`), by pod UID.
        self._storage_of: StorageReading | None = None
        self._pods_storage: dict[str, _PodStorage] = {}
        # One sample at a time: the file reader keeps per-sample state (the processes it read).
        self._lock = asyncio.Lock()

    def latest(self) -> NodeStats | None:
        return self._latest

    def history(self, uid: str) -> tuple[UsagePoint, ...]:
        return self._history.of(uid)

    def _remember(self, pods: tuple[PodStats, ...]) -> None:
        """Append each pod's usage to its history; forget the pods no longer sampled."""
        for pod in pods:
            cores = None
            if pod.cpu is not None and pod.cpu.usage_nano_cores is not None:
                cores = pod.cpu.usage_nano_cores / 1e9
            memory = pod.memory.working_set_bytes if pod.memory is not None else None
            time = max((u.time for u in (pod.cpu, pod.memory) if u is not None), default=None)
            self._history.append(pod.uid, time or pod.start_time, cores, memory)
        self._history.keep_only(pod.uid for pod in pods)

    async def run(self) -> None:
        """Sample now and every `period` until cancelled. A sample another reader took (the
        eviction manager's, when the latest was too old for it) less than half a period ago
        counts as this period's: the next is a period after it, not a second one now."""
        loop = asyncio.get_running_loop()
        while True:
            last = self._sampled_at
            if last is None or loop.time() - last >= self.period / 2:
                last = loop.time()
                try:
                    await self.sample()
                except Exception:  # a bug in one sample must not end the sampling
                    log.exception("resource usage sample failed")
            await asyncio.sleep(max(0.0, last + self.period - loop.time()))

    async def sample(self, *, storage: bool | None = None) -> NodeStats:
        """Take one sample now, keep it as the latest and return it. `storage`: measure the
        file systems now (True), never (False: the last measurement), or when due (None).

        Asked while a sample is being taken, and not for storage now, the answer is that
        sample (read at most its own duration before the call): the eviction manager, finding
        the latest a period old just as the collector takes the next, would take a second."""
        taking = self._taking
        if taking is not None and storage is not True:
            joined = await asyncio.shield(taking)
            if joined is not None:
                return joined
            # That sample failed or was cancelled: this caller takes its own.
        async with self._lock:
            loop = asyncio.get_running_loop()
            self._sampled_at = loop.time()
            taking = self._taking = loop.create_future()
            stats: NodeStats | None = None
            try:
                stats = await self._sample(storage)
            finally:
                self._taking = None
                taking.set_result(stats)
            return stats

    async def _storage_reading(
        self, containers: list[RuntimeContainer], wanted: bool | None
    ) -> StorageReading | None:
        sampler = self._storage
        if sampler is None:
            return None
        if wanted or (wanted is None and sampler.due(time.time())) or sampler.latest is None:
            return await sampler.sample(containers)
        return sampler.latest

    async def _sample(self, wanted_storage: bool | None = None) -> NodeStats:
        errors: list[str] = []
        try:
            pods = await self._runtime.list_pods()
        except Exception as exc:  # the runtime's failure is this sample's error, not ours
            errors.append(f"cannot list the runtime's pods: {exc}")
            pods = []
        targets = [
            (pod, c)
            for pod in pods
            for c in pod.containers
            if c.state is ContainerRunState.RUNNING and c.pid is not None
        ]
        processes = [(c.pid, c.id) for _, c in targets if c.pid is not None]
        storage = await self._storage_reading([c for _, c in targets], wanted_storage)
        node, readings, boot, problem = await asyncio.to_thread(self._read, processes)
        if problem:
            errors.append(problem)
        cpu, memory, pod_stats = self._build(
            node, list(zip(targets, readings, strict=True)), storage
        )
        at = node.at if node is not None else max((r.at for r in readings if r), default=0.0)
        stats = NodeStats(
            node_name=self.node_name,
            start_time=_time(boot),
            time=_time(at),
            cpu=cpu,
            memory=memory,
            pods=pod_stats,
            fs=storage.node_fs if storage is not None else None,
            image_fs=storage.image_fs if storage is not None else None,
            errors=tuple(errors),
        )
        if errors and not self._failing:
            log.warning("resource usage sample incomplete: %s", "; ".join(errors))
        elif not errors and self._failing:
            log.info("resource usage samples complete again")
        self._failing = bool(errors)
        self._remember(pod_stats)
        self._latest = stats
        return stats

    def _read(
        self, processes: list[tuple[int, str]]
    ) -> tuple[Reading | None, list[Reading | None], float, str]:
        """In a thread: everything this sample reads from files, for each (pid, container ID)."""
        problem = ""
        try:
            self._fs.refresh()
        except OSError as exc:
            problem = f"cannot read the cgroup mounts: {exc}"
        if self._boot is None:
            try:
                self._boot = self._fs.boot_time()
            except OSError:
                self._boot = 0.0
        node: Reading | None = None
        try:
            node = self._fs.node()
        except (OSError, ValueError, KeyError, IndexError, AssertionError) as exc:
            problem = problem or f"cannot read the node's usage: {exc}"
        readings: list[Reading | None] = []
        for pid, container_id in processes:
            try:
                readings.append(self._fs.container(pid, container_id))
            except (OSError, ValueError) as exc:
                log.debug("cannot read the usage of process %d: %s", pid, exc)
                readings.append(None)
        self._fs.keep_only({container_id for _, container_id in processes})
        return node, readings, self._boot, problem

    def _cpu(self, key: str, reading: Reading, at: datetime) -> CpuUsage | None:
        """`at`: the reading's time as a datetime (made once for its CPU and memory)."""
        if reading.cpu_ns is None:
            return None
        last = self._last.get(key)
        offset = last.offset if last is not None else 0
        value = reading.cpu_ns + offset
        if last is not None and value < last.cpu_ns:
            offset += last.cpu_ns - value
            value = last.cpu_ns
        rate = None
        if last is not None and reading.at > last.at:
            rate = int((value - last.cpu_ns) / (reading.at - last.at))
        self._last[key] = _Last(reading.at, value, offset)
        return CpuUsage(at, value, rate)

    @staticmethod
    def _memory(reading: Reading, at: datetime) -> MemoryUsage | None:
        if reading.working_set is None:
            return None
        available = None
        if reading.limit is not None:
            available = max(0, reading.limit - reading.working_set)
        return MemoryUsage(
            at,
            reading.working_set,
            usage_bytes=reading.usage,
            rss_bytes=reading.rss,
            available_bytes=available,
            page_faults=reading.page_faults,
            major_page_faults=reading.major_page_faults,
        )

    def _build(
        self,
        node: Reading | None,
        readings: list[tuple[tuple[RuntimePod, RuntimeContainer], Reading | None]],
        storage: StorageReading | None = None,
    ) -> tuple[CpuUsage | None, MemoryUsage | None, tuple[PodStats, ...]]:
        seen: set[str] = {""}
        node_cpu = node_memory = None
        if node is not None:
            node_at = _time(node.at)
            node_cpu, node_memory = self._cpu("", node, node_at), self._memory(node, node_at)
        by_pod: dict[str, tuple[RuntimePod, list[ContainerStats]]] = {}
        for (pod, container), reading in readings:
            if reading is None:
                continue  # exited while it was read
            seen.add(container.id)
            at = _time(reading.at)
            stats = ContainerStats(
                name=container.name,
                id=container.id,
                start_time=container.started_at or container.created_at,
                cpu=self._cpu(container.id, reading, at),
                memory=self._memory(reading, at),
                rootfs=storage.rootfs.get(container.id) if storage is not None else None,
                logs=storage.logs.get(container.id) if storage is not None else None,
            )
            by_pod.setdefault(pod.uid, (pod, []))[1].append(stats)
        for gone in set(self._last) - seen:
            del self._last[gone]
        pods = tuple(
            _pod_stats(pod, containers, self._pod_storage(pod.uid, containers, storage))
            for pod, containers in by_pod.values()
        )
        return node_cpu, node_memory, pods

    def _pod_storage(
        self, uid: str, containers: list[ContainerStats], storage: StorageReading | None
    ) -> _PodStorage | None:
        """The pod's volumes and ephemeral storage from `storage`: worked out once per storage
        reading and set of containers (storage is measured once a period, usage each sample).
        None: storage not sampled, or the pod started after it was."""
        if storage is None or uid not in storage.volumes:
            return None
        if self._storage_of is not storage:
            self._storage_of, self._pods_storage = storage, {}
        ids = tuple(c.id for c in containers)
        kept = self._pods_storage.get(uid)
        if kept is None or kept.container_ids != ids:
            volumes = storage.volumes[uid]
            files = storage.pod_files.get(uid)
            others = [files] if files is not None else []
            ephemeral = ephemeral_storage(containers, volumes, others, storage.node_fs)
            kept = self._pods_storage[uid] = _PodStorage(ids, volumes, ephemeral)
        return kept


def ephemeral_storage(
    containers: Iterable[ContainerStats],
    volumes: Iterable[VolumeStats],
    others: Iterable[FsStats],
    totals: FsStats | None,
) -> FsStats:
    """The kubelet's calcEphemeralStorage: the sum of the containers' writable layers and logs,
    the pod's volumes and `others` (the files kept for it), on the node file system's totals."""
    parts = [
        *(fs for c in containers for fs in (c.rootfs, c.logs) if fs is not None),
        *(v.fs for v in volumes),
        *others,
    ]
    used = _sum_known(p.used_bytes for p in parts)
    inodes = _sum_known(p.inodes_used for p in parts)
    at = max((p.time for p in parts), default=totals.time if totals else datetime.now(UTC))
    return usage_on(totals, used, inodes, at)


def _sum_known(values: Iterable[int | None]) -> int | None:
    """The sum of the values known (the kubelet's addUsage); None if none is."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _containers_usage(
    containers: list[ContainerStats],
) -> tuple[CpuUsage | None, MemoryUsage | None]:
    """A pod's CPU and memory: the sums of its containers' (None where one is unknown)."""
    cpus = [c.cpu for c in containers if c.cpu is not None]
    memories = [c.memory for c in containers if c.memory is not None]
    cpu = None
    if cpus:
        rates = [c.usage_nano_cores for c in cpus]
        cpu = CpuUsage(
            max(c.time for c in cpus),
            sum(c.usage_core_nanoseconds for c in cpus),
            None if None in rates else sum(r or 0 for r in rates),
        )
    memory = None
    if memories:
        memory = MemoryUsage(
            max(m.time for m in memories),
            sum(m.working_set_bytes for m in memories),
            usage_bytes=_sum(m.usage_bytes for m in memories),
            rss_bytes=_sum(m.rss_bytes for m in memories),
            page_faults=_sum(m.page_faults for m in memories),
            major_page_faults=_sum(m.major_page_faults for m in memories),
        )
    return cpu, memory


def _one_container_usage(only: ContainerStats) -> tuple[CpuUsage | None, MemoryUsage | None]:
    """A pod of one container uses what it does (most pods: `_containers_usage`'s sums of one,
    without building them again), but for the memory available, which a pod does not report."""
    memory = only.memory
    if memory is not None and memory.available_bytes is not None:
        memory = memory._replace(available_bytes=None)
    return only.cpu, memory


def _pod_stats(
    pod: RuntimePod, containers: list[ContainerStats], storage: _PodStorage | None
) -> PodStats:
    if len(containers) == 1:
        cpu, memory = _one_container_usage(containers[0])
    else:
        cpu, memory = _containers_usage(containers)
    if pod.sandbox is not None:
        start = pod.sandbox.created_at
    else:
        start = min(c.start_time for c in containers)
    # A pod that started after the last storage measurement has none yet (None, not 0: eviction
    # then measures it itself).
    volumes: tuple[VolumeStats, ...] = ()
    ephemeral = None
    if storage is not None:
        volumes, ephemeral = storage.volumes, storage.ephemeral
    return PodStats(
        uid=pod.uid,
        name=pod.name,
        namespace=pod.namespace,
        start_time=start,
        containers=tuple(containers),
        cpu=cpu,
        memory=memory,
        volumes=volumes,
        ephemeral_storage=ephemeral,
    )


def _sum(values: Iterable[int | None]) -> int | None:
    """The sum; None if any value is unknown, or there is none."""
    total: int | None = None
    for value in values:
        if value is None:
            return None
        total = value if total is None else total + value
    return total
