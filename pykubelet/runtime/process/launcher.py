"""The process runtime's launcher: prepares a container's process, then execs its command.

Run as `python -I -S launcher.py CONFIG_FD ERROR_FD [TREE_FD ...]` only for containers that need
it (cgroups, mounts, another user): plain containers are exec'd directly, since this costs a
Python start (or forked by a launch server, launchserver_main.py, which also follows these
instructions itself for a container that asks for mounts alone). `-S` keeps site-packages out,
so this file imports nothing but the standard library and never the pykubelet package. It runs
as root with a fixed environment (PATH only): the container's own variables (LD_PRELOAD...)
would reach the dynamic linker of a root process; they are in the instructions and only the
exec'd command gets them.

CONFIG_FD holds the instructions in `marshal`'s format (a memfd, read once; the agent and the
launcher are one interpreter, `sys.executable`, so the format is the same on both sides, and
unlike `json` it costs no import: this file's imports are most of a container's start):
    {"cgroups": [".../cgroup.procs", ...], "mounts": [{"source", "target", "read_only", "tree"}],
     "read_only_root": bool, "pods_dir": str|null, "uid": int|null, "gid": int|null,
     "groups": [int]|null, "cwd": str, "argv": [str, ...], "env": {str: str},
     "home_of_user": bool, "tty": bool, "no_new_privs": bool, "capabilities": [int]|null,
     "pods_detached": bool (a launch server's: its namespace has nothing of pods_dir)}
("home_of_user": HOME becomes the user's home from /etc/passwd, or /, as runc sets it. "tty": the
container's stdin is a terminal, made its controlling terminal first, as below for --exec.
"no_new_privs": allowPrivilegeEscalation false. "capabilities": the capability numbers the
process keeps, as runc applies a container's set: every other one leaves the bounding set before
the user changes, and these are its effective, permitted, inheritable and (for a user that is
not root) ambient set after. "tree": null, or the index among the TREE_FDs (or the fds a launch
server was sent) of the source's mounts as the agent cloned them with open_tree: they are moved
into place instead of a bind of the path, which a launch server's namespace may not have.)
In that order, the launcher joins the cgroups (before anything is forked, so nothing escapes
them), enters a private mount namespace with the binds, drops to the user and execs. Any failure
before the exec is written to ERROR_FD as one object {"stage", "errno", "message"} (marshal) and
the launcher exits 127. ERROR_FD is close-on-exec: the agent reads EOF with nothing on it once the
exec succeeded, exactly as Popen learns of an exec error.

`launcher.py --exec CONFIG_FD [ERROR_FD]` runs a command in a running container's context
instead (an exec probe or hook, `kubectl exec`): the same JSON, with "mount_ns_pid" and
"mount_ns_start_time" (the container's process, whose mount namespace it enters) in place of
mounts, and "tty": bool. A failure is written to stderr (the command's output) and exits 127;
given ERROR_FD, it is reported there as for a container instead, so the agent can tell that
the command never ran. With "tty", standard input is a terminal that becomes the command's
controlling terminal (a new session, TIOCSCTTY) before anything else, and is given to the user
the command runs as.

A missing mount point is created on the host (the mount namespace shares the host's files): an
empty directory, or an empty file when the source is a file, which stays there afterwards. The
path to it is walked one component at a time without following a symlink that is not root's: a
container's user could otherwise plant one (in /tmp, in an emptyDir) to have a volume bound over
/etc, say, in its namespace.
"""

from __future__ import annotations

import ctypes
import errno as errnos
import marshal
import os
import stat
import sys
import warnings  # noqa: F401 - os.execvpe imports it, after the user switch may bar the library

TYPE_CHECKING = False  # typing's, without importing typing (3 ms a start)
if TYPE_CHECKING:
    from typing import Any, NoReturn

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
# mount_setattr(2), Linux >= 5.12: one call for a whole tree of mounts.
SYS_MOUNT_SETATTR = 442
MOUNT_ATTR_RDONLY = 1
MOUNT_ATTR_NOSUID = 2
MOUNT_ATTR_NODEV = 4
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
# open_tree(2) and move_mount(2), Linux >= 5.2 (numbered alike on every architecture).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40
MAX_SYMLINKS = 40

