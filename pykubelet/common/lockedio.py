"""File system calls made without letting the interpreter lock go, for the agent's threads.

Each call of `os` lets the lock go around its system call, and taking it back costs the thread
a wait for the lock's holder to let it go: up to the switch interval (5 ms) while the event loop
runs Python. A thread that makes a burst of short calls (a state file is eight: open, write,
fsync, close, rename, and the directory's open, fsync, close) then spends most of its time
waiting. Measured with another thread running Python: 43 ms a state file, 0.19 ms without.
The calls here keep the lock, through the C library (ctypes.PyDLL): use them for what takes
microseconds on a local file system (open, a small file's write, close, rename), and
`os` for what may wait for a disk (fsync).

They raise OSError (its subclass by errno, as `os` does) naming the path. Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import os

# PyDLL, unlike CDLL, keeps the interpreter lock through the call.
_LIBC = ctypes.PyDLL(None, use_errno=True)
_open = _LIBC.open  # variadic (the mode): int arguments pass as fixed ones do on Linux
_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint]
_open.restype = ctypes.c_int
_write = _LIBC.write
_write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_write.restype = ctypes.c_ssize_t
_close = _LIBC.close
_close.argtypes = [ctypes.c_int]
_close.restype = ctypes.c_int
_rename = _LIBC.rename
_rename.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
_rename.restype = ctypes.c_int


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
