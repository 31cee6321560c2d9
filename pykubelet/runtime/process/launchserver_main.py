"""The launch server's process: `python -I -S launchserver_main.py SOCKET_FD AGENT_PID [PODS_DIR]
[--in-agent-namespace]`, one long-lived process of the agent's (launchserver.py is its side)
that starts the containers needing a launcher (launcher.py) without a Python start for each
(29 -> 4 ms of CPU a container here). It is single-threaded, so a child it forks may run Python
code safely, as a launcher started afresh does. Like launcher.py it imports the standard library
alone (`-S`): launcher.py and posixspawn.py are loaded by their path, `-I` putting this file's
directory on no sys.path.

Over SOCKET_FD (a SOCK_SEQPACKET socket, one message a request, served in order):
  ("launch",) with four fds [instructions memfd, stdin, stdout+stderr, error pipe's write end]
      and the mount trees the agent cloned (each mount's "tree" indexes them)
      -> ("launched", pid): the child runs in a new session, as launcher.py's `run_launch` (or
      is the container itself, below);
  ("spawn", marker, sandbox_record, log_path, argv, env, cwd), no fds -> ("spawned", pid), or
      ("failed", stage, errno, strerror, filename) with stage "marker", "cwd", "log", "exec"
      or "value": a plain container (no launcher, stdin or terminal) started as the agent's
      own thread starts one (starts.py): its start marker (a hard link to the sandbox record),
      its log's directory and file, then posix_spawn in its own session, stdin /dev/null and
      its output appended to the log (spawnserver.py asks, from the agent's event loop);
  ("spawn-in-namespace", marker, sandbox_record, log_path, instructions), no fds, from a
      server --in-agent-namespace -> ("spawned", pid), ("failed", stage, ...) as for "spawn"
      (stage "marker" or "log"), or ("failed", "launch", report) with a launcher's report
      (launcher.py's `report_of`): a container that asks for its mounts alone (below) started
      with its files made as for "spawn", its volumes' trees cloned by the server itself;
  ("reap", pid) -> ("reaped", wait status or None): the server's child waited for, once the
      agent saw it exit (through a pidfd) and killed its group: until then the zombie keeps its
      pid, as for the agent's own children.
  ("kill", pid) -> ("killed",): a child of the server's that must not go on (its start was
      cancelled): its group killed, not waited for (the agent waits through a pidfd, then
      asks for a "reap"; a process stuck in the kernel does not stall the server).
A request longer than REQUEST_BYTES is refused, not read in part.
The server dies with the agent (PR_SET_PDEATHSIG); its children, the containers, run on.

Given PODS_DIR and a kernel with open_tree, a launch server runs in a mount namespace of its
own (a spawn server holds one, below): the host's, a slave of it (the host's mounts reach it
where they are shared, as under systemd; nothing goes back), without the pods directory's
mount, so without any pod's volume. A launcher's unshare then copies a few mounts, not one per
pod's volume (at 1,000 pods, 0.8 ms more CPU a launch, and the kernel's mount lock held as
long), and its volumes come as trees the agent cloned in the host's namespace.

A container that asks for its mounts alone (no cgroup, user, capability, no_new_privs or
terminal: what only the process itself can take) is not forked: the server makes its mount
namespace, enters it (unshare), spawns the command there with posix_spawn, which shares the
server's memory until the exec instead of copying it, and goes back to its own namespace
(setns; a spawn server to the agent's). A forked launcher cost 3.5 ms of CPU a container here,
most of it the kernel copying the pages the child's Python wrote to and tearing the copy down
at the exec; this, 1.4 ms. A failure is reported on the error pipe as a launcher's, by a child
that exits at once (to a spawn server's asker, in its answer).

With --in-agent-namespace (the spawn servers, spawnserver.py) the server stays in the agent's
namespace, where its plain spawns run and the volumes' sources are, and holds the namespace
above (made once at its start) by an fd: a "spawn-in-namespace" request clones each source's
tree (open_tree) where it is, enters that namespace (setns), makes the container's copy of it
and spawns there as above, then goes back to the agent's. The agent asks from its event loop,
without a thread hop, the marker and the log's files made here too (spawnserver.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import marshal
import os
import socket
import sys

TYPE_CHECKING = False  # typing's, without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from pykubelet.runtime.process import launcher, posixspawn


def _sibling(name: str) -> ModuleType:
    """The module `name`.py beside this file, loaded by its path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if not TYPE_CHECKING:
    launcher = _sibling("launcher")
    posixspawn = _sibling("posixspawn")