EXIT_FAILED = 127
MAX_TREES = 240  # mount trees a launch server's message carries: 253 fds at most (SCM_MAX_FD)


class LaunchError(Exception):
    def __init__(self, stage: str, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.errno = errno


_LIBC: Any = None


def c_library() -> Any:
    """The C library, loaded once per process: a launch server loads it (and the functions a
    launch calls) before it forks, and each launcher inherits them ready (0.13 ms a launch)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _check(result: int, stage: str, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise LaunchError(stage, f"{what}: {os.strerror(err)}", err)


def mount(libc: Any, source: str | None, target: str, flags: int, what: str) -> None:
    src = None if source is None else os.fsencode(source)
    _check(libc.mount(src, os.fsencode(target), None, ctypes.c_ulong(flags), None), "mount", what)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _set_attrs(libc: Any, dir_fd: int, path: str, flags: int, attrs: int, clear: int = 0) -> bool:
    """mount_setattr(2): sets `attrs` and clears `clear` on every mount of the tree at `path`;
    False if the kernel is too old for it (the caller then remounts one mount at a time)."""
    attr = _MountAttr(attrs, clear, 0, 0)
    result = libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.c_uint(flags | AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err == errnos.ENOSYS:
        return False
    raise LaunchError("mount", f"cannot restrict the mounts at {path}: {os.strerror(err)}", err)


def _kept_flags(path: str) -> int:
    """The flags of the mount at `path` that a bind remount would otherwise clear."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
        (os.ST_RDONLY, MS_RDONLY),
    ):
        if f & st:
            out |= ms
    return out


