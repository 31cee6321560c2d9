"""Log records to systemd's journal as structured entries (`--log-format journal`).

Under systemd, stderr is a stream to the journal and `$JOURNAL_STREAM` names its `device:inode`
(systemd.exec(5)): when stderr is still that stream, records go to the journal's native socket
instead, one datagram per record of `KEY=value` fields (the protocol of sd_journal_sendv(3)):
PRIORITY, MESSAGE, CODE_FILE, CODE_LINE, CODE_FUNC, SYSLOG_IDENTIFIER=pykubelet, LOGGER, and the
record's own fields (an event's KIND, OBJECT, REASON, TYPE; POD and NAMESPACE when it is about a
pod). A value with a newline is sent in the protocol's binary form; an entry too large for a
datagram goes as a sealed memfd, as sd-journal does.

If the socket cannot take an entry (no journald, its queue full: the socket is non-blocking, so
the event loop never waits on it), the record is written to stderr as a line with the `<N>`
priority prefix of sd-daemon(3), which the journal's stream reads as that priority.

`$PYKUBELET_JOURNAL_SOCKET` replaces /run/systemd/journal/socket: for tests only.
"""

from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import re
import socket
import struct
import sys
from collections.abc import Mapping
from typing import Any, TextIO

JOURNAL_SOCKET = "/run/systemd/journal/socket"
SOCKET_ENV = "PYKUBELET_JOURNAL_SOCKET"
STREAM_ENV = "JOURNAL_STREAM"
IDENTIFIER = "pykubelet"
FIELDS_ATTR = "fields"  # as logs.py: what callers attach with extra={"fields": {...}}

# syslog(3)'s priorities, as sd-daemon.h's SD_ERR ... SD_DEBUG.
PRIORITY_CRIT, PRIORITY_ERR, PRIORITY_WARNING, PRIORITY_INFO, PRIORITY_DEBUG = 2, 3, 4, 6, 7

_NOT_NAME = re.compile(r"[^A-Z0-9_]")


def priority(levelno: int) -> int:
    if levelno >= logging.CRITICAL:
        return PRIORITY_CRIT
    if levelno >= logging.ERROR:
        return PRIORITY_ERR
    if levelno >= logging.WARNING:
        return PRIORITY_WARNING
    if levelno >= logging.INFO:
        return PRIORITY_INFO
    return PRIORITY_DEBUG


def stderr_is_journal(env: Mapping[str, str], fd: int = 2) -> bool:
    """True when `fd` is the journal stream systemd connected ($JOURNAL_STREAM's device:inode):
    a stderr redirected elsewhere since (a shell under the unit) is not."""
    value = env.get(STREAM_ENV, "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def field_name(key: str) -> str | None:
    """A journal field name for a record field: upper case, [A-Z0-9_], not starting with `_`
    (trusted fields) or a digit, at most 64 characters; None if nothing is left."""
    name = _NOT_NAME.sub("_", key.upper()).lstrip("_")
    if not name or name[0].isdigit():
        return None
    return name[:64]


def encode(fields: list[tuple[str, str]]) -> bytes:
    """The native protocol's datagram: `KEY=value\\n`, or `KEY\\n<le64 length>value\\n` for a
    value with a newline."""
    out = bytearray()
    for key, value in fields:
        data = value.encode("utf-8", errors="replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def record_fields(record: logging.LogRecord, message: str) -> list[tuple[str, str]]:
    """The journal fields of one record."""
    fields: list[tuple[str, str]] = [
        ("MESSAGE", message),
        ("PRIORITY", str(priority(record.levelno))),
        ("SYSLOG_IDENTIFIER", IDENTIFIER),
        ("LOGGER", record.name),
        ("CODE_FILE", record.pathname),
        ("CODE_LINE", str(record.lineno)),
        ("CODE_FUNC", record.funcName),
    ]
    extra: Any = getattr(record, FIELDS_ATTR, None)
    if isinstance(extra, dict):
        taken = {key for key, _ in fields}
        for key, value in extra.items():
            name = field_name(str(key))
            if name is not None and name not in taken:
                taken.add(name)
                fields.append((name, value if isinstance(value, str) else str(value)))
        # An event about a pod carries "namespace/name" as its object: the pod's own fields.
        target = extra.get("object")
        if extra.get("kind") == "Pod" and isinstance(target, str) and "/" in target:
            namespace, pod = target.split("/", 1)
            for name, value in (("POD", pod), ("NAMESPACE", namespace)):
                if name not in taken:
                    fields.append((name, value))
    return fields


def prefixed_lines(record: logging.LogRecord, message: str) -> str:
    """The record as sd-daemon(3) lines: each line with its `<N>` priority prefix."""
    prefix = f"<{priority(record.levelno)}>"
    return "".join(f"{prefix}{line}\n" for line in message.splitlines() or [""])


class JournalHandler(logging.Handler):
    """Each record as one journal entry; `<N>`-prefixed lines on `fallback` when the journal's
    socket does not take it."""

    def __init__(self, path: str | None = None, fallback: TextIO | None = None) -> None:
        super().__init__()
        self._path = path or os.environ.get(SOCKET_ENV) or JOURNAL_SOCKET
        self._fallback = fallback
        self._socket: socket.socket | None = None

    def _send(self, datagram: bytes) -> None:
        if self._socket is None:
            self._socket = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
            )
        try:
            self._socket.sendto(datagram, self._path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                raise
            self._send_memfd(datagram)

    def _send_memfd(self, datagram: bytes) -> None:
        # Larger than a datagram: the entry in a sealed memfd, its descriptor passed alone.
        assert self._socket is not None
        fd = os.memfd_create("pykubelet-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, datagram)
            fcntl.fcntl(
                fd,
                fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL,
            )
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())
            self._socket.sendmsg([], [rights], 0, self._path)
        finally:
            os.close(fd)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + self.formatException(record.exc_info)
            try:
                self._send(encode(record_fields(record, message)))
            except OSError:
                stream = self._fallback if self._fallback is not None else sys.stderr
                stream.write(prefixed_lines(record, message))
                stream.flush()
        except Exception:
            self.handleError(record)

    def formatException(self, exc_info: Any) -> str:
        return logging.Formatter().formatException(exc_info)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        super().close()
