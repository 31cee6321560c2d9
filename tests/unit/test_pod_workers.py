"""Pod workers: serialized per pod, latest update wins, kills never lost, one pod per name."""

from __future__ import annotations

import asyncio

from pykubelet.api.model import Pod
from pykubelet.pod.workers import PodWorkers, SyncResult, UpdateType, WorkerState


def make_pod(name: str, uid: str, image: str = "i") -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": image}]},
        }
    )


class RecordingSyncer:
    """Records what the workers asked for; each sync takes `delay` seconds."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.calls: list[tuple[str, str, str]] = []
        self.active: set[str] = set()
        self.overlap = False
        self.fail_next = False
        self.terminal: set[str] = set()
        self.cancelled: list[tuple[str, str]] = []

    async def _work(self, kind: str, uid: str, detail: str) -> None:
        if uid in self.active:
            self.overlap = True
        self.active.add(uid)
        self.calls.append((kind, uid, detail))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled.append((kind, uid))
            raise
        finally:
            self.active.discard(uid)

    async def sync_pod(self, update: UpdateType, pod: Pod) -> SyncResult:
        await self._work("sync", pod.uid, f"{update.value}:{pod.spec.containers[0].image}")
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return SyncResult(terminal=pod.uid in self.terminal)

    async def sync_terminating_pod(self, uid: str, pod: Pod | None, grace: float | None) -> None:
        await self._work("terminating", uid, f"grace={grace}")

    async def sync_terminated_pod(self, uid: str, pod: Pod | None, removed: bool) -> None:
        await self._work("terminated", uid, f"removed={removed}")

    def on_waiting_for_name(self, pod: Pod, holder_uid: str) -> None:
        self.calls.append(("waiting", pod.uid, holder_uid))


async def settle(workers: PodWorkers, seconds: float = 0.5) -> None:
    await asyncio.sleep(seconds)


async def test_updates_are_serialized_and_latest_wins() -> None:
    syncer = RecordingSyncer(delay=0.1)
    workers = PodWorkers(syncer, resync_seconds=60)
    workers.update_pod(UpdateType.CREATE, make_pod("a", "u1", "v1"))
    await asyncio.sleep(0.02)  # the create is running
    for image in ("v2", "v3", "v4"):
        workers.update_pod(UpdateType.UPDATE, make_pod("a", "u1", image))
    await settle(workers)
    assert [c[2] for c in syncer.calls] == ["create:v1", "update:v4"]
    assert not syncer.overlap


async def test_kill_is_never_lost_and_grace_only_shrinks() -> None:
    syncer = RecordingSyncer(delay=0.1)
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    workers.update_pod(UpdateType.CREATE, pod)
    await asyncio.sleep(0.02)
    workers.update_pod(UpdateType.KILL, pod, grace=20)
    workers.update_pod(UpdateType.UPDATE, make_pod("a", "u1", "v9"))  # ignored: being killed
    workers.update_pod(UpdateType.KILL, pod, grace=30)  # longer: ignored
    workers.update_pod(UpdateType.KILL, pod, grace=5, removed=True)
    await settle(workers)
    kinds = [(c[0], c[2]) for c in syncer.calls]
    assert kinds == [
        ("sync", "create:i"),
        ("terminating", "grace=5"),
        ("terminated", "removed=True"),
    ]
    assert workers.state_of("u1") is WorkerState.TERMINATED


async def test_new_pod_with_same_name_waits_for_old_to_terminate() -> None:
    syncer = RecordingSyncer(delay=0.1)
    workers = PodWorkers(syncer, resync_seconds=60)
    old, new = make_pod("a", "old"), make_pod("a", "new")
    workers.update_pod(UpdateType.CREATE, old)
    await asyncio.sleep(0.15)
    workers.update_pod(UpdateType.KILL, old, removed=True)
    workers.update_pod(UpdateType.CREATE, new)
    await settle(workers, 0.8)
    order = [(c[0], c[1]) for c in syncer.calls if c[0] != "waiting"]
    assert order.index(("terminating", "old")) < order.index(("sync", "new"))
    assert ("waiting", "new", "old") in syncer.calls


async def test_failed_sync_is_requeued_and_resync_is_due() -> None:
    now = [0.0]
    syncer = RecordingSyncer(delay=0)
    workers = PodWorkers(syncer, resync_seconds=60, clock=lambda: now[0])
    syncer.fail_next = True
    workers.update_pod(UpdateType.CREATE, make_pod("a", "u1"))
    workers.update_pod(UpdateType.CREATE, make_pod("b", "u2"))
    await settle(workers, 0.1)
    now[0] = 10.5  # the failed one is due after 10 s, the good one after the resync
    assert workers.due_pods() == ["u1"]
    now[0] = 100
    assert workers.due_pods() == ["u2"]


async def test_terminal_pod_terminates_but_stays_until_removed() -> None:
    syncer = RecordingSyncer(delay=0)
    syncer.terminal.add("u1")
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    workers.update_pod(UpdateType.CREATE, pod)
    await settle(workers, 0.1)
    assert [c[0] for c in syncer.calls] == ["sync", "terminating", "terminated"]
    assert syncer.calls[-1][2] == "removed=False"
    workers.update_pod(UpdateType.SYNC, pod)  # a terminal pod is not synced again
    await settle(workers, 0.1)
    assert len(syncer.calls) == 3
    workers.update_pod(UpdateType.KILL, pod, removed=True)
    await settle(workers, 0.1)
    assert syncer.calls[-1] == ("terminated", "u1", "removed=True")
    workers.forget_finished(desired=set())
    assert not workers.is_known("u1")


async def test_readded_while_being_removed_starts_again() -> None:
    syncer = RecordingSyncer(delay=0.05)
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    workers.update_pod(UpdateType.CREATE, pod)
    await settle(workers, 0.1)
    workers.update_pod(UpdateType.KILL, pod, removed=True)
    workers.update_pod(UpdateType.CREATE, pod)
    await settle(workers, 0.5)
    assert [c[0] for c in syncer.calls] == ["sync", "terminating", "terminated", "sync"]
    assert workers.state_of("u1") is WorkerState.SYNCING


async def test_shutdown_kills_everything() -> None:
    syncer = RecordingSyncer(delay=0.01)
    workers = PodWorkers(syncer, resync_seconds=60)
    for i in range(5):
        workers.update_pod(UpdateType.CREATE, make_pod(f"p{i}", f"u{i}"))
    await settle(workers, 0.1)
    await asyncio.wait_for(workers.shutdown(kill=True), 5)
    removed = {c[1] for c in syncer.calls if c == ("terminated", c[1], "removed=True")}
    assert removed == {f"u{i}" for i in range(5)}


async def test_readded_after_removal_finished_starts_again() -> None:
    syncer = RecordingSyncer(delay=0.01)
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    workers.update_pod(UpdateType.CREATE, pod)
    await settle(workers, 0.1)
    workers.update_pod(UpdateType.KILL, pod, removed=True)
    await settle(workers, 0.2)  # terminated and cleaned up, not yet forgotten
    workers.update_pod(UpdateType.CREATE, pod)
    await settle(workers, 0.2)
    assert [c[0] for c in syncer.calls] == ["sync", "terminating", "terminated", "sync"]
    assert workers.state_of("u1") is WorkerState.SYNCING


async def test_removed_readded_removed_stays_removed() -> None:
    syncer = RecordingSyncer(delay=0.05)
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    workers.update_pod(UpdateType.CREATE, pod)
    await settle(workers, 0.1)
    workers.update_pod(UpdateType.KILL, pod, removed=True)
    workers.update_pod(UpdateType.CREATE, pod)
    workers.update_pod(UpdateType.KILL, pod, removed=True)
    await settle(workers, 0.5)
    assert [c[0] for c in syncer.calls] == ["sync", "terminating", "terminated"]


async def test_a_kill_cancels_the_sync_in_progress() -> None:
    syncer = RecordingSyncer(delay=30)  # a sync that would hang (an image pull, a hook)
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    workers.update_pod(UpdateType.CREATE, pod)
    await asyncio.sleep(0.05)
    syncer.delay = 0.01
    workers.update_pod(UpdateType.KILL, pod, grace=5, removed=True)
    await settle(workers, 0.3)
    assert syncer.cancelled == [("sync", "u1")]
    assert [c[0] for c in syncer.calls] == ["sync", "terminating", "terminated"]
    assert syncer.calls[1][2] == "grace=5"
    assert not syncer.overlap
    await workers.shutdown(kill=False)


def worker_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("pod-worker-")]


async def test_an_idle_pod_keeps_no_task_and_nothing_runs_after_shutdown() -> None:
    syncer = RecordingSyncer(delay=0.01)
    workers = PodWorkers(syncer, resync_seconds=60)
    pod = make_pod("a", "u1")
    for update in (UpdateType.CREATE, UpdateType.SYNC):  # each: a task for it, then none
        workers.update_pod(update, pod)
        assert len(worker_tasks()) == 1
        await settle(workers, 0.2)
        assert not worker_tasks()
    assert [c[2] for c in syncer.calls] == ["create:i", "sync:i"]
    await workers.shutdown(kill=False)
    workers.update_pod(UpdateType.SYNC, pod)  # too late: the agent is stopping
    await asyncio.sleep(0.1)
    assert len(syncer.calls) == 2 and not worker_tasks()
