"""Pod workers: one task per pod UID that drives it through SyncPod → Terminating → Terminated.
The task runs while the pod has work (an update, a periodic sync, its termination) and ends when
it has none: an idle pod keeps only its state, not a task waiting (0.8 KB a pod with its frames).

Updates for one pod are serialized. While a sync runs, a newer update replaces the pending one
(only the latest matters), but a kill is never dropped and its grace period can only get
shorter. Only one pod per full name (`name_namespace`) runs at a time: an edited static pod gets
a new UID, and the new one waits until the old one has finished terminating.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from pykubelet.api.model import Pod
from pykubelet.common import metrics
from pykubelet.common.lightevent import LightEvent

log = logging.getLogger(__name__)

ERROR_REQUEUE_SECONDS = 10.0
RESYNC_JITTER = 0.5


class UpdateType(Enum):
    CREATE = "create"
    UPDATE = "update"
    SYNC = "sync"
    KILL = "kill"


class WorkerState(Enum):
    SYNCING = "syncing"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


@dataclass(frozen=True)
class SyncResult:
    terminal: bool = False  # the pod reached Succeeded or Failed: stop syncing it
    requeue_after: float | None = None  # sooner than the resync interval (a back-off ends)


class PodSyncer(Protocol):
    """What a worker calls; the Kubelet's pod sync implements it."""

    async def sync_pod(self, update: UpdateType, pod: Pod) -> SyncResult: ...

    async def sync_terminating_pod(
        self, uid: str, pod: Pod | None, grace: float | None
    ) -> None: ...

    async def sync_terminated_pod(self, uid: str, pod: Pod | None, removed: bool) -> None: ...

    def on_waiting_for_name(self, pod: Pod, holder_uid: str) -> None: ...


@dataclass
class _Worker:
    uid: str
    full_name: str
    pod: Pod | None  # None for a pod only the runtime knows (an orphan)
    state: WorkerState = WorkerState.SYNCING
    pending: UpdateType | None = None
    kill_requested: bool = False
    kill_grace: float | None = None
    removed: bool = False  # no source has it any more: clean up everything when terminated
    finished: bool = False  # terminated and cleaned up
    restart_requested: bool = False  # re-added (same UID) while it was being removed
    woken: bool = False  # work arrived since the task last looked
    terminated: LightEvent = field(default_factory=LightEvent)
    task: asyncio.Task[None] | None = None
    syncing: asyncio.Task[SyncResult] | None = None  # the sync in progress, if any


