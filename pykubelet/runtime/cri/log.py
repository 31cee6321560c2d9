"""The CRI container log format, as containerd and CRI-O write it for the kubelet, and following
one container's log file across the kubelet's rotations.

The decoding and the backwards tail live in `pykubelet.runtime.logfiles`, shared by the
file-based runtimes; these names stay importable from here for the CRI runtime. A log file is
read with `read_cri_log` (and followed from `read_cri_tail`), never whole; file system calls run
in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

from pykubelet.runtime import logrotation
from pykubelet.runtime.base import LogTimes
from pykubelet.runtime.logfiles import (
    CriLogDecoder,
    cri_tail_offset,
    decode_records,
    read_cri_log,
    read_cri_tail,
    read_from,
    tail_start,
)

__all__ = [
    "CriLogDecoder",
    "cri_tail_offset",
    "decode_records",
    "follow_cri_log",
    "read_cri_log",
    "read_cri_tail",
    "tail_start",
]

FOLLOW_INTERVAL = 0.2


async def follow_cri_log(
    path: Path, tail_lines: int | None, times: LogTimes, exited: Callable[[], bool]
) -> AsyncGenerator[bytes, None]:
    """The file so far (its last `tail_lines`), then what is appended, until `exited()` said so
    before a read that found the file at its end. A rotated file (renamed aside, the runtime
    reopened a new one) is read to its end first, then the new one from its start."""
    first, offset = await asyncio.to_thread(read_cri_tail, path, tail_lines, times)
    inode = await asyncio.to_thread(_inode, path)
    if first:
        yield first
    decoder = CriLogDecoder(times)
    while True:
        done = exited()
        chunk = await asyncio.to_thread(read_from, path, offset)
        offset += len(chunk)
        if chunk:
            out = decoder.feed(chunk)
            if out:
                yield out
            continue
        now = await asyncio.to_thread(_inode, path)
        if now != inode and now is not None:
            async for out in _drain_rotated(path, inode, offset, decoder):
                yield out
            inode, offset = now, 0
            continue
        if done:
            return
        await asyncio.sleep(FOLLOW_INTERVAL)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _find_rotated(path: Path, inode: int | None) -> Path | None:
    for p in reversed(logrotation.rotated_files(path)):
        with contextlib.suppress(FileNotFoundError):
            if p.stat().st_ino == inode:
                return p
    return None


async def _drain_rotated(
    path: Path, inode: int | None, offset: int, decoder: CriLogDecoder
) -> AsyncGenerator[bytes, None]:
    """The rest of the rotated file that was `inode`, from `offset`."""
    rotated = await asyncio.to_thread(_find_rotated, path, inode)
    while rotated is not None:
        chunk = await asyncio.to_thread(read_from, rotated, offset)
        if not chunk:
            return
        offset += len(chunk)
        out = decoder.feed(chunk)
        if out:
            yield out
