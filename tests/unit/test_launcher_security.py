"""The launcher runs as root for containers that are not: what it must never let through."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykubelet.runtime.base import Mount as VolumeMount
from pykubelet.runtime.base import RuntimeContainer, RuntimeFailure, StartError
from pykubelet.runtime.process.launcher import mount_points
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.unit.test_process_launcher import with_
from tests.unit.test_process_runtime import config, new_pod, sh, wait_exited, wait_log

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's features need root")

MNT_DETACH = 2
MS_SHARED = 1 << 20
SERVED: dict[str, object] = {"supplemental_groups": [4321]}  # a launcher, not a plain start
PRELOAD = "/nonexistent/pykubelet-preload.so"


@contextlib.contextmanager
def tmpfs(path: Path) -> Iterator[Path]:
    """A tmpfs mounted on the host, as pykubelet.pod.volumes mounts Secret volumes."""
    path.mkdir(parents=True, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, b"size=1m") != 0:
        pytest.skip(f"cannot mount a tmpfs: {os.strerror(ctypes.get_errno())}")
    try:
        yield path
    finally:
        libc.umount2(os.fsencode(path), MNT_DETACH)


def mountinfo(pid: int) -> str:
    return Path(f"/proc/{pid}/mountinfo").read_text()


def mounts_under(pid: int, root: Path, part: str) -> list[str]:
    """The mount lines of `pid`'s namespace at a path under `root` that holds `part`: other
    tests, on the other worker, mount their own pods' tmpfs in the same host namespace."""
    return [
        line
        for line in mountinfo(pid).splitlines()
        if any(f.startswith(f"{root}/") and part in f for f in line.split()[3:5])
    ]


def mount_options(pid: int, target: Path) -> list[set[str]]:
    """The options of each mount at `target` in the mount namespace of `pid`."""
    out = []
    for line in mountinfo(pid).splitlines():
        fields = line.split()
        if fields[4] == str(target):
            out.append(set(fields[5].split(",")))
    return out