PR_SET_PDEATHSIG = 1
REQUEST_BYTES = 65536
# The longest message text in an answer, which the agent reads in one REQUEST_BYTES message.
ANSWER_TEXT = 16384  # a few paths of PATH_MAX
LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
ENOENT, ENOTDIR = 2, 20  # errno's, without importing errno
LAUNCH_CALLS = ("unshare", "mount", "umount2", "syscall", "prctl", "setns")
SIGKILL = 9
LAUNCH_FDS = 4
# The spawn servers' flag (spawnserver.py): the server stays in the agent's mount namespace.
IN_AGENT_NAMESPACE = "--in-agent-namespace"
# Set when the server could not go back to its own namespace (a spawn server: the agent's) after
# a spawn (never seen): it must not start the next container in that one's mounts, and exits
# after answering.
_astray = False


def own_namespace(pods_dir: str) -> bool:
    """The launch server's own mount namespace, as above; whether the pods directory's mount
    (podsmount.py) left it with every volume below. False, and the namespace unchanged, where
    trees cannot be moved or no namespace can be made (not root)."""
    if not launcher.trees_supported():
        return False
    libc = launcher.c_library()
    if libc.unshare(launcher.CLONE_NEWNS) != 0:
        return False
    try:
        slave = launcher.MS_REC | launcher.MS_SLAVE
        launcher.mount(libc, None, "/", slave, "cannot make / a slave of the host's")
    except launcher.LaunchError:
        return False  # the host's mounts as they are now, each launcher detaching the pods'
    return bool(libc.umount2(os.fsencode(os.path.realpath(pods_dir)), launcher.MNT_DETACH) == 0)


def _fork_in_session(child: Callable[[], object]) -> int:
    """A forked child that runs `child()` (which execs or exits) in a session of its own; its
    pid, answered once the child leads that session: a kill of its process group (the agent
    cancelling the start, stopping the pod) must never find no such group yet, and miss it (as
    Popen returns only after its child's setsid, and its exec)."""
    in_session, session_made = os.pipe()
    pid = os.fork()
    if pid != 0:
        os.close(session_made)
        os.read(in_session, 1)  # EOF: the child closed its end after setsid, or died
        os.close(in_session)
        return pid
    try:
        os.close(in_session)
        os.setsid()
        os.close(session_made)
        child()
    finally:
        os._exit(launcher.EXIT_FAILED)


