"""The CRI container log format, as containerd and CRI-O write it for the kubelet.

One record per line: `<RFC3339Nano time> <stdout|stderr> <F|P> <payload>`. A payload tagged P
is part of a line the container wrote without its newline yet (the runtime splits long lines
and flushes partial ones); the F record that follows ends it. What a container wrote is the
payloads joined, with a newline after each F record.
"""

from __future__ import annotations


class CriLogDecoder:
    """Records as the bytes the container wrote. Fed chunks as they are read: a record may be
    split anywhere across chunks; an incomplete last record waits for the rest."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        end = self._buf.rfind(b"\n")
        if end < 0:
            return b""
        complete = bytes(self._buf[: end + 1])
        del self._buf[: end + 1]
        return decode_records(complete)


def decode_records(data: bytes) -> bytes:
    """Whole records (each ending with a newline) as the payload bytes; malformed ones are
    skipped, as the kubelet skips them."""
    out = bytearray()
    for record in data.split(b"\n"):
        if not record:
            continue
        parts = record.split(b" ", 3)
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
            continue
        payload = parts[3] if len(parts) == 4 else b""
        out += payload
        if parts[2] != b"P":
            out += b"\n"
    return bytes(out)


def tail_start(data: bytes, lines: int) -> int:
    """Where, in a log of whole records, the records of the last `lines` lines written begin.
    A line continued by P records counts once, from its first record."""
    if lines <= 0:
        return len(data)
    count = 0
    pos = len(data)
    while pos > 0:
        start = data.rfind(b"\n", 0, pos - 1) + 1
        parts = data[start:pos].split(b" ", 3)
        full = len(parts) >= 3 and parts[2] != b"P"
        if full:
            if count == lines:
                return pos
            count += 1
        pos = start
    return 0
