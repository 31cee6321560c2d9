"""The kubelet's sync loop over the in-memory runtime: pods added, updated and removed through
the merger, admission, housekeeping, health and shutdown, in milliseconds.

The Kubelet is built as `pykubelet/app.py` builds it; only the runtime is a fake
(`tests/fakes/runtime.py`), and, where a test needs it, the housekeeping period is shortened and
the clock the health checks read is moved on.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pykubelet.api.model import Pod, PodStatus
from pykubelet.cmd.node_resources import parse_reserved, parse_thresholds
from pykubelet.common.allocatable import float32
from pykubelet.common.events import Event, EventRecorder, ObjectRef
from pykubelet.common.machine import MachineFacts
from pykubelet.common.metrics import REGISTRY
from pykubelet.common.options import Options
from pykubelet.common.sdnotify import Notifier
from pykubelet.config.pod_config import PodConfig
from pykubelet.config.types import FILE_SOURCE, HTTP_SOURCE, NotificationMode, Op, PodUpdate
from pykubelet.kubelet import kubelet as kubelet_module
from pykubelet.kubelet import pleg as pleg_module
from pykubelet.kubelet.kubelet import Kubelet
from pykubelet.pod.volumes import NoApiServer
from pykubelet.pod.workers import WorkerState
from pykubelet.runtime.base import ContainerConfig, ContainerRunState
from pykubelet.status.manager import StatusManager
from tests.fakes import FakeRuntime

T = TypeVar("T")
GIB = 1 << 30
MIB = 1 << 20
T0 = datetime(2026, 1, 1, tzinfo=UTC)
FACTS = MachineFacts(
    cpus=2,
    memory_kib=4 * GIB // 1024,
    storage_bytes=100 * GIB,
    hostname="node-1",
    machine_id="m",
    boot_id="b",
    system_uuid="s",
    kernel="6.1",
    os_image="Test",
    arch="amd64",
)


def make_pod(
    name: str,
    *,
    uid: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    created: int = 0,
    **spec: Any,
) -> Pod:
    """A pod of the file source; `created` seconds after T0 orders a batch of additions."""
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": uid or f"uid-{name}",
                "creationTimestamp": (T0 + timedelta(seconds=created)).isoformat(),
            },
            "spec": {
                "containers": containers or [{"name": "c", "image": "busybox:1.36"}],
                "initContainers": init or [],
                **spec,
            },
        }
    )


def container(name: str = "c", image: str = "busybox:1.36", **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **fields}


def requests(**values: str) -> dict[str, Any]:
    return {"resources": {"requests": values}}


async def eventually(what: str, check: Callable[[], T | None], within: float = 2.0) -> T:
    """Poll `check` every few milliseconds until it returns something true."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.002)


