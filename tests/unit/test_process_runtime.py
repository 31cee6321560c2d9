"""ProcessRuntime with real processes. Waits poll with generous timeouts: a noisy 2-core machine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import pykubelet
from pykubelet.api.model import Pod
from pykubelet.runtime.base import (
    ContainerConfig,
    ContainerRunState,
    RuntimeContainer,
    RuntimeFailure,
    RuntimeSandbox,
    StartError,
)
from pykubelet.runtime.process import statefile
from pykubelet.runtime.process.processes import proc_start_time
from pykubelet.runtime.process.runtime import (
    UNKNOWN_EXIT_CODE,
    UNKNOWN_MESSAGE,
    UNKNOWN_REASON,
    ProcessRuntime,
)

TIMEOUT = 15.0


def make_pod(name: str = "web") -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": uuid.uuid4().hex},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )


def config(
    *args: str,
    command: list[str] | None = None,
    name: str = "c",
    attempt: int = 0,
    env: list[tuple[str, str]] | None = None,
    working_dir: str | None = None,
) -> ContainerConfig:
    return ContainerConfig(
        name=name,
        image="busybox:1.36",
        command=command if command is not None else [],
        args=list(args),
        env=env or [],
        working_dir=working_dir,
        attempt=attempt,
        spec_hash="h1",
        image_pull_policy="IfNotPresent",
    )


def sh(
    script: str, name: str = "c", attempt: int = 0, working_dir: str | None = None
) -> ContainerConfig:
    return config(
        "-c", script, command=["/bin/sh"], name=name, attempt=attempt, working_dir=working_dir
    )


async def wait_until(pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def current(rt: ProcessRuntime, c: RuntimeContainer) -> RuntimeContainer:
    pod = await rt.get_pod(c.pod_uid)
    assert pod is not None
    [found] = [x for x in pod.containers if x.id == c.id]
    return found


async def wait_exited(rt: ProcessRuntime, c: RuntimeContainer) -> RuntimeContainer:
    deadline = time.monotonic() + TIMEOUT
    while (now := await current(rt, c)).state is not ContainerRunState.EXITED:
        if time.monotonic() > deadline:
            pytest.fail(f"container {c.name} did not exit")
        await asyncio.sleep(0.02)
    return now


async def wait_log(rt: ProcessRuntime, c: RuntimeContainer, text: bytes) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in await rt.read_log(c):
        if time.monotonic() > deadline:
            pytest.fail(f"{text!r} never appeared in the log of {c.name}")
        await asyncio.sleep(0.02)


def gone(pid: int) -> bool:
    """No such process, or a zombie (PID 1 here may not reap orphans)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return data[data.rindex(b")") + 2 :].split()[0] in (b"Z", b"X")


def kill_quietly(pgid: int, reap: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if reap:  # a child of this process: do not leave a zombie
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, 0)


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    runtime = ProcessRuntime(tmp_path, node_ip="10.1.2.3")
    await runtime.start()
    yield runtime
    for pod in await runtime.list_pods():
        await runtime.remove_pod(pod.uid)
    await runtime.close()


async def new_pod(rt: ProcessRuntime, name: str = "web") -> tuple[Pod, RuntimeSandbox]:
    pod = make_pod(name)
    return pod, await rt.run_sandbox(pod)


# --- sandbox and state files --------------------------------------------------------------------


