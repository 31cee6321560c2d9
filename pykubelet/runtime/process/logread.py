"""Reading a process-runtime container's log: the plain file its process writes itself, for
`/containerLogs` (tailLines, limitBytes, since/timestamps) and `kubectl logs -f`.

The file has no per-line times, so since/timestamps are honoured only where they keep all of it
or none (logfiles.plain_times); following is polling the file's end through the log rotator,
which keeps the offset right across a rotation in place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pykubelet.common.lightevent import LightEvent
from pykubelet.runtime import logfiles
from pykubelet.runtime.base import LogTimes
from pykubelet.runtime.process.logrotate import LogRotator

FOLLOW_POLL_SECONDS = 0.2


async def read_plain_log(
    path: Path,
    created_at: datetime,
    tail_lines: int | None,
    limit_bytes: int | None,
    times: LogTimes,
) -> bytes:
    """Like the kubelet: the last `tail_lines` lines, of which at most the first `limit_bytes`
    bytes."""
    if times.any:
        _, last_ns = await asyncio.to_thread(_log_stat, path)
        if not logfiles.plain_times(times, _unix_ns(created_at), last_ns, time.time_ns()):
            return b""
    return await asyncio.to_thread(logfiles.read_log, path, tail_lines, limit_bytes)


async def follow_plain_log(
    rotator: LogRotator,
    container_id: str,
    path: Path,
    created_at: datetime,
    exited: LightEvent | None,
    tail_lines: int | None,
    times: LogTimes,
) -> AsyncGenerator[bytes, None]:
    """The head (as read_plain_log), then what is appended until the container has exited
    (`exited` None: it is gone, the file is read to its end once)."""
    skip_to: int | None = None
    if times.any:
        size, last_ns = await asyncio.to_thread(_log_stat, path)
        if not logfiles.plain_times(times, _unix_ns(created_at), last_ns, time.time_ns()):
            skip_to = size
    # The offset is where the head ended: what is appended meanwhile is read next.
    if skip_to is None:
        head, offset = await rotator.read_tail(container_id, path, tail_lines)
    else:
        head, offset = b"", await rotator.end(container_id, path)
    if head:
        yield head
    while True:
        done = exited is None or exited.is_set()
        chunk, offset = await rotator.read_from(container_id, path, offset)
        if chunk:
            yield chunk
        elif done:
            return
        else:
            await asyncio.sleep(FOLLOW_POLL_SECONDS)


def _log_stat(path: Path) -> tuple[int, int]:
    """A log file's size and when it was last written (Unix ns); a missing one is empty and was
    never written (0)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return 0, 0
    return st.st_size, st.st_mtime_ns


def _unix_ns(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000
