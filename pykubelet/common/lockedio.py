"""File system calls made without letting the interpreter lock go, for the agent's threads.

Each call of `os` lets the lock go around its system call, and taking it back costs the thread
a wait for the lock's holder to let it go: up to the switch interval (5 ms) while the event loop
runs Python. A thread that makes a burst of short calls (a state file is eight: open, write,
fsync, close, rename, and the directory's open, fsync, close) then spends most of its time
waiting. Measured with another thread running Python: 43 ms a state file, 0.19 ms without.
The calls here keep the lock, through the C library (ctypes.PyDLL): use them for what takes
microseconds on a local file system (open, a small file's write, close, rename, mkdir, stat, a
small file's read, chmod, symlink, readlink, unlink, a pipe, a memfd, a pidfd), and `os`
for what may wait for a disk (fsync) or for another process (a socket's answer). In a burst of
100 manifests the file source's reads (stat, then open, read, close) took 0.5 ms a file through
`os`, waiting for the loop, and the first pods' syncs waited for the last manifests. A new
inode on a disk (a create, a mkdir) may take long enough that the loop, waiting for the lock
meanwhile, stalls: a container's start and the state files make theirs through `os`
(bench/HISTORY.md).

They raise OSError (its subclass by errno, as `os` does) naming the path. Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from stat import S_ISDIR, S_ISLNK
from typing import Any, NamedTuple

# PyDLL, unlike CDLL, keeps the interpreter lock through the call.
_LIBC = ctypes.PyDLL(None, use_errno=True)


def _function(name: str, restype: Any, *argtypes: Any) -> Any:
    """The C library's `name`, typed; None where this glibc has none."""
    function = getattr(_LIBC, name, None)
    if function is not None:
        function.argtypes = list(argtypes)
        function.restype = restype
    return function


_int, _str, _size = ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
# open is variadic (the mode): int arguments pass as fixed ones do on Linux.
_open = _function("open", _int, _str, _int, ctypes.c_uint)
_write = _function("write", ctypes.c_ssize_t, _int, _str, _size)
_close = _function("close", _int, _int)
_rename = _function("rename", _int, _str, _str)
_read = _function("read", ctypes.c_ssize_t, _int, ctypes.c_void_p, _size)
_mkdir = _function("mkdir", _int, _str, ctypes.c_uint)
_chmod = _function("chmod", _int, _str, ctypes.c_uint)
_fchmod = _function("fchmod", _int, _int, ctypes.c_uint)
_symlink = _function("symlink", _int, _str, _str)
_readlink = _function("readlink", ctypes.c_ssize_t, _str, _str, _size)
_unlink = _function("unlink", _int, _str)
_lseek = _function("lseek", ctypes.c_long, _int, ctypes.c_long, _int)
_pipe2 = _function("pipe2", _int, ctypes.c_void_p, _int)
# glibc 2.27 and 2.36; before them, os's (which lets the lock go) does.
_memfd_create = _function("memfd_create", _int, _str, ctypes.c_uint)
_pidfd_open = _function("pidfd_open", _int, _int, ctypes.c_uint)
# glibc 2.28 has statx; before it, os.stat (which lets the lock go) does.
_statx = _function("statx", _int, _int, _str, _int, ctypes.c_uint, ctypes.c_void_p)
_PATH_MAX = 4096
_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_BASIC_STATS = 0x7FF
# struct statx (linux/stat.h) up to stx_dev_minor, the same on every architecture: mask,
# blksize, attributes, nlink, uid, gid, mode, pad, ino, size, blocks, attributes_mask, then
# atime, btime and ctime (16 bytes each) skipped, mtime (sec, nsec, pad), rdev and dev.
_STATX = struct.Struct("=IIQIIIHHQQQQ48xqI4xIIII")
_STATX_SIZE = 256  # the kernel's whole struct


def _failed(path: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), path)


def open_fd(path: str, flags: int, mode: int = 0) -> int:
    encoded = os.fsencode(path)
    while True:
        fd = int(_open(encoded, flags, mode))
        if fd >= 0:
            return fd
        if ctypes.get_errno() != errno.EINTR:
            raise _failed(path)


def close_fd(fd: int, path: str) -> None:
    # An EINTR from close on Linux closed the fd all the same: never retried.
    if _close(fd) != 0 and ctypes.get_errno() != errno.EINTR:
        raise _failed(path)


def write_all(fd: int, payload: bytes, path: str) -> None:
    while payload:
        written = int(_write(fd, payload, len(payload)))
        if written < 0:
            if ctypes.get_errno() == errno.EINTR:
                continue
            raise _failed(path)
        payload = payload[written:]


def rename(source: str, target: str) -> None:
    if _rename(os.fsencode(source), os.fsencode(target)) != 0:
        raise _failed(target)


def mkdir(path: str, mode: int) -> None:
    if _mkdir(os.fsencode(path), mode) != 0:
        raise _failed(path)


def makedirs(path: str, mode: int) -> None:
    """`path` made with `mode` and its missing parents with 0777 (less the umask), as
    os.makedirs with exist_ok: a directory there already is fine, anything else there is
    FileExistsError."""
    try:
        mkdir(path, mode)
        return
    except FileExistsError:
        pass
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not parent or parent == path:
            raise
        makedirs(parent, 0o777)
        try:
            mkdir(path, mode)
            return
        except FileExistsError:
            pass
    if not S_ISDIR(stat(path).st_mode):
        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), path)


