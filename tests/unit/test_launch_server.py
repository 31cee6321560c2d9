"""The launch server: the containers that need a launcher are forked by a long-lived process (one
while they start one by one, a few when they start together), their exit codes still known; a
server that dies is started again, and what it had started runs on (its exit code unknown, as
after a restart of the agent). A container that asks for mounts alone is spawned by a spawn
server (asked from the loop) into a mount namespace it made, the server back in the agent's;
without spawn servers, by a launch server, back in its own."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from pykubelet.runtime.base import ContainerRunState, Mount, StartError
from pykubelet.runtime.process.launchserver import LAUNCH_SERVERS
from pykubelet.runtime.process.runtime import UNKNOWN_REASON, ProcessRuntime
from tests.unit.test_process_launcher import LAUNCHED, with_
from tests.unit.test_process_runtime import (
    config,
    current,
    kill_quietly,
    new_pod,
    sh,
    wait_exited,
    wait_until,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's features need root")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def servers(spawn: bool = False) -> list[int]:
    """This process's live launch servers, or with `spawn` its spawn servers (started
    --in-agent-namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            at = next(i for i, a in enumerate(argv) if a.endswith(b"/launchserver_main.py"))
            kind = b"--in-agent-namespace" in argv[at + 1 :]
            mine = parent_of(int(entry)) == os.getpid() and state_of(int(entry)) != "Z"
            if kind == spawn and mine:
                found.append(int(entry))
        except (OSError, IndexError, ValueError, StopIteration):
            continue
    return found


async def test_launched_containers_are_forked_by_one_server_and_their_exits_known(
    rt: ProcessRuntime,
) -> None:
    pod, sb = await new_pod(rt)
    first = await rt.start_container(pod, sb, with_(sh("exit 3", name="a"), **LAUNCHED))
    second = await rt.start_container(pod, sb, with_(sh("sleep 300", name="b"), **LAUNCHED))
    [server] = servers()
    assert second.pid is not None and parent_of(second.pid) == server
    got = await wait_exited(rt, first)
    assert (got.exit_code, got.reason) == (3, "Error")
    kill_quietly(second.pid)
    got = await wait_exited(rt, second)
    assert (got.exit_code, got.reason) == (128 + signal.SIGKILL, "Error")
    assert servers() == [server]


async def test_a_server_that_died_is_started_again(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    before = await rt.start_container(pod, sb, with_(sh("sleep 300", name="a"), **LAUNCHED))
    [server] = servers()
    os.kill(server, signal.SIGKILL)
    await wait_until(lambda: state_of(server) == "Z", "the server to be killed")
    after = await rt.start_container(pod, sb, with_(sh("exit 4", name="b"), **LAUNCHED))
    got = await wait_exited(rt, after)
    assert (got.exit_code, got.reason) == (4, "Error")
    assert servers() not in ([], [server])
    # Its first server's child ran on; its status went with that server.
    assert before.pid is not None
    assert (await current(rt, before)).state is ContainerRunState.RUNNING
    kill_quietly(before.pid)
    got = await wait_exited(rt, before)
    assert got.reason == UNKNOWN_REASON


async def test_containers_started_together_are_forked_by_a_few_servers_their_exits_known(
    rt: ProcessRuntime,
) -> None:
    pods = [await new_pod(rt, f"pod{i}") for i in range(12)]  # one pod's starts are serialized
    started = await asyncio.gather(
        *(
            rt.start_container(pod, sb, with_(sh(f"exit {10 + i}", name="c"), **LAUNCHED))
            for i, (pod, sb) in enumerate(pods)
        )
    )
    running = servers()
    assert 1 <= len(running) <= LAUNCH_SERVERS, running
    for i, container in enumerate(started):
        # Each exit is asked of the server that forked it.
        got = await wait_exited(rt, container)
        assert (got.exit_code, got.reason) == (10 + i, "Error")


async def mounts_alone(rt: ProcessRuntime, tmp_path: Path) -> int:
    """Containers that ask for their mounts alone, started (and two failing to) as a user
    sees them, each in a namespace of its own with the volume; the pid of the server that
    started the first."""
    pod, sb = await new_pod(rt)
    (tmp_path / "volume").mkdir()
    (tmp_path / "volume" / "data").write_text("in the volume\n")
    mounts = [Mount(str(tmp_path / "volume"), str(tmp_path / "at"), read_only=True)]
    script = "cat at/data; exec sleep 300"
    first = await rt.start_container(
        pod, sb, with_(sh(script, name="a", working_dir=str(tmp_path)), mounts=mounts)
    )
    assert first.pid is not None
    parent = parent_of(first.pid)
    assert os.readlink(f"/proc/{first.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    # A start that fails in its namespace leaves the server ready for the next.
    with pytest.raises(StartError) as e:
        cfg = config(command=["no-such-program-pykubelet"], name="b")
        await rt.start_container(pod, sb, with_(cfg, mounts=mounts))
    assert "executable file not found" in e.value.message
    with pytest.raises(StartError) as e:
        missing = [Mount(str(tmp_path / "gone"), str(tmp_path / "at"))]
        await rt.start_container(pod, sb, with_(sh("true", name="d"), mounts=missing))
    assert (
        e.value.message
        == f"cannot mount {tmp_path}/gone at {tmp_path}/at: {tmp_path}/gone is missing"
    )
    pod_dir = tmp_path / "runtime" / "process" / pod.uid
    assert pod_dir.is_dir() and list(pod_dir.glob("*.starting")) == []  # the failures' gone
    second = await rt.start_container(
        pod, sb, with_(sh("cat at/data", name="c", working_dir=str(tmp_path)), mounts=mounts)
    )
    got = await wait_exited(rt, second)
    assert got.exit_code == 0 and await rt.read_log(second) == b"in the volume\n"
    # The volume was in the containers' namespaces alone.
    assert list((tmp_path / "at").iterdir()) == []
    assert await rt.read_log(first) == b"in the volume\n"
    kill_quietly(first.pid)
    got = await wait_exited(rt, first)
    assert (got.exit_code, got.reason) == (128 + signal.SIGKILL, "Error")
    return parent


async def test_a_container_with_mounts_alone_is_spawned_by_a_spawn_server_in_its_namespace(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    """Asked from the loop: the spawn server makes its namespace and stays in the agent's."""
    await wait_until(lambda: len(servers(spawn=True)) == 2, "the spawn servers to start")
    parent = await mounts_alone(rt, tmp_path)
    spawners = servers(spawn=True)
    assert parent in spawners and servers() == []
    for server in spawners:
        assert os.readlink(f"/proc/{server}/ns/mnt") == os.readlink("/proc/self/ns/mnt")


async def test_without_spawn_servers_the_launch_server_spawns_it_in_its_own_namespace(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    await wait_until(lambda: len(servers(spawn=True)) == 2, "the spawn servers to start")
    for server in servers(spawn=True):
        os.kill(server, signal.SIGKILL)  # given up for a minute: the agent does without
    await wait_until(lambda: servers(spawn=True) == [], "the spawn servers to die")
    parent = await mounts_alone(rt, tmp_path)
    assert servers() == [parent]
    # Back in its own namespace, the agent's without the pods' volumes.
    assert os.readlink(f"/proc/{parent}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
