"""The process runtime's launcher, through ProcessRuntime: mounts, users, its start errors."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import uuid
from pathlib import Path

import pytest

from pykubelet.runtime.base import STDOUT, ContainerConfig, ContainerRunState, Mount, StartError
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.unit.test_process_runtime import (
    config,
    current,
    kill_quietly,
    new_pod,
    sh,
    wait_exited,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's features need root")


def with_(c: ContainerConfig, **changes: object) -> ContainerConfig:
    return dataclasses.replace(c, **changes)  # type: ignore[arg-type]


def proc_file(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


# A supplemental group is the cheapest way to route a container through a forked launcher.
LAUNCHED: dict[str, object] = {"supplemental_groups": [4321]}


@pytest.fixture(params=["forked", "spawned"])
def route(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    """The changes that start a container through a launcher the launch server forks, or (mounts
    alone) through the server itself, which spawns the command into a namespace it made."""
    if request.param == "forked":
        return LAUNCHED
    (tmp_path / "volume").mkdir()
    return {"mounts": [Mount(str(tmp_path / "volume"), str(tmp_path / "mounted"))]}


async def test_launcher_reports_exec_errors_as_plain_starts_do(
    rt: ProcessRuntime, tmp_path: Path, route: dict[str, object]
) -> None:
    pod, sb = await new_pod(rt)
    with pytest.raises(StartError) as e:
        await rt.start_container(
            pod, sb, with_(config(command=["no-such-program-pykubelet"]), **route)
        )
    assert (e.value.reason, e.value.message) == (
        "RunContainerError",
        'exec: "no-such-program-pykubelet": executable file not found in $PATH',
    )
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, with_(config(command=[str(script)]), **route))
    assert e.value.reason == "RunContainerError" and "permission denied" in e.value.message
    with pytest.raises(StartError) as e:
        cfg = config("true", command=["/bin/sh"], working_dir=str(tmp_path / "nope"))
        await rt.start_container(pod, sb, with_(cfg, **route))
    assert (e.value.reason, e.value.message) == (
        "RunContainerError",
        f'the working directory "{tmp_path}/nope" does not exist',
    )
    with pytest.raises(StartError) as e:
        mount = Mount(str(tmp_path / "missing-source"), str(tmp_path / "m"))
        await rt.start_container(pod, sb, with_(sh("true"), mounts=[mount]))
    assert e.value.reason == "RunContainerError" and "missing-source is missing" in e.value.message
    got = await rt.get_pod(pod.uid)
    assert got is not None and got.containers == []  # nothing recorded, nothing left running


async def test_a_launched_container_starts_with_the_signals_and_fds_of_a_plain_one(
    rt: ProcessRuntime, route: dict[str, object]
) -> None:
    """As runc starts a container: the launcher's Python ignores SIGPIPE and SIGXFSZ, and an
    exec'd command would inherit that (`yes | head` would never end). It gets what a command
    exec'd directly gets (Popen's restore_signals): no signal blocked, SIGPIPE and SIGXFSZ at
    their defaults, and whatever the agent itself was started with ignored (nohup's SIGHUP).
    Its open files are its stdio alone, as a plain container's."""
    script = "grep -E '^Sig(Ign|Blk)' /proc/self/status; yes | head -n 1; ls /proc/$$/fd"
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", script, stdout=asyncio.subprocess.PIPE
    )
    plain, _ = await proc.communicate()
    pipe_and_xfsz = (1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))
    assert int(plain.split(b"SigIgn:\t")[1][:16], 16) & pipe_and_xfsz == 0
    assert plain.split()[-3:] == [b"0", b"1", b"2"]
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, with_(sh(script), **route))
    done = await wait_exited(rt, c)
    assert done.exit_code == 0, await rt.read_log(c)
    assert await rt.read_log(c) == plain