@dataclass
class Node:
    kubelet: Kubelet
    runtime: FakeRuntime
    statuses: StatusManager
    recorder: EventRecorder
    files: Callable[[PodUpdate], None]
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    shut_down: bool = False
    other_sources: dict[str, Callable[[PodUpdate], None]] = field(default_factory=dict)

    def set_pods(self, *pods: Pod) -> None:
        """The file source's whole state, as it sends it after each listing."""
        self.files(PodUpdate(list(pods), Op.SET, FILE_SOURCE))

    def status(self, pod: Pod) -> PodStatus | None:
        return self.statuses.get(pod.uid)

    def phase(self, pod: Pod) -> str | None:
        status = self.statuses.get(pod.uid)
        return status.phase if status is not None else None

    def events(self, pod: Pod, reason: str | None = None) -> list[Event]:
        found = self.recorder.for_object("Pod", pod.metadata.name, pod.metadata.namespace)
        return [e for e in found if reason is None or e.reason == reason]

    def running(self, pod: Pod, name: str = "c") -> bool:
        latest = self.runtime.latest(pod.uid, name)
        return latest is not None and latest.state is ContainerRunState.RUNNING

    async def started(self, *pods: Pod) -> None:
        """Until each pod's containers run and its status says so (its sync has ended)."""
        for pod in pods:

            def shown(pod: Pod = pod) -> bool:
                status = self.status(pod)
                return (
                    status is not None
                    and bool(status.container_statuses)
                    and all(c.state.running is not None for c in status.container_statuses or [])
                    and all(self.running(pod, c.name) for c in pod.spec.containers)
                )

            await eventually(f"{pod.metadata.name} running", shown)

    async def wait_phase(self, pod: Pod, phase: str) -> PodStatus:
        await eventually(f"{pod.metadata.name} {phase}", lambda: self.phase(pod) == phase)
        status = self.status(pod)
        assert status is not None
        return status

    async def settle(self, quiet: float = 0.01) -> None:
        """Until the runtime has had no call for `quiet` seconds: the syncs in flight have
        ended. (A kill that interrupts a sync waits 3 s for a container it may have started.)"""
        deadline = time.monotonic() + 1.0
        count = -1
        while len(self.runtime.calls) != count and time.monotonic() < deadline:
            count = len(self.runtime.calls)
            await asyncio.sleep(quiet)

    async def run(self) -> None:
        self.task = asyncio.create_task(self.kubelet.run(self.stop))

    async def shutdown(self) -> None:
        """What app.py does at a signal: end the loop, then stop the pods."""
        if self.shut_down:
            return
        self.shut_down = True
        await self.settle()
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 2)
        await asyncio.wait_for(self.kubelet.shutdown(), 5)


NodeFactory = Callable[..., Awaitable[Node]]


@pytest.fixture
async def make_node(tmp_path: Path) -> AsyncIterator[NodeFactory]:
    """Builds a running kubelet over a started fake runtime; options as keyword arguments,
    `sources` the names of further sources to register (they start not ready)."""
    nodes: list[Node] = []

    async def build(
        *,
        runtime: FakeRuntime | None = None,
        facts: MachineFacts = FACTS,
        sources: tuple[str, ...] = (),
        on_sync_loop: Callable[[], None] | None = None,
        **options: Any,
    ) -> Node:
        options.setdefault("node_name", "node-1")
        opts = Options(root_dir=tmp_path / f"root{len(nodes)}", **options)
        opts.root_dir.mkdir(mode=0o700)
        runtime = runtime or FakeRuntime()
        recorder = EventRecorder()

        def merger_event(reason: str, subject: str, message: str) -> None:
            recorder.record("Warning", reason, message, ObjectRef.node(opts.node_name))

        pod_config = PodConfig(NotificationMode.INCREMENTAL, recorder=merger_event)
        statuses = StatusManager()
        kubelet = Kubelet(
            opts,
            runtime,
            "192.0.2.10",
            pod_config=pod_config,
            recorder=recorder,
            statuses=statuses,
            objects=NoApiServer(),
            facts=facts,
            on_sync_loop=on_sync_loop,
        )
        files = pod_config.channel(FILE_SOURCE)
        others = {name: pod_config.channel(name) for name in sources}
        if not runtime.started:
            await runtime.start()
        node = Node(kubelet, runtime, statuses, recorder, files, asyncio.Event(), None)
        node.other_sources = others
        nodes.append(node)
        await node.run()
        return node

    yield build
    for node in nodes:
        await node.shutdown()


# --- pods added, updated, removed ---------------------------------------------------------------


