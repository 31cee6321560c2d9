"""Reading the container log files the file-based runtimes keep, without reading them whole.

Two formats:

- plain: the bytes the container wrote, as they came (the process runtime, whose processes write
  their files themselves);
- CRI, as containerd and CRI-O write them for the kubelet (the CRI runtime): one record per
  line, `<RFC3339Nano time> <stdout|stderr> <F|P> <payload>`. A payload tagged P is part of a
  line the container wrote without its newline yet (the runtime splits long lines and flushes
  partial ones); the F record that follows ends it. What the container wrote is the payloads
  joined, with a newline after each F record.

What this module promises:

- `tailLines` is found by reading backwards from the end of the file in blocks: what comes
  before the tail is never read, and memory stays at a block or two whatever the file's size.
  In a CRI log a line continued by P records counts once; only whole records count (a record
  still being written, after the last newline, waits for its newline).
- `limitBytes` as the kubelet applies it: the beginning of what was selected is kept, the rest is
  cut off; a CRI log is decoded only as far as the limit needs.
- `sinceSeconds`/`sinceTime` and `timestamps` (a `LogTimes`) apply to CRI logs as the kubelet
  applies them: after the tail is found, each record older than `since` is left out, each kept
  record (a P record too) is prefixed with its time in RFC3339Nano at fixed width; a record
  whose time does not parse is left out then. `limitBytes` counts the prefixes. Plain logs
  have no times: `plain_times` says when a request can still be answered exactly.
- The results are those of reading the whole file into memory (the property tests in
  tests/unit/test_logfiles.py compare the two for random logs and block sizes).
- A missing file reads as empty; other errors are raised (OSError).

Everything here is blocking file I/O: callers run it in a thread (`asyncio.to_thread`). It
imports no runtime backend.
"""

from __future__ import annotations

import calendar
import io
import os
import re
import time
from pathlib import Path
from typing import IO

from pykubelet.runtime.base import NO_LOG_TIMES, LogTimes, LogUnsupported

BLOCK_SIZE = 64 * 1024
# The most `read_from` returns at once: a follower catching up never holds a whole file.
FOLLOW_CHUNK = 1 << 20


# --- plain logs ---------------------------------------------------------------------------------


def tail_offset(f: IO[bytes], lines: int, block_size: int = BLOCK_SIZE) -> int:
    """Where the last `lines` lines of `f` begin, reading backwards from its end in blocks."""
    end = f.seek(0, os.SEEK_END)
    if lines <= 0:
        return end
    if end == 0:
        return 0
    f.seek(end - 1)
    # A final newline ends the last line; it does not start another one.
    pos = end - 1 if f.read(1) == b"\n" else end
    found = 0
    while pos > 0:
        size = min(block_size, pos)
        pos -= size
        f.seek(pos)
        block = f.read(size)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            found += 1
            if found == lines:
                return pos + i + 1
    return 0


def read_log(
    path: Path, tail_lines: int | None, limit_bytes: int | None, *, block_size: int = BLOCK_SIZE
) -> bytes:
    """A plain log: its last `tail_lines` lines (all if None), of which the first
    `limit_bytes` bytes (all if None)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return b""
    with f:
        start = 0 if tail_lines is None else tail_offset(f, tail_lines, block_size)
        f.seek(start)
        return f.read() if limit_bytes is None else f.read(max(limit_bytes, 0))


def read_tail(
    path: Path, tail_lines: int | None, *, block_size: int = BLOCK_SIZE
) -> tuple[bytes, int]:
    """Where following a plain log starts: its last `tail_lines` lines (all if None) and the
    offset just after them, from which `read_from` goes on without losing or repeating a byte."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return b"", 0
    with f:
        start = 0 if tail_lines is None else tail_offset(f, tail_lines, block_size)
        f.seek(start)
        data = f.read()
    return data, start + len(data)


