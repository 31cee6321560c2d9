"""The process runtime's launcher: prepares a container's process, then execs its command.

Run as `python -I -S launcher.py CONFIG_FD ERROR_FD` only for containers that need it (cgroups,
mounts, another user): plain containers are exec'd directly, since this costs a Python start.
`-S` keeps site-packages out, so this file imports nothing but the standard library and never the
pykubelet package.

CONFIG_FD holds the instructions as JSON (a memfd, read once):
    {"cgroups": [".../cgroup.procs", ...], "mounts": [{"source", "target", "read_only"}],
     "read_only_root": bool, "uid": int|null, "gid": int|null, "groups": [int]|null,
     "cwd": str, "argv": [str, ...], "env": {str: str}, "home_of_user": bool}
("home_of_user": HOME becomes the user's home from /etc/passwd, or /, as runc sets it.)
In that order, the launcher joins the cgroups (before anything is forked, so nothing escapes
them), enters a private mount namespace with the binds, drops to the user and execs. Any failure
before the exec is written to ERROR_FD as one JSON object {"stage", "errno", "message"} and the
launcher exits 127. ERROR_FD is close-on-exec: the agent reads EOF with nothing on it once the
exec succeeded, exactly as Popen learns of an exec error.

`launcher.py --exec JSON` runs an exec probe or hook in a running container's context instead:
the same JSON, with "mount_ns_pid" (the container's pid, whose mount namespace it enters) in
place of mounts and without "env" (the launcher's own environment is the command's); a failure
is written to stderr (the command's output) and exits 127.

A missing mount point is created on the host (the mount namespace shares the host's files): an
empty directory, or an empty file when the source is a file, which stays there afterwards.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

EXIT_FAILED = 127


class LaunchError(Exception):
    def __init__(self, stage: str, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.errno = errno


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, stage: str, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise LaunchError(stage, f"{what}: {os.strerror(err)}", err)


def _mount(libc: Any, source: str | None, target: str, flags: int, what: str) -> None:
    src = None if source is None else os.fsencode(source)
    _check(libc.mount(src, os.fsencode(target), None, ctypes.c_ulong(flags), None), "mount", what)


def join_mount_namespace(pid: int) -> None:
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise LaunchError(
            "mount", f"cannot open the mount namespace of process {pid}: {e.strerror}", e.errno
        ) from e
    try:
        _check(_libc().setns(fd, CLONE_NEWNS), "mount", f"cannot enter the mounts of {pid}")
    finally:
        os.close(fd)


def join_cgroups(procs_files: list[str]) -> None:
    pid = str(os.getpid())
    for path in procs_files:
        try:
            with open(path, "w") as f:
                f.write(pid)
        except OSError as e:
            raise LaunchError("cgroup", f"cannot join cgroup {path}: {e.strerror}", e.errno) from e


def _make_mount_point(source: str, target: str) -> None:
    if os.path.lexists(target):
        return
    try:
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as e:
        raise LaunchError(
            "mount", f"cannot create the mount point {target}: {e.strerror}", e.errno
        ) from e


def set_up_mounts(mounts: list[dict[str, Any]], read_only_root: bool) -> None:
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "mount", "cannot create a mount namespace (unshare)")
    # Private, so that nothing mounted here shows on the host, nor the other way round.
    _mount(libc, None, "/", MS_REC | MS_PRIVATE, "cannot make / private")
    for m in mounts:
        source, target = str(m["source"]), str(m["target"])
        if not os.path.exists(source):
            raise LaunchError("mount", f"cannot mount {source} at {target}: {source} is missing")
        _make_mount_point(source, target)
        _mount(libc, source, target, MS_BIND | MS_REC, f"cannot bind {source} at {target}")
        if m.get("read_only"):
            # A bind takes the source's flags: read-only needs a remount of the new mount.
            _mount(
                libc,
                None,
                target,
                MS_BIND | MS_REMOUNT | MS_RDONLY,
                f"cannot make {target} read-only",
            )
    if read_only_root:
        # Only this namespace's copy of the root mount; the binds above stay as they are, and
        # files opened before (the log) remain writable.
        _mount(libc, None, "/", MS_BIND | MS_REMOUNT | MS_RDONLY, "cannot make / read-only")


def _chdir(cwd: str) -> OSError | None:
    try:
        os.chdir(cwd)
    except OSError as e:
        return e
    return None


def _home(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_dir or "/"
    except KeyError:
        return "/"  # as runc, for a uid without a passwd entry


def _primary_gid(uid: int) -> int:
    import pwd  # a builtin module: no site-packages needed

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return 0  # as runc: a uid with no passwd entry runs with gid 0


def switch_user(
    uid: int | None, gid: int | None, groups: list[int] | None, cwd: str
) -> OSError | None:
    """Groups, gid, uid; returns the error of a chdir tried as root that the user should retry.

    The working directory is entered as root first (the default one, the pod's directory, is
    0700 root), and again as the user only if root could not (as runc does, for a directory on
    NFS with root squashing)."""
    early = _chdir(cwd)
    if uid is None and gid is None and groups is None:
        return early
    if gid is None:
        gid = 0 if uid is None else _primary_gid(uid)
    try:
        os.setgroups(groups or [])
        os.setgid(gid)
        if uid is not None:
            os.setuid(uid)
    except OSError as e:
        raise LaunchError(
            "user", f"cannot switch to uid {uid} gid {gid} groups {groups}: {e.strerror}", e.errno
        ) from e
    return early if early is None else _chdir(cwd)


def launch(config: dict[str, Any], error_fd: int | None) -> None:
    join_cgroups(list(config.get("cgroups") or []))
    if config.get("mount_ns_pid"):
        join_mount_namespace(int(config["mount_ns_pid"]))
    elif config.get("mounts") or config.get("read_only_root"):
        set_up_mounts(list(config.get("mounts") or []), bool(config.get("read_only_root")))
    cwd = str(config["cwd"])
    err = switch_user(config.get("uid"), config.get("gid"), config.get("groups"), cwd)
    if err is not None:
        raise LaunchError("chdir", f"cannot enter {cwd}: {err.strerror}", err.errno)
    argv = [str(a) for a in config["argv"]]
    env = {str(k): str(v) for k, v in config["env"].items()}
    uid = config.get("uid")
    if config.get("home_of_user") and uid is not None:
        env["HOME"] = _home(int(uid))
    if error_fd is not None:
        os.set_inheritable(error_fd, False)  # closed by a successful exec: the agent reads EOF
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        raise LaunchError("exec", e.strerror or str(e), e.errno) from e
    except ValueError as e:  # a NUL byte in an argument or variable
        raise LaunchError("exec", str(e)) from e


def main() -> None:
    exec_mode = sys.argv[1] == "--exec"
    error_fd = 2 if exec_mode else int(sys.argv[2])
    report: dict[str, Any]
    try:
        if exec_mode:
            config = json.loads(sys.argv[2])
            config.setdefault("env", dict(os.environ))  # passed as the environment, not argv
        else:
            with os.fdopen(int(sys.argv[1]), "rb") as f:
                config = json.loads(f.read())
        launch(config, None if exec_mode else error_fd)
        report = {"stage": "launcher", "errno": None, "message": "exec returned"}
    except LaunchError as e:
        report = {"stage": e.stage, "errno": e.errno, "message": e.message}
    except BaseException as e:  # never a silent crash: the agent turns this into a StartError
        report = {"stage": "launcher", "errno": None, "message": f"{type(e).__name__}: {e}"}
    try:
        if exec_mode:
            os.write(error_fd, f"pykubelet launcher: {report['message']}\n".encode())
        else:
            os.write(error_fd, json.dumps(report).encode())
    finally:
        os._exit(EXIT_FAILED)


if __name__ == "__main__":
    main()
