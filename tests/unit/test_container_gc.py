"""The container GC's policy (the kubelet's containerGC) over a runtime that is only a list of
pods: which dead instances go, which stay."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from pykubelet.kubelet.container_gc import ContainerGC, ContainerGCPolicy
from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def instance(
    uid: str, name: str, attempt: int, state: ContainerRunState = ContainerRunState.EXITED
) -> RuntimeContainer:
    return RuntimeContainer(
        id=f"{uid}-{name}-{attempt}",
        runtime="fake",
        pod_uid=uid,
        pod_name=uid,
        pod_namespace="default",
        name=name,
        attempt=attempt,
        spec_hash="h",
        image="busybox",
        state=state,
        created_at=NOW - timedelta(minutes=10 - attempt),
    )


class ListedPods:
    """What a runtime lists, and what was removed from it."""

    def __init__(self, *containers: RuntimeContainer) -> None:
        self.containers = list(containers)
        self.removed: list[str] = []

    async def list_pods(self) -> list[RuntimePod]:
        uids = sorted({c.pod_uid for c in self.containers})
        return [
            RuntimePod(uid, uid, "default", None, [c for c in self.containers if c.pod_uid == uid])
            for uid in uids
        ]

    async def remove_container(self, container: RuntimeContainer) -> None:
        self.removed.append(container.id)
        self.containers.remove(container)

    def left(self) -> list[str]:
        return sorted(c.id for c in self.containers)


def collect(runtime: ListedPods, policy: ContainerGCPolicy, wanted: set[str]) -> ContainerGC:
    return ContainerGC(runtime, policy, wanted.__contains__, clock=lambda: NOW)


async def test_the_newest_dead_instance_of_each_container_stays() -> None:
    running = instance("a", "c", 3, ContainerRunState.RUNNING)
    runtime = ListedPods(*(instance("a", "c", n) for n in range(3)), running, instance("a", "d", 0))
    assert await collect(runtime, ContainerGCPolicy(), {"a"}).run_once() == 2
    # Oldest first; the previous instance (kubectl logs --previous) and the other one stay.
    assert runtime.removed == ["a-c-1", "a-c-0"]
    assert runtime.left() == ["a-c-2", "a-c-3", "a-d-0"]


async def test_more_instances_kept_when_asked_and_young_ones_always() -> None:
    runtime = ListedPods(*(instance("a", "c", n) for n in range(5)))
    await collect(runtime, ContainerGCPolicy(max_per_pod_container=3), {"a"}).run_once()
    assert runtime.left() == ["a-c-2", "a-c-3", "a-c-4"]

    young = ListedPods(*(instance("a", "c", n) for n in range(5)))
    # Created 6..10 minutes ago: with a 7.5-minute minimum age only the three oldest count.
    await collect(young, ContainerGCPolicy(min_age=7.5 * 60), {"a"}).run_once()
    assert young.left() == ["a-c-2", "a-c-3", "a-c-4"]


async def test_maximum_dead_containers_share_then_oldest_first() -> None:
    runtime = ListedPods(
        *(instance("a", "c", n) for n in range(3)),
        *(instance("b", "c", n) for n in range(3)),
        *(instance("b", "d", n) for n in range(3)),
    )
    policy = ContainerGCPolicy(max_per_pod_container=-1, max_containers=4)
    await collect(runtime, policy, {"a", "b"}).run_once()
    # 4 // 3 units = 1 each, then none more to remove: one per container.
    assert runtime.left() == ["a-c-2", "b-c-2", "b-d-2"]

    runtime = ListedPods(*(instance("a", "c", n) for n in range(3)), instance("b", "c", 0))
    policy = ContainerGCPolicy(max_per_pod_container=-1, max_containers=0)
    await collect(runtime, policy, {"a", "b"}).run_once()
    # Down to zero, except the newest instance of a wanted pod (what its sync decides from).
    assert runtime.left() == ["a-c-2", "b-c-0"]


async def test_only_exited_containers_of_wanted_pods_are_touched() -> None:
    created = replace(instance("a", "c", 0), state=ContainerRunState.CREATED)
    unknown = replace(instance("a", "c", 1), state=ContainerRunState.UNKNOWN)
    runtime = ListedPods(
        created,
        unknown,
        instance("a", "c", 2),
        *(instance("gone", "c", n) for n in range(3)),
    )
    await collect(runtime, ContainerGCPolicy(max_per_pod_container=0), {"a"}).run_once()
    # A pod no source has is the housekeeping's, which removes all of it through its worker.
    assert runtime.left() == ["a-c-0", "a-c-1", "a-c-2", "gone-c-0", "gone-c-1", "gone-c-2"]
