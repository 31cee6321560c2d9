"""Structured logs: one line per record, as text (for people), logfmt or JSON (for machines), or
journal entries (`journal.py`): chosen by itself for `text` when stderr is systemd's journal
stream, so `journalctl -u pykubelet` has each record's priority and fields.

The records are written from a thread of their own (`BackgroundHandler`): a write to stderr
blocks when what reads it is slow (a full pipe, the journal's back-pressure), and the agent's
event loop must not wait for it. What is queued is written before the process exits
(`logging.shutdown()`, which runs at exit and before the agent's `os._exit`); past MAX_QUEUED
records waiting, new ones are dropped and a line says how many. A record reaches the output
within LINGER (50 ms) of being logged: the thread is woken once for a burst of records.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

from pykubelet.cmd import journal

FORMATS = ("text", "logfmt", "json", "journal")
# Fields callers attach with `extra={"fields": {...}}` (events carry object, reason, type).
FIELDS_ATTR = "fields"


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS_ATTR, None)
    return dict(fields) if isinstance(fields, dict) else {}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _logfmt_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        return json.dumps(text)
    return text


def _structured(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "ts": _timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
        **_fields(record),
    }
    if record.exc_info:
        doc["error"] = formatter.formatException(record.exc_info)
    return doc


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        pairs = _structured(self, record)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in pairs.items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_structured(self, record), default=str)


def make_handler(log_format: str) -> logging.Handler:
    """`text` under systemd (stderr is $JOURNAL_STREAM) is the journal: the same message, with
    its priority and fields; logfmt and json stay lines for whatever reads them."""
    if log_format == "journal" or (log_format == "text" and journal.stderr_is_journal(os.environ)):
        return journal.JournalHandler()
    formatter: logging.Formatter = {
        "text": TextFormatter,
        "logfmt": LogfmtFormatter,
        "json": JsonFormatter,
    }[log_format]()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    return handler


# Records waiting for an output that does not keep up: past this, new ones are dropped and
# counted (a line says how many once there is room), not kept without bound.
MAX_QUEUED = 10_000
# How long the writer thread, once woken, lets records gather before it writes them: a burst's
# records then cost one wake-up of the thread, not one each.
LINGER = 0.05
CLOSE_WAIT = 5.0  # seconds `close` waits for the writer thread to finish


class BackgroundHandler(logging.Handler):
    """Hands each record to `target` in a thread of its own; `close` writes what is queued
    first (logging.shutdown closes the handlers made last first: this one before its target),
    and a record logged after it goes to `target` directly.

    Why not logging's QueueHandler: its queue wakes the writer thread for every record, from
    the thread that logs while it holds the interpreter lock. In a 1,000-pod cluster burst those
    1,000 wake-ups were 7 % of the agent's lock-held time: on a busy machine the woken thread
    often takes the logging thread's CPU, which then waits with the lock held. Here a record is
    appended to a deque, and only the first record after the writer went idle wakes it."""

    def __init__(
        self, target: logging.Handler, max_queued: int = MAX_QUEUED, linger: float = LINGER
    ) -> None:
        super().__init__()
        self._target = target
        self._max_queued = max_queued
        self._linger = linger
        # Appended under this handler's lock (Handler.handle holds it around emit), taken
        # from the left by the writer: deque's append and popleft are atomic.
        self._records: deque[logging.LogRecord] = deque()
        self._dropped = 0
        self._wake = threading.Event()
        self._closing = False
        self._writer: threading.Thread | None = threading.Thread(
            target=self._write_forever, name="log-writer", daemon=True
        )
        self._writer.start()

    def pending(self) -> int:
        """Records queued and not yet handed to the target."""
        return len(self._records)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record = self._prepare(record)
        except Exception:
            self.handleError(record)
            return
        if self._writer is None:
            self._target.handle(record)
            return
        if len(self._records) >= self._max_queued:
            self._dropped += 1
            return
        if self._dropped:
            self._records.append(self._dropped_note())
            self._dropped = 0
        self._records.append(record)
        if not self._wake.is_set():
            self._wake.set()

    @staticmethod
    def _prepare(record: logging.LogRecord) -> logging.LogRecord:
        # The message made now (its arguments may change once the call returns); the rest, the
        # traceback included, formatted by the target's formatter, as it would be unqueued.
        record = copy.copy(record)
        record.msg, record.args = record.getMessage(), None
        return record

    def _write_forever(self) -> None:
        while True:
            self._wake.wait()
            if not self._closing:
                time.sleep(self._linger)
            # Cleared before the queue is read: a record appended after this sets it again.
            self._wake.clear()
            self._write_queued()
            if self._closing:
                return

    def _write_queued(self) -> None:
        while self._records:
            record = self._records.popleft()
            if record.levelno >= self._target.level:
                self._target.handle(record)

    def _dropped_note(self) -> logging.LogRecord:
        return logging.LogRecord(
            __name__,
            logging.WARNING,
            __file__,
            0,
            f"{self._dropped} log records dropped: the log output did not keep up",
            None,
            None,
        )

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            self._closing = True
            self._wake.set()
            writer.join(CLOSE_WAIT)
            if not writer.is_alive():
                if self._dropped:
                    self._target.handle(self._dropped_note())
                    self._dropped = 0
                self._write_queued()  # what came while it finished
        super().close()


def setup(log_format: str, verbosity: int) -> None:
    handler = BackgroundHandler(make_handler(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # As klog's -v: 0-3 informational, 4 and up debug.
    root.setLevel(logging.DEBUG if verbosity >= 4 else logging.INFO)
    for noisy in ("aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