async def test_an_added_pod_runs_its_init_containers_then_its_containers(
    make_node: NodeFactory,
) -> None:
    node = await make_node()
    node.runtime.behave("setup", exit_code=0)
    pod = make_pod(
        "web",
        init=[container("setup"), container("log", restartPolicy="Always")],  # then a sidecar
        containers=[container("app"), container("helper")],
    )
    node.set_pods(pod)
    await node.started(pod)
    status = await node.wait_phase(pod, "Running")
    started = [c.container for c in node.runtime.ops("start_container", pod.uid)]
    assert started == ["setup", "log", "app", "helper"]
    assert status.init_container_statuses is not None
    setup, log = status.init_container_statuses
    assert setup.state.terminated is not None
    assert (setup.state.terminated.exit_code, setup.state.terminated.reason) == (0, "Completed")
    assert log.state.running is not None and node.running(pod, "log")
    assert status.pod_ip is not None and status.pod_ip.startswith("10.88.0.")
    assert status.host_ip == "192.0.2.10"
    assert status.qos_class == "BestEffort"
    assert [e.message for e in node.events(pod, "Started")] == [
        f"Started container {name}" for name in started
    ]
    # Only the pod's worker started anything, once per container.
    assert {c.pod_uid for c in node.runtime.ops("start_container")} == {pod.uid}
    assert len(node.runtime.ops("run_sandbox", pod.uid)) == 1


async def test_a_crashing_container_is_restarted_with_its_next_attempt(
    make_node: NodeFactory,
) -> None:
    node = await make_node()
    pod = make_pod("crash")
    node.set_pods(pod)
    await node.started(pod)
    node.runtime.exit_container(pod.uid, "c", 1)
    # The runtime's change wakes the PLEG at once; the first restart has no back-off.
    await eventually(
        "restartCount 1",
        lambda: (
            (s := node.status(pod)) is not None
            and s.container_statuses is not None
            and s.container_statuses[0].restart_count == 1
            and s.container_statuses[0].state.running is not None
        ),
    )
    assert [c.attempt for c in node.runtime.containers(pod.uid)] == [0, 1]
    assert node.running(pod) and node.phase(pod) == "Running"
    status = node.status(pod)
    assert status is not None and status.container_statuses is not None
    last = status.container_statuses[0].last_state.terminated
    assert last is not None and last.exit_code == 1 and last.reason == "Error"


def worker_runs(operation: str) -> float:
    """How many times the pod workers ran this operation (kubelet_pod_worker_duration_seconds)."""
    value = REGISTRY.get_sample_value(
        "kubelet_pod_worker_duration_seconds_count", {"operation_type": operation}
    )
    return value or 0.0


async def test_a_start_its_own_sync_saw_does_not_sync_the_pod_again(
    make_node: NodeFactory,
) -> None:
    """The PLEG tells of each container started; the sync that started it and then looked at
    it has its status already: no second sync (in a burst it delayed the next pods' starts).
    A start made elsewhere, or an exit, still syncs the pod."""
    node = await make_node()
    syncs = worker_runs("sync")
    pod = make_pod("once")
    node.set_pods(pod)
    await node.started(pod)
    await asyncio.sleep(pleg_module.RELIST_PERIOD * 1.5)  # a full relist too
    assert worker_runs("sync") == syncs
    node.runtime.exit_container(pod.uid, "c", 1)
    await eventually("the restart", lambda: len(node.runtime.containers(pod.uid)) == 2)
    assert worker_runs("sync") > syncs


async def test_a_start_seen_while_its_sync_goes_on_does_not_sync_the_pod_again(
    make_node: NodeFactory,
) -> None:
    """The PLEG tells of the first container's start while the sync is still starting the
    second: that sync's last look at the runtime will see the first one, so the event needs no
    sync of its own (a relist in a burst found half of the pods so). An exit still does."""
    node = await make_node()
    node.runtime.behave("slow", start_delay=0.3)
    syncs = worker_runs("sync")
    pod = make_pod("two", containers=[container("quick"), container("slow")])
    node.set_pods(pod)
    await eventually("the quick one started", lambda: node.running(pod, "quick"))
    assert not node.running(pod, "slow")  # its sync goes on
    await node.started(pod)
    status = await node.wait_phase(pod, "Running")
    assert status.container_statuses is not None
    assert all(c.state.running is not None for c in status.container_statuses)
    await asyncio.sleep(pleg_module.RELIST_PERIOD * 1.5)  # a full relist too
    assert worker_runs("sync") == syncs
    node.runtime.exit_container(pod.uid, "quick", 1)
    await eventually("the restart", lambda: len(node.runtime.containers(pod.uid)) == 3)
    assert worker_runs("sync") > syncs