def _read_only_mount(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _remount(libc: Any, path: str, flags: int, what: str, clear: int = 0) -> None:
    kept = _kept_flags(path) & ~clear
    mount(libc, None, path, MS_BIND | MS_REMOUNT | flags | kept, what)


def _open_tree(path: str, flags: int) -> int:
    libc = c_library()
    fd: int = libc.syscall(
        ctypes.c_long(SYS_OPEN_TREE),
        ctypes.c_int(AT_FDCWD),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.c_uint(flags | os.O_CLOEXEC),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def trees_supported() -> bool:
    """Whether this kernel has open_tree and move_mount (Linux >= 5.2)."""
    try:
        os.close(_open_tree("/", 0))  # an O_PATH fd of /, nothing cloned
    except OSError:
        return False
    return True


def clone_tree(path: str) -> int:
    """A detached copy of the mounts at `path` and below (what a recursive bind would mount,
    as this mount namespace sees them), to mount elsewhere with move_mount: its fd. OSError as
    open(2) raises it. It lets the interpreter lock go: the kernel's mount lock, which the
    launch servers' namespaces take too, may keep it waiting."""
    return _open_tree(path, OPEN_TREE_CLONE | AT_RECURSIVE)


def clone_trees(mounts: list[dict[str, Any]]) -> list[int]:
    """Each mount's source cloned (`clone_tree`) as this namespace sees it, the mount given
    the index of its tree ("tree"); their fds. A source that cannot be cloned fails the
    whole (a LaunchError naming it and its target), the trees cloned before it closed."""
    trees: list[int] = []
    try:
        for m in mounts:
            source, target = str(m["source"]), str(m["target"])
            try:
                trees.append(clone_tree(source))
            except OSError as e:
                why = f"{source} is missing" if e.errno == errnos.ENOENT else e.strerror
                raise LaunchError(
                    "mount", f"cannot mount {source} at {target}: {why}", e.errno
                ) from None
            m["tree"] = len(trees) - 1
    except BaseException:
        for fd in trees:
            os.close(fd)
        raise
    return trees


def _move_tree(libc: Any, tree: int, point_fd: int, what: str) -> None:
    result = libc.syscall(
        ctypes.c_long(SYS_MOVE_MOUNT),
        ctypes.c_int(tree),
        ctypes.c_char_p(b""),
        ctypes.c_int(point_fd),
        ctypes.c_char_p(b""),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
    )
    _check(result, "mount", what)


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo, where space, tab, newline and backslash are octal."""
    if "\\" not in field:
        return field
    raw = os.fsencode(field)
    out, i = bytearray(), 0
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return os.fsdecode(bytes(out))


def mount_points() -> list[str]:
    """The mount points of this namespace (also the agent's: podsmount.py)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return [_unescape(line.split(" ")[4]) for line in f if line.strip()]


def join_mount_namespace(pid: int, start_time: int | None) -> None:
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise LaunchError(
            "mount", f"cannot open the mount namespace of process {pid}: {e.strerror}", e.errno
        ) from e
    try:
        # Opened first, checked second: the namespace is the container's, not that of a process
        # that got its pid after it exited.
        if start_time is not None and _start_time(pid) != start_time:
            raise LaunchError("mount", f"process {pid} is no longer the container's")
        _check(c_library().setns(fd, CLONE_NEWNS), "mount", f"cannot enter the mounts of {pid}")
    finally:
        os.close(fd)


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2 :].split()[19])


def join_cgroups(procs_files: list[str]) -> None:
    pid = str(os.getpid())
    for path in procs_files:
        try:
            with open(path, "w") as f:
                f.write(pid)
        except OSError as e:
            raise LaunchError("cgroup", f"cannot join cgroup {path}: {e.strerror}", e.errno) from e


class _MountPoint:
    """A mount target, resolved and held open: `fd` (O_PATH) is what gets mounted on, whatever
    happens to the path meanwhile, `name` in the directory `parent_fd` is how the mount on it is
    reached again; `path` is where it really is."""

    def __init__(self, parent_fd: int, name: str, fd: int, path: str) -> None:
        self.parent_fd = parent_fd
        self.name = name
        self.fd = fd
        self.path = path

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.parent_fd)


def _open_mount_point(source: str, target: str, is_dir: bool) -> _MountPoint:
    """Walks `target` from /, creating what is missing (a directory, or a file for a source
    that is not one), following only symlinks owned by root (the host's own, such as
    /var/run -> /run)."""
    target = os.path.normpath(target)
    pending = [p for p in target.split("/") if p]
    if not pending:
        raise LaunchError("mount", f"cannot mount {source} at /")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    where: list[str] = []
    hops = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == "..":
                parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = parent
                if where:
                    where.pop()
                continue
            last = not pending
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if last and not is_dir:
                    os.close(
                        os.open(
                            name,
                            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                            0o644,
                            dir_fd=fd,
                        )
                    )
                else:
                    os.mkdir(name, 0o755, dir_fd=fd)
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0:
                    raise LaunchError(
                        "mount",
                        f"cannot mount {source} at {target}: "
                        f"{'/'.join(['', *where, name])} is a symlink not owned by root",
                    )
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise LaunchError("mount", f"cannot mount {source} at {target}: too many links")
                link = os.readlink(name, dir_fd=fd)
                pending[:0] = [p for p in link.split("/") if p and p != "."]
                if link.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    where = []
                continue
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
            if not last:
                flags |= os.O_DIRECTORY
            child = os.open(name, flags, dir_fd=fd)
            where.append(name)
            if last:
                return _MountPoint(fd, name, child, "/" + "/".join(where))
            os.close(fd)
            fd = child
    except LaunchError:
        os.close(fd)
        raise
    except OSError as e:
        os.close(fd)
        raise LaunchError(
            "mount", f"cannot create the mount point {target}: {e.strerror}", e.errno
        ) from e
    os.close(fd)
    # Only a symlink can end the walk without a name to mount on: one to "/", or ending in "..".
    raise LaunchError("mount", f"cannot mount {source} at {target}: a symlink in it ends in /, ..")