async def test_sandbox_is_idempotent_and_persisted(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    assert sb.ready and sb.ip == "10.1.2.3" and sb.pod_uid == pod.uid
    assert (await rt.run_sandbox(pod)).id == sb.id
    pod_dir = tmp_path / "runtime" / "process" / pod.uid
    assert stat.S_IMODE(pod_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((pod_dir / "sandbox.json").stat().st_mode) == 0o600
    data = json.loads((pod_dir / "sandbox.json").read_text())
    assert (data["pod_name"], data["pod_namespace"], data["pod_uid"]) == ("web", "default", pod.uid)

    other = ProcessRuntime(tmp_path)
    await other.start()
    loaded = await other.get_pod(pod.uid)
    assert loaded is not None and loaded.sandbox is not None and loaded.sandbox.id == sb.id
    assert loaded.name == "web" and loaded.containers == []
    await other.close()


async def test_a_sandbox_record_found_maybe_unsynced_is_synced_with_its_first_container_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = ProcessRuntime(tmp_path)
    await first.start()
    pod, sb = await new_pod(first)
    await first.close()
    # An agent killed after the sandbox's record, written unsynced, before any container's.
    pod_dir = tmp_path / "runtime" / "process" / pod.uid
    synced: list[str] = []
    fsync = os.fsync

    def logged(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", logged)
    again = ProcessRuntime(tmp_path)
    await again.start()
    try:
        assert (await again.run_sandbox(pod)).id == sb.id
        await again.start_container(pod, sb, sh("exec sleep 600"))
        assert str(pod_dir / "sandbox.json") in synced
        assert synced[-1] == str(pod_dir)  # before the directory that names it
    finally:
        await again.remove_pod(pod.uid)
        await again.close()


def test_statefile_atomic_write_and_corrupt_read(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    statefile.ensure_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    path = d / "x.json"
    for value in (1, 2):
        assert statefile.write_json_many([statefile.StateWrite(path, {"k": value})]) == [None]
    assert statefile.read_json(path) == {"k": 2}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in d.iterdir()) == ["x.json"]  # no temporary left behind

    path.write_bytes(b'{"k": ')
    with pytest.raises(statefile.StateFileError, match="not valid JSON"):
        statefile.read_json(path)
    path.write_bytes(b"[1]")
    with pytest.raises(statefile.StateFileError, match="not an object"):
        statefile.read_json(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(statefile.StateFileError):
        statefile.read_json(path)
    with pytest.raises(FileNotFoundError):
        statefile.read_json(d / "missing.json")

    # A marker to remove whose directory is gone, or was never one: nothing to remove.
    assert statefile.remove(path) and not statefile.remove(path)
    path.write_bytes(b"not a directory")
    assert not statefile.remove(path / "c.starting")


# --- start, exit, logs --------------------------------------------------------------------------


async def test_exit_codes_and_reasons(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    ok = await rt.start_container(pod, sb, sh("exit 0", name="ok"))
    assert ok.state is ContainerRunState.RUNNING and ok.pid and ok.started_at
    assert ok.container_id == f"process://{ok.id}" and len(ok.id) == 32
    bad = await rt.start_container(pod, sb, sh("exit 3", name="bad"))
    sig = await rt.start_container(pod, sb, sh("kill -USR1 $$", name="sig"))

    ok, bad, sig = [await wait_exited(rt, c) for c in (ok, bad, sig)]
    assert (ok.exit_code, ok.reason) == (0, "Completed")
    assert (bad.exit_code, bad.reason) == (3, "Error")
    assert (sig.exit_code, sig.reason) == (128 + signal.SIGUSR1, "Error")
    assert ok.finished_at is not None and ok.started_at is not None
    assert ok.finished_at >= ok.started_at

    # The view changes at once; the file follows from a thread.
    path = tmp_path / "runtime/process" / pod.uid / f"{bad.id}.json"
    await wait_until(lambda: json.loads(path.read_text())["state"] == "exited", "the exit on disk")
    state = json.loads(path.read_text())
    assert state["exit_code"] == 3 and state["reason"] == "Error" and state["state"] == "exited"
    assert state["pid"] == bad.pid and isinstance(state["proc_start_time"], int)
    assert (state["name"], state["attempt"], state["spec_hash"]) == ("bad", 0, "h1")


async def test_the_recorded_start_time_is_the_process_s_even_if_it_exits_at_once(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    """Read off the loop (in the state files' thread) or, for a process that exits first, by
    the exit handling before it reaps: never 0, never another process's."""
    pod, sb = await new_pod(rt)
    running = await rt.start_container(pod, sb, sh("exec sleep 30", name="running"))
    gone = [await rt.start_container(pod, sb, sh("exit 0", name=f"gone{i}")) for i in range(5)]
    pod_dir = tmp_path / "runtime/process" / pod.uid
    assert running.pid is not None
    recorded = json.loads((pod_dir / f"{running.id}.json").read_text())["proc_start_time"]
    assert recorded == proc_start_time(running.pid)  # /proc/<pid>/stat's, now
    for c in gone:
        await wait_exited(rt, c)
        path = pod_dir / f"{c.id}.json"
        await wait_until(lambda p=path: json.loads(p.read_text())["state"] == "exited", "exit")
        assert json.loads(path.read_text())["proc_start_time"] > 0
    await rt.stop_container(running, grace_seconds=1)


def test_a_state_file_s_content_can_be_made_in_the_writer_s_thread(tmp_path: Path) -> None:
    def failing() -> dict[str, int]:
        raise OSError(3, "no such process")

    ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
    errors = statefile.write_json_many(
        [statefile.StateWrite(ok, lambda: {"k": 1}), statefile.StateWrite(bad, failing)]
    )
    assert errors[0] is None and isinstance(errors[1], OSError)
    assert statefile.read_json(ok) == {"k": 1} and not bad.exists()


async def test_containers_sorted_by_name_and_attempt(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    for name, attempt in [("b", 1), ("a", 0), ("b", 0)]:
        await rt.start_container(pod, sb, sh("exit 0", name=name, attempt=attempt))
    got = await rt.get_pod(pod.uid)
    assert got is not None
    assert [(c.name, c.attempt) for c in got.containers] == [("a", 0), ("b", 0), ("b", 1)]
    assert [p.uid for p in await rt.list_pods()] == [pod.uid]


async def test_log_has_stdout_and_stderr_tail_and_limit(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, sh("echo out; echo err >&2; printf 'a\\nb\\nc\\n'"))
    await wait_exited(rt, c)
    assert await rt.read_log(c) == b"out\nerr\na\nb\nc\n"
    assert await rt.read_log(c, tail_lines=2) == b"b\nc\n"
    assert await rt.read_log(c, tail_lines=0) == b""
    assert await rt.read_log(c, tail_lines=100) == b"out\nerr\na\nb\nc\n"
    assert await rt.read_log(c, limit_bytes=6) == b"out\ner"  # keeps the beginning
    assert await rt.read_log(c, tail_lines=2, limit_bytes=3) == b"b\nc"
    path = rt.log_path(c)
    assert path.name == "0.log" and path.parent.name == "c" and path.is_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    partial = await rt.start_container(pod, sb, sh("printf 'x\\ny'", name="p", attempt=1))
    await wait_exited(rt, partial)
    assert await rt.read_log(partial, tail_lines=1) == b"y"
    assert rt.log_path(partial).name == "1.log"


async def test_follow_log_gives_the_tail_then_each_new_line_once(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, sh("echo a; echo b; sleep 0.5; echo c; sleep 0.3"))
    await wait_log(rt, c, b"b\n")
    async with asyncio.timeout(TIMEOUT):
        chunks = [chunk async for chunk in rt.follow_log(c, tail_lines=1)]
    assert b"".join(chunks) == b"b\nc\n"  # ends once the container has exited
    assert await rt.read_log(c) == b"a\nb\nc\n"


async def test_environment_is_minimal_and_ordered(
    rt: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYKUBELET_AGENT_SECRET", "leak")
    pod, sb = await new_pod(rt, name="envpod")
    env = [("B", "1"), ("A", "2"), ("B", "3"), ("HOME", "/home/x"), ("EMPTY", "")]
    c = await rt.start_container(pod, sb, config(command=["env"], env=env))
    await wait_exited(rt, c)
    lines = (await rt.read_log(c)).decode().splitlines()
    assert lines == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTNAME=envpod",
        "HOME=/home/x",
        "B=3",
        "A=2",
        "EMPTY=",
        f"PYKUBELET_CONTAINER_ID={c.id}",  # how a lost state file finds its process
    ]


async def test_args_alone_run_as_the_command(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, config("echo", "hello"))
    await wait_exited(rt, c)
    assert await rt.read_log(c) == b"hello\n"


async def test_working_dir(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    wd = tmp_path / "wd"
    wd.mkdir()
    given = await rt.start_container(pod, sb, config(command=["pwd"], working_dir=str(wd)))
    default = await rt.start_container(pod, sb, config(command=["pwd"], name="d"))
    await wait_exited(rt, given)
    await wait_exited(rt, default)
    assert await rt.read_log(given) == f"{wd}\n".encode()
    assert await rt.read_log(default) == f"{tmp_path}/runtime/process/{pod.uid}\n".encode()

    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, config("true", working_dir=str(tmp_path / "nope")))
    assert e.value.reason == "RunContainerError" and "nope" in e.value.message
    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, config("true", working_dir="relative/dir"))
    assert e.value.reason == "RunContainerError" and "absolute" in e.value.message


async def test_start_errors(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, config())
    assert e.value.reason == "CreateContainerConfigError"
    assert e.value.message == (
        "the process runtime needs command or args: there is no image entrypoint "
        "(image busybox:1.36 is not pulled)"
    )

    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, config(command=["no-such-program-pykubelet"]))
    assert e.value.reason == "RunContainerError"
    assert e.value.message == (
        'exec: "no-such-program-pykubelet": executable file not found in $PATH'
    )

    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, config(command=[str(tmp_path / "missing")]))
    assert e.value.reason == "RunContainerError" and "no such file" in e.value.message

    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, config(command=[str(script)]))
    assert e.value.reason == "RunContainerError" and "permission denied" in e.value.message

    got = await rt.get_pod(pod.uid)
    assert got is not None and got.containers == []

    other = make_pod("other")
    fake = RuntimeSandbox("x", other.uid, "other", "default", True, None, sb.created_at)
    with pytest.raises(RuntimeFailure):
        await rt.start_container(other, fake, sh("exit 0"))


# --- stop, leftovers, listeners -----------------------------------------------------------------


async def test_stop_with_sigterm(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, config("sleep", "60", command=[]))
    t0 = time.monotonic()
    await rt.stop_container(c, grace_seconds=30)
    assert time.monotonic() - t0 < 10  # SIGTERM honoured: far less than the grace period
    done = await current(rt, c)
    assert (done.state, done.exit_code, done.reason) == (ContainerRunState.EXITED, 143, "Error")
    assert c.pid is not None and gone(c.pid)
    await rt.stop_container(c, grace_seconds=30)  # idempotent
    await rt.stop_container(done, grace_seconds=0)


async def test_sigterm_ignored_means_sigkill_after_grace(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(
        pod, sb, sh("trap '' TERM; echo ready; while :; do sleep 0.1; done")
    )
    await wait_log(rt, c, b"ready")
    t0 = time.monotonic()
    await rt.stop_container(c, grace_seconds=0.5)
    assert time.monotonic() - t0 >= 0.5
    done = await current(rt, c)
    assert (done.exit_code, done.reason) == (137, "Error")


async def test_leftovers_of_the_group_are_killed(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, sh("sleep 60 & echo $!; exit 0"))
    done = await wait_exited(rt, c)
    assert done.exit_code == 0
    child = int((await rt.read_log(c)).split()[0])
    await wait_until(lambda: gone(child), "the background sleep to be killed")


async def test_listeners_on_start_and_exit(rt: ProcessRuntime) -> None:
    seen: list[str] = []

    def broken(uid: str) -> None:
        raise RuntimeError("a listener bug must not break the runtime")

    rt.add_listener(broken)
    rt.add_listener(seen.append)
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, sh("read x"))  # stdin is /dev/null: exits at once
    assert seen and seen[0] == pod.uid
    await wait_exited(rt, c)
    await wait_until(lambda: len(seen) >= 2, "the exit notification")
    assert set(seen) == {pod.uid}


# --- removal ------------------------------------------------------------------------------------


async def test_remove_container(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    running = await rt.start_container(pod, sb, config("sleep", "60"))
    with pytest.raises(RuntimeFailure, match="running"):
        await rt.remove_container(running)
    done = await rt.start_container(pod, sb, sh("echo bye", name="done"))
    await wait_exited(rt, done)
    state_file = tmp_path / "runtime/process" / pod.uid / f"{done.id}.json"
    assert state_file.exists() and rt.log_path(done).exists()
    await rt.remove_container(done)
    assert not state_file.exists() and not rt.log_path(done).exists()
    got = await rt.get_pod(pod.uid)
    assert got is not None and [c.id for c in got.containers] == [running.id]
    await rt.remove_container(done)  # idempotent


async def test_remove_pod_kills_and_deletes(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    a = await rt.start_container(pod, sb, sh("sleep 60 & echo $!; wait", name="a"))
    b = await rt.start_container(pod, sb, sh("trap '' TERM; echo ready; sleep 60", name="b"))
    await wait_log(rt, a, b"\n")
    await wait_log(rt, b, b"ready")
    child = int((await rt.read_log(a)).split()[0])
    await rt.remove_pod(pod.uid)
    assert await rt.get_pod(pod.uid) is None
    assert not (tmp_path / "runtime/process" / pod.uid).exists()
    pids = [p for p in (a.pid, b.pid, child) if p is not None]
    assert len(pids) == 3
    await wait_until(lambda: all(gone(p) for p in pids), "the processes of the pod to die")
    await rt.remove_pod(pod.uid)  # idempotent


# --- adoption -----------------------------------------------------------------------------------


WAIT_FOR_GO = "echo started; while [ ! -e go ]; do sleep 0.05; done; exit 3"


async def test_adoption_in_the_same_process(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    a = ProcessRuntime(tmp_path)
    await a.start()
    pod, sb = await new_pod(a)
    waiter = await a.start_container(pod, sb, sh(WAIT_FOR_GO, name="w", working_dir=str(wd)))
    sleeper = await a.start_container(pod, sb, config("sleep", "60", name="s"))
    await wait_log(a, waiter, b"started")
    await a.close()

    b = ProcessRuntime(tmp_path)
    events: list[str] = []
    b.add_listener(events.append)
    try:
        await b.start()
        got = await b.get_pod(pod.uid)
        assert got is not None and got.sandbox is not None and got.sandbox.id == sb.id
        by_id = {c.id: c for c in got.containers}
        for c in (waiter, sleeper):
            assert by_id[c.id].state is ContainerRunState.RUNNING
            assert by_id[c.id].pid == c.pid
        assert (await b.read_log(waiter)).count(b"started") == 1  # not started a second time

        (wd / "go").touch()
        done = await wait_exited(b, waiter)
        # Started by a spawn server of the first runtime, which went with it: the status is
        # unknown, as after the agent's own exit (below), though this is the same process.
        assert (done.exit_code, done.reason) == (UNKNOWN_EXIT_CODE, UNKNOWN_REASON)
        await wait_until(lambda: pod.uid in events, "the exit notification")

        await b.stop_container(sleeper, grace_seconds=10)
        stopped = await current(b, sleeper)
        assert stopped.state is ContainerRunState.EXITED and stopped.reason == UNKNOWN_REASON
    finally:
        for p in await b.list_pods():
            await b.remove_pod(p.uid)
        await b.close()


AGENT = """
import asyncio, json, sys
from pathlib import Path
from pykubelet.api.model import Pod
from pykubelet.runtime.base import ContainerConfig
from pykubelet.runtime.process.runtime import ProcessRuntime

async def main() -> None:
    root, wd = Path(sys.argv[1]), sys.argv[2]
    rt = ProcessRuntime(root)
    await rt.start()
    pod = Pod.model_validate({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}})
    sb = await rt.run_sandbox(pod)
    out = {}
    for name, argv in [("w", ["/bin/sh", "-c", sys.argv[3]]), ("s", ["sleep", "60"])]:
        cfg = ContainerConfig(name, "img", argv, [], [], wd, 0, "h", "Never")
        c = await rt.start_container(pod, sb, cfg)
        out[name] = [c.id, c.pid]
    await rt.close()
    print(json.dumps(out))

asyncio.run(main())
"""


async def test_adoption_after_the_agent_exited(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(pykubelet.__file__).parents[1])}
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", AGENT, str(tmp_path), str(wd), WAIT_FOR_GO],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    started = json.loads(proc.stdout)
    pids = [pid for _, pid in started.values()]

    b = ProcessRuntime(tmp_path)
    try:
        await b.start()
        got = await b.get_pod("u1")
        assert got is not None and (got.name, got.namespace) == ("p", "ns")
        by_name = {c.name: c for c in got.containers}
        for name, (cid, pid) in started.items():  # they outlived the agent that started them
            assert (by_name[name].id, by_name[name].pid) == (cid, pid)
            assert by_name[name].state is ContainerRunState.RUNNING

        (wd / "go").touch()
        done = await wait_exited(b, by_name["w"])
        assert (done.exit_code, done.reason, done.message) == (
            UNKNOWN_EXIT_CODE,
            UNKNOWN_REASON,
            UNKNOWN_MESSAGE,
        )

        await b.stop_container(by_name["s"], grace_seconds=10)
        stopped = await current(b, by_name["s"])
        assert stopped.state is ContainerRunState.EXITED and stopped.reason == UNKNOWN_REASON
        await wait_until(lambda: gone(pids[1]), "the adopted sleep to die")
    finally:
        for pid in pids:
            kill_quietly(pid)
        await b.close()


async def test_gone_or_recycled_pid_at_start_is_an_unknown_exit(tmp_path: Path) -> None:
    a = ProcessRuntime(tmp_path)
    await a.start()
    pod, sb = await new_pod(a)
    recycled = await a.start_container(pod, sb, config("sleep", "60", name="recycled"))
    vanished = await a.start_container(pod, sb, config("sleep", "60", name="vanished"))
    await a.close()
    pod_dir = tmp_path / "runtime/process" / pod.uid
    assert recycled.pid is not None and vanished.pid is not None

    # "recycled": its pid now seems to belong to a process started at another time.
    path = pod_dir / f"{recycled.id}.json"
    data = json.loads(path.read_text())
    data["proc_start_time"] += 1
    path.write_text(json.dumps(data))
    # "vanished": its pid is that of a process that has exited and been reaped.
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    path = pod_dir / f"{vanished.id}.json"
    data = json.loads(path.read_text())
    data["pid"] = dead.pid
    path.write_text(json.dumps(data))

    b = ProcessRuntime(tmp_path)
    try:
        await b.start()
        for c in (recycled, vanished):
            done = await wait_exited(b, c)
            assert (done.exit_code, done.reason, done.message) == (
                UNKNOWN_EXIT_CODE,
                UNKNOWN_REASON,
                UNKNOWN_MESSAGE,
            )
        # The process now behind the recycled pid is not ours: it must not have been touched.
        await asyncio.sleep(0.2)
        assert not gone(recycled.pid)
        await b.close()

        # The verdict was written down.
        reloaded = ProcessRuntime(tmp_path)
        await reloaded.start()
        again = await current(reloaded, recycled)
        assert again.state is ContainerRunState.EXITED and again.reason == UNKNOWN_REASON
        await reloaded.close()
    finally:
        kill_quietly(recycled.pid, reap=True)
        kill_quietly(vanished.pid, reap=True)


async def test_corrupt_state_files_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = ProcessRuntime(tmp_path)
    await a.start()
    pod, sb = await new_pod(a)
    good = await a.start_container(pod, sb, sh("exit 0"))
    await wait_exited(a, good)
    await a.close()
    root = tmp_path / "runtime/process"
    (root / pod.uid / f"{uuid.uuid4().hex}.json").write_bytes(b"{not json")
    (root / pod.uid / "deadbeef.json").write_text(json.dumps({"version": 1, "id": "deadbeef"}))
    (root / pod.uid / ".x.json.123.tmp").write_text("half-written")
    broken = root / "broken-pod"
    broken.mkdir()
    (broken / "sandbox.json").write_text("")

    b = ProcessRuntime(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pykubelet.runtime.process.records"):
        await b.start()
    assert sum("corrupt state file" in r.getMessage() for r in caplog.records) == 3
    got = await b.get_pod(pod.uid)
    assert got is not None and [c.id for c in got.containers] == [good.id]
    assert not (root / pod.uid / ".x.json.123.tmp").exists()
    # Listed without a sandbox, so that housekeeping can remove it.
    listed = await b.get_pod("broken-pod")
    assert listed is not None and listed.sandbox is None
    await b.remove_pod("broken-pod")
    assert not broken.exists()
    await b.close()


def _running_with(argument: str) -> list[int]:
    """The pids of processes whose command line has `argument`."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if argument.encode() in words and state != "Z":
                pids.append(int(entry))
    return pids


async def test_a_start_cancelled_while_it_forks_leaves_nothing_unrecorded(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    """A kill cancels the sync while the start's thread forks: what the thread started is
    killed and reaped, and its marker goes; a start that finished is a recorded container."""
    pod, sb = await new_pod(rt)
    argument = f"3600.{uuid.uuid4().int % 10**9:09d}"  # GNU sleep takes a fraction
    for i, delay in enumerate((0.0, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02)):
        task = asyncio.create_task(
            rt.start_container(pod, sb, config("sleep", argument, name=f"c{i}"))
        )
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    got = await rt.get_pod(pod.uid)
    assert got is not None
    recorded = {c.pid for c in got.containers if c.state is ContainerRunState.RUNNING}
    assert set(_running_with(argument)) == recorded
    pod_dir = tmp_path / "runtime" / "process" / pod.uid
    assert not list(pod_dir.glob("*.starting"))


async def test_a_container_forked_but_never_recorded_is_killed_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The agent killed between the fork and the state file: its marker remains, no state."""
    a = ProcessRuntime(tmp_path)
    await a.start()
    pod, sb = await new_pod(a)
    orphan = await a.start_container(pod, sb, config("sleep", "60", name="s"))
    kept = await a.start_container(pod, sb, config("sleep", "61", name="k"))
    pod_dir = tmp_path / "runtime" / "process" / pod.uid
    assert not list(pod_dir.glob("*.starting"))  # removed once the state file is written
    await a.close()
    # As the agent would have left it: the marker written, the state file not yet.
    (pod_dir / f"{orphan.id}.json").unlink()
    (pod_dir / f"{orphan.id}.starting").touch()
    assert orphan.pid is not None

    b = ProcessRuntime(tmp_path)
    try:
        await b.start()
        pid = orphan.pid
        await wait_until(lambda: gone(pid), "the orphan killed")
        got = await b.get_pod(pod.uid)
        assert got is not None and [c.id for c in got.containers] == [kept.id]
        assert not (pod_dir / f"{orphan.id}.starting").exists()
    finally:
        for p in await b.list_pods():
            await b.remove_pod(p.uid)
        await b.close()