async def test_a_spec_change_restarts_the_container(make_node: NodeFactory) -> None:
    node = await make_node()
    pod = make_pod("web")
    node.set_pods(pod)
    await node.started(pod)
    first = node.runtime.latest(pod.uid, "c")
    assert first is not None

    changed = make_pod("web", containers=[container(image="busybox:1.37")])
    node.set_pods(changed)
    await eventually(
        "the new image running",
        lambda: (
            (c := node.runtime.latest(pod.uid, "c")) is not None
            and c.image == "busybox:1.37"
            and c.state is ContainerRunState.RUNNING
        ),
    )
    latest = node.runtime.latest(pod.uid, "c")
    assert latest is not None and latest.attempt == 1
    stops = node.runtime.ops("stop_container", pod.uid)
    assert [(s.container, s.detail) for s in stops] == [("c", "grace=30")]
    assert [e.message for e in node.events(pod, "Killing")] == [
        "Container c definition changed, will be restarted"
    ]
    # Only one dead instance is kept (its lastState): the first one, here.
    assert [c.attempt for c in node.runtime.containers(pod.uid)] == [0, 1]
    # The same spec again (a re-list) changes nothing.
    calls = len(node.runtime.ops("start_container"))
    node.set_pods(changed)
    await asyncio.sleep(0.02)
    assert len(node.runtime.ops("start_container")) == calls


async def test_dead_containers_are_collected_down_to_the_last_one(
    make_node: NodeFactory,
) -> None:
    node = await make_node(container_gc_period=0.05)
    pod = make_pod("web")
    node.set_pods(pod)
    await node.started(pod)
    for n, image in enumerate(("busybox:1.35", "busybox:1.37", "busybox:1.38"), start=1):
        node.set_pods(make_pod("web", containers=[container(image=image)]))
        await eventually(
            f"attempt {n} running",
            lambda n=n: (
                (c := node.runtime.latest(pod.uid, "c")) is not None
                and c.attempt == n
                and c.state is ContainerRunState.RUNNING
            ),
        )
    # The running instance and the newest dead one (--previous) stay; the GC removed the rest.
    await eventually(
        "old instances removed",
        lambda: [c.attempt for c in node.runtime.containers(pod.uid)] == [2, 3],
    )


async def test_a_removed_pod_is_killed_and_cleaned_up(make_node: NodeFactory) -> None:
    node = await make_node()
    keep, gone = make_pod("keep"), make_pod("gone", terminationGracePeriodSeconds=5)
    node.set_pods(keep, gone)
    await node.started(keep, gone)
    await node.settle()  # a kill that interrupts a sync waits 3 s for stragglers
    node.set_pods(keep)
    await eventually("gone removed", lambda: not node.runtime.containers(gone.uid))
    assert [(s.container, s.detail) for s in node.runtime.ops("stop_container", gone.uid)] == [
        ("c", "grace=5")
    ]
    assert node.runtime.ops("remove_pod", gone.uid)
    await eventually("its status forgotten", lambda: node.status(gone) is None)
    assert [e.message for e in node.events(gone, "Killing")] == ["Stopping container c"]
    assert node.kubelet.find_pod("default", "gone") is None
    # The other pod is untouched.
    assert node.running(keep) and not node.runtime.ops("stop_container", keep.uid)
    assert node.phase(keep) == "Running"


# --- admission ----------------------------------------------------------------------------------


def rejection(node: Node, pod: Pod) -> tuple[str | None, str | None, str | None]:
    status = node.status(pod)
    assert status is not None
    return status.phase, status.reason, status.message