def wait_zombie(pid: int) -> None:
    """Blocks, without letting the event loop see the exit."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        if data[data.rindex(b")") + 2 :].split()[0] == b"Z":
            return
        time.sleep(0.01)
    pytest.fail(f"process {pid} did not exit")


async def log_of(rt: ProcessRuntime, c: RuntimeContainer) -> str:
    done = await wait_exited(rt, c)
    text = (await rt.read_log(c)).decode()
    assert done.exit_code == 0, text
    return text


# --- 1. the launcher's environment ---------------------------------------------------------------


async def test_launcher_does_not_run_with_the_pods_environment(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    # The dynamic linker reports a preload it cannot find once per process it loads: the
    # container's shell only, never the root launcher before it.
    env = [("LD_PRELOAD", PRELOAD), ("MINE", "kept")]
    cfg = with_(
        config("-c", "echo $MINE", command=["/bin/sh"], env=env), supplemental_groups=[4321]
    )
    c = await rt.start_container(pod, sb, cfg)
    text = await log_of(rt, c)
    assert text.count(PRELOAD) == 1, text
    assert text.endswith("kept\n")

    long = await rt.start_container(
        pod, sb, with_(sh("exec sleep 60", name="l"), run_as_user=65534)
    )
    result = await rt.exec_sync(long, ["/bin/sh", "-c", "echo $MINE $HOME"], env, 10)
    out = result.output.decode()
    assert result.exit_code == 0, out
    assert out.count(PRELOAD) == 1, out
    assert out.endswith("kept /nonexistent\n")
    await rt.stop_container(long, grace_seconds=5)


# --- 2. exec fails closed -----------------------------------------------------------------------


async def test_exec_in_an_exited_launched_container_never_runs_on_the_host(
    rt: ProcessRuntime,
) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, with_(sh("exec sleep 60"), run_as_user=65534))
    assert c.pid is not None
    os.kill(c.pid, signal.SIGKILL)
    # A zombie: no mount namespace to read or enter, yet not reaped by the agent.
    wait_zombie(c.pid)
    with pytest.raises(RuntimeFailure, match="not running"):
        await rt.exec_sync(c, ["/bin/sh", "-c", "id -u"], [], timeout_seconds=10)


async def test_exec_refused_while_the_exit_is_being_recorded(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    cfg = with_(sh("exec sleep 60"), limits={"memory": "64Mi"})
    c = await rt.start_container(pod, sb, cfg)
    assert c.pid is not None
    os.kill(c.pid, signal.SIGKILL)
    wait_zombie(c.pid)
    # Two turns of the loop: the exit is seen, and the cgroups are being read and emptied.
    for _ in range(2):
        await asyncio.sleep(0)
    with pytest.raises(RuntimeFailure, match="not running"):
        await rt.exec_sync(c, ["/bin/sh", "-c", "id -u"], [], timeout_seconds=10)


# --- 3. no new privileges, nosuid and nodev, symlinks -------------------------------------------


async def test_no_new_privs_for_another_user(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    script = "grep NoNewPrivs /proc/self/status"
    c = await rt.start_container(pod, sb, with_(sh(script), run_as_user=65534))
    assert (await log_of(rt, c)).split() == ["NoNewPrivs:", "1"]
    root = await rt.start_container(pod, sb, with_(sh(script, name="r"), supplemental_groups=[7]))
    assert (await log_of(rt, root)).split() == ["NoNewPrivs:", "0"]

    long = await rt.start_container(
        pod, sb, with_(sh("exec sleep 60", name="l"), run_as_user=65534)
    )
    result = await rt.exec_sync(long, ["/bin/sh", "-c", script], [], timeout_seconds=10)
    assert result.output.split() == [b"NoNewPrivs:", b"1"]
    await rt.stop_container(long, grace_seconds=5)


async def test_binds_are_nosuid_and_nodev(rt: ProcessRuntime, tmp_path: Path) -> None:
    pod, sb = await new_pod(rt)
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.mkdir()
    ro.mkdir()
    mounts = [
        VolumeMount(str(rw), str(tmp_path / "in-rw")),
        VolumeMount(str(ro), str(tmp_path / "in-ro"), read_only=True),
    ]
    c = await rt.start_container(pod, sb, with_(sh("exec sleep 60"), mounts=mounts))
    assert c.pid is not None
    [rw_options] = mount_options(c.pid, tmp_path / "in-rw")
    [ro_options] = mount_options(c.pid, tmp_path / "in-ro")
    assert {"rw", "nosuid", "nodev"} <= rw_options
    assert {"ro", "nosuid", "nodev"} <= ro_options
    await rt.stop_container(c, grace_seconds=5)


async def test_mount_target_through_a_users_symlink_is_refused(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    pod, sb = await new_pod(rt)
    source, victim, users = tmp_path / "vol", tmp_path / "etc", tmp_path / "users-dir"
    for d in (source, victim, users):
        d.mkdir()
    (victim / "passwd").write_text("root:x:0:0\n")
    # Planted by the container's user in a directory it may write (an emptyDir, /tmp).
    link = users / "link"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    for target in (link, link / "sub"):
        with pytest.raises(StartError) as e:
            cfg = with_(sh("cat /dev/null"), mounts=[VolumeMount(str(source), str(target))])
            await rt.start_container(pod, sb, cfg)
        assert "symlink not owned by root" in e.value.message
    assert not (victim / "sub").exists() and (victim / "passwd").exists()

    # The host's own symlinks (/var/run -> /run) are followed.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "roots-link").symlink_to(real)
    (source / "f").write_text("in the volume\n")
    cfg = with_(
        sh(f"cat {real}/m/f"),
        mounts=[VolumeMount(str(source), str(tmp_path / "roots-link" / "m"))],
    )
    c = await rt.start_container(pod, sb, cfg)
    assert await log_of(rt, c) == "in the volume\n"


async def test_read_only_root_covers_the_mounts_under_it(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    pod, sb = await new_pod(rt)
    data = tmp_path / "data"
    data.mkdir()
    with tmpfs(tmp_path / "separate") as separate:
        script = (
            f"touch {separate}/f 2>/dev/null && echo written || echo refused; "
            f"echo ok > {tmp_path}/mnt/f"
        )
        cfg = with_(
            sh(script),
            read_only_root_filesystem=True,
            mounts=[VolumeMount(str(data), str(tmp_path / "mnt"))],
        )
        c = await rt.start_container(pod, sb, cfg)
        assert await log_of(rt, c) == "refused\n"
        assert not (separate / "f").exists()
    assert (data / "f").read_text() == "ok\n"


# --- 4. other pods' volumes -----------------------------------------------------------------------


async def test_container_namespace_holds_no_other_pods_tmpfs(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    pod, sb = await new_pod(rt)
    pods = tmp_path / "pods"
    others = pods / "other-uid" / "volumes" / "kubernetes.io~secret" / "token"
    own = pods / pod.uid / "volumes" / "kubernetes.io~secret" / "token"
    with tmpfs(others), tmpfs(own):
        (own / "key").write_text("mine\n")
        target = tmp_path / "secret"
        cfg = with_(
            sh(f"cat {target}/key; exec sleep 60"),
            mounts=[VolumeMount(str(own), str(target), read_only=True)],
        )
        c = await rt.start_container(pod, sb, cfg)
        assert c.pid is not None
        await wait_log(rt, c, b"mine\n")
        mounted = mountinfo(c.pid)
        assert str(pods) not in mounted, mounted
        assert len(mount_options(c.pid, target)) == 1
        await rt.stop_container(c, grace_seconds=5)


async def test_a_volume_mounted_after_the_launch_server_started_is_seen_whole_and_private(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    """The launch server's namespace holds no pod's volume (the host's of its start, less the
    pods directory): a container's volume comes cloned from the agent's namespace, as it is
    at the start, and not as a peer of the host's mount."""
    from tests.unit.test_launch_server import servers

    pod, sb = await new_pod(rt)
    first = await rt.start_container(pod, sb, with_(sh("exec sleep 60", name="first"), **SERVED))
    [server] = servers()
    assert os.readlink(f"/proc/{server}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    pods = tmp_path / "pods"
    own = pods / pod.uid / "volumes" / "kubernetes.io~secret" / "token"
    with tmpfs(own):
        (own / "key").write_text("mine\n")
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mount(None, os.fsencode(own), None, MS_SHARED, None) == 0
        assert not mounts_under(server, tmp_path, "/pods/")
        target = tmp_path / "secret"
        cfg = with_(
            sh(f"cat {target}/key; exec sleep 60", name="second"),
            mounts=[VolumeMount(str(own), str(target), read_only=True)],
        )
        c = await rt.start_container(pod, sb, cfg)
        assert c.pid is not None
        await wait_log(rt, c, b"mine\n")
        [line] = [x for x in mountinfo(c.pid).splitlines() if x.split()[4] == str(target)]
        assert "shared:" not in line and "master:" not in line, line
        await rt.stop_container(c, grace_seconds=5)
    await rt.stop_container(first, grace_seconds=5)


async def test_the_pods_directory_is_a_mount_of_its_own_while_the_runtime_runs(
    tmp_path: Path,
) -> None:
    """So that a launcher detaches every other pod's volume in one call (podsmount.py); the
    bind goes with the runtime, and a mount point that was there before stays."""
    pods = str(tmp_path / "pods")
    rt = ProcessRuntime(tmp_path)
    await rt.start()
    assert mount_points().count(pods) == 1
    await rt.close()
    assert pods not in mount_points()
    with tmpfs(tmp_path / "pods"):  # the operator's own file system for the volumes
        rt = ProcessRuntime(tmp_path)
        await rt.start()
        assert mount_points().count(pods) == 1  # not bound again on top
        await rt.close()
        assert pods in mount_points()


async def test_other_pods_tmpfs_go_one_by_one_below_a_pods_directory_of_no_mount(
    tmp_path: Path,
) -> None:
    """Volumes mounted before the runtime started (an earlier version's) keep the directory a
    plain one: each launcher then detaches them one by one."""
    others = tmp_path / "pods" / "earlier-uid" / "volumes" / "kubernetes.io~secret" / "token"
    with tmpfs(others):
        rt = ProcessRuntime(tmp_path)
        await rt.start()
        try:
            assert str(tmp_path / "pods") not in mount_points()
            pod, sb = await new_pod(rt)
            (tmp_path / "d").mkdir()
            mounts = [VolumeMount(str(tmp_path / "d"), str(tmp_path / "mnt"))]
            c = await rt.start_container(pod, sb, with_(sh("exec sleep 60"), mounts=mounts))
            assert c.pid is not None
            assert not mounts_under(c.pid, tmp_path, "/pods/earlier-uid")
            await rt.stop_container(c, grace_seconds=5)
            await rt.remove_pod(pod.uid)
        finally:
            await rt.close()


async def test_other_pods_tmpfs_also_go_from_a_bind_above_them(tmp_path: Path) -> None:
    # The agent's root directory reached through a symlink, and bound whole as a hostPath.
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(tmp_path)
    rt = ProcessRuntime(link)
    await rt.start()
    try:
        pod, sb = await new_pod(rt)
        with tmpfs(tmp_path / "pods" / "other-uid" / "volumes" / "kubernetes.io~secret" / "t"):
            view = tmp_path / "view"
            cfg = with_(
                sh("exec sleep 60"), mounts=[VolumeMount(str(tmp_path), str(view), read_only=True)]
            )
            c = await rt.start_container(pod, sb, cfg)
            assert c.pid is not None
            assert len(mount_options(c.pid, view)) == 1
            assert not mounts_under(c.pid, tmp_path, "/pods/other-uid")
            await rt.stop_container(c, grace_seconds=5)
        await rt.remove_pod(pod.uid)
    finally:
        await rt.close()
        link.unlink()