def _make_tree_read_only(libc: Any) -> None:
    if _set_attrs(libc, AT_FDCWD, "/", 0, MOUNT_ATTR_RDONLY):
        return
    for path in sorted(set(mount_points()), key=len):
        try:
            _remount(libc, path, MS_RDONLY, f"cannot make {path} read-only")
        except (LaunchError, OSError):
            if path == "/":
                raise  # a mount hidden under another one cannot be reached, nor written


def _bind(libc: Any, source: str, point: _MountPoint, read_only: bool, tree: int | None) -> None:
    """`read_only`: asked for, or the source was on the host (before / turned read-only, which
    the bind inherits otherwise). `tree`: the source's mounts as the agent cloned them, moved
    here, instead of a bind of the path as this namespace sees it (its fd stays open: its
    owner's to close, or close-on-exec)."""
    what = f"cannot bind {source} at {point.path}"
    if tree is None:
        mount(libc, source, f"/proc/self/fd/{point.fd}", MS_BIND | MS_REC, what)
        want = os.stat(source)
    else:
        want = os.fstat(tree)
        _move_tree(libc, tree, point.fd, what)
    # The new mount sits on top of the mount point, out of reach of the held fd: looked up again
    # in the held parent, it must be the source's root, or the name was replaced meanwhile.
    try:
        fd = os.open(point.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=point.parent_fd)
    except OSError as e:
        raise LaunchError("mount", f"{what}: {e.strerror}", e.errno) from e
    try:
        got = os.fstat(fd)
        if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
            raise LaunchError("mount", f"{what}: {point.path} changed while it was mounted")
        if tree is not None:
            # A clone of a shared mount joins its peer group: private, as a bind made here is.
            mount(libc, None, f"/proc/self/fd/{fd}", MS_REC | MS_PRIVATE, f"{what} (private)")
        # A bind ignores flags; set-user-ID programs and device files from a volume would give
        # the container's user what its runAsUser denies.
        attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0)
        clear = 0 if read_only else MOUNT_ATTR_RDONLY
        if not _set_attrs(libc, fd, "", AT_EMPTY_PATH, attrs, clear):
            flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
            what = f"cannot restrict {point.path}"
            _remount(libc, f"/proc/self/fd/{fd}", flags, what, 0 if read_only else MS_RDONLY)
    finally:
        os.close(fd)


def _detach_pods(pods_dir: str, mounts: list[tuple[str, _MountPoint]], pods_detached: bool) -> None:
    """Every mount under the agent's pods directory (other pods' tmpfs volumes, copied by
    unshare) goes from this namespace: a copy would keep their memory after the agent unmounts
    them. The container's own binds are mounts at their targets and stay. When the directory
    is a mount itself, that one detach takes them all (one call, not one per pod).
    `pods_detached`: the namespace copied had none of it (a launch server's own)."""
    # As mountinfo spells them: the agent's --root-dir may be reached through a symlink.
    pods_dir = os.path.realpath(pods_dir)
    roots = [pods_dir]
    for source, point in mounts:
        # A bind of a directory above the pods directory (MS_REC) copied them there too.
        rel = os.path.relpath(pods_dir, os.path.realpath(source))
        if not rel.startswith(".."):
            roots.append(os.path.normpath(os.path.join(point.path, rel)))
    if pods_detached:
        roots.remove(pods_dir)  # never in the launch server's namespace, nor in this copy
    own = {point.path for _, point in mounts}
    libc = c_library()
    rest = []
    for root in roots:
        if not any(o == root or o.startswith(root + "/") for o in own):
            # A mount of its own (the agent binds the pods directory onto itself,
            # podsmount.py): detached, it takes every volume below it along, in one call and
            # without reading mountinfo, which holds a line per pod's volume.
            if libc.umount2(os.fsencode(root), MNT_DETACH) == 0:
                continue
            err = ctypes.get_errno()
            if err not in (errnos.EINVAL, errnos.ENOENT):  # no mount point there, or no path
                raise LaunchError("mount", f"cannot detach {root}: {os.strerror(err)}", err)
        rest.append(root)
    points = mount_points() if rest else []
    doomed = [p for p in points if p not in own and any(p.startswith(r + "/") for r in rest)]
    for path in sorted(doomed, key=lambda p: p.count("/"), reverse=True):
        if libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            # Already gone with a mount above it.
            if err not in (errnos.EINVAL, errnos.ENOENT):
                raise LaunchError("mount", f"cannot detach {path}: {os.strerror(err)}", err)


