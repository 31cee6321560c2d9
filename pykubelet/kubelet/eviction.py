"""The eviction manager (the kubelet's pkg/kubelet/eviction): every `--eviction-monitoring-interval`
(10 s) it observes the signals, keeps the node's pressure conditions, and when a threshold has
held for its grace period, reclaims what the node can and otherwise evicts one pod.

- Observations: `memory.available` from the stats collector's sample, a fresh one unless its
  latest is younger than an interval (the kubelet asks its summary provider to update its
  stats), the file-system and pid signals read in a
  thread (`eviction_signals`). What cannot be observed meets no threshold.
- A pod's ephemeral storage, for the disk ranking, is the collector's (a fresh storage sample:
  writable layers, logs, local volumes, as the kubelet's podDiskUsage); a pod with no running
  container (not in the sample) is measured by its directories under --root-dir.
- The decisions are `eviction_policy`'s: thresholds met (minimum reclaim), grace periods, the
  transition period of the conditions, the ranking and the messages.
- Reclaim first: for a disk signal, the exited instances of each container beyond the latest
  (kept for `--previous` logs) are removed; if the signals are then back above every threshold
  plus its minimum reclaim, nothing is evicted. Images are not garbage-collected here.
- Then one pod per interval, the first of the ranking that is not critical (static pods and
  priority >= 2000000000, as the kubelet's IsCriticalPod): an `Evicted` warning event, the
  status Failed with reason `Evicted` and the kubelet's message, killed with a grace period of
  1 s for a hard threshold (the kubelet's immediateEvictionGracePeriodSeconds) or
  min(--eviction-max-pod-grace-period, the pod's terminationGracePeriodSeconds) for a soft one.
  Before it acts, an `EvictionThresholdMet` warning on the node ("Attempting to reclaim
  memory"). Once the evicted pod's containers have stopped, its volumes are removed (the
  kubelet's volume manager tears down a terminated pod's volumes), which frees what an
  emptyDir held. The next observation waits for that cleanup (at most 30 s), as the kubelet's
  waitForPodsCleanup.
- `EvictionAdmit` is the kubelet's eviction admit handler: under MemoryPressure alone,
  BestEffort pods are refused (unless they tolerate the memory-pressure taint); under any other
  pressure, every pod but critical ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pykubelet.api.model import Pod
from pykubelet.api.qos import BEST_EFFORT, qos_class
from pykubelet.common import metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.kubelet.admission import ADMIT, AdmitResult, NodeUsage
from pykubelet.kubelet.eviction_policy import (
    MEMORY_PRESSURE,
    REASON,
    Observation,
    PodUsage,
    PressureState,
    Rule,
    admit_message,
    eviction_message,
    is_critical,
    pod_disk_usage,
    rank,
    thresholds_met,
)
from pykubelet.kubelet.eviction_signals import (
    disk_usage,
    fs_observations,
    pid_observation,
    pod_paths,
    process_counts,
)
from pykubelet.kubelet.pod_store import PodView, is_static
from pykubelet.pod.workers import UpdateType
from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod
from pykubelet.stats.types import NodeStats
from pykubelet.status.manager import StatusManager

log = logging.getLogger(__name__)

MONITORING_INTERVAL = 10.0
IMMEDIATE_GRACE_SECONDS = 1
POD_CLEANUP_TIMEOUT = 30.0  # the kubelet's podCleanupTimeout
MEMORY_PRESSURE_TAINT = "node.kubernetes.io/memory-pressure"
# The taint each condition puts on the Node (the node lifecycle controller's, NoSchedule).
PRESSURE_TAINTS = {
    "MemoryPressure": MEMORY_PRESSURE_TAINT,
    "DiskPressure": "node.kubernetes.io/disk-pressure",
    "PIDPressure": "node.kubernetes.io/pid-pressure",
}


class Sampler(Protocol):
    """The stats collector: its latest sample, or a fresh one."""

    def latest(self) -> NodeStats | None: ...

    async def sample(self, *, storage: bool | None = None) -> NodeStats: ...


class RuntimeView(Protocol):
    async def list_pods(self) -> list[RuntimePod]: ...

    async def remove_container(self, container: RuntimeContainer) -> None: ...


class Killer(Protocol):
    def update_pod(
        self,
        update: UpdateType,
        pod: Pod | None,
        uid: str | None = None,
        *,
        grace: float | None = None,
        removed: bool = False,
    ) -> None: ...


class PodVolumes(Protocol):
    async def teardown(self, uid: str) -> None: ...


class PressureView(Protocol):
    """What admission and the node status read of the manager."""

    def pressure_conditions(self) -> frozenset[str]: ...


class EvictionManager:
    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        node_name: str,
        root_dir: Path,
        memory_capacity: int,
        sampler: Sampler | None,
        runtime: RuntimeView,
        pods: PodView,
        is_active: Callable[[str], bool],
        killer: Killer,
        statuses: StatusManager,
        recorder: EventRecorder,
        volumes: PodVolumes | None = None,
        max_pod_grace_period: int = 0,
        transition_period: float = 300.0,
        interval: float = MONITORING_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        observe_fs: Callable[[Path], dict[str, Observation]] = fs_observations,
        observe_pids: Callable[[], Observation] = pid_observation,
    ) -> None:
        self._rules = tuple(rules)
        self._node_name = node_name
        self._root_dir = root_dir
        self._memory_capacity = memory_capacity
        self._sampler = sampler
        self._runtime = runtime
        self._pods = pods
        self._is_active = is_active
        self._killer = killer
        self._statuses = statuses
        self._recorder = recorder
        self._volumes = volumes
        # Evicted pods not cleaned up yet (containers stopped, volumes removed): set when done.
        self._evicted: dict[str, asyncio.Event] = {}
        self._evicted_at = datetime.min.replace(tzinfo=UTC)
        self._max_pod_grace = max_pod_grace_period
        self.interval = interval
        self._clock = clock
        self._observe_fs = observe_fs
        self._observe_pids = observe_pids
        self._state = PressureState(transition_period)
        self._signals = {r.signal for r in self._rules}
        self._failing = False

    # --- what others read -----------------------------------------------------------------

    def pressure_conditions(self) -> frozenset[str]:
        """The pressure conditions that are True now (MemoryPressure, DiskPressure,
        PIDPressure)."""
        return self._state.conditions

    async def on_terminated(self, uid: str, pod: Pod | None) -> None:
        """Once an evicted pod's containers have stopped, its volumes go (the kubelet's volume
        manager tears down a terminated pod's volumes; an emptyDir's data with them), so the
        space it filled is reclaimed although the pod stays, Failed, in its source."""
        cleaned = self._evicted.pop(uid, None)
        if cleaned is None:
            return
        if self._volumes is not None:
            await self._volumes.teardown(uid)
            log.info("eviction manager: removed the volumes of evicted pod %s", uid)
        self._evicted_at = datetime.now(UTC)  # samples before this still count what it used
        cleaned.set()

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            evicted = None
            try:
                evicted = await self.synchronize()
                if self._failing:
                    log.info("eviction manager: observing again")
                self._failing = False
            except Exception:  # one failed observation must not end the monitoring
                if not self._failing:
                    log.exception("eviction manager: synchronize failed; retrying")
                self._failing = True
            if evicted is not None:
                # As the kubelet: the next observation once the evicted pod is cleaned up
                # (what it used given back), or after 30 s.
                await self._wait_for_cleanup(evicted)
            else:
                await asyncio.sleep(self.interval)

    async def _wait_for_cleanup(self, pod: Pod) -> None:
        cleaned = self._evicted.get(pod.uid)
        if cleaned is None:
            return
        try:
            async with asyncio.timeout(POD_CLEANUP_TIMEOUT):
                await cleaned.wait()
            log.info("eviction manager: pod %s was cleaned up", pod.key)
        except TimeoutError:
            log.info("eviction manager: timed out waiting for pod %s to be cleaned up", pod.key)

    async def synchronize(self) -> Pod | None:
        """One observation and what follows from it; the pod evicted, if one was."""
        if not self._rules:
            return None
        stats = await self._sample()
        observations = await self._observe(stats)
        due = self._state.update(self._rules, observations, self._clock())
        if not due:
            return None
        rule = due[0]
        resource = rule.resource
        log.info("eviction manager: attempting to reclaim %s", resource)
        self._recorder.record(
            "Warning",
            "EvictionThresholdMet",
            f"Attempting to reclaim {resource}",
            ObjectRef.node(self._node_name),
        )
        if await self._reclaim_node_level(rule, observations):
            log.info("eviction manager: reduced %s pressure without evicting pods", resource)
            return None
        active = [p for p in self._pods if self._is_active(p.uid)]
        if not active:
            log.error("eviction manager: thresholds are met, but no pods are active to evict")
            return None
        usage = await self._pod_usage(active, stats, resource)
        for pod in rank(resource, active, usage):
            if is_critical(pod, is_static(pod)):
                log.error("eviction manager: cannot evict a critical pod %s", pod.key)
                continue
            message = eviction_message(rule, observations.get(rule.signal), pod, usage.get(pod.uid))
            self._evict(pod, self._grace(rule, pod), message)
            metrics.evictions.labels(rule.signal).inc()
            return pod
        log.info("eviction manager: unable to evict any pods from the node")
        return None

    # --- observing ----------------------------------------------------------------------------

    async def _sample(self) -> NodeStats | None:
        if self._sampler is None or not self._signals & {
            "memory.available",
            "allocatableMemory.available",
        }:
            return None
        # The collector's own sample when it is younger than an interval (it samples every
        # 10 s too): the cost of a sample is not paid twice.
        # Never one taken before the last evicted pod stopped: what it used is gone since.
        latest = self._sampler.latest()
        if latest is not None and latest.time > self._evicted_at:
            age = (datetime.now(UTC) - latest.time).total_seconds()
            if 0 <= age < self.interval:
                return latest
        return await self._sampler.sample()

    async def _observe(self, stats: NodeStats | None) -> dict[str, Observation]:
        out: dict[str, Observation] = {}
        if stats is not None and stats.memory is not None:
            working_set = stats.memory.working_set_bytes
            out["memory.available"] = Observation(
                max(0, self._memory_capacity - working_set), self._memory_capacity
            )
        if self._signals & {
            "nodefs.available",
            "nodefs.inodesFree",
            "imagefs.available",
            "imagefs.inodesFree",
            "containerfs.available",
            "containerfs.inodesFree",
        }:
            fs = await asyncio.to_thread(self._observe_fs, self._root_dir)
            out.update(fs)
            for kind in ("available", "inodesFree"):
                if f"nodefs.{kind}" in fs:
                    out[f"containerfs.{kind}"] = fs[f"nodefs.{kind}"]
        if "pid.available" in self._signals:
            out["pid.available"] = await asyncio.to_thread(self._observe_pids)
        return out

    async def _pod_usage(
        self, pods: Sequence[Pod], stats: NodeStats | None, resource: str
    ) -> dict[str, PodUsage]:
        """What each pod uses of `resource` (only that one is measured)."""
        if resource == "memory":
            by_uid = {p.uid: p for p in stats.pods} if stats is not None else {}
            out: dict[str, PodUsage] = {}
            for pod in pods:
                found = by_uid.get(pod.uid)
                if found is None or found.memory is None:
                    continue
                containers = {
                    c.name: c.memory.working_set_bytes
                    for c in found.containers
                    if c.memory is not None
                }
                out[pod.uid] = PodUsage(
                    memory=found.memory.working_set_bytes, containers_memory=containers
                )
            return out
        if resource == "pids":
            roots: dict[str, list[int]] = {}
            for runtime_pod in await self._runtime.list_pods():
                roots[runtime_pod.uid] = [
                    c.pid
                    for c in runtime_pod.containers
                    if c.state is ContainerRunState.RUNNING and c.pid is not None
                ]
            wanted = {p.uid: roots.get(p.uid, []) for p in pods}
            counts = await asyncio.to_thread(process_counts, wanted)
            return {uid: PodUsage(processes=n) for uid, n in counts.items()}
        out = {}
        if self._sampler is not None:
            # A fresh storage sample (the engines measure the writable layers): ranking happens
            # only under disk pressure, and what an eviction freed must show.
            fresh = await self._sampler.sample(storage=True)
            by_uid = {p.uid: p for p in fresh.pods if p.ephemeral_storage is not None}
            out = {p.uid: pod_disk_usage(p, by_uid[p.uid]) for p in pods if p.uid in by_uid}
        # A pod with no container running is not in the sample: its directories are measured.
        rest = [p.uid for p in pods if p.uid not in out]
        measured = await asyncio.to_thread(self._disk_usage, rest) if rest else {}
        for uid, used in measured.items():
            out[uid] = PodUsage(disk=used.bytes, inodes=used.inodes)
        return out

    def _disk_usage(self, uids: list[str]) -> dict[str, Any]:
        return {uid: disk_usage(pod_paths(self._root_dir, uid)) for uid in uids}

    # --- acting -------------------------------------------------------------------------------

    async def _reclaim_node_level(
        self, rule: Rule, observations: Mapping[str, Observation]
    ) -> bool:
        """Dead containers for a disk signal; True if every threshold is then resolved."""
        if rule.resource not in ("ephemeral-storage", "inodes"):
            return False
        removed = await self._remove_dead_containers()
        if not removed:
            return False
        fresh = dict(observations)
        fresh.update(await asyncio.to_thread(self._observe_fs, self._root_dir))
        return not thresholds_met(self._rules, fresh, True)

    async def _remove_dead_containers(self) -> int:
        """Exited instances of each container beyond its latest (the latest stays for
        `--previous` logs)."""
        removed = 0
        for runtime_pod in await self._runtime.list_pods():
            by_name: dict[str, list[RuntimeContainer]] = {}
            for container in runtime_pod.containers:
                by_name.setdefault(container.name, []).append(container)
            for instances in by_name.values():
                instances.sort(key=lambda c: c.attempt)
                for old in instances[:-1]:
                    if old.state is not ContainerRunState.EXITED:
                        continue
                    try:
                        await self._runtime.remove_container(old)
                        removed += 1
                    except Exception as exc:  # the runtime's refusal: keep going
                        log.info("eviction manager: cannot remove container %s: %s", old.id, exc)
        if removed:
            log.info("eviction manager: removed %d dead containers", removed)
        return removed

    def _grace(self, rule: Rule, pod: Pod) -> int:
        if rule.hard:
            return IMMEDIATE_GRACE_SECONDS
        return min(self._max_pod_grace, pod.spec.termination_grace_period_seconds)

    def _evict(self, pod: Pod, grace: int, message: str) -> None:
        log.warning("evicting pod %s (grace %ds): %s", pod.key, grace, message)
        self._recorder.record(
            "Warning",
            REASON,
            message,
            ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, pod.uid),
        )
        status = self._statuses.get(pod.uid)
        if status is not None:
            self._statuses.set(
                pod.uid,
                status.model_copy(update={"phase": "Failed", "reason": REASON, "message": message}),
            )
        self._evicted[pod.uid] = asyncio.Event()
        self._evicted_at = datetime.now(UTC)
        self._killer.update_pod(UpdateType.KILL, pod, grace=float(grace))


def _tolerates_memory_pressure(pod: Pod) -> bool:
    for toleration in pod.spec.tolerations or []:
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        effect = toleration.get("effect") or ""
        if effect and effect != "NoSchedule":
            continue
        if operator == "Exists" and key in ("", MEMORY_PRESSURE_TAINT):
            return True
        if operator == "Equal" and key == MEMORY_PRESSURE_TAINT and not toleration.get("value"):
            return True
    return False


class EvictionAdmit:
    """The kubelet's eviction admit handler (the first admission handler)."""

    def __init__(self, pressure: PressureView) -> None:
        self._pressure = pressure

    def admit(self, pod: Pod, requests: Mapping[str, int], usage: NodeUsage) -> AdmitResult:
        conditions = self._pressure.pressure_conditions()
        if not conditions or is_critical(pod, is_static(pod)):
            return ADMIT
        if conditions == {MEMORY_PRESSURE} and (
            qos_class(pod) != BEST_EFFORT or _tolerates_memory_pressure(pod)
        ):
            return ADMIT
        return AdmitResult(False, REASON, admit_message(conditions))
