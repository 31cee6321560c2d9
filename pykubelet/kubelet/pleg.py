"""The pod lifecycle event generator: relist the runtime, tell the sync loop what changed.

A relist runs every second, and at once when the runtime says a container started or exited,
so a crash reaches its pod worker in milliseconds while the periodic relist stays the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from enum import Enum

from pykubelet.common import metrics
from pykubelet.runtime.base import ContainerRunState, Runtime

log = logging.getLogger(__name__)

RELIST_PERIOD = 1.0


class EventType(Enum):
    CONTAINER_STARTED = "ContainerStarted"
    CONTAINER_DIED = "ContainerDied"
    CONTAINER_REMOVED = "ContainerRemoved"


@dataclass(frozen=True)
class PodLifecycleEvent:
    pod_uid: str
    type: EventType
    container_id: str


class PLEG:
    def __init__(self, runtime: Runtime, period: float = RELIST_PERIOD) -> None:
        self.runtime = runtime
        self.period = period
        self.events: asyncio.Queue[PodLifecycleEvent] = asyncio.Queue()
        self._last: dict[str, tuple[str, ContainerRunState]] = {}  # container id -> (pod, state)
        self._sandboxes: dict[str, tuple[str, bool]] = {}  # sandbox id -> (pod, ready)
        self._poke = asyncio.Event()
        self.last_relist_seconds = 0.0
        self.last_relist_at = 0.0
        self._started_at = 0.0
        runtime.add_listener(self._on_runtime_change)

    def _on_runtime_change(self, pod_uid: str) -> None:
        self._poke.set()

    def healthy(self, now: float | None = None) -> bool:
        """Relisting keeps up: the last one finished within three periods (and ten seconds) -
        or, before any relist succeeded, the PLEG has not run that long yet (the kubelet's
        "pleg has yet to be successful")."""
        now = time.monotonic() if now is None else now
        since = self.last_relist_at or self._started_at
        return since == 0.0 or now - since < 3 * self.period + 10

    async def run(self) -> None:
        self._started_at = time.monotonic()
        while True:
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation that
            # arrives as the event is set, and the agent would never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period):
                    await self._poke.wait()
            self._poke.clear()
            try:
                await self.relist()
            except Exception:
                log.exception("relisting the runtime failed")

    async def relist(self) -> None:
        started = time.monotonic()
        current: dict[str, tuple[str, ContainerRunState]] = {}
        sandboxes: dict[str, tuple[str, bool]] = {}
        by_state = dict.fromkeys(ContainerRunState, 0)
        running_pods = 0
        for pod in await self.runtime.list_pods():
            # As the kubelet counts: a pod is running while any of its containers is.
            if any(c.state is ContainerRunState.RUNNING for c in pod.containers):
                running_pods += 1
            for c in pod.containers:
                current[c.id] = (pod.uid, c.state)
                by_state[c.state] += 1
            if pod.sandbox is not None:
                sandboxes[pod.sandbox.id] = (pod.uid, pod.sandbox.ready)
        metrics.running_pods.set(running_pods)
        for state, count in by_state.items():
            metrics.running_containers.labels(state.value).set(count)
        for cid, (uid, state) in current.items():
            before = self._last.get(cid)
            if before is not None and before[1] is state:
                continue
            if state is ContainerRunState.RUNNING:
                self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_STARTED, cid))
            elif state in (ContainerRunState.EXITED, ContainerRunState.UNKNOWN):
                self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_DIED, cid))
        for cid, (uid, _) in self._last.items():
            if cid not in current:
                self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_REMOVED, cid))
        for sid, (uid, ready) in sandboxes.items():
            # As the kubelet's PLEG: a sandbox that dies is an event of its pod, whose sync then
            # makes a new one (the docker runtime's infra container).
            if not ready and self._sandboxes.get(sid, (uid, True))[1]:
                self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_DIED, sid))
        self._last = current
        self._sandboxes = sandboxes
        self.last_relist_at = time.monotonic()
        self.last_relist_seconds = self.last_relist_at - started
        metrics.pleg_relist_duration.observe(self.last_relist_seconds)