class PodWorkers:
    def __init__(
        self,
        syncer: PodSyncer,
        resync_seconds: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._syncer = syncer
        self._resync = resync_seconds
        self._clock = clock or asyncio.get_running_loop().time
        self._workers: dict[str, _Worker] = {}
        self._name_holder: dict[str, str] = {}  # full name -> uid of the pod allowed to run
        self._name_waiters: dict[str, set[str]] = {}  # full name -> uids waiting for it
        self._due: dict[str, float] = {}  # uid -> loop time of the next periodic sync
        # Hear of each pod whose worker became TERMINATED or was replaced (`state_of` changed
        # to or from TERMINATED): admission's count of the pods using capacity.
        self._terminated_listeners: list[Callable[[str], None]] = []
        self._closing = False
        self._stopped = False  # shutdown cancelled the tasks: no worker starts one again

    # --- dispatch ---------------------------------------------------------------------------

    def update_pod(
        self,
        update: UpdateType,
        pod: Pod | None,
        uid: str | None = None,
        *,
        grace: float | None = None,
        removed: bool = False,
    ) -> None:
        """Hand an update to the pod's worker; never blocks."""
        key = uid or (pod.uid if pod is not None else "")
        worker = self._workers.get(key)
        if worker is not None and worker.finished and update is UpdateType.CREATE:
            # Removed and cleaned up, now wanted again (a manifest restored): start afresh.
            del self._workers[key]
            self._due.pop(key, None)
            self._terminated(key)
            worker = None
        if worker is None:
            if update is UpdateType.KILL and pod is None and uid is None:
                return
            full_name = pod.full_name if pod is not None else key
            worker = _Worker(uid=key, full_name=full_name, pod=pod)
            self._workers[key] = worker
        if pod is not None:
            worker.pod = pod
        if update is UpdateType.KILL:
            if worker.syncing is not None and not worker.syncing.done():
                # As the kubelet cancels a sync's context: a kill does not wait for an image
                # pull, a hook or a liveness restart in progress to end.
                worker.syncing.cancel()
            worker.kill_requested = True
            worker.removed = worker.removed or removed
            if removed:
                worker.restart_requested = False  # removed again: the re-add is void
            if grace is not None:
                worker.kill_grace = (
                    grace if worker.kill_grace is None else min(worker.kill_grace, grace)
                )
        elif worker.state is WorkerState.SYNCING and not worker.kill_requested:
            # Latest wins; a CREATE that has not run yet stays a CREATE.
            if worker.pending is not UpdateType.CREATE:
                worker.pending = update
        elif worker.removed and update is UpdateType.CREATE:
            # The kill still runs to its end; then the pod starts again from scratch.
            worker.restart_requested = True
        self._wake(worker)

    def _wake(self, worker: _Worker) -> None:
        """Work for the worker: its task looks again, or one starts if it had ended. A finished
        worker's task has ended for good (a re-add makes a new worker)."""
        worker.woken = True
        if self._stopped or worker.finished or (worker.task is not None and not worker.task.done()):
            return
        worker.task = asyncio.create_task(self._run(worker), name=f"pod-worker-{worker.uid[:12]}")

    def due_pods(self) -> list[str]:
        now = self._clock()
        due = [uid for uid, at in self._due.items() if at <= now]
        for uid in due:
            del self._due[uid]
        return due

    def is_known(self, uid: str) -> bool:
        return uid in self._workers

    def add_terminated_listener(self, listener: Callable[[str], None]) -> None:
        """`listener(uid)` hears of each worker that became TERMINATED, or that was
        terminated and is replaced by a new one (`state_of` changed to or from TERMINATED)."""
        self._terminated_listeners.append(listener)

    def _terminated(self, uid: str) -> None:
        for listener in self._terminated_listeners:
            listener(uid)

    def state_of(self, uid: str) -> WorkerState | None:
        worker = self._workers.get(uid)
        return worker.state if worker is not None else None

    def known_uids(self) -> list[str]:
        return list(self._workers)

    def forget_finished(self, desired: set[str]) -> None:
        """Drop finished workers of pods no source wants (the kubelet's SyncKnownPods)."""
        for uid, worker in list(self._workers.items()):
            if worker.finished and uid not in desired:
                del self._workers[uid]
                self._due.pop(uid, None)

    async def shutdown(self, kill: bool) -> None:
        """Stop all workers; with `kill`, terminate and remove every pod first.

        Removing (not only stopping) them means the next start begins afresh: a stopped
        `restartPolicy: Never` pod would otherwise count as failed.
        """
        self._closing = True
        workers = list(self._workers.values())
        if kill:
            for worker in workers:
                self.update_pod(UpdateType.KILL, worker.pod, worker.uid, removed=True)
            await asyncio.gather(*(w.terminated.wait() for w in workers))
            await asyncio.gather(*(w.task for w in workers if w.task is not None))
        self._stopped = True
        for worker in workers:
            if worker.task is not None:
                worker.task.cancel()
        await asyncio.gather(*(w.task for w in workers if w.task), return_exceptions=True)

    # --- the worker ---------------------------------------------------------------------------

    async def _run(self, worker: _Worker) -> None:
        while worker.woken:
            worker.woken = False
            if worker.kill_requested and worker.state is WorkerState.SYNCING:
                worker.state = WorkerState.TERMINATING
            if worker.state is WorkerState.SYNCING:
                await self._sync(worker)
            if worker.state is WorkerState.TERMINATING:
                await self._terminate(worker)
            if worker.state is WorkerState.TERMINATED and worker.removed and not worker.finished:
                await self._cleanup(worker)
            if worker.finished:
                if worker.restart_requested and worker.pod is not None and not self._closing:
                    del self._workers[worker.uid]
                    self._terminated(worker.uid)
                    self.update_pod(UpdateType.CREATE, worker.pod)
                return
        # Nothing more to do: the task ends (and is let go: a done task keeps its coroutine),
        # and the next update (or periodic sync) starts one.
        worker.task = None

    async def _sync(self, worker: _Worker) -> None:
        update, worker.pending = worker.pending, None
        pod = worker.pod
        if update is None or pod is None:
            return
        holder = self._name_holder.setdefault(worker.full_name, worker.uid)
        if holder != worker.uid:
            # Woken again by _release when the holder has terminated.
            worker.pending = update
            self._name_waiters.setdefault(worker.full_name, set()).add(worker.uid)
            self._syncer.on_waiting_for_name(pod, holder)
            return
        started = self._clock()
        worker.syncing = asyncio.create_task(self._syncer.sync_pod(update, pod))
        try:
            result = await worker.syncing
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if worker.syncing.cancelled() and not (current and current.cancelling()):
                log.info("sync of pod %s cancelled: the pod is being killed", pod.key)
                return  # kill_requested is set: the worker terminates the pod next
            raise
        except Exception:
            log.exception(
                "sync of pod %s failed; retrying in %.0fs", pod.key, ERROR_REQUEUE_SECONDS
            )
            self._requeue(worker.uid, ERROR_REQUEUE_SECONDS, jitter=False)
            return
        finally:
            worker.syncing = None
            metrics.pod_worker_duration.labels(update.value).observe(self._clock() - started)
        if result.terminal:
            worker.state = WorkerState.TERMINATING
            return
        delay = self._resync
        if result.requeue_after is not None and result.requeue_after < delay:
            self._requeue(worker.uid, max(result.requeue_after, 0.0), jitter=False)
        else:
            self._requeue(worker.uid, delay, jitter=True)

    async def _terminate(self, worker: _Worker) -> None:
        started = self._clock()
        while True:
            try:
                await self._syncer.sync_terminating_pod(worker.uid, worker.pod, worker.kill_grace)
                break
            except Exception:
                log.exception("terminating pod %s failed; retrying in 1s", worker.full_name)
                await asyncio.sleep(1.0)
        metrics.pod_worker_duration.labels(UpdateType.KILL.value).observe(self._clock() - started)
        worker.state = WorkerState.TERMINATED
        self._terminated(worker.uid)
        worker.terminated.set()
        self._due.pop(worker.uid, None)
        self._release(worker)
        if not worker.removed:
            # A pod that completed (or was stopped at shutdown) keeps its containers and logs.
            try:
                await self._syncer.sync_terminated_pod(worker.uid, worker.pod, removed=False)
            except Exception:
                log.exception("post-termination of pod %s failed", worker.full_name)

    async def _cleanup(self, worker: _Worker) -> None:
        while True:
            try:
                await self._syncer.sync_terminated_pod(worker.uid, worker.pod, removed=True)
                break
            except Exception:
                log.exception("cleaning up pod %s failed; retrying in 1s", worker.full_name)
                await asyncio.sleep(1.0)
        worker.finished = True

    def _release(self, worker: _Worker) -> None:
        if self._name_holder.get(worker.full_name) != worker.uid:
            return
        del self._name_holder[worker.full_name]
        for uid in self._name_waiters.pop(worker.full_name, set()):
            if (other := self._workers.get(uid)) is not None:
                self._wake(other)

    def _requeue(self, uid: str, delay: float, *, jitter: bool) -> None:
        if jitter:
            delay += random.random() * RESYNC_JITTER * delay
        self._due[uid] = self._clock() + delay