def unshare() -> None:
    """This process in a mount namespace of its own, a copy of the one it was in."""
    _check(c_library().unshare(CLONE_NEWNS), "mount", "cannot create a mount namespace (unshare)")


def set_up_mounts(
    mounts: list[dict[str, Any]],
    read_only_root: bool,
    pods_dir: str | None,
    trees: list[int] | None = None,
    pods_detached: bool = False,
) -> None:
    """The container's mounts, in the new mount namespace the caller made (`unshare`).
    `trees`: the fds of the sources' mounts cloned by the agent, indexed by each mount's "tree"
    (those of the launch server's children, whose namespace has no pod's volume)."""
    libc = c_library()
    # Private, so that nothing mounted here shows on the host, nor the other way round.
    mount(libc, None, "/", MS_REC | MS_PRIVATE, "cannot make / private")
    points: list[tuple[str, _MountPoint]] = []
    read_only: list[bool] = []
    tree_of: list[int | None] = []
    try:
        # All mount points first: they are made on the host's files, before / is read-only.
        for m in mounts:
            source, target = str(m["source"]), str(m["target"])
            tree = None if m.get("tree") is None or trees is None else trees[int(m["tree"])]
            if tree is not None:
                is_dir = stat.S_ISDIR(os.fstat(tree).st_mode)
                source_read_only = bool(os.fstatvfs(tree).f_flag & os.ST_RDONLY)
            elif os.path.exists(source):
                is_dir, source_read_only = os.path.isdir(source), _read_only_mount(source)
            else:
                raise LaunchError(
                    "mount", f"cannot mount {source} at {target}: {source} is missing"
                )
            points.append((source, _open_mount_point(source, target, is_dir)))
            read_only.append(bool(m.get("read_only")) or source_read_only)
            tree_of.append(tree)
        if read_only_root:
            # The whole tree (/tmp, /dev/shm...), then the binds, which are the container's own
            # to write; files opened before (the log) remain writable.
            _make_tree_read_only(libc)
        for (source, point), ro, tree in zip(points, read_only, tree_of, strict=True):
            _bind(libc, source, point, ro, tree)
        if pods_dir:
            _detach_pods(pods_dir, points, pods_detached)
    finally:
        for _, point in points:
            point.close()


def set_up_mounts_of(config: dict[str, Any], trees: list[int] | None) -> None:
    """`set_up_mounts` as the instructions ask (in the namespace the caller made)."""
    set_up_mounts(
        list(config.get("mounts") or []),
        bool(config.get("read_only_root")),
        config.get("pods_dir"),
        trees,
        bool(config.get("pods_detached")),
    )


def spawnable(config: dict[str, Any]) -> bool:
    """Whether a launch server can spawn the container itself, in a namespace it makes
    (launchserver_main.py): it asks for its mounts alone, nothing only its own process can
    take (cgroups, a terminal, no_new_privs, another user, capabilities)."""
    taken = ("cgroups", "tty", "no_new_privs", "mount_ns_pid")
    identity = ("uid", "gid", "groups", "capabilities")
    return not any(config.get(k) for k in taken) and all(config.get(k) is None for k in identity)


def chdir(cwd: str) -> OSError | None:
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


def prctl(stage: str, what: str, *args: int) -> None:
    values = [*args, 0, 0, 0, 0][:5]
    _check(c_library().prctl(*(ctypes.c_ulong(v) for v in values)), stage, what)


