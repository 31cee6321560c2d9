"""Rotating a log file that a container's process appends to itself (O_APPEND on its own
descriptor, which survives an agent restart): the file cannot be renamed and reopened as the
CRI runtime's are, and copy + truncate would lose what is written between the two.

So the head of the file is copied to the rotated file and then cut out of the live file in
place with fallocate(FALLOC_FL_COLLAPSE_RANGE): the writer's next append lands at the new end,
and nothing written meanwhile is lost. The kernel collapses whole file system blocks only, so
the cut is at a block boundary, usually inside a line: the rotated file ends with the start of
that line and the current one begins with its rest. File systems without the operation
(tmpfs, btrfs, NFS ...) answer EOPNOTSUPP: the caller then leaves the file as it is.

`LogRotator` does it for the runtime, and keeps how much was cut from each file so that a
follower's offset stays right across a cut (a follower more than a whole rotated file behind
goes on at the current file's start)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
from pathlib import Path

from pykubelet.runtime import logfiles, logrotation
from pykubelet.runtime.base import LogRotationPolicy

log = logging.getLogger(__name__)

FALLOC_FL_COLLAPSE_RANGE = 0x08

# The C library the interpreter already has loaded: find_library would run ldconfig.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def _collapse(fd: int, length: int) -> None:
    if _libc.fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def rotate_in_place(path: Path, target: Path) -> int:
    """Move the whole blocks at the head of `path` to `target` (a new file); returns how many
    bytes left `path` (0: too small to cut, nothing done). OSError(EOPNOTSUPP) where the file
    system cannot collapse a range."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        block = os.fstatvfs(fd).f_bsize or st.st_blksize
        # The range must end before the end of the file.
        length = ((st.st_size - 1) // block) * block if st.st_size > 0 else 0
        if length <= 0:
            return 0
        tmp = target.with_name(target.name + ".tmp")
        with open(tmp, "wb") as dst, os.fdopen(os.dup(fd), "rb") as src:
            src.seek(0)
            left = length
            while left > 0:
                data = src.read(min(left, 1 << 20))
                if not data:
                    break
                dst.write(data)
                left -= len(data)
            dst.flush()
            os.fsync(dst.fileno())
        try:
            _collapse(fd, length)
        except OSError:
            os.unlink(tmp)
            raise
        os.replace(tmp, target)
        return length
    finally:
        os.close(fd)


def unsupported(exc: OSError) -> bool:
    return exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS)


class LogRotator:
    def __init__(self) -> None:
        self._cut: dict[str, int] = {}  # container id -> bytes cut from the head of its log
        self._locks: dict[str, asyncio.Lock] = {}
        self._unsupported = False

    def _lock(self, id: str) -> asyncio.Lock:
        return self._locks.setdefault(id, asyncio.Lock())

    async def rotate(self, id: str, path: Path, policy: LogRotationPolicy) -> bool:
        """Rotate the log of running container `id` if it is due; whether it was."""
        if self._unsupported:
            return False
        target = await asyncio.to_thread(logrotation.prepare, path, policy)
        if target is None:
            return False
        async with self._lock(id):
            try:
                cut = await asyncio.to_thread(rotate_in_place, path, target)
            except OSError as exc:
                if not unsupported(exc):
                    raise
                self._unsupported = True
                log.warning(
                    "container log rotation is off: the file system of %s cannot cut the head "
                    "of a file in place (fallocate COLLAPSE_RANGE: %s); the logs grow unbounded",
                    path.parent,
                    exc.strerror,
                )
                return False
            self._cut[id] = self._cut.get(id, 0) + cut
        if cut:
            log.info("rotated the log of container %s to %s", id, target.name)
        return cut > 0

    async def read_tail(self, id: str, path: Path, lines: int | None) -> tuple[bytes, int]:
        """logfiles.read_tail, its offset counted from the start of the log as first written."""
        async with self._lock(id):
            head, offset = await asyncio.to_thread(logfiles.read_tail, path, lines)
            return head, offset + self._cut.get(id, 0)

    async def end(self, id: str, path: Path) -> int:
        """Where the log ends now, counted as read_tail's offsets."""
        async with self._lock(id):
            try:
                size = (await asyncio.to_thread(path.stat)).st_size
            except FileNotFoundError:
                size = 0
            return size + self._cut.get(id, 0)

    async def read_from(self, id: str, path: Path, offset: int) -> tuple[bytes, int]:
        """What follows `offset` (as read_tail counts), and the offset after it."""
        async with self._lock(id):
            cut = self._cut.get(id, 0)
            start = max(offset - cut, 0)
            chunk = await asyncio.to_thread(logfiles.read_from, path, start)
            return chunk, start + cut + len(chunk)

    def forget(self, id: str) -> None:
        self._cut.pop(id, None)
        self._locks.pop(id, None)
