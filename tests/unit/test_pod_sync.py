"""One pod's sync against the real process runtime: restart policy, back-off, spec changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import pytest

from pykubelet.api.model import Pod
from pykubelet.common.events import EventRecorder
from pykubelet.config.types import API_SOURCE
from pykubelet.pod.envvars import Allocatable, container_env
from pykubelet.pod.sync import PodSync
from pykubelet.pod.volumes import VolumeManager
from pykubelet.pod.workers import UpdateType
from pykubelet.probes.handlers import ActionRunner
from pykubelet.probes.prober import ProbeManager
from pykubelet.runtime.base import ContainerRunState, Runtime
from pykubelet.runtime.process.runtime import ProcessRuntime
from pykubelet.status.manager import StatusManager
from tests.fakes.pods import sourced_pod
from tests.fakes.runtime import FakeRuntime


def pod(script: str) -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-sync"},
            "spec": {
                "containers": [{"name": "c", "image": "i", "command": ["/bin/sh", "-c", script]}]
            },
        }
    )


@dataclass
class Node:
    runtime: ProcessRuntime
    sync: PodSync
    statuses: StatusManager


def pod_sync(
    runtime: Runtime, tmp_path: Path, **options: int
) -> tuple[PodSync, StatusManager, ActionRunner]:
    """A pod sync over `runtime` (its actions to close after)."""
    recorder = EventRecorder()
    actions = ActionRunner(
        runtime, "127.0.0.1", lambda pod, spec, ip: container_env(pod, spec, "127.0.0.1", ip)
    )
    statuses = StatusManager()
    node = Allocatable(cpu=Fraction(2), memory=1 << 30, ephemeral_storage=1 << 34)
    sync = PodSync(
        runtime,
        statuses,
        recorder,
        "127.0.0.1",
        actions,
        ProbeManager(actions, recorder, print),
        VolumeManager(tmp_path, node),
        node,
        **options,
    )
    return sync, statuses, actions


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    """A pod sync over a real process runtime; removes whatever the test left running."""
    runtime = ProcessRuntime(tmp_path)
    await runtime.start()
    sync, statuses, actions = pod_sync(runtime, tmp_path)
    yield Node(runtime, sync, statuses)
    for runtime_pod in await runtime.list_pods():
        await runtime.remove_pod(runtime_pod.uid)
    await runtime.close()
    await actions.close()


async def exited(runtime: ProcessRuntime, attempt: int) -> None:
    for _ in range(200):
        rp = await runtime.get_pod("uid-sync")
        if rp and any(
            c.attempt == attempt and c.state is ContainerRunState.EXITED for c in rp.containers
        ):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"attempt {attempt} did not exit")


async def test_crash_loop_then_a_fixed_spec_starts_at_once(node: Node) -> None:
    runtime, sync, statuses = node.runtime, node.sync, node.statuses
    crashing = pod("exit 1")
    await sync.sync_pod(UpdateType.CREATE, crashing)
    await exited(runtime, 0)
    await sync.sync_pod(UpdateType.SYNC, crashing)  # the first restart is immediate
    await exited(runtime, 1)
    result = await sync.sync_pod(UpdateType.SYNC, crashing)
    status = statuses.get("uid-sync")
    assert status is not None and status.container_statuses is not None
    waiting = status.container_statuses[0].state.waiting
    assert waiting is not None and waiting.reason == "CrashLoopBackOff"
    assert result.requeue_after is not None and 9 < result.requeue_after <= 10

    # The spec is fixed (an API pod keeps its UID): no back-off for the new spec.
    fixed = pod("sleep 30")
    await sync.sync_pod(UpdateType.UPDATE, fixed)
    rp = await runtime.get_pod("uid-sync")
    assert rp is not None
    running = [c for c in rp.containers if c.state is ContainerRunState.RUNNING]
    assert [c.attempt for c in running] == [2]


async def test_deleted_api_pod_ends_in_a_terminal_phase(node: Node) -> None:
    sync, statuses = node.sync, node.statuses
    api_pod = pod("sleep 30")
    api_pod.metadata.annotations["kubernetes.io/config.source"] = "api"
    await sync.sync_pod(UpdateType.CREATE, api_pod)
    running = statuses.get("uid-sync")
    assert running is not None and running.phase == "Running"
    deleted = api_pod.model_copy(deep=True)
    deleted.metadata.deletion_timestamp = datetime.now(UTC)
    await sync.sync_terminating_pod("uid-sync", deleted, 2)
    final = statuses.get("uid-sync")
    assert final is not None and final.phase == "Failed"  # killed: exit 143, not 0
    # A static pod (not from the API) keeps the kubelet's usual phase.
    static = pod("sleep 30")
    static.metadata.uid = "uid-static"
    await sync.sync_pod(UpdateType.CREATE, static)
    static.metadata.deletion_timestamp = datetime.now(UTC)
    await sync.sync_terminating_pod("uid-static", static, 2)
    assert statuses.get("uid-static").phase == "Running"  # type: ignore[union-attr]


def with_message_path(p: Pod, **fields: str) -> Pod:
    p.spec.containers[0].termination_message_path = "/dev/termination-log"
    for name, value in fields.items():
        setattr(p.spec.containers[0], name, value)
    return p


async def test_the_termination_message_reaches_the_status(node: Node, tmp_path: Path) -> None:
    runtime, sync, statuses = node.runtime, node.sync, node.statuses
    farewell = with_message_path(pod("printf bye > /dev/termination-log; exit 3"))
    farewell.spec.restart_policy = "Never"
    await sync.sync_pod(UpdateType.CREATE, farewell)
    await exited(runtime, 0)
    await sync.sync_pod(UpdateType.SYNC, farewell)
    status = statuses.get("uid-sync")
    assert status is not None and status.container_statuses is not None
    terminated = status.container_statuses[0].state.terminated
    assert terminated is not None and terminated.exit_code == 3 and terminated.message == "bye"
    files = list((tmp_path / "pods" / "uid-sync" / "containers" / "c").iterdir())
    assert [f.read_bytes() for f in files] == [b"bye"]


async def test_a_start_that_fails_leaves_no_message_file(node: Node, tmp_path: Path) -> None:
    broken = with_message_path(pod("unused"))
    broken.spec.containers[0].command = []  # the process runtime needs one
    await node.sync.sync_pod(UpdateType.CREATE, broken)
    status = node.statuses.get("uid-sync")
    assert status is not None and status.container_statuses is not None
    waiting = status.container_statuses[0].state.waiting
    assert waiting is not None and waiting.reason == "CreateContainerConfigError"
    assert list((tmp_path / "pods" / "uid-sync" / "containers" / "c").iterdir()) == []


async def test_api_pods_sync_a_few_at_once_and_static_pods_do_not_wait(tmp_path: Path) -> None:
    runtime = FakeRuntime(started=True)
    sync, _, actions = pod_sync(runtime, tmp_path, max_api_syncs=2)

    def sandboxes() -> list[str]:
        return [c.pod_uid for c in runtime.calls if c.op == "run_sandbox"]

    runtime.hang("run_sandbox")  # every sync waits in its sandbox until released
    pods = [sourced_pod(f"api{i}", API_SOURCE) for i in range(4)] + [sourced_pod("static", "file")]
    syncs = [asyncio.create_task(sync.sync_pod(UpdateType.CREATE, p)) for p in pods]
    try:
        for _ in range(200):
            if len(sandboxes()) >= 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert sorted(sandboxes()) == ["uid-api0", "uid-api1", "uid-static"]
        runtime.release("run_sandbox")
        await asyncio.wait_for(asyncio.gather(*syncs), 10)
        assert sorted(sandboxes()) == sorted(p.uid for p in pods)
    finally:
        runtime.release("run_sandbox")
        for task in syncs:
            task.cancel()
        await asyncio.gather(*syncs, return_exceptions=True)
        await actions.close()