def _forked_launch(config: dict[str, Any], fds: list[int], server_fd: int) -> int:
    _, stdin_fd, out_fd, error_fd = fds[:LAUNCH_FDS]

    def prepare_and_follow() -> None:
        # As `spawn` starts the launcher (Popen with start_new_session, close_fds).
        os.dup2(stdin_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        for fd in (server_fd, stdin_fd, out_fd):
            if fd > 2:
                os.close(fd)
        launcher.follow(config, error_fd, fds[LAUNCH_FDS:])

    return _fork_in_session(prepare_and_follow)


def _spawned_launch(config: dict[str, Any], fds: list[int], home: int, ignores: int) -> int:
    """The container started by the server in a mount namespace of its own (above); its pid.
    A failure is written to the error pipe, and the pid is a child's that exits at once."""
    try:
        return _spawn_in_namespace(config, fds[1], fds[2], fds[LAUNCH_FDS:], home, ignores)
    except Exception as e:
        os.write(fds[3], marshal.dumps(launcher.report_of(e)))
        return _fork_in_session(lambda: None)


def _spawn_in_namespace(
    config: dict[str, Any],
    stdin: int,
    out: int,
    trees: list[int],
    home: int,
    ignores: int,
    base: int | None = None,
) -> int:
    """Started as the agent starts a plain container (posixspawn.py: its fds and exec errors),
    in a copy of the namespace the server is in (of `base`, if given), the signals in
    `ignores` left ignored. The server is back in `home` when this returns."""
    global _astray
    try:
        libc = launcher.c_library()
        if base is not None and libc.setns(base, launcher.CLONE_NEWNS) != 0:
            number = ctypes.get_errno()
            why = f"cannot enter the launch namespace (setns): {os.strerror(number)}"
            raise launcher.LaunchError("mount", why, number)
        launcher.unshare()
        launcher.set_up_mounts_of(config, trees)
        cwd = str(config["cwd"])
        err = launcher.chdir(cwd)  # entered here, in the container's mounts, as a launcher would
        if err is not None:
            raise launcher.chdir_failed(cwd, err)
        argv = [str(a) for a in config["argv"]]
        env = {str(k): str(v) for k, v in config["env"].items()}
        try:
            pid = posixspawn.spawn_process(
                argv[0], argv, env, cwd, stdin, out, keep_ignored=ignores
            )
        except (OSError, ValueError) as e:
            raise launcher.exec_failed(e) from e
        return pid
    finally:
        # Its root and working directory with it.
        if launcher.c_library().setns(home, launcher.CLONE_NEWNS) != 0:
            _astray = True


def _failed(stage: str, e: OSError) -> tuple[Any, ...]:
    return ("failed", stage, e.errno, e.strerror, e.filename)


def _marker_and_log(
    marker: str, sandbox: str, log_path: str, cwd: str | None
) -> int | tuple[Any, ...]:
    """A start's files, in the order starts.py's plain route takes: the marker, the log's
    directory, the working directory looked at (if given), the log file: its fd, or the
    failure's answer."""
    try:
        try:
            os.link(sandbox, marker)  # no new inode (starts.py says why)
        except FileExistsError:
            pass
        except OSError:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError as e:
        return _failed("marker", e)
    log_dir = os.path.dirname(log_path)
    with contextlib.suppress(OSError):  # the log file's open below says why
        os.makedirs(log_dir, mode=0o700, exist_ok=True)
    if cwd is not None and not os.path.isdir(cwd):
        return ("failed", "cwd", 0, "", cwd)
    try:
        try:
            return os.open(log_path, LOG_FLAGS, 0o600)
        except FileNotFoundError:
            os.makedirs(log_dir, mode=0o700, exist_ok=True)
            return os.open(log_path, LOG_FLAGS, 0o600)
    except OSError as e:
        return _failed("log", e)


def _spawn_plain(request: tuple[Any, ...], stdin: int) -> tuple[Any, ...]:
    """A "spawn" request answered (above): its files (`_marker_and_log`), then the spawn."""
    _, marker, sandbox, log_path, argv, env, cwd = request
    log_fd = _marker_and_log(marker, sandbox, log_path, cwd)
    if isinstance(log_fd, tuple):
        return log_fd
    try:
        pid = posixspawn.spawn_process(str(argv[0]), argv, env, cwd, stdin, log_fd)
    except OSError as e:
        if e.errno in (ENOENT, ENOTDIR) and not os.path.isdir(cwd):
            e.filename = cwd  # the chdir failed: the directory went after the look above
        return _failed("exec", e)
    except ValueError as e:  # a NUL byte, or "=" in a variable name
        return ("failed", "value", 0, str(e), None)
    finally:
        with contextlib.suppress(OSError):  # started or not, the close changes nothing of it
            os.close(log_fd)
    return ("spawned", pid)


def _spawn_mounted(
    request: tuple[Any, ...], stdin: int, home: int, base: int | None, ignores: int
) -> tuple[Any, ...]:
    """A "spawn-in-namespace" request answered (above): the files as for "spawn" (the
    working directory is looked at in the container's mounts), the sources' trees cloned here,
    in the agent's namespace, then the container spawned in a copy of `base` (the server's
    launch namespace) with them mounted, as a launch server spawns one."""
    _, marker, sandbox, log_path, config = request
    log_fd = _marker_and_log(marker, sandbox, log_path, None)
    if isinstance(log_fd, tuple):
        return log_fd
    try:
        # Without a launch namespace (no open_tree, or no pods directory's mount), a copy of
        # the agent's: its binds by path, and every pod's volume detached from it.
        config["pods_detached"] = base is not None
        # Cloned here, in the agent's namespace: the launch namespace has no pod's volume.
        trees = launcher.clone_trees(config.get("mounts") or []) if base is not None else []
        try:
            return (
                "spawned",
                _spawn_in_namespace(config, stdin, log_fd, trees, home, ignores, base),
            )
        finally:
            for fd in trees:
                os.close(fd)
    except Exception as e:
        report = launcher.report_of(e)
        report["message"] = report["message"][:ANSWER_TEXT]  # an answer is one short message
        return ("failed", "launch", report)
    finally:
        with contextlib.suppress(OSError):
            os.close(log_fd)


def _launch_namespace(pods_dir: str | None, home: int) -> int | None:
    """For a server that stays in the agent's namespace (its plain spawns run there): the
    launch server's own namespace (`own_namespace`) made once and held by an fd, the server
    back in `home`; None where it cannot be made (each launch then copies the agent's). Not
    called in a chroot (`serve`)."""
    if not pods_dir:
        return None
    made = own_namespace(pods_dir)
    base = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC) if made else None
    moved = os.stat("/proc/self/ns/mnt").st_ino != os.fstat(home).st_ino
    if moved and launcher.c_library().setns(home, launcher.CLONE_NEWNS) != 0:
        os._exit(launcher.EXIT_FAILED)  # its plain spawns would be in the wrong mounts
    return base