async def test_max_pods_rejects_the_newest_pods_of_a_batch(make_node: NodeFactory) -> None:
    node = await make_node(max_pods=2)
    # Admitted oldest first, whatever the order the source sends them in.
    a, b, c = make_pod("a", created=1), make_pod("b", created=2), make_pod("c", created=3)
    node.set_pods(c, a, b)
    await node.started(a, b)
    message = (
        "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, "
        "capacity: 2"
    )
    assert rejection(node, c) == ("Failed", "OutOfpods", message)
    status = node.status(c)
    assert status is not None and status.qos_class == "BestEffort"
    # The kubelet's rejectPod: the event carries the admission handler's message alone.
    (event,) = node.events(c, "OutOfpods")
    assert event.type == "Warning" and event.message == message.removeprefix("Pod was rejected: ")
    assert not node.runtime.ops(pod_uid=c.uid)  # never reached the runtime


async def test_requests_over_what_is_left_of_allocatable_are_rejected(
    make_node: NodeFactory,
) -> None:
    node = await make_node()  # 2 cpus, 4 GiB
    big = make_pod("big", containers=[container(**requests(cpu="1500m"))], created=1)
    more = make_pod("more", containers=[container(**requests(cpu="600m"))], created=2)
    fits = make_pod("fits", containers=[container(**requests(cpu="500m"))], created=3)
    huge = make_pod(
        "huge",
        containers=[container(resources={"limits": {"memory": "5Gi"}})],  # a limit is a request
        created=4,
    )
    node.set_pods(big, more, fits, huge)
    await node.started(big, fits)
    assert rejection(node, more) == (
        "Failed",
        "OutOfcpu",
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 600, used: 1500, "
        "capacity: 2000",
    )
    assert rejection(node, huge) == (
        "Failed",
        "OutOfmemory",
        # Allocatable: the kubelet's default hard eviction threshold memory.available<100Mi.
        f"Pod was rejected: Node didn't have enough resource: memory, requested: {5 * GIB}, "
        f"used: 0, capacity: {4 * GIB - 100 * MIB}",
    )
    assert node.events(more, "OutOfcpu") and node.events(huge, "OutOfmemory")
    assert not node.runtime.ops(pod_uid=more.uid) and not node.runtime.ops(pod_uid=huge.uid)


async def test_admission_counts_against_capacity_less_the_reservations(
    make_node: NodeFactory,
) -> None:
    node = await make_node(
        kube_reserved=parse_reserved({"cpu": "300m", "memory": "512Mi"}),
        system_reserved=parse_reserved({"cpu": "200m", "memory": "1Gi"}),
        eviction_hard=parse_thresholds({"memory.available": "5%"}),
    )  # 2 cpus, 4 GiB
    allocatable_memory = 4 * GIB - 512 * MIB - GIB - int(4 * GIB * float32(0.05))
    assert node.kubelet.node_resources().allocatable == {
        "cpu": 1500,
        "memory": allocatable_memory,
        "ephemeral-storage": 100 * GIB,  # no nodefs.available threshold given: none
        "pods": 110,
    }
    fits = make_pod("fits", containers=[container(**requests(cpu="1500m"))], created=1)
    more = make_pod("more", containers=[container(**requests(cpu="1m"))], created=2)
    big = make_pod("big", containers=[container(**requests(memory="2560Mi"))], created=3)
    node.set_pods(fits, more, big)
    await node.started(fits)
    assert rejection(node, more) == (
        "Failed",
        "OutOfcpu",
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 1, used: 1500, "
        "capacity: 1500",
    )
    assert rejection(node, big) == (
        "Failed",
        "OutOfmemory",
        f"Pod was rejected: Node didn't have enough resource: memory, requested: {2560 * MIB}, "
        f"used: 0, capacity: {allocatable_memory}",
    )