def drop_bounding(keep: list[int]) -> None:
    """Every capability not in `keep` leaves the bounding set (needs CAP_SETPCAP: before the
    user changes)."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())  # noqa: SIM115 - one read
    for cap in range(last + 1):
        if cap not in keep:
            prctl("capabilities", f"cannot drop capability {cap}", PR_CAPBSET_DROP, cap)


def set_capabilities(keep: list[int], ambient: bool) -> None:
    """The process's effective, permitted and inheritable sets become `keep` (capset), and its
    ambient set too when `ambient` (a user that is not root keeps them across the exec)."""
    low = sum(1 << c for c in keep if c < 32)
    high = sum(1 << (c - 32) for c in keep if c >= 32)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(low, low, low, high, high, high)
    libc = c_library()
    number = SYS_CAPSET.get(os.uname().machine)
    if number is None:
        raise LaunchError("capabilities", f"capset: unknown system call on {os.uname().machine}")
    if libc.syscall(ctypes.c_long(number), header, data) != 0:
        err = ctypes.get_errno()
        raise LaunchError("capabilities", f"cannot set capabilities: {os.strerror(err)}", err)
    if ambient:
        for cap in keep:
            prctl("capabilities", f"cannot raise ambient capability {cap}", PR_CAP_AMBIENT,
                   PR_CAP_AMBIENT_RAISE, cap)  # fmt: skip


def switch_user(
    uid: int | None, gid: int | None, groups: list[int] | None, cwd: str
) -> OSError | None:
    """Groups, gid, uid; returns the error of a chdir tried as root that the user should retry.

    The working directory is entered as root first (the default one, the pod's directory, is
    0700 root), and again as the user only if root could not (as runc does, for a directory on
    NFS with root squashing)."""
    early = chdir(cwd)
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
    if os.getuid() != 0:
        # No set-user-ID program (su, sudo, one on a volume) gives root back to the user.
        _check(
            c_library().prctl(PR_SET_NO_NEW_PRIVS, *(ctypes.c_ulong(v) for v in (1, 0, 0, 0))),
            "user",
            "cannot set no_new_privs",
        )
    return early if early is None else chdir(cwd)


def take_terminal(uid: int | None) -> None:
    """Standard input, a terminal, becomes the controlling terminal of a new session (as runc
    gives a container its console); owned by the user the command runs as, so that it can
    change its modes and a program that checks its terminal's owner (write, mesg) works."""
    import fcntl  # builtin modules, as pwd
    import termios

    try:
        if os.getsid(0) != os.getpid():  # the agent starts it as a session leader already
            os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if uid is not None:
            os.fchown(0, uid, -1)
    except OSError as e:
        raise LaunchError(
            "tty", f"cannot make the terminal a controlling terminal: {e.strerror}", e.errno
        ) from e


def launch(config: dict[str, Any], error_fd: int | None, trees: list[int] | None = None) -> None:
    if config.get("tty"):
        uid = config.get("uid")
        take_terminal(None if uid is None else int(uid))
    join_cgroups(list(config.get("cgroups") or []))
    if config.get("mount_ns_pid"):
        start_time = config.get("mount_ns_start_time")
        join_mount_namespace(
            int(config["mount_ns_pid"]), None if start_time is None else int(start_time)
        )
    elif config.get("mounts") or config.get("read_only_root"):
        unshare()
        set_up_mounts_of(config, trees)
    cwd = str(config["cwd"])
    keep = config.get("capabilities")
    if keep is not None:
        drop_bounding([int(c) for c in keep])
        prctl("capabilities", "cannot keep capabilities", PR_SET_KEEPCAPS, 1)
    err = switch_user(config.get("uid"), config.get("gid"), config.get("groups"), cwd)
    if err is not None:
        raise chdir_failed(cwd, err)
    if keep is not None:
        set_capabilities([int(c) for c in keep], ambient=os.getuid() != 0)
    if config.get("no_new_privs"):
        prctl("no_new_privs", "cannot set no_new_privs", PR_SET_NO_NEW_PRIVS, 1)
    argv = [str(a) for a in config["argv"]]
    env = {str(k): str(v) for k, v in config["env"].items()}
    uid = config.get("uid")
    if config.get("home_of_user") and uid is not None:
        env["HOME"] = _home(int(uid))
    if error_fd is not None:
        os.set_inheritable(error_fd, False)  # closed by a successful exec: the agent reads EOF
    restore_signals()
    try:
        os.execvpe(argv[0], argv, env)
    except (OSError, ValueError) as e:
        raise exec_failed(e) from e