def processes_running(argv: list[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = proc_file(int(entry), "cmdline").split(b"\0")[:-1]
            except OSError:
                continue
            if cmdline == [a.encode() for a in argv]:
                found.append(int(entry))
    return found


async def test_a_start_cancelled_while_its_launcher_forks_leaves_nothing_unrecorded(
    rt: ProcessRuntime, route: dict[str, object]
) -> None:
    """The launcher forks in a thread; a kill that cancels the start meanwhile (pod workers do)
    must find the container either recorded or gone once the start is over, never running
    unknown to the runtime (nor coming up later)."""
    pod, sb = await new_pod(rt)
    argv = ["sleep", f"61.{uuid.uuid4().int % 10**6}"]
    cfg = with_(config(command=argv), **route)

    async def recorded() -> set[int | None]:
        got = await rt.get_pod(pod.uid)
        running = ContainerRunState.RUNNING
        return {c.pid for c in (got.containers if got else []) if c.state is running}

    for delay in (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02):
        task = asyncio.create_task(rt.start_container(pod, sb, cfg))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, StartError):
            await task
        assert set(processes_running(argv)) <= await recorded()  # at once: nothing to come
    await asyncio.sleep(0.3)
    assert set(processes_running(argv)) == await recorded()


async def test_bind_mounts_rw_ro_and_file(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    src_rw, src_ro = tmp_path / "rw", tmp_path / "ro"
    src_rw.mkdir()
    src_ro.mkdir()
    (src_ro / "data").write_text("from the host\n")
    src_file = tmp_path / "one.conf"
    src_file.write_text("key=value\n")
    inside = tmp_path / "inside"  # no mount points exist yet: the launcher creates them
    mounts = [
        Mount(str(src_rw), str(inside / "rw")),
        Mount(str(src_ro), str(inside / "ro"), read_only=True),
        Mount(str(src_file), str(inside / "etc" / "one.conf"), read_only=True),
    ]
    script = (
        "cat ro/data etc/one.conf; echo written > rw/out; "
        "touch ro/x 2>/dev/null || echo ro-refused; "
        "{ echo more >> etc/one.conf; } 2>/dev/null || echo file-refused"
    )
    c = await rt.start_container(pod, sb, with_(sh(script, working_dir=str(inside)), mounts=mounts))
    done = await wait_exited(rt, c)
    assert done.exit_code == 0, await rt.read_log(c)
    assert await rt.read_log(c) == b"from the host\nkey=value\nro-refused\nfile-refused\n"
    assert (src_rw / "out").read_text() == "written\n"
    assert not (src_ro / "x").exists() and src_file.read_text() == "key=value\n"
    # The mounts lived in the container's namespace only; the created mount points stay, empty.
    assert list((inside / "rw").iterdir()) == [] and list((inside / "ro").iterdir()) == []
    assert (inside / "etc" / "one.conf").read_text() == ""


async def test_read_only_root_filesystem(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    data = tmp_path / "data"
    data.mkdir()
    probe = tmp_path / "on-root"
    # The binds stay writable; their mount points are made before / turns read-only.
    mounts = [Mount(str(data), str(tmp_path / "mnt"))]
    script = f"touch {probe} 2>/dev/null || echo root-refused; echo ok > {tmp_path}/mnt/f"
    c = await rt.start_container(
        pod, sb, with_(sh(script), read_only_root_filesystem=True, mounts=mounts)
    )
    done = await wait_exited(rt, c)
    log = await rt.read_log(c)
    assert done.exit_code == 0, log
    assert log == b"root-refused\n" and not probe.exists()
    assert (data / "f").read_text() == "ok\n"


async def test_run_as_user_group_and_supplemental_groups(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(
        pod,
        sb,
        with_(
            sh("id -u; id -g; id -G; pwd"),
            run_as_user=65534,
            run_as_group=4000,
            supplemental_groups=[4001, 4002],
        ),
    )
    done = await wait_exited(rt, c)
    log = (await rt.read_log(c)).decode().splitlines()
    assert done.exit_code == 0, log
    assert log[:2] == ["65534", "4000"]
    assert sorted(log[2].split()) == ["4000", "4001", "4002"]
    # The default working directory (the pod's, 0700 root) was entered before dropping root.
    assert log[3].endswith(pod.uid)

    # runAsUser alone takes the user's primary group from /etc/passwd, as runc does.
    only_user = await rt.start_container(
        pod, sb, with_(sh("id -u; id -g; echo $HOME", name="u"), run_as_user=65534)
    )
    await wait_exited(rt, only_user)
    # HOME too is the user's (nobody's is /nonexistent on Debian), unless the manifest sets it.
    assert await rt.read_log(only_user) == b"65534\n65534\n/nonexistent\n"
    given = await rt.start_container(
        pod, sb, with_(sh("echo $HOME", name="h"), run_as_user=65534, env=[("HOME", "/h")])
    )
    await wait_exited(rt, given)
    assert await rt.read_log(given) == b"/h\n"


async def test_launched_container_is_adopted_after_a_restart(tmp_path: Path) -> None:
    a = ProcessRuntime(tmp_path)
    await a.start()
    pod, sb = await new_pod(a)
    c = await a.start_container(pod, sb, with_(sh("exec sleep 60"), run_as_user=65534))
    assert c.pid is not None
    try:
        await a.close()  # as after a SIGKILL of the agent: the process runs on
        b = ProcessRuntime(tmp_path)
        await b.start()
        adopted = await current(b, c)
        assert adopted.state is ContainerRunState.RUNNING and adopted.pid == c.pid
        # The pid is the one the launcher exec'd into: it is the user's `sleep` now (on a busy
        # machine the exec may come a moment after the start was reported).
        for _ in range(100):
            if proc_file(c.pid, "cmdline") == b"sleep\x0060\x00":
                break
            await asyncio.sleep(0.05)
        assert proc_file(c.pid, "cmdline") == b"sleep\x0060\x00"
        status = proc_file(c.pid, "status").decode()
        assert "\nUid:\t65534\t" in status
        await b.stop_container(adopted, grace_seconds=5)
        assert (await current(b, c)).state is ContainerRunState.EXITED
        await b.remove_pod(pod.uid)
        await b.close()
    finally:
        kill_quietly(c.pid)


async def test_unprivileged_agent_refuses_mounts_and_users(
    rt: ProcessRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pykubelet.runtime.process import spawn

    monkeypatch.setattr(spawn, "effective_capabilities", lambda: 0)
    pod, sb = await new_pod(rt)
    with pytest.raises(StartError) as e:
        await rt.start_container(
            pod, sb, with_(sh("true"), mounts=[Mount(str(tmp_path), str(tmp_path / "m"))])
        )
    assert e.value.reason == "CreateContainerConfigError" and "CAP_SYS_ADMIN" in e.value.message
    with pytest.raises(StartError) as e:
        await rt.start_container(pod, sb, with_(sh("true"), run_as_user=1000))
    assert e.value.reason == "CreateContainerConfigError" and "runAsUser" in e.value.message


async def test_exec_runs_in_the_containers_mounts_user_and_cgroups(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    pod, sb = await new_pod(rt)
    src = tmp_path / "src"
    src.mkdir()
    (src / "ready").write_text("yes\n")
    # Reachable by the user: the test's own directories are 0700 root.
    target = Path("/tmp") / f"pykubelet-exec-{uuid.uuid4().hex}"
    cfg = with_(
        sh("exec sleep 60"),
        mounts=[Mount(str(src), str(target), read_only=True)],
        run_as_user=65534,
        supplemental_groups=[4001],
        limits={"memory": "64Mi"},
    )
    c = await rt.start_container(pod, sb, cfg)
    probe = ["/bin/sh", "-c", f"cat {target}/ready; id -u; id -G; grep memory /proc/self/cgroup"]
    result = await rt.exec_sync(c, probe, [("A", "1")], timeout_seconds=10)
    lines = result.output.decode().splitlines()
    assert result.exit_code == 0, lines
    assert lines[0] == "yes" and lines[1] == "65534" and "4001" in lines[2].split()
    assert lines[3].endswith(f"/pod{pod.uid}/{c.id}")
    # A command that cannot start fails the probe with the reason in its output.
    missing = await rt.exec_sync(c, ["no-such-probe-pykubelet"], [], timeout_seconds=10)
    assert missing.exit_code == 127 and b"No such file" in missing.output
    await rt.stop_container(c, grace_seconds=5)
    target.rmdir()  # the mount point the launcher made, empty on the host


async def test_exec_stream_with_a_terminal_joins_the_containers_cgroups(
    rt: ProcessRuntime,
) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, with_(sh("exec sleep 60"), limits={"memory": "64Mi"}))
    stream = await rt.exec_stream(
        c, ["/bin/sh", "-c", "grep memory /proc/self/cgroup; tty"], [], stdin=False, tty=True
    )
    try:
        out = b""
        async with asyncio.timeout(15):
            async for name, data in stream.output():
                assert name == STDOUT  # a terminal has one stream
                out += data
            assert await stream.wait() == 0
        lines = out.decode().split("\r\n")
        assert lines[0].endswith(f"/pod{pod.uid}/{c.id}") and lines[1].startswith("/dev/pts/")
    finally:
        await stream.close()
    # Its cgroups go at its exit, and the exec'd commands still in them with them.
    stream = await rt.exec_stream(c, ["sleep", "60"], [], stdin=False, tty=False)
    await rt.stop_container(c, grace_seconds=5)
    async with asyncio.timeout(15):
        assert await stream.wait() is None
    await stream.close()