async def test_node_features_privileged_and_host_paths(make_node: NodeFactory) -> None:
    node = await make_node(allowed_host_paths=["/srv/data"])
    privileged = make_pod(
        "priv",
        init=[container("i", securityContext={"privileged": True})],
    )
    host_path = make_pod(
        "etc",
        volumes=[
            {"name": "ok", "hostPath": {"path": "/srv/data/x"}},
            {"name": "bad", "hostPath": {"path": "/etc"}},
        ],
    )
    node.set_pods(privileged, host_path)
    await eventually("both rejected", lambda: node.phase(privileged) and node.phase(host_path))
    assert rejection(node, privileged) == (
        "Failed",
        "PrivilegedNotAllowed",
        "Pod was rejected: spec.initContainers[0].securityContext.privileged: privileged "
        "containers are not allowed on this node (pykubelet --allow-privileged)",
    )
    assert rejection(node, host_path) == (
        "Failed",
        "HostPathNotAllowed",
        "Pod was rejected: spec.volumes[1].hostPath.path: /etc is not below "
        "--allowed-host-paths (/srv/data)",
    )
    assert node.events(privileged, "PrivilegedNotAllowed")
    assert node.events(host_path, "HostPathNotAllowed")
    assert not node.runtime.ops(pod_uid=privileged.uid)
    assert not node.runtime.ops(pod_uid=host_path.uid)


async def test_privileged_pods_run_where_allowed(make_node: NodeFactory) -> None:
    node = await make_node(allow_privileged=True)
    pod = make_pod("priv", containers=[container(securityContext={"privileged": True})])
    node.set_pods(pod)
    await node.started(pod)
    latest = node.runtime.latest(pod.uid, "c")
    assert latest is not None and node.runtime.config_of(latest.id).privileged


async def test_a_rejected_pod_takes_no_capacity_and_its_removal_frees_none(
    make_node: NodeFactory,
) -> None:
    node = await make_node(max_pods=2)
    a = make_pod("a", created=1)
    greedy = make_pod("greedy", containers=[container(**requests(cpu="3"))], created=2)
    node.set_pods(a, greedy)
    await node.started(a)
    assert rejection(node, greedy)[1] == "OutOfcpu"
    # The rejected pod holds no pod slot: b is admitted next to a.
    b = make_pod("b", created=3)
    node.set_pods(a, greedy, b)
    await node.started(b)
    # Removing the rejected pod frees nothing: the node is still full with a and b.
    c = make_pod("c", created=4)
    node.set_pods(a, b)
    await eventually("greedy forgotten", lambda: node.status(greedy) is None)
    node.set_pods(a, b, c)
    await eventually("c rejected", lambda: node.phase(c) == "Failed")
    assert rejection(node, c)[1] == "OutOfpods"
    assert "used: 2, capacity: 2" in (rejection(node, c)[2] or "")
    assert not node.runtime.ops(pod_uid=greedy.uid) and not node.runtime.ops(pod_uid=c.uid)


async def test_a_terminal_pod_frees_its_capacity_for_the_next_batch(
    make_node: NodeFactory,
) -> None:
    node = await make_node(max_pods=1)
    node.runtime.behave("job", exit_code=0)
    job = make_pod("job", containers=[container("job")], restartPolicy="Never", created=1)
    node.set_pods(job)
    await node.wait_phase(job, "Succeeded")
    # The finished pod stays (a source still has it) but holds no capacity any more.
    web = make_pod("web", created=2)
    node.set_pods(job, web)
    await node.started(web)
    assert node.phase(job) == "Succeeded"
    # A running pod does hold it.
    late = make_pod("late", created=3)
    node.set_pods(job, web, late)
    await eventually("late rejected", lambda: node.phase(late) == "Failed")
    assert rejection(node, late)[1] == "OutOfpods"


