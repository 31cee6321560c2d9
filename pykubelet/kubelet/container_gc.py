"""Container garbage collection (the kubelet's containerGC), every minute once all sources are
ready, on any runtime through the Runtime protocol:

- exited instances of a pod's container beyond `--maximum-dead-containers-per-container`
  (default 1: the newest dead one stays, for its lastState and `kubectl logs --previous`),
  oldest attempt first; then, with `--maximum-dead-containers` >= 0 (default -1: no limit), the
  node's dead containers down to that number, an equal share per container first, then oldest
  first; only instances that exited more than `--minimum-container-ttl-duration` after they
  were created count (default 0);
- pods that no source has are left to the housekeeping (housekeeping.py), which hands them to
  a worker that stops and removes everything of them (containers, sandbox, logs) within 2 s:
  the kubelet's HandlePodCleanups kill and its GC's removal of deleted pods, in one place, so
  that two removals of one pod never race.

Differences, deliberate: only exited containers are collected (never one being created or in
an unknown state); the newest instance of a container of a pod that a source still has is
never removed, whatever the limits, since the sync decides restarts (a `restartPolicy: Never`
pod that completed must not run again) from it, and the kubelet keeps it in its status cache.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod

log = logging.getLogger(__name__)

# The kubelet's ContainerGCPeriod.
CONTAINER_GC_PERIOD = 60.0


@dataclass(frozen=True)
class ContainerGCPolicy:
    """The kubelet's ContainerGCPolicy: MinAge, MaxPerPodContainer, MaxContainers (< 0: no
    limit)."""

    min_age: float = 0.0
    max_per_pod_container: int = 1
    max_containers: int = -1


class GCRuntime(Protocol):
    async def list_pods(self) -> list[RuntimePod]: ...

    async def remove_container(self, container: RuntimeContainer) -> None: ...


Unit = tuple[str, str]  # (pod uid, container name)


def _newest_first(containers: list[RuntimeContainer]) -> list[RuntimeContainer]:
    # The kubelet's byAttempt: the higher attempt first, then the later creation.
    return sorted(containers, key=lambda c: (c.attempt, c.created_at), reverse=True)


class ContainerGC:
    def __init__(
        self,
        runtime: GCRuntime,
        policy: ContainerGCPolicy,
        is_wanted: Callable[[str], bool],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`is_wanted(uid)`: a source has the pod or a worker still holds it."""
        self._runtime = runtime
        self._policy = policy
        self._is_wanted = is_wanted
        self._clock = clock

    async def run_once(self) -> int:
        """One collection; returns how many containers it removed. Raises what the runtime's
        listing raises; a failed removal is logged and retried at the next collection."""
        pods = await self._runtime.list_pods()
        newest_cutoff = self._clock() - timedelta(seconds=self._policy.min_age)
        units: dict[Unit, list[RuntimeContainer]] = {}
        protected: set[str] = set()  # container ids
        for pod in pods:
            if not self._is_wanted(pod.uid):
                continue  # the housekeeping's
            by_name: dict[str, list[RuntimeContainer]] = {}
            for c in pod.containers:
                by_name.setdefault(c.name, []).append(c)
            for name, history in by_name.items():
                protected.add(_newest_first(history)[0].id)
                dead = [
                    c
                    for c in history
                    if c.state is ContainerRunState.EXITED and c.created_at <= newest_cutoff
                ]
                if dead:
                    units[(pod.uid, name)] = _newest_first(dead)
        removed = 0
        # MaxPerPodContainer.
        if self._policy.max_per_pod_container >= 0:
            removed += await self._enforce_per_unit(
                units, self._policy.max_per_pod_container, protected
            )
        # MaxContainers: an equal share per unit (at least 1), then the oldest of all.
        limit = self._policy.max_containers
        if limit >= 0 and units and sum(map(len, units.values())) > limit:
            removed += await self._enforce_per_unit(units, max(limit // len(units), 1), protected)
            flattened = _newest_first([c for unit in units.values() for c in unit])
            if len(flattened) > limit:
                removed += await self._remove(flattened[limit:], protected)
        return removed

    async def _enforce_per_unit(
        self, units: dict[Unit, list[RuntimeContainer]], keep: int, protected: set[str]
    ) -> int:
        removed = 0
        for key, dead in units.items():
            if len(dead) > keep:
                removed += await self._remove(dead[keep:], protected)
                units[key] = dead[:keep]
        return removed

    async def _remove(self, containers: list[RuntimeContainer], protected: set[str]) -> int:
        removed = 0
        for c in containers:
            if c.id in protected:
                continue
            try:
                await self._runtime.remove_container(c)
                removed += 1
                log.info(
                    "removed dead container %s (%s of pod %s/%s, attempt %d)",
                    c.id,
                    c.name,
                    c.pod_namespace,
                    c.pod_name,
                    c.attempt,
                )
            except Exception as exc:
                log.warning("failed to remove container %s: %s", c.id, exc)
        return removed


async def run_periodically(
    gc: ContainerGC, period: float, ready: Callable[[], bool], stop: asyncio.Event
) -> None:
    """`gc` every `period` seconds while `ready()` (all sources ready), until `stop`."""
    while not stop.is_set():
        try:
            async with asyncio.timeout(period):
                await stop.wait()
            return
        except TimeoutError:
            pass
        if not ready():
            continue
        try:
            await gc.run_once()
        except Exception as exc:
            log.warning("container garbage collection failed: %s", exc)