def read_from(path: Path, offset: int, max_bytes: int = FOLLOW_CHUNK) -> bytes:
    """At most `max_bytes` of the file from `offset` (what was appended since, when following)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(max_bytes)
    except FileNotFoundError:
        return b""


def plain_times(times: LogTimes, first_ns: int, last_ns: int, now_ns: int) -> bool:
    """Whether a plain log whose lines were all written between `first_ns` and `last_ns` is
    kept whole (True) or left out whole (False) by `times`, what follows it being written after
    `now_ns`. A plain log has no time per line: LogUnsupported, naming the parameter, when its
    lines would have to be told apart, or for `timestamps`."""
    if times.timestamps:
        raise LogUnsupported(
            "timestamps: this runtime's log is the bytes the container wrote, without the time "
            "of each line"
        )
    since = times.since_ns
    if since is None or since <= first_ns:
        return True
    if since > last_ns and since <= now_ns:
        return False
    raise LogUnsupported(
        f"sinceSeconds/sinceTime: this runtime's log has no time per line; its lines were "
        f"written between {format_time(first_ns).decode()} and {format_time(last_ns).decode()}, "
        f"so only a time before the first or after the last (and not in the future) can be "
        f"answered exactly, not {format_time(since).decode()}"
    )


# --- CRI logs -----------------------------------------------------------------------------------


class CriLogDecoder:
    """Records as the bytes the container wrote. Fed chunks as they are read: a record may be
    split anywhere across chunks; an incomplete last record waits for the rest."""

    def __init__(self, times: LogTimes = NO_LOG_TIMES) -> None:
        self._buf = bytearray()
        self._times = times

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        end = self._buf.rfind(b"\n")
        if end < 0:
            return b""
        complete = bytes(self._buf[: end + 1])
        del self._buf[: end + 1]
        return decode_records(complete, self._times)


def decode_records(data: bytes, times: LogTimes = NO_LOG_TIMES) -> bytes:
    """Whole records (each ending with a newline) as the payload bytes; malformed ones are
    skipped, as the kubelet skips them. With `times`, records older than its `since_ns` are
    left out and, with `timestamps`, each is prefixed with its time."""
    out = bytearray()
    for record in data.split(b"\n"):
        if not record:
            continue
        parts = record.split(b" ", 3)
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
            continue
        if times.any:
            parsed = parse_time(parts[0])
            if parsed is None or (times.since_ns is not None and parsed[0] < times.since_ns):
                continue
            if times.timestamps:
                out += parsed[1] + b" "
        payload = parts[3] if len(parts) == 4 else b""
        out += payload
        if parts[2] != b"P":
            out += b"\n"
    return bytes(out)


# What the kubelet parses a record's time with (RFC3339Nano, the fraction optional).
_TIME = re.compile(
    rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:Z|([+-])(\d\d):(\d\d))"
)


def parse_time(raw: bytes) -> tuple[int, bytes] | None:
    """A record's time: (Unix nanoseconds, the time as the kubelet prints it: RFC3339Nano with
    nine digits, in the record's own offset, `Z` for UTC), or None if it is no such time."""
    m = _TIME.fullmatch(raw)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    fraction = (m.group(7) or b"").ljust(9, b"0")
    offset = 0
    zone = b"Z"
    if m.group(8):
        oh, om = int(m.group(9)), int(m.group(10))
        if oh > 23 or om > 59:
            return None
        offset = (oh * 60 + om) * 60 * (1 if m.group(8) == b"+" else -1)
        if offset:
            zone = m.group(8) + m.group(9) + b":" + m.group(10)
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) - offset
    shown = raw[:19] + b"." + fraction + zone
    return seconds * 1_000_000_000 + int(fraction), shown