async def test_a_pod_added_while_being_deleted_takes_no_capacity(make_node: NodeFactory) -> None:
    node = await make_node(max_pods=1)
    deleted = make_pod("deleted", created=1)
    deleted.metadata.deletion_timestamp = T0
    deleted.metadata.deletion_grace_period_seconds = 0
    node.set_pods(deleted)
    await eventually(
        "it is terminated",
        lambda: node.kubelet.worker_state(deleted.uid) is WorkerState.TERMINATED,
    )
    await node.settle()
    assert not node.runtime.ops("start_container", deleted.uid)  # never started
    web = make_pod("web", created=2)
    node.set_pods(deleted, web)
    await eventually("web admitted or rejected", lambda: node.phase(web))
    assert node.phase(web) != "Failed", rejection(node, web)


# --- housekeeping -------------------------------------------------------------------------------


async def seed_orphan(runtime: FakeRuntime) -> Pod:
    """A pod an earlier agent started, which no source has any more."""
    orphan = make_pod("orphan")
    sandbox = await runtime.run_sandbox(orphan)
    config = ContainerConfig(
        name="c",
        image="busybox:1.36",
        command=["sleep", "3600"],
        args=[],
        env=[],
        working_dir=None,
        attempt=0,
        spec_hash="old",
        image_pull_policy="IfNotPresent",
    )
    await runtime.start_container(orphan, sandbox, config)
    return orphan


async def test_housekeeping_kills_what_no_source_has_once_all_sources_are_ready(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubelet_module, "HOUSEKEEPING_PERIOD", 0.01)
    runtime = FakeRuntime(started=True)
    orphan = await seed_orphan(runtime)
    node = await make_node(runtime=runtime, sources=(HTTP_SOURCE,))
    wanted = make_pod("wanted")
    node.set_pods(wanted)
    await node.started(wanted)
    # The http source has not answered: what it may still want is not touched.
    await asyncio.sleep(0.1)  # ten housekeeping periods
    assert node.running(orphan)
    assert not node.runtime.ops("stop_container", orphan.uid)

    node.other_sources[HTTP_SOURCE](PodUpdate([], Op.SET, HTTP_SOURCE))
    await eventually("the orphan removed", lambda: not node.runtime.containers(orphan.uid))
    # Its pod is unknown: the default grace period.
    assert [(s.container, s.detail) for s in node.runtime.ops("stop_container", orphan.uid)] == [
        ("c", "grace=30")
    ]
    assert node.runtime.ops("remove_pod", orphan.uid)
    assert node.running(wanted)
    assert not node.runtime.ops("stop_container", wanted.uid)


async def test_housekeeping_failures_do_not_end_the_sync_loop(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubelet_module, "HOUSEKEEPING_PERIOD", 0.01)
    node = await make_node()
    node.set_pods()
    node.runtime.fail("list_pods", times=2)  # housekeeping (and relists) fail for a while
    await eventually("the failures used up", lambda: len(node.runtime.ops("list_pods")) >= 3)
    pod = make_pod("after")
    node.set_pods(pod)
    await node.started(pod)
    assert node.task is not None and not node.task.done()


# --- health -------------------------------------------------------------------------------------


async def test_the_watchdog_is_fed_by_the_sync_loop_and_starves_while_it_is_stuck(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kubelet_module, "HOUSEKEEPING_PERIOD", 0.01)
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(tmp_path / "notify"))
    manager.setblocking(False)
    pings: list[bytes] = []

    def received() -> int:
        try:
            while True:
                pings.append(manager.recv(64))
        except BlockingIOError:
            return len(pings)

    notifier = Notifier(str(tmp_path / "notify"), watchdog_every=0.0)  # at every turn
    try:
        node = await make_node(on_sync_loop=notifier.watchdog)
        node.set_pods()  # sources ready: housekeeping runs in the loop
        await eventually("the loop feeding the watchdog", lambda: received() >= 3)
        assert set(pings) == {b"WATCHDOG=1"}

        # The runtime stops answering: housekeeping hangs, and with it the sync loop.
        calls = len(node.runtime.ops("list_pods"))
        node.runtime.hang("list_pods")
        await eventually("both hung", lambda: len(node.runtime.ops("list_pods")) >= calls + 2)
        before = received()
        await asyncio.sleep(0.3)
        assert received() == before  # systemd would kill and restart the agent

        node.runtime.release("list_pods")
        await eventually("fed again", lambda: received() > before)
    finally:
        notifier.close()
        manager.close()


