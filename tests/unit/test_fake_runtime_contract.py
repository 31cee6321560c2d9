"""The fake runtime keeps the promises of the real ones: the same scenarios run against
`FakeRuntime` and the process runtime (real processes), and must look the same through the
`Runtime` interface. Then the fake's own test controls."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from pykubelet.api.model import Pod
from pykubelet.runtime.base import (
    MAX_EXEC_OUTPUT,
    ContainerConfig,
    ContainerRunState,
    ExecResult,
    LogTimes,
    LogUnsupported,
    Runtime,
    RuntimeContainer,
    RuntimeFailure,
    StartError,
)
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.fakes import FakeRuntime

TIMEOUT = 10.0


def make_pod(name: str = "web") -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": uuid.uuid4().hex},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )


def config(name: str, command: list[str], attempt: int = 0) -> ContainerConfig:
    return ContainerConfig(
        name=name,
        image="busybox:1.36",
        command=command,
        args=[],
        env=[],
        working_dir=None,
        attempt=attempt,
        spec_hash=f"hash-{name}",
        image_pull_policy="IfNotPresent",
    )


@dataclass
class Subject:
    """A runtime, and how to make one of its containers do something."""

    runtime: Runtime
    changes: list[str]

    def program(self, name: str, *, output: bytes = b"", exit_code: int | None = None) -> list[str]:
        """The command of a container that writes `output` then exits with `exit_code` (runs
        until stopped if None); the fake is told the same."""
        if isinstance(self.runtime, FakeRuntime):
            self.runtime.behave(name, output=output, exit_code=exit_code)
        printed = output.decode().replace("\n", "\\n")
        script = f"printf '{printed}'; " + (
            f"exit {exit_code}" if exit_code is not None else "exec sleep 30"
        )
        return ["/bin/sh", "-c", script]


@pytest.fixture(params=["fake", "process"])
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    runtime: Runtime = FakeRuntime() if request.param == "fake" else ProcessRuntime(tmp_path)
    await runtime.start()
    changes: list[str] = []
    runtime.add_listener(changes.append)
    yield Subject(runtime, changes)
    for pod in await runtime.list_pods():
        await runtime.remove_pod(pod.uid)
    await runtime.close()


async def exited(runtime: Runtime, container: RuntimeContainer) -> RuntimeContainer:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        pod = await runtime.get_pod(container.pod_uid)
        found = next((c for c in pod.containers if c.id == container.id), None) if pod else None
        if found is not None and found.state is ContainerRunState.EXITED:
            return found
        await asyncio.sleep(0.005)
    raise AssertionError(f"container {container.name} did not exit")


async def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_a_container_runs_exits_and_keeps_its_log(subject: Subject) -> None:
    runtime = subject.runtime
    pod = make_pod()
    assert await runtime.get_pod(pod.uid) is None
    sandbox = await runtime.run_sandbox(pod)
    assert sandbox.ready and sandbox.pod_uid == pod.uid
    assert await runtime.run_sandbox(pod) == sandbox  # the ready one again
    command = subject.program("c", output=b"one\ntwo\nthree\n", exit_code=3)
    started = await runtime.start_container(pod, sandbox, config("c", command, attempt=2))
    assert started.state is ContainerRunState.RUNNING
    assert (started.attempt, started.spec_hash, started.pod_uid) == (2, "hash-c", pod.uid)
    assert started.container_id == f"{runtime.name}://{started.id}"
    assert started.started_at is not None and started.exit_code is None

    done = await exited(runtime, started)
    assert (done.exit_code, done.reason) == (3, "Error")
    assert done.finished_at is not None
    await until(lambda: subject.changes.count(pod.uid) >= 2)  # started, then exited
    assert await runtime.read_log(done) == b"one\ntwo\nthree\n"
    assert await runtime.read_log(done, tail_lines=2) == b"two\nthree\n"
    assert await runtime.read_log(done, tail_lines=0) == b""
    assert await runtime.read_log(done, tail_lines=9) == b"one\ntwo\nthree\n"
    assert await runtime.read_log(done, tail_lines=2, limit_bytes=5) == b"two\nt"
    assert [c async for c in runtime.follow_log(done, tail_lines=1)] == [b"three\n"]
    # A plain log has no time per line: since keeps all of it or none, timestamps are refused.
    assert await runtime.read_log(done, times=LogTimes(since_ns=0)) == b"one\ntwo\nthree\n"
    assert await runtime.read_log(done, times=LogTimes(since_ns=time.time_ns())) == b""
    assert [
        c async for c in runtime.follow_log(done, times=LogTimes(since_ns=time.time_ns()))
    ] == []
    with pytest.raises(LogUnsupported, match=r"^timestamps: "):
        await runtime.read_log(done, times=LogTimes(timestamps=True))

    listed = await runtime.list_pods()
    assert [(p.uid, [c.id for c in p.containers]) for p in listed] == [(pod.uid, [done.id])]


async def test_a_container_that_exits_zero_completes(subject: Subject) -> None:
    runtime = subject.runtime
    pod = make_pod()
    sandbox = await runtime.run_sandbox(pod)
    started = await runtime.start_container(
        pod, sandbox, config("init", subject.program("init", exit_code=0))
    )
    done = await exited(runtime, started)
    assert (done.exit_code, done.reason, done.message) == (0, "Completed", None)


async def test_stop_remove_and_the_errors_of_the_interface(subject: Subject) -> None:
    runtime = subject.runtime
    pod = make_pod()
    sandbox = await runtime.run_sandbox(pod)
    running = await runtime.start_container(pod, sandbox, config("c", subject.program("c")))
    with pytest.raises(RuntimeFailure):
        await runtime.remove_container(running)  # stop it first
    await runtime.stop_container(running, 5)  # returns once it is gone
    pod_now = await runtime.get_pod(pod.uid)
    assert pod_now is not None
    (stopped,) = pod_now.containers
    assert stopped.state is ContainerRunState.EXITED and stopped.exit_code == 143
    with pytest.raises(RuntimeFailure):
        await runtime.exec_sync(stopped, ["true"], [], 1)
    await runtime.stop_container(stopped, 5)  # stopping an exited one is nothing
    await runtime.remove_container(stopped)
    after = await runtime.get_pod(pod.uid)
    assert after is not None and after.containers == [] and after.sandbox is not None
    await runtime.remove_container(stopped)  # removing it again is nothing

    # A container of another pod's sandbox is refused.
    other = make_pod("other")
    with pytest.raises(RuntimeFailure):
        await runtime.start_container(other, sandbox, config("c", subject.program("c")))

    # remove_pod kills what still runs and forgets the pod.
    again = await runtime.start_container(pod, sandbox, config("c", subject.program("c"), 1))
    await runtime.remove_pod(pod.uid)
    assert await runtime.get_pod(pod.uid) is None
    assert await runtime.read_log(again) == b""


async def test_exec_in_a_running_container(subject: Subject) -> None:
    runtime = subject.runtime
    if isinstance(runtime, FakeRuntime):
        runtime.set_exec(lambda c, cmd, env: ExecResult(0 if cmd[-1] == "ok" else 1, b"out\n"))
    pod = make_pod()
    sandbox = await runtime.run_sandbox(pod)
    running = await runtime.start_container(pod, sandbox, config("c", subject.program("c")))
    ok = await runtime.exec_sync(running, ["/bin/sh", "-c", "echo out; true", "ok"], [], 5)
    assert ok == ExecResult(0, b"out\n") and not ok.timed_out
    failed = await runtime.exec_sync(running, ["/bin/sh", "-c", "echo out; false", "no"], [], 5)
    assert failed.exit_code == 1


# --- the fake's controls ------------------------------------------------------------------------


@pytest.fixture
async def fake() -> FakeRuntime:
    return FakeRuntime(started=True)


async def start(fake: FakeRuntime, name: str = "c", attempt: int = 0) -> RuntimeContainer:
    pod = make_pod()
    sandbox = await fake.run_sandbox(pod)
    return await fake.start_container(pod, sandbox, config(name, ["x"], attempt))


async def test_exit_oom_and_the_calls_recorded(fake: FakeRuntime) -> None:
    c = await start(fake)
    with pytest.raises(LookupError):
        fake.exit_container(c.pod_uid, "nope", 1)
    done = fake.exit_container(c.pod_uid, "c", 2, reason="Custom", message="why")
    assert (done.state, done.exit_code, done.reason, done.message) == (
        ContainerRunState.EXITED,
        2,
        "Custom",
        "why",
    )
    with pytest.raises(LookupError):
        fake.exit_container(c.pod_uid, "c", 1)  # not running any more
    pod = make_pod()
    sandbox = await fake.run_sandbox(pod)
    await fake.start_container(pod, sandbox, config("m", ["x"]))
    oom = fake.oom_kill(pod.uid, "m")
    assert (oom.exit_code, oom.reason) == (137, "OOMKilled")
    assert [(k.op, k.container, k.detail) for k in fake.ops("start_container", pod.uid)] == [
        ("start_container", "m", "attempt=0")
    ]
    assert fake.config_of(oom.id).command == ["x"]


async def test_failures_are_injected_and_healed(fake: FakeRuntime) -> None:
    fake.fail("list_pods", times=2)
    for _ in range(2):
        with pytest.raises(RuntimeFailure, match="injected"):
            await fake.list_pods()
    assert await fake.list_pods() == []
    fake.fail("start_container", StartError("RunContainerError", "no"), container="bad")
    with pytest.raises(StartError):
        await start(fake, "bad")
    await start(fake, "good")
    await start(fake, "bad")  # once only
    fake.fail("get_pod", times=None)
    for _ in range(3):
        with pytest.raises(RuntimeFailure):
            await fake.get_pod("x")
    fake.heal("get_pod")
    assert await fake.get_pod("x") is None
    with pytest.raises(ValueError):
        fake.fail("no_such_op")


async def test_images_are_pulled_as_the_policy_says(fake: FakeRuntime) -> None:
    fake.present_images = {"present:1"}
    fake.pull_errors["broken:1"] = "manifest unknown"
    pod = make_pod()
    sandbox = await fake.run_sandbox(pod)

    def with_image(image: str, policy: str, name: str) -> ContainerConfig:
        return replace(config(name, ["x"]), image=image, image_pull_policy=policy)

    await fake.start_container(pod, sandbox, with_image("present:1", "IfNotPresent", "a"))
    assert not fake.ops("pull_image")
    with pytest.raises(StartError) as never:
        await fake.start_container(pod, sandbox, with_image("absent:1", "Never", "b"))
    assert never.value.reason == "ErrImageNeverPull"
    with pytest.raises(StartError) as broken:
        await fake.start_container(pod, sandbox, with_image("broken:1", "IfNotPresent", "c"))
    assert broken.value.reason == "ErrImagePull"
    await fake.start_container(pod, sandbox, with_image("new:1", "IfNotPresent", "d"))
    assert "new:1" in fake.present_images
    await fake.start_container(pod, sandbox, with_image("present:1", "Always", "e"))
    assert [c.detail for c in fake.ops("pull_image")] == ["broken:1", "new:1", "present:1"]
    with pytest.raises(StartError) as twice:
        await fake.start_container(pod, sandbox, with_image("present:1", "IfNotPresent", "a"))
    assert twice.value.reason == "CreateContainerError"  # name and attempt in use


async def test_a_container_that_ignores_sigterm_is_killed_after_the_grace_period(
    fake: FakeRuntime,
) -> None:
    fake.behave("stubborn", ignores_term=True)
    c = await start(fake, "stubborn")
    began = time.monotonic()
    await fake.stop_container(c, 0.05)
    assert time.monotonic() - began >= 0.05
    latest = fake.latest(c.pod_uid, "stubborn")
    assert latest is not None and latest.exit_code == 137
    # One that exits by itself during the grace period ends the wait.
    c2 = await start(fake, "stubborn")
    stop = asyncio.create_task(fake.stop_container(c2, 30))
    await asyncio.sleep(0.01)
    fake.exit_container(c2.pod_uid, "stubborn", 0)
    await asyncio.wait_for(stop, 1)
    latest = fake.latest(c2.pod_uid, "stubborn")
    assert latest is not None and latest.exit_code == 0


async def test_created_sandboxes_logs_and_hangs(fake: FakeRuntime) -> None:
    fake.behave("slow", stays_created=True)
    c = await start(fake, "slow")
    assert c.state is ContainerRunState.CREATED and c.started_at is None
    with pytest.raises(RuntimeFailure):
        await fake.exec_sync(c, ["true"], [], 1)  # not running
    await fake.stop_container(c, 1)

    c = await start(fake)
    fake.kill_sandbox(c.pod_uid)
    pod = await fake.get_pod(c.pod_uid)
    assert pod is not None and pod.sandbox is not None and not pod.sandbox.ready

    # follow_log: what is written, until the container has exited.
    c = await start(fake, "talk")
    chunks: list[bytes] = []

    async def follow() -> None:
        async for chunk in fake.follow_log(c):
            chunks.append(chunk)

    task = asyncio.create_task(follow())
    fake.write_log(c.pod_uid, "talk", b"a\n")
    await until(lambda: chunks == [b"a\n"])
    fake.write_log(c.pod_uid, "talk", b"b\n")
    fake.exit_container(c.pod_uid, "talk", 0)
    await asyncio.wait_for(task, 1)
    assert b"".join(chunks) == b"a\nb\n"

    fake.set_exec(ExecResult(0, b"x" * (MAX_EXEC_OUTPUT + 10)), container="big")
    big = await start(fake, "big")
    assert len((await fake.exec_sync(big, ["cat"], [], 1)).output) == MAX_EXEC_OUTPUT
    fake.set_exec(RuntimeFailure("cannot run cat"))
    with pytest.raises(RuntimeFailure):
        await fake.exec_sync(await start(fake, "other"), ["cat"], [], 1)

    fake.hang("get_pod")
    waiting = asyncio.create_task(fake.get_pod(c.pod_uid))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    fake.release("get_pod")
    assert await asyncio.wait_for(waiting, 1) is not None
