"""The pod lifecycle event generator: relist the runtime, tell the sync loop what changed.

A relist of every pod runs every second; when the runtime says a container of a pod started
or exited, that pod alone is looked at again at once, so a crash reaches its pod worker in
milliseconds while the periodic relist stays the safety net. (A whole relist per change made a
burst of 1,000 starts cost a million container views.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from enum import Enum

from pykubelet.common import metrics
from pykubelet.runtime.base import ContainerRunState, Runtime, RuntimePod

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
        self._changed: set[str] = set()  # pods the runtime announced since the last look
        # What the partial relists need to diff one pod and keep the gauges: per pod, its
        # containers' and sandboxes' ids (tuples: a set of one id is four times the size, and
        # each pod keeps them), and what it adds to the gauges.
        self._pod_ids: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._pod_counts: dict[str, tuple[bool, list[ContainerRunState]]] = {}
        # The view each pod was last diffed from. A runtime that keeps a pod's view until a part
        # of it changes (the process runtime) hands the same object back: nothing to diff.
        self._seen: dict[str, RuntimePod] = {}
        self._running_pods = 0
        self._by_state = dict.fromkeys(ContainerRunState, 0)
        self.last_relist_seconds = 0.0
        self.last_relist_at = 0.0
        self._started_at = 0.0
        runtime.add_listener(self._on_runtime_change)

    def _on_runtime_change(self, pod_uid: str) -> None:
        self._changed.add(pod_uid)
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
        next_full = self._started_at  # the first relist at once, as the kubelet's wait.Until
        while True:
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancellation that
            # arrives as the event is set, and the agent would never stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_full - time.monotonic())):
                    await self._poke.wait()
            self._poke.clear()
            try:
                if time.monotonic() >= next_full:
                    next_full = time.monotonic() + self.period
                    await self.relist()
                elif self._changed:
                    await self.relist_pods()
            except Exception:
                log.exception("relisting the runtime failed")

    async def relist_pods(self) -> None:
        """Look again at the pods the runtime announced, only them."""
        changed, self._changed = self._changed, set()
        for uid in sorted(changed):
            self._diff_pod(uid, await self.runtime.get_pod(uid))
        self._set_gauges()

    async def relist(self) -> None:
        """Look at every pod."""
        started = time.monotonic()
        self._changed.clear()  # looked at below
        listed: set[str] = set()
        for pod in await self.runtime.list_pods():
            listed.add(pod.uid)
            self._diff_pod(pod.uid, pod)
        for uid in [uid for uid in self._pod_ids if uid not in listed]:
            self._diff_pod(uid, None)
        self._set_gauges()
        self.last_relist_at = time.monotonic()
        self.last_relist_seconds = self.last_relist_at - started
        metrics.pleg_relist_duration.observe(self.last_relist_seconds)

    def _diff_pod(self, uid: str, pod: RuntimePod | None) -> None:
        """Events for what changed in one pod since it was last looked at (None: it is gone)."""
        if pod is not None and self._seen.get(uid) is pod:
            # Views are frozen: the very one diffed last time has nothing new. A relist of
            # 1,000 idle pods was 20-50 ms of the loop each second, which an edit waited behind.
            return
        old_containers, old_sandboxes = self._pod_ids.pop(uid, ((), ()))
        self._count(self._pod_counts.pop(uid, None), -1)
        containers: set[str] = set()
        sandboxes: dict[str, bool] = {}
        if pod is not None:
            for c in pod.containers:
                containers.add(c.id)
                before = self._last.get(c.id)
                self._last[c.id] = (uid, c.state)
                if before is not None and before[1] is c.state:
                    continue
                if c.state is ContainerRunState.RUNNING:
                    self.events.put_nowait(
                        PodLifecycleEvent(uid, EventType.CONTAINER_STARTED, c.id)
                    )
                elif c.state in (ContainerRunState.EXITED, ContainerRunState.UNKNOWN):
                    self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_DIED, c.id))
            if pod.sandbox is not None:
                sandboxes[pod.sandbox.id] = pod.sandbox.ready
            self._pod_ids[uid] = (tuple(containers), tuple(sandboxes))
            counts = (
                any(c.state is ContainerRunState.RUNNING for c in pod.containers),
                [c.state for c in pod.containers],
            )
            self._pod_counts[uid] = counts
            self._count(counts, 1)
            self._seen[uid] = pod
        else:
            self._seen.pop(uid, None)
        for cid in set(old_containers) - containers:
            if self._last.pop(cid, None) is not None:
                self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_REMOVED, cid))
        for sid in set(old_sandboxes) - set(sandboxes):
            self._sandboxes.pop(sid, None)
        for sid, ready in sandboxes.items():
            # As the kubelet's PLEG: a sandbox that dies is an event of its pod, whose sync then
            # makes a new one (the docker runtime's infra container).
            if not ready and self._sandboxes.get(sid, (uid, True))[1]:
                self.events.put_nowait(PodLifecycleEvent(uid, EventType.CONTAINER_DIED, sid))
            self._sandboxes[sid] = (uid, ready)

    def _count(self, counts: tuple[bool, list[ContainerRunState]] | None, sign: int) -> None:
        if counts is None:
            return
        running, states = counts
        # As the kubelet counts: a pod is running while any of its containers is.
        self._running_pods += sign * running
        for state in states:
            self._by_state[state] += sign

    def _set_gauges(self) -> None:
        metrics.running_pods.set(self._running_pods)
        for state, count in self._by_state.items():
            metrics.running_containers.labels(state.value).set(count)