class Clock:
    """`time` as the kubelet's health checks read it, moved on by `advance`."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


async def test_health_problems_name_a_stuck_runtime_and_sync_loop(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(kubelet_module, "time", clock)
    monkeypatch.setattr(pleg_module, "time", clock)
    monkeypatch.setattr(kubelet_module, "HOUSEKEEPING_PERIOD", 0.01)
    node = await make_node()
    pod = make_pod("web")
    node.set_pods(pod)
    await node.started(pod)  # the start woke the PLEG: it has relisted
    await asyncio.sleep(0.01)
    assert node.kubelet.health_problems() == []

    # The runtime stops answering: relists hang, and so does housekeeping, in the sync loop.
    node.runtime.hang("list_pods")
    calls = len(node.runtime.ops("list_pods"))
    node.runtime.exit_container(pod.uid, "c", 0)  # a change: the PLEG relists at once
    await eventually("both hung", lambda: len(node.runtime.ops("list_pods")) >= calls + 2)
    clock.advance(31)
    late = make_pod("late")
    node.set_pods(pod, late)  # a loop that iterates would take this at once
    await asyncio.sleep(0.01)
    assert node.kubelet.health_problems() == [
        "pleg: the runtime has not been relisted for too long",
        "syncloop: no iteration in 30s",
    ]
    assert not node.runtime.ops("run_sandbox", late.uid)

    node.runtime.release("list_pods")
    await eventually("healthy again", lambda: node.kubelet.health_problems() == [])
    await node.started(pod, late)  # restarted (restartPolicy Always), and the new pod started


async def test_a_runtime_that_never_answers_is_a_health_problem(
    make_node: NodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(kubelet_module, "time", clock)
    monkeypatch.setattr(pleg_module, "time", clock)
    runtime = FakeRuntime(started=True)
    runtime.fail("list_pods", times=None)  # every relist fails, from the start
    node = await make_node(runtime=runtime)
    pod = make_pod("web")
    node.set_pods(pod)
    await node.started(pod)  # the start woke the PLEG: its relist failed
    await eventually("a relist", lambda: runtime.ops("list_pods"))
    clock.advance(600)
    other = make_pod("other")
    node.set_pods(pod, other)  # the sync loop goes on: only the PLEG is stuck
    await node.started(other)
    assert node.kubelet.health_problems() == [
        "pleg: the runtime has not been relisted for too long"
    ]
    runtime.heal()


# --- shutdown -----------------------------------------------------------------------------------


async def test_shutdown_stops_and_removes_the_pods(make_node: NodeFactory) -> None:
    node = await make_node()
    a, b = make_pod("a"), make_pod("b")
    node.set_pods(a, b)
    await node.started(a, b)
    await node.shutdown()
    assert await node.runtime.list_pods() == []
    stopped = {s.pod_uid for s in node.runtime.ops("stop_container")}
    assert stopped == {a.uid, b.uid}


async def test_shutdown_keeps_the_pods_with_keep_pods_on_exit(make_node: NodeFactory) -> None:
    node = await make_node(keep_pods_on_exit=True)
    a = make_pod("a")
    node.set_pods(a)
    await node.started(a)
    await node.shutdown()
    assert node.running(a)
    assert not node.runtime.ops("stop_container") and not node.runtime.ops("remove_pod")

    # The next agent adopts it: it is not started twice.
    again = await make_node(runtime=node.runtime)
    again.set_pods(a)
    await again.wait_phase(a, "Running")
    assert [c.attempt for c in again.runtime.containers(a.uid)] == [0]
    assert len(again.runtime.ops("start_container", a.uid)) == 1