def format_time(ns: int) -> bytes:
    """Unix nanoseconds as the kubelet prints a time in UTC (RFC3339Nano, nine digits)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    t = time.gmtime(seconds)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', t)}.{fraction:09d}Z".encode()


def tail_start(data: bytes, lines: int) -> int:
    """Where, in a log of whole records held in memory, the records of the last `lines` lines
    written begin. A line continued by P records counts once, from its first record."""
    return cri_tail_offset(io.BytesIO(data), lines, len(data))


def cri_tail_offset(f: IO[bytes], lines: int, end: int, block_size: int = BLOCK_SIZE) -> int:
    """Where, in the records of `f` before offset `end`, those of the last `lines` lines begin,
    reading backwards from `end` in blocks.

    A record counts as a line when it has at least three fields and its third is not `P`, the
    fields being what splitting the record (its newline included) at its first three spaces
    gives: the rule the CRI runtime has always applied."""
    if lines <= 0:
        return end
    count = 0
    record_end = end
    # The newline ending the last record (at end - 1) is not a boundary before it.
    pos = max(end - 1, 0)
    while pos > 0:
        size = min(block_size, pos)
        pos -= size
        f.seek(pos)
        block = f.read(size)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            start = pos + i + 1
            if _ends_line(f, start, record_end, block, i + 1, block_size):
                if count == lines:
                    return record_end
                count += 1
            record_end = start
    if record_end > 0:
        f.seek(0)
        head = f.read(min(block_size, record_end))
        if _ends_line(f, 0, record_end, head, 0, block_size) and count == lines:
            return record_end
    return 0


def _ends_line(f: IO[bytes], start: int, end: int, buf: bytes, lo: int, block_size: int) -> bool:
    """Whether the record at [start, end) of `f` counts as a line (see `cri_tail_offset`).

    `buf[lo:]` holds the record's first bytes (or some of them); only if its first three spaces
    are not among those is more of the record read, a block at a time. Only two bytes of the
    third field are kept: enough to tell it from `P`."""
    spaces = 0
    field = b""
    pos = start
    hi = min(len(buf), lo + (end - start))
    while True:
        i = lo
        while spaces < 3:
            j = buf.find(b" ", i, hi)
            if spaces == 2 and len(field) < 2:
                field += buf[i : min(i + 2 - len(field), hi if j < 0 else j)]
            if j < 0:
                break
            spaces += 1
            i = j + 1
        if spaces == 3:
            return field != b"P"
        pos += hi - lo
        if pos >= end:
            break
        f.seek(pos)
        buf = f.read(min(block_size, end - pos))
        if not buf:  # truncated while being read
            break
        lo, hi = 0, len(buf)
    return spaces == 2 and field != b"P"


def _whole_records_end(f: IO[bytes], block_size: int) -> int:
    """The offset just after the last newline of `f`: a record after it is still being written."""
    pos = f.seek(0, os.SEEK_END)
    while pos > 0:
        size = min(block_size, pos)
        pos -= size
        f.seek(pos)
        i = f.read(size).rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0


def _decode_range(
    f: IO[bytes], start: int, end: int, limit_bytes: int | None, times: LogTimes, block_size: int
) -> bytes:
    """The records in [start, end) decoded, a block at a time, stopping once `limit_bytes` of
    output are there."""
    out = bytearray()
    decoder = CriLogDecoder(times)
    pos = start
    while pos < end and (limit_bytes is None or len(out) < limit_bytes):
        f.seek(pos)
        chunk = f.read(min(block_size, end - pos))
        if not chunk:
            break
        pos += len(chunk)
        out += decoder.feed(chunk)
    return bytes(out) if limit_bytes is None else bytes(out[: max(limit_bytes, 0)])


def read_cri_log(
    path: Path,
    tail_lines: int | None,
    limit_bytes: int | None,
    times: LogTimes = NO_LOG_TIMES,
    *,
    block_size: int = BLOCK_SIZE,
) -> bytes:
    """What the container wrote, from a CRI log: its last `tail_lines` lines (all if None), of
    those the records `times` keeps, of that the first `limit_bytes` bytes (all if None)."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return b""
    with f:
        end = _whole_records_end(f, block_size)
        start = 0 if tail_lines is None else cri_tail_offset(f, tail_lines, end, block_size)
        return _decode_range(f, start, end, limit_bytes, times, block_size)


def read_cri_tail(
    path: Path,
    tail_lines: int | None,
    times: LogTimes = NO_LOG_TIMES,
    *,
    block_size: int = BLOCK_SIZE,
) -> tuple[bytes, int]:
    """Where following a CRI log starts: its last `tail_lines` lines (all if None), decoded,
    and the offset just after the whole records read, from which a `CriLogDecoder` fed with
    `read_from` goes on."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return b"", 0
    with f:
        end = _whole_records_end(f, block_size)
        start = 0 if tail_lines is None else cri_tail_offset(f, tail_lines, end, block_size)
        return _decode_range(f, start, end, None, times, block_size), end