def chdir_failed(cwd: str, e: OSError) -> LaunchError:
    return LaunchError("chdir", f"cannot enter {cwd}: {e.strerror}", e.errno)


def exec_failed(e: OSError | ValueError) -> LaunchError:
    if isinstance(e, OSError):
        return LaunchError("exec", e.strerror or str(e), e.errno)
    return LaunchError("exec", str(e))  # a NUL byte in an argument or variable


def restore_signals() -> None:
    """The dispositions Python set at its start back to the default, as Popen's restore_signals
    does: an ignored signal survives exec, and the command would ignore SIGPIPE and SIGXFSZ.
    (`_signal`, the builtin behind `signal`, which would import enum.)"""
    _signal: Any = __import__("_signal")

    for name in ("SIGPIPE", "SIGXFSZ"):
        number = getattr(_signal, name, None)
        if number is not None:
            _signal.signal(number, _signal.SIG_DFL)


def read_all(fd: int, close: bool = True) -> bytes:
    """`fd` read to its end, then closed unless `close` is False (os.read: a file object costs
    a forked launcher as much as the read)."""
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        if close:
            os.close(fd)
    return b"".join(chunks)


def run_launch(config_fd: int, error_fd: int | None, trees: list[int] | None = None) -> None:
    """Read the instructions, follow them and exec; never returns: a failure is reported (on
    error_fd, else on stderr) and the process exits EXIT_FAILED."""
    try:
        config = marshal.loads(read_all(config_fd))
    except BaseException as e:
        report_and_exit(report_of(e), error_fd)
    follow(config, error_fd, trees)


def follow(config: dict[str, Any], error_fd: int | None, trees: list[int] | None) -> None:
    """As `run_launch`, with the instructions read."""
    try:
        launch(config, error_fd, trees)
        report = {"stage": "launcher", "errno": None, "message": "exec returned"}
    except BaseException as e:
        report = report_of(e)
    report_and_exit(report, error_fd)


def report_of(e: BaseException) -> dict[str, Any]:
    if isinstance(e, LaunchError):
        return {"stage": e.stage, "errno": e.errno, "message": e.message}
    # Never a silent crash: the agent turns this into a StartError.
    return {"stage": "launcher", "errno": None, "message": f"{type(e).__name__}: {e}"}


def report_and_exit(report: dict[str, Any], error_fd: int | None) -> NoReturn:
    try:
        if error_fd is None:
            os.write(2, f"pykubelet launcher: {report['message']}\n".encode())
        else:
            # marshal too: nothing to import now, when the user it switched to may not read
            # the interpreter's library any more.
            os.write(error_fd, marshal.dumps(report))
    finally:
        os._exit(EXIT_FAILED)


def main() -> None:
    exec_mode = sys.argv[1] == "--exec"
    args = sys.argv[2:] if exec_mode else sys.argv[1:]
    # An exec without an error pipe reports on stderr, as text: its output is all it has.
    trees = [int(a) for a in args[2:]]  # a container's: the mount trees, after CONFIG and ERROR
    for fd in trees:
        os.set_inheritable(fd, False)  # moved into place, then closed by the exec
    run_launch(int(args[0]), int(args[1]) if len(args) > 1 else None, trees)


if __name__ == "__main__":
    main()