def _inherited_ignores() -> int:
    """The signals this server was started with ignored (as /proc's SigIgn mask), less SIGPIPE
    and SIGXFSZ, which Python ignores: what a forked launcher's exec keeps (`restore_signals`),
    as Popen's child does, so a container spawned here keeps them too (nohup's SIGHUP)."""
    with open("/proc/self/status", "rb") as f:
        line = next(line for line in f if line.startswith(b"SigIgn:"))
    mask = int(line.split()[1], 16)
    signals: Any = __import__("_signal")  # the builtin behind `signal` (which imports enum)
    python_ignores: int = (1 << (signals.SIGPIPE - 1)) | (1 << (signals.SIGXFSZ - 1))
    return mask & ~python_ignores


def _wait_status(pid: int) -> int | None:
    try:
        waited, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if waited == pid else None


def _kill(pid: int) -> tuple[Any, ...]:
    """Its group SIGKILLed (a spawned child leads its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, SIGKILL)
    return ("killed",)


def serve(socket_fd: int, agent_pid: int, pods_dir: str | None, in_agent_namespace: bool) -> None:
    launcher.prctl("server", "cannot follow the agent's death", PR_SET_PDEATHSIG, SIGKILL)
    if os.getppid() != agent_pid:
        os._exit(0)  # the agent died before the line above
    # In a chroot, a setns (back to `home`) would take the server out of it: a spawn server
    # makes no launch namespace and refuses launches, which go through the launch servers.
    chrooted = os.readlink("/proc/self/root") != "/"
    base: int | None = None
    if in_agent_namespace:
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        base = None if chrooted else _launch_namespace(pods_dir, home)
        pods_detached = False
    else:
        pods_detached = bool(pods_dir) and own_namespace(str(pods_dir))
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    os.set_inheritable(socket_fd, False)  # nothing a container spawned here should hold
    server = socket.socket(fileno=socket_fd)
    libc = launcher.c_library()
    for name in LAUNCH_CALLS:
        getattr(libc, name)  # looked up once here, not in every launcher
    spawnable_here = posixspawn.available()
    launches_here = spawnable_here and not chrooted
    ignores = _inherited_ignores()  # as the server was started: read once
    # The stdin of the containers it spawns plainly, as the agent's own (spawn.null_stdin).
    null_stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    while True:
        data, fds, flags, _ = socket.recv_fds(
            server, REQUEST_BYTES, LAUNCH_FDS + launcher.MAX_TREES
        )
        if not data:
            os._exit(0)  # the agent closed its end: it stops
        for fd in fds:
            # Close-on-exec, every one (recv_fds passes no MSG_CMSG_CLOEXEC on): a container
            # spawned here gets its stdio alone.
            os.set_inheritable(fd, False)
        reply: tuple[Any, ...]
        try:
            request: tuple[Any, ...] = (
                marshal.loads(data) if not flags & socket.MSG_TRUNC else ("too long",)
            )
            if request[0] == "too long":
                reply = ("error", f"a request longer than {REQUEST_BYTES} bytes")
            elif request[0] == "spawn" and len(request) == 7:
                reply = _spawn_plain(request, null_stdin)
            elif request[0] == "spawn-in-namespace" and len(request) == 5:
                if not launches_here or not launcher.spawnable(request[4]):
                    reply = ("error", "not a container this server can spawn")
                else:
                    reply = _spawn_mounted(request, null_stdin, home, base, ignores)
            elif request[0] == "launch" and len(fds) >= LAUNCH_FDS:
                config = marshal.loads(launcher.read_all(fds[0], close=False))
                config["pods_detached"] = pods_detached
                if spawnable_here and launcher.spawnable(config):
                    reply = ("launched", _spawned_launch(config, fds, home, ignores))
                else:
                    reply = ("launched", _forked_launch(config, fds, socket_fd))
            elif request[0] in ("reap", "kill") and int(request[1]) <= 1:
                reply = ("error", f"not a child's pid: {request[1]!r:.20}")
            elif request[0] == "reap":
                reply = ("reaped", _wait_status(int(request[1])))
            elif request[0] == "kill":
                reply = _kill(int(request[1]))
            else:
                reply = ("error", f"not a request: {request!r:.200} with {len(fds)} fds")
        except Exception as e:  # a request it cannot read: said, and the next one served
            reply = ("error", f"{type(e).__name__}: {e}")
        finally:
            for fd in fds:
                os.close(fd)
        try:
            server.send(marshal.dumps(reply))
        except OSError:
            os._exit(0)  # the agent closed its end, or gave the server up
        if _astray:
            # The agent starts another one (launchserver.py, spawnserver.py).
            os._exit(launcher.EXIT_FAILED)


def main() -> None:
    args = sys.argv[1:]
    in_agent_namespace = IN_AGENT_NAMESPACE in args
    if in_agent_namespace:
        args.remove(IN_AGENT_NAMESPACE)
    pods_dir = args[2] if len(args) > 2 else None
    serve(int(args[0]), int(args[1]), pods_dir, in_agent_namespace)


if __name__ == "__main__":
    main()
