"""Starting a container's process, and running a command as in a running container.

What this module promises:

- `spawn` fork+execs a command in its own session (a process group signalled as a whole), its
  output appended to the log file by the process itself, and returns a pidfd opened before
  anything can reap it, with the process's /proc start time; it never leaves a process running
  that the caller does not learn of;
- containers that need cgroups, mounts or another user are started through `launcher.py`
  (`python -I -S`, stdlib only): `launch_config` says when and with which instructions (None is
  the fast path, a plain fork+exec), checking first that the agent has the capabilities for
  them; the instructions travel in a close-on-exec memfd, never in argv or on disk;
  `spawn_launched` returns once the launcher has exec'd the command, or raises its failure as
  the kubelet words it (RunContainerError, CreateContainerConfigError), the launcher killed;
  given a `LaunchServer`, the launcher is forked by it (no Python start), else started afresh,
  and `reap_exited` gets the exit code of either;
- `exec_context` and `exec_launched` run an exec probe's or hook's command with the container's
  mounts, user and cgroups, read from its live process; `spawn_attached` starts such a command
  (an `ExecPlan`) with the stdio it is given (`kubectl exec`), returning once it was exec'd, and
  raises RuntimeFailure if it could not be, leaving nothing running;
- processes get a small fixed environment (`container_env`), never the agent's; the launcher,
  which runs as root, gets only PATH.

A plain container is started by a spawn server (spawnserver.py); where none answers, its
fork+exec runs in a worker thread by posix_spawn, which lets the GIL go (`spawn_prepared`,
posixspawn.py); one with stdin or a terminal is fork+exec'd on the event
loop, as asyncio's own subprocess support does (it returns as soon as the child has exec'd); a
launcher is forked by the launch server or, started afresh, in a pool thread, and waiting for
its report is asynchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import marshal
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pykubelet.common import lockedio
from pykubelet.runtime.base import ContainerConfig, ExecResult, Mount, RuntimeFailure, StartError
from pykubelet.runtime.process import posixspawn, statefile
from pykubelet.runtime.process.hostexec import run_command
from pykubelet.runtime.process.launcher import LaunchError, clone_trees, trees_supported
from pykubelet.runtime.process.launchserver import (
    LAUNCHER_ARGV,
    LaunchServer,
    ServerUnavailable,
)
from pykubelet.runtime.process.processes import (
    exit_code,
    kill_group,
    proc_start_time,
    readable,
    reap,
    settle,
)
from pykubelet.runtime.process.security import kept_capabilities

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The launcher's own environment. It runs as root: a pod's LD_PRELOAD, LD_LIBRARY_PATH or
# GCONV_PATH would load the pod's code into it before it drops to the pod's user. The container's
# variables travel in its instructions, for the command it execs.
LAUNCHER_ENV = {"PATH": BASE_PATH}
LAUNCH_TIMEOUT = 60.0
# Capability bits (linux/capability.h) the launcher needs for users and mounts.
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SYS_ADMIN = 21


def container_env(pod_name: str, env: list[tuple[str, str]]) -> dict[str, str]:
    """A small fixed base instead of the agent's own environment, then the pod's variables."""
    out = {"PATH": BASE_PATH, "HOSTNAME": pod_name, "HOME": "/root"}
    out.update(env)  # later entries win, and a name keeps its first position
    return out


# --- fork+exec ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stdio:
    """A container's stdin other than /dev/null (`stdin: true`), or a terminal's slave that is
    all three of its stdio (`tty: true`, then its output reaches the log through the agent)."""

    stdin: int | None = None
    terminal: int | None = None


def spawn(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    log_path: Path,
    pass_fds: tuple[int, ...] = (),
    stdio: Stdio | None = None,
    *,
    start_time: bool = True,
    log_fd: int | None = None,
) -> tuple[int, int, int]:
    """fork+exec `argv` in a new session writing to `log_path`: (pid, pidfd, /proc start time).
    With `start_time=False` the start time is 0, for the caller to read before the process is
    reaped (right after the fork the read waits for the child's exec). `log_fd`: the log file
    opened already (`open_log`, in a thread: creating it is a new inode), which spawn closes."""
    log_fd = _log_in(cwd, log_path, log_fd)
    stdio = stdio or Stdio()
    out = log_fd if stdio.terminal is None else stdio.terminal
    stdin: int = subprocess.DEVNULL
    if stdio.terminal is not None:
        stdin = stdio.terminal
    elif stdio.stdin is not None:
        stdin = stdio.stdin
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=out,
            stderr=out,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group, signalled and killed as a whole
            close_fds=True,
            pass_fds=pass_fds,
        )
    except OSError as e:
        raise exec_error(argv[0], cwd, e) from e
    except ValueError as e:  # a NUL byte, or "=" in a variable name
        raise StartError("CreateContainerConfigError", f"cannot start {argv[0]!r}: {e}") from e
    finally:
        os.close(log_fd)
    # Popen is only our fork+exec; the pid is reaped through its pidfd. A returncode makes the
    # Popen look finished, so its __del__ does not queue the pid for subprocess._cleanup(), which
    # would reap the child behind our back and lose its exit status.
    proc.returncode = 0
    return _watched(proc.pid, start_time)


async def spawn_prepared(
    prepare: Callable[[], int | None],
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    log_path: Path,
) -> tuple[int, int]:
    """As `spawn` (without stdio, start time or passed fds), in a worker thread after
    `prepare()` there (the caller's files; it returns the log file opened, or None): fork+exec
    by posix_spawn, which lets the GIL go (posixspawn.py), so the loop runs on meanwhile.
    (pid, pidfd). A caller cancelled meanwhile waits for the thread and kills and reaps what it
    started before it goes on: never left running unrecorded."""
    # A future of the pool, not a task: the loop's shutdown cancels tasks, and a thread that
    # forks anyway must still be waited for.
    started = asyncio.get_running_loop().run_in_executor(
        None, _prepare_and_spawn, prepare, argv, cwd, env, log_path
    )
    try:
        return await asyncio.shield(started)
    except asyncio.CancelledError:
        await settle(started)
        if not started.cancelled() and started.exception() is None:
            await _kill_and_reap(*started.result())
        raise


def spawns_unlocked() -> bool:
    """Whether `spawn_prepared` can be used here (glibc's posix_spawn with its file actions)."""
    return posixspawn.available()


def _prepare_and_spawn(
    prepare: Callable[[], int | None],
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    log_path: Path,
) -> tuple[int, int]:
    log_fd = _log_in(cwd, log_path, prepare())
    try:
        pid = posixspawn.spawn_process(argv[0], argv, env, cwd, null_stdin(), log_fd)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(cwd):
            # posix_spawn's chdir failed (the directory went after the look above): the error
            # names the program, not the directory.
            e.filename = cwd
        raise exec_error(argv[0], cwd, e) from e
    except ValueError as e:  # a NUL byte, or "=" in a variable name
        raise StartError("CreateContainerConfigError", f"cannot start {argv[0]!r}: {e}") from e
    finally:
        lockedio.close_fd(log_fd, str(log_path))
    pid, pidfd, _ = _watched(pid, with_start_time=False)
    return pid, pidfd


_null_stdin_lock = threading.Lock()
_null_stdin_fd: int | None = None


def null_stdin() -> int:
    """/dev/null opened once for this process, read-only and close-on-exec, never closed: the
    stdin of every container that has none of its own (the spawn dups it into the child). An
    open and a close per container, with the interpreter lock kept, waited in a burst on the
    other threads' spawns (bench/HISTORY.md, session 23)."""
    global _null_stdin_fd
    with _null_stdin_lock:
        if _null_stdin_fd is None:
            _null_stdin_fd = lockedio.open_fd(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        return _null_stdin_fd


def _log_in(cwd: str, log_path: Path, log_fd: int | None) -> int:
    """The log file of a process to start in `cwd`: `log_fd` if opened already, else opened
    now. A missing `cwd` is the container's RunContainerError (`log_fd` closed): the exec would
    say so too, but naming the program, not the directory."""
    if not lockedio.is_dir(cwd):
        if log_fd is not None:
            os.close(log_fd)
        raise StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    return open_log(log_path) if log_fd is None else log_fd


def open_log(log_path: Path) -> int:
    """The container's log file, for its process to append to (close-on-exec here); its
    directory made only when the file cannot be for want of it (every start's preparation
    makes it first, and a look at a directory there already lets the interpreter lock go
    twice)."""
    # The child writes to the file itself: its output does not go through the agent, and
    # nothing is lost while the agent restarts.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    try:
        try:
            return os.open(log_path, flags, 0o600)
        except FileNotFoundError:
            statefile.ensure_dir(log_path.parent)  # its own error names what is wrong
            return os.open(log_path, flags, 0o600)
    except OSError as e:
        # No space or inodes left under --root-dir, a read-only file system: the container
        # cannot be created (its waiting reason), not a failure of the runtime.
        raise StartError(
            "CreateContainerError", f"cannot create the log file: {os_reason(e)}"
        ) from e


def _watched(pid: int, with_start_time: bool = True) -> tuple[int, int, int]:
    """(pid, pidfd, /proc start time or 0 if not `with_start_time`) of a process just started,
    not reaped yet (so /proc/<pid> exists even if it has already exited); killed if either
    cannot be had."""
    pidfd = _open_pidfd(pid)
    if not with_start_time:
        return pid, pidfd, 0
    start_time = proc_start_time(pid)
    if start_time is None:
        kill_group(pid, signal.SIGKILL)
        os.close(pidfd)
        raise RuntimeFailure(f"cannot read /proc/{pid}/stat; is /proc mounted?")
    return pid, pidfd, start_time


async def reap_exited(pid: int, pidfd: int, server: LaunchServer | None) -> int | None:
    """The Kubernetes exit code of the exited process `pid` (behind `pidfd`), if it can be
    known: the agent's own child is waited for here, a launch or spawn server's child by its
    server."""
    if server is not None and server.owns(pid):
        return exit_code(await server.reap_child(pid))
    return reap(pidfd)


def os_reason(e: OSError, where: Path | str | None = None) -> str:
    """An operating-system error as Go prints one: "/var/lib/x: no space left on device"
    (`where` names the file when the error does not, as a write's does not)."""
    reason = (e.strerror or str(e)).lower()
    place = e.filename or where
    return f"{place}: {reason}" if place else reason


def exec_error(program: str, cwd: str, e: OSError) -> StartError:
    if e.filename == cwd and not os.path.isdir(cwd):
        return StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    if isinstance(e, FileNotFoundError) and "/" not in program:
        problem = "executable file not found in $PATH"
    else:
        problem = (e.strerror or str(e)).lower()
    return StartError("RunContainerError", f'exec: "{program}": {problem}')


# --- the launcher -------------------------------------------------------------------------------


@cache
def effective_capabilities() -> int:
    """The agent's effective capabilities (CapEff of /proc/self/status), 0 if unreadable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def launch_config(
    config: ContainerConfig, argv: list[str], cwd: str, env: dict[str, str], cgroups: bool
) -> dict[str, Any] | None:
    """The launcher's instructions, or None when a plain fork+exec does (the fast path)."""
    identity = (
        (config.run_as_user is not None and config.run_as_user != os.geteuid())
        or (config.run_as_group is not None and config.run_as_group != os.getegid())
        or bool(config.supplemental_groups)
    )
    binds = list(config.mounts)
    if config.resolv_conf is not None:
        # The pod's own resolver (dnsPolicy, dnsConfig), bound over the node's.
        binds.append(Mount(config.resolv_conf, "/etc/resolv.conf"))
    mounts = bool(binds) or config.read_only_root_filesystem
    restricted = (
        config.no_new_privileges or bool(config.capabilities_add) or bool(config.capabilities_drop)
    )
    # A terminal becomes the controlling terminal in the launcher (Popen has no safe way).
    if not (identity or mounts or cgroups or config.tty or restricted):
        return None
    caps = effective_capabilities()
    keep = kept_capabilities(config, caps)
    if mounts and not caps >> CAP_SYS_ADMIN & 1:
        raise StartError(
            "CreateContainerConfigError",
            "volume mounts and readOnlyRootFilesystem need an agent running as root with "
            "CAP_SYS_ADMIN (a mount namespace per container); this agent has no CAP_SYS_ADMIN",
        )
    if identity and not (caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1):
        raise StartError(
            "CreateContainerConfigError",
            f"runAsUser/runAsGroup/supplementalGroups need an agent running as root "
            f"(CAP_SETUID, CAP_SETGID); this agent runs as uid {os.geteuid()} without them",
        )
    for m in binds:
        _check_mount(m)
    return {
        "cgroups": [],
        "mounts": [
            {"source": m.host_path, "target": m.container_path, "read_only": m.read_only}
            for m in binds
        ],
        "read_only_root": config.read_only_root_filesystem,
        "uid": config.run_as_user,
        "gid": config.run_as_group,
        "groups": list(config.supplemental_groups) if identity else None,
        "cwd": cwd,
        "argv": argv,
        "env": env,
        "home_of_user": not any(name == "HOME" for name, _ in config.env),
        "tty": config.tty,
        "no_new_privs": config.no_new_privileges,
        "capabilities": keep,
    }


def _check_mount(m: Mount) -> None:
    for what, path in (("host path", m.host_path), ("container path", m.container_path)):
        if not os.path.isabs(path) or "\0" in path:
            raise StartError(
                "CreateContainerConfigError",
                f"mount {m.host_path} -> {m.container_path}: the {what} must be absolute",
            )


def _memfd(name: str, data: dict[str, Any]) -> int:
    """A close-on-exec memfd holding `data` for the launcher (`marshal`'s format: the launcher
    runs this interpreter, and reads it without importing json), at offset 0."""
    fd = lockedio.memfd_create(name, os.MFD_CLOEXEC)
    try:
        lockedio.write_all(fd, marshal.dumps(data), name)
        lockedio.lseek(fd, 0, os.SEEK_SET, name)
    except BaseException:
        os.close(fd)
        raise
    return fd


@cache
def _can_clone_trees() -> bool:
    return trees_supported()


def _clone_trees(launch: dict[str, Any]) -> list[int]:
    """Each bind's source as the agent's namespace has it, cloned (open_tree) for the launcher
    to move into place: a launch server's namespace has no pod's volume (launcher.py). Each
    mount gets the index of its tree; none where the kernel cannot (Linux < 5.2)."""
    mounts = launch["mounts"]
    if not mounts or not _can_clone_trees():
        return []
    try:
        return clone_trees(mounts)
    except LaunchError as e:
        raise StartError("RunContainerError", e.message) from None


def state_write_error(e: OSError) -> StartError:
    """A container's files that cannot be made under --root-dir (no space, no inodes): the
    kubelet's CreateContainerError, as a start that cannot be created."""
    return StartError("CreateContainerError", f"cannot write the container's state: {os_reason(e)}")


def _start_launcher(
    launch: dict[str, Any],
    log_path: Path,
    stdio: Stdio | None,
    server: LaunchServer | None,
    prepare: Callable[[], object] | None = None,
) -> tuple[int, int, int, int]:
    """fork+exec the launcher: (pid, pidfd, /proc start time, read end of its error pipe).

    The instructions go through a memfd (no size limit, nothing on disk, no shell); the error
    pipe's write end is close-on-exec in the launcher, so EOF without data means it exec'd."""
    if prepare is not None:
        try:
            prepare()
        except OSError as e:
            raise state_write_error(e) from e
    trees = _clone_trees(launch)
    try:
        try:
            config_fd = _memfd("pykubelet-launch", launch)
        except OSError as e:
            raise RuntimeFailure(f"cannot pass the launcher its instructions: {e}") from e
        err_r, err_w = lockedio.pipe()
        try:
            try:
                if server is None:
                    raise ServerUnavailable("no launch server")
                pid, pidfd, start_time = _start_served(
                    server, config_fd, err_w, log_path, stdio, trees
                )
            except ServerUnavailable:
                argv = [*LAUNCHER_ARGV, str(config_fd), str(err_w), *map(str, trees)]
                # "/" as the launcher's cwd: it enters the container's own after the mounts,
                # and reports a missing one as the container's error.
                pid, pidfd, start_time = spawn(
                    argv,
                    "/",
                    dict(LAUNCHER_ENV),
                    log_path,
                    pass_fds=(config_fd, err_w, *trees),
                    stdio=stdio,
                )
        except BaseException:
            os.close(err_r)
            raise
        finally:
            lockedio.close_fd(config_fd, "the launcher's instructions")
            lockedio.close_fd(err_w, "the launcher's error pipe")
    finally:
        for fd in trees:
            lockedio.close_fd(fd, "a mount tree")
    return pid, pidfd, start_time, err_r


def _start_served(
    server: LaunchServer,
    config_fd: int,
    err_w: int,
    log_path: Path,
    stdio: Stdio | None,
    trees: list[int],
) -> tuple[int, int, int]:
    """A launcher forked by the launch server, with the stdio `spawn` would give it."""
    stdio = stdio or Stdio()
    log_fd = open_log(log_path)
    try:
        out = log_fd if stdio.terminal is None else stdio.terminal
        if stdio.terminal is not None:
            stdin = stdio.terminal
        elif stdio.stdin is not None:
            stdin = stdio.stdin
        else:
            stdin = null_stdin()
        pid = server.launch(config_fd, stdin, out, err_w, trees)
    finally:
        lockedio.close_fd(log_fd, str(log_path))
    return _watched(pid)


async def _kill_unrecorded(
    started: asyncio.Future[tuple[int, int, int, int]], server: LaunchServer | None
) -> None:
    """The start was cancelled while its thread forked: once the thread is done, what it
    started is killed and reaped, before the caller's cleanup (its starting marker, the child's
    fds, the pod's lock) can run."""
    await settle(started)
    if started.cancelled() or started.exception() is not None:
        return
    pid, pidfd, _, err_r = started.result()
    os.close(err_r)
    await _kill_and_reap(pid, pidfd, server)


async def _kill_and_reap(pid: int, pidfd: int, server: LaunchServer | None = None) -> None:
    """A launcher that must not go on (cancelled, stuck): killed, reaped, its pidfd closed."""
    kill_group(pid, signal.SIGKILL)
    try:
        await settle(asyncio.ensure_future(readable(pidfd)))
        await settle(asyncio.ensure_future(reap_exited(pid, pidfd, server)))
    finally:
        os.close(pidfd)


async def spawn_launched(
    launch: dict[str, Any],
    log_path: Path,
    stdio: Stdio | None = None,
    server: LaunchServer | None = None,
    prepare: Callable[[], object] | None = None,
) -> tuple[int, int, int]:
    """As `spawn`, through the launcher following `launch`: returns once it exec'd.
    `prepare()` (the caller's files) runs first in the same thread; its OSError is the start's
    CreateContainerError.

    The fork runs in a thread (the launch server's own, or the pool's for a launcher started
    afresh): a launcher started afresh is a Python start, whose exec kept the loop
    4 ms a container when the machine was idle and 12-19 ms in a burst (measured: 300 API pods
    held every API request and status for 5 s). A caller cancelled meanwhile waits for the
    thread (one fork+exec) and kills what it started before it goes on: never left running
    unrecorded, nor with fds its caller has closed and reused."""
    # A future of the pool, not a task: the loop's shutdown cancels tasks, and a thread that
    # forks anyway must still be waited for.
    if server is None:
        started = asyncio.get_running_loop().run_in_executor(
            None, _start_launcher, launch, log_path, stdio, None, prepare
        )
    else:
        started = server.call(_start_launcher, launch, log_path, stdio, server, prepare)
    try:
        pid, pidfd, start_time, err_r = await asyncio.shield(started)
    except asyncio.CancelledError:
        await _kill_unrecorded(started, server)
        raise
    try:
        async with asyncio.timeout(LAUNCH_TIMEOUT):
            report = await _read_until_eof(err_r)
    except BaseException as e:
        # Cancelled, or stuck (a mount on a dead NFS server): never leave it running unrecorded.
        await _kill_and_reap(pid, pidfd, server)
        if isinstance(e, TimeoutError):
            raise StartError(
                "RunContainerError",
                f"the launcher of {launch['argv'][0]!r} did not exec it within "
                f"{LAUNCH_TIMEOUT:g} s (a mount or a cgroup hanging?); it was killed",
            ) from None
        raise
    finally:
        os.close(err_r)
    if not report:
        # exec'd (or killed before it could report: its exit is then the container's).
        return pid, pidfd, start_time
    try:
        await readable(pidfd)  # it exits right after writing the report
        await reap_exited(pid, pidfd, server)
    finally:
        os.close(pidfd)
    raise _launch_error(report, launch)


def _launch_error(report: bytes, launch: dict[str, Any]) -> StartError:
    try:
        # Our own launcher wrote it, before it exec'd anything else (the pipe is close-on-exec).
        data = marshal.loads(report)
    except (ValueError, EOFError):
        return StartError("RunContainerError", f"the launcher failed: {report[:200]!r}")
    return launch_error(data, launch)


def launch_error(data: Any, launch: dict[str, Any]) -> StartError:
    """A launcher's report (launcher.py's `report_of`) as the start's error."""
    program, cwd = str(launch["argv"][0]), str(launch["cwd"])
    try:
        stage, code, message = str(data["stage"]), data.get("errno"), str(data["message"])
    except (KeyError, TypeError, AttributeError):
        return StartError("RunContainerError", f"the launcher failed: {data!r:.200}")
    if stage == "exec":
        if not isinstance(code, int):
            return StartError("CreateContainerConfigError", f"cannot start {program!r}: {message}")
        return exec_error(program, cwd, OSError(code, os.strerror(code)))
    if stage == "chdir" and code == errno.ENOENT:
        return StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    return StartError("RunContainerError", message)


async def _read_until_eof(fd: int) -> bytes:
    """All of a pipe, without blocking the loop (the launcher takes ~30 ms to exec)."""
    os.set_blocking(fd, False)
    out = b""
    while True:
        await readable(fd)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            return out
        out += chunk


# --- commands in a running container ------------------------------------------------------------


def exec_context(pid: int) -> dict[str, Any] | None:
    """How to run a command as in the container of `pid`: its mount namespace if not ours, its
    uid, gid and groups if not the agent's; empty if it runs as the agent's processes do, None
    if it cannot be read."""
    out: dict[str, Any] = {}
    try:
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
            out["mount_ns_pid"] = pid
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        uid, gid = int(fields["Uid"].split()[1]), int(fields["Gid"].split()[1])
        groups = [int(g) for g in fields["Groups"].split()]
    except (OSError, KeyError, ValueError, IndexError):
        return None  # gone meanwhile, or a zombie (no namespaces left): the caller decides
    if (uid, gid, sorted(groups)) != (os.geteuid(), os.getegid(), sorted(os.getgroups())):
        out.update(uid=uid, gid=gid, groups=groups)
    return out


async def exec_launched(enter: dict[str, Any], timeout_seconds: float) -> ExecResult:
    """Run the command of `enter` (the launcher's --exec instructions) through the launcher.

    Raises RuntimeFailure if it cannot be started."""
    program = enter["argv"][0]
    try:
        config_fd = _memfd("pykubelet-exec", enter)
    except OSError as e:
        raise RuntimeFailure(f"cannot run {program!r}: {e}") from e
    # The instructions in a memfd, not in argv: any user of the host may read an argv in
    # /proc, and the environment in them may hold secrets.
    argv = [*LAUNCHER_ARGV, "--exec", str(config_fd)]
    try:
        return await run_command(argv, "/", LAUNCHER_ENV, timeout_seconds, pass_fds=(config_fd,))
    except (OSError, ValueError) as e:
        raise RuntimeFailure(f"cannot run {program!r}: {e}") from e
    finally:
        os.close(config_fd)


@dataclass(frozen=True)
class ExecPlan:
    """How to run a command as in a running container: `enter` is the launcher's --exec
    instructions (cwd, argv, env included); `direct` when a plain fork+exec with `cwd` and `env`
    is the same (a container started as the agent's own processes are, without cgroups)."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    enter: dict[str, Any]
    direct: bool


async def spawn_attached(
    plan: ExecPlan, stdin: int, stdout: int, stderr: int, *, tty: bool
) -> tuple[int, int]:
    """Start `plan` in a session of its own with those fds as its stdio: (pid, pidfd), once the
    command was exec'd. With `tty`, `stdin` is a terminal's slave, which becomes its controlling
    terminal: the launcher does that (Popen could only through a preexec_fn, which is not safe
    beside the agent's threads), so a terminal always goes through it. RuntimeFailure if the
    command cannot start; nothing is then left running."""
    program = plan.argv[0]
    if plan.direct and not tty:
        try:
            proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec only, as spawn()
                plan.argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=plan.cwd,
                env=plan.env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            why = exec_error(program, plan.cwd, e).message
            raise RuntimeFailure(f"cannot run {program!r}: {why}") from e
        except ValueError as e:
            raise RuntimeFailure(f"cannot run {program!r}: {e}") from e
        proc.returncode = 0  # reaped through the pidfd, never by subprocess' own cleanup
        return proc.pid, _open_pidfd(proc.pid)
    try:
        config_fd = _memfd("pykubelet-exec", {**plan.enter, "tty": tty})
    except OSError as e:
        raise RuntimeFailure(f"cannot run {program!r}: {e}") from e
    err_r, err_w = os.pipe()
    argv = [*LAUNCHER_ARGV, "--exec", str(config_fd), str(err_w)]
    try:
        proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec only, as spawn()
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd="/",
            env=dict(LAUNCHER_ENV),
            start_new_session=True,
            close_fds=True,
            pass_fds=(config_fd, err_w),
        )
    except (OSError, ValueError) as e:
        os.close(err_r)
        raise RuntimeFailure(f"cannot run {program!r}: cannot start the launcher: {e}") from e
    finally:
        os.close(config_fd)
        os.close(err_w)
    proc.returncode = 0
    try:
        pidfd = _open_pidfd(proc.pid)
    except BaseException:
        os.close(err_r)
        raise
    try:
        async with asyncio.timeout(LAUNCH_TIMEOUT):
            report = await _read_until_eof(err_r)
    except BaseException as e:
        await _kill_and_reap(proc.pid, pidfd)
        if isinstance(e, TimeoutError):
            raise RuntimeFailure(
                f"cannot run {program!r}: the launcher did not exec it within "
                f"{LAUNCH_TIMEOUT:g} s (a mount namespace or a cgroup hanging?); it was killed"
            ) from None
        raise
    finally:
        os.close(err_r)
    if not report:
        return proc.pid, pidfd
    await readable(pidfd)  # it exits right after writing the report
    reap(pidfd)
    os.close(pidfd)
    raise RuntimeFailure(f"cannot run {program!r}: {_launch_error(report, plan.enter).message}")


def _open_pidfd(pid: int) -> int:
    """A pidfd on our child `pid`, not reaped yet; if that fails, the child is killed."""
    try:
        return lockedio.pidfd_open(pid)
    except OSError as e:
        kill_group(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # SIGKILLed just now: this does not wait for long
        raise RuntimeFailure(f"cannot watch process {pid} ({e}); it was killed") from e
