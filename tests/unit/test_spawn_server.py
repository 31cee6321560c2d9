"""The spawn servers: plain containers started by a server process asked from the event loop,
requests pipelined and each answer reaching its own caller; the files a start makes, its
failures told step by step, a caller cancelled never leaving a process behind, and a server
that dies or does not answer given up (what it may have started killed by its tag) and
started again a while later."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from pykubelet.runtime.process import spawnserver
from pykubelet.runtime.process.launchserver import SERVER_ARGV
from pykubelet.runtime.process.processes import ID_VARIABLE, readable
from pykubelet.runtime.process.spawnserver import (
    REQUEST_BYTES,
    LaunchFailed,
    RequestTooLarge,
    ServerUnavailable,
    SpawnFailed,
    SpawnServers,
)
from tests.unit.test_process_runtime import gone, kill_quietly, wait_until

ENV = {"PATH": "/usr/bin:/bin"}


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def children_of_servers() -> list[int]:
    """The live children of this process's spawn servers (what a test left running)."""
    servers, children = set(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"launchserver_main.py" in cmdline and parent_of(int(entry)) == os.getpid():
                servers.add(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if parent_of(int(entry)) in servers:
                children.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return children


def running(argv: list[str]) -> list[int]:
    """The live processes (not zombies) running exactly `argv`."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (
                Path(f"/proc/{entry}/cmdline").read_bytes() == wanted
                and state_of(int(entry)) != "Z"
            ):
                found.append(int(entry))
        except OSError:
            continue
    return found


class Pod:
    """A pod's directory with its sandbox record, and where a container's files go."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "pod"
        self.dir.mkdir()
        self.record = self.dir / "sandbox.json"
        self.record.write_text("{}")
        self.logs = root / "logs"

    def args(
        self, name: str, argv: list[str], cwd: str = "/"
    ) -> tuple[str, str, str, str, list[str], dict[str, str], str]:
        """`SpawnServers.spawn`'s arguments for container `name` (its id, and its tag)."""
        marker = str(self.dir / f"{name}.starting")
        log = str(self.logs / name / "0.log")
        env = {**ENV, ID_VARIABLE: f"{self.dir.parent.name}-{name}"}
        return (env[ID_VARIABLE], marker, str(self.record), log, argv, env, cwd)


@pytest.fixture
async def spawns() -> AsyncIterator[SpawnServers]:
    servers = SpawnServers(SERVER_ARGV, ENV)
    try:
        yield servers
    finally:
        for pid in children_of_servers():
            kill_quietly(pid)
        servers.detach()
        await asyncio.to_thread(servers.close)


async def test_a_container_is_started_with_its_files_and_its_exit_is_known(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    pod = Pod(tmp_path)
    pid = await spawns.spawn(*pod.args("a", ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"]))
    assert spawns.owns(pid) and parent_of(pid) != os.getpid()  # the server's child
    marker = pod.dir / "a.starting"
    assert marker.exists() and os.path.samefile(marker, pod.record)  # a link: no new inode
    await wait_until(lambda: state_of(pid) == "Z", "the container to exit")  # kept until reaped
    status = await spawns.reap(pid)
    assert status is not None and os.waitstatus_to_exitcode(status) == 3
    assert not spawns.owns(pid)
    assert (pod.logs / "a" / "0.log").read_text() == "out\nerr\n"
    assert oct((pod.logs / "a").stat().st_mode & 0o777) == "0o700"


async def test_a_container_leads_its_session_with_stdin_from_dev_null(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    pod = Pod(tmp_path)
    script = "readlink /proc/self/fd/0; cat; cut -d' ' -f6 /proc/$$/stat; echo $$; exec sleep 60"
    pid = await spawns.spawn(*pod.args("s", ["/bin/sh", "-c", script]))
    log = pod.logs / "s" / "0.log"
    await wait_until(lambda: log.read_text().count("\n") >= 3, "the container's lines")
    stdin, sid, own = log.read_text().split()
    assert (stdin, int(sid), int(own)) == ("/dev/null", pid, pid)


async def test_requests_in_flight_together_each_get_their_own_answer(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    pod = Pod(tmp_path)
    argvs = [["sleep", f"60.{i:03d}"] for i in range(40)]
    pids = await asyncio.gather(
        *(spawns.spawn(*pod.args(f"c{i}", argv)) for i, argv in enumerate(argvs))
    )
    for pid, argv in zip(pids, argvs, strict=True):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        assert [a.decode() for a in cmdline] == argv
    parents = {parent_of(pid) for pid in pids}
    assert 1 <= len(parents) <= 2  # at most SPAWN_SERVERS servers


async def test_each_failure_says_at_which_step_and_why(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    pod = Pod(tmp_path)
    with pytest.raises(SpawnFailed) as missing:
        await spawns.spawn(*pod.args("a", ["no-such-program-here"]))
    assert missing.value.stage == "exec" and isinstance(missing.value.error, FileNotFoundError)

    with pytest.raises(SpawnFailed) as no_cwd:
        await spawns.spawn(*pod.args("b", ["true"], cwd=str(tmp_path / "gone")))
    assert no_cwd.value.stage == "cwd"

    (pod.logs / "c").mkdir(parents=True)
    (pod.logs / "c" / "0.log").mkdir()  # a directory where the log file goes
    with pytest.raises(SpawnFailed) as no_log:
        await spawns.spawn(*pod.args("c", ["true"]))
    assert no_log.value.stage == "log" and isinstance(no_log.value.error, IsADirectoryError)

    tag, marker, record, log, argv, env, cwd = pod.args("d", ["true"])
    with pytest.raises(SpawnFailed) as bad_env:
        await spawns.spawn(tag, marker, record, log, argv, {"A=B": "c"}, cwd)
    assert (bad_env.value.stage, bad_env.value.error) == (
        "value",
        "illegal environment variable name",
    )

    with pytest.raises(SpawnFailed) as no_marker:
        await spawns.spawn(tag, str(tmp_path / "none" / "e.starting"), record, log, argv, env, cwd)
    assert no_marker.value.stage == "marker"
    assert isinstance(no_marker.value.error, FileNotFoundError)


async def test_a_request_too_long_for_one_message_is_refused_before_it_is_sent(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    pod = Pod(tmp_path)
    tag, marker, record, log, argv, _, cwd = pod.args("a", ["true"])
    with pytest.raises(RequestTooLarge):
        await spawns.spawn(tag, marker, record, log, argv, {"BIG": "x" * REQUEST_BYTES}, cwd)
    assert not Path(marker).exists()


async def test_a_cancelled_caller_leaves_no_process_behind(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    pod = Pod(tmp_path)
    await spawns.spawn(*pod.args("warm", ["true"]))  # the server runs: the next request is sent
    task = asyncio.ensure_future(spawns.spawn(*pod.args("a", ["sleep", "60.424242"])))
    await asyncio.sleep(0)  # sent: the server is spawning it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert running(["sleep", "60.424242"]) == []


async def test_a_server_that_dies_is_given_up_for_a_while_then_started_again(
    spawns: SpawnServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = Pod(tmp_path)
    first = await spawns.spawn(*pod.args("a", ["sleep", "60"]))
    server = parent_of(first)
    os.kill(server, signal.SIGSTOP)  # requests sent to it now wait
    try:
        waiting = asyncio.ensure_future(spawns.spawn(*pod.args("b", ["sleep", "61"])))
        await asyncio.sleep(0.2)
        assert not waiting.done()
    finally:
        os.kill(server, signal.SIGKILL)
    with pytest.raises(ServerUnavailable):  # nothing of "b" runs: the caller starts it
        await waiting
    # What it had started runs on, its exit code now unknown (init's child).
    await wait_until(lambda: parent_of(first) != server, "the container to be reparented")
    assert not spawns.owns(first) and await spawns.reap(first) is None
    with pytest.raises(ServerUnavailable, match="a moment ago"):
        await spawns.spawn(*pod.args("c", ["sleep", "62"]))
    monkeypatch.setattr(spawnserver, "RETRY_SECONDS", 0.0)
    again = await spawns.spawn(*pod.args("c", ["sleep", "62"]))
    assert parent_of(again) not in (server, os.getpid())
    kill_quietly(first)
    await wait_until(lambda: gone(first), "the first container to go")


async def test_a_request_whose_answer_is_lost_leaves_nothing_of_it_running(
    spawns: SpawnServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No answer in time (here: at once): the server is given up, and the container it may
    have started is killed by its tag before the caller is told to start it itself."""
    pod = Pod(tmp_path)
    await spawns.spawn(*pod.args("warm", ["true"]))
    monkeypatch.setattr(spawnserver, "ANSWER_TIMEOUT", 0.0)
    args = pod.args("lost", ["sleep", "60.737373"])
    with pytest.raises(ServerUnavailable):
        await spawns.spawn(*args)
    assert running(["sleep", "60.737373"]) == []


async def test_a_server_that_cannot_start_is_not_tried_again_at_once(tmp_path: Path) -> None:
    spawns = SpawnServers([str(tmp_path / "no-such-python")], ENV)
    pod = Pod(tmp_path)
    try:
        with pytest.raises(ServerUnavailable) as first:
            await spawns.spawn(*pod.args("a", ["true"]))
        assert "cannot start the spawn server" in str(first.value)
        with pytest.raises(ServerUnavailable) as second:
            await spawns.spawn(*pod.args("b", ["true"]))
        assert "a moment ago" in str(second.value)
    finally:
        spawns.detach()
        await asyncio.to_thread(spawns.close)


def mounted(source: str, target: str, argv: list[str], cwd: str = "/") -> dict[str, Any]:
    """A launcher's instructions for a container that asks for one bind alone."""
    return {
        "cgroups": [],
        "mounts": [{"source": source, "target": target, "read_only": True}],
        "read_only_root": False,
        "uid": None,
        "gid": None,
        "groups": None,
        "cwd": cwd,
        "argv": argv,
        "env": dict(ENV),
        "home_of_user": True,
        "tty": False,
        "no_new_privs": False,
        "capabilities": None,
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
async def test_a_launch_that_fails_says_why_and_the_server_serves_on(
    spawns: SpawnServers, tmp_path: Path
) -> None:
    """However long the reason (a missing source's path twice), the answer is read whole: the
    server is not given up, and its next start is its own."""
    pod = Pod(tmp_path)
    missing = str(tmp_path.joinpath(*[c * 200 for c in "defghijklm"]) / "gone")
    tag, marker, record, log, *_ = pod.args("a", ["true"])
    instructions = mounted(missing, str(tmp_path / "at"), ["true"])
    with pytest.raises(LaunchFailed) as failed:
        await spawns.launch(tag, marker, record, log, instructions)
    assert failed.value.report["message"] == (
        f"cannot mount {missing} at {tmp_path / 'at'}: {missing} is missing"
    )
    (tmp_path / "volume").mkdir()
    (tmp_path / "volume" / "data").write_text("in the volume\n")
    (tmp_path / "at").mkdir()
    tag, marker, record, log, *_ = pod.args("b", ["cat", "at/data"])
    instructions = mounted(
        str(tmp_path / "volume"), str(tmp_path / "at"), ["cat", "at/data"], str(tmp_path)
    )
    pid = await spawns.launch(tag, marker, record, log, instructions)
    assert spawns.owns(pid)
    pidfd = os.pidfd_open(pid)
    try:
        await readable(pidfd)
    finally:
        os.close(pidfd)
    assert await spawns.reap(pid) == 0
    assert Path(log).read_text() == "in the volume\n" and Path(marker).exists()
    assert list((tmp_path / "at").iterdir()) == []  # mounted in the container's namespace alone


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
async def test_a_cancelled_or_lost_launch_leaves_no_process_behind(
    spawns: SpawnServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = Pod(tmp_path)
    (tmp_path / "volume").mkdir()
    (tmp_path / "at").mkdir()

    def launch(name: str, argv: list[str]) -> Awaitable[int]:
        tag, marker, record, log, *_ = pod.args(name, argv)
        instructions = mounted(str(tmp_path / "volume"), str(tmp_path / "at"), argv)
        instructions["env"][ID_VARIABLE] = tag  # what a lost request's container is found by
        return spawns.launch(tag, marker, record, log, instructions)

    await spawns.spawn(*pod.args("warm", ["true"]))  # the server runs: the next request is sent
    task = asyncio.ensure_future(launch("a", ["sleep", "60.515151"]))
    await asyncio.sleep(0)  # sent: the server is spawning it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert running(["sleep", "60.515151"]) == []

    # No answer in time (here: at once): the server is given up, and what it may have
    # started is killed by its tag before the caller is told to start it itself.
    monkeypatch.setattr(spawnserver, "ANSWER_TIMEOUT", 0.0)
    with pytest.raises(ServerUnavailable):
        await launch("b", ["sleep", "60.525252"])
    assert running(["sleep", "60.525252"]) == []