def chmod(path: str, mode: int) -> None:
    if _chmod(os.fsencode(path), mode) != 0:
        raise _failed(path)


def fchmod(fd: int, mode: int, path: str) -> None:
    if _fchmod(fd, mode) != 0:
        raise _failed(path)


def symlink(target: str, path: str) -> None:
    """`path` made a symbolic link to `target`, as os.symlink(target, path)."""
    if _symlink(os.fsencode(target), os.fsencode(path)) != 0:
        raise _failed(path)


def readlink(path: str) -> str:
    buf = ctypes.create_string_buffer(_PATH_MAX)
    n = int(_readlink(os.fsencode(path), buf, _PATH_MAX))
    if n < 0:
        raise _failed(path)
    return os.fsdecode(buf.raw[:n])


def unlink(path: str) -> None:
    if _unlink(os.fsencode(path)) != 0:
        raise _failed(path)


def lseek(fd: int, offset: int, how: int, path: str) -> int:
    at = int(_lseek(fd, offset, how))
    if at < 0:
        raise _failed(path)
    return at


def pipe() -> tuple[int, int]:
    """(read end, write end), close-on-exec both, as os.pipe."""
    fds = (ctypes.c_int * 2)()
    if _pipe2(fds, os.O_CLOEXEC) != 0:
        raise _failed("pipe")
    return fds[0], fds[1]


def memfd_create(name: str, flags: int) -> int:
    if _memfd_create is None:
        return os.memfd_create(name, flags)
    fd = int(_memfd_create(os.fsencode(name), flags))
    if fd < 0:
        raise _failed(f"memfd {name}")
    return fd


def pidfd_open(pid: int) -> int:
    """A pidfd of process `pid` (close-on-exec, as os.pidfd_open)."""
    if _pidfd_open is None:
        return os.pidfd_open(pid)
    fd = int(_pidfd_open(pid, 0))
    if fd < 0:
        raise _failed(f"process {pid}")
    return fd


class Stat(NamedTuple):
    """What stat(2) tells of a path (links followed): the fields of os.stat_result used here,
    with the same values (a tuple: the file source's re-list makes one per manifest)."""

    st_mode: int
    st_dev: int
    st_ino: int
    st_size: int
    st_mtime_ns: int


def stat(path: str) -> Stat:
    return _stat(path, follow_symlinks=True)


def lstat(path: str) -> Stat:
    """What lstat(2) tells: a symbolic link's own."""
    return _stat(path, follow_symlinks=False)


def exists(path: str) -> bool:
    """As os.path.exists: links followed, False for a path that cannot be looked at."""
    try:
        stat(path)
    except (OSError, ValueError):
        return False
    return True


def is_dir(path: str) -> bool:
    """As os.path.isdir: links followed, False for a path that cannot be looked at."""
    try:
        return S_ISDIR(stat(path).st_mode)
    except (OSError, ValueError):
        return False


def is_symlink(path: str) -> bool:
    """As os.path.islink: False for a path that cannot be looked at."""
    try:
        return S_ISLNK(lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def is_mount(path: str) -> bool:
    """As os.path.ismount: a mount point's device differs from its parent's, or / is its own
    parent; a symbolic link or a path that cannot be looked at is none."""
    try:
        own = lstat(path)
        if S_ISLNK(own.st_mode):
            return False
        parent = lstat(os.path.join(path, ".."))
    except (OSError, ValueError):
        return False
    return own.st_dev != parent.st_dev or own.st_ino == parent.st_ino


def _stat(path: str, follow_symlinks: bool) -> Stat:
    if _statx is None:
        st = os.stat(path, follow_symlinks=follow_symlinks)
        return Stat(st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    encoded = os.fsencode(path)
    flags = 0 if follow_symlinks else _AT_SYMLINK_NOFOLLOW
    while _statx(_AT_FDCWD, encoded, flags, _STATX_BASIC_STATS, buf) != 0:
        if ctypes.get_errno() != errno.EINTR:
            raise _failed(path)
    fields = _STATX.unpack_from(buf)
    return Stat(
        fields[6],  # mode
        os.makedev(fields[16], fields[17]),
        fields[8],  # ino
        fields[9],  # size
        fields[12] * 1_000_000_000 + fields[13],  # mtime
    )


def read_file(path: str, size_hint: int = 0) -> bytes:
    """The whole of a small file (`size_hint`: its size, as a stat said). O_NONBLOCK: a FIFO
    put where the file was reads as empty instead of waiting for a writer."""
    fd = open_fd(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        buf = ctypes.create_string_buffer(max(size_hint + 1, 4096))
        while True:
            n = int(_read(fd, buf, len(buf)))
            if n < 0:
                if ctypes.get_errno() == errno.EINTR:
                    continue
                raise _failed(path)
            if n == 0:
                return b"".join(chunks)
            chunks.append(ctypes.string_at(buf, n))
    finally:
        close_fd(fd, path)
