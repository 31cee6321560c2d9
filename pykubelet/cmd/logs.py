"""Structured logs: one line per record, as text (for people), logfmt or JSON (for machines), or
journal entries (`journal.py`): chosen by itself for `text` when stderr is systemd's journal
stream, so `journalctl -u pykubelet` has each record's priority and fields.

The records are written from a thread of their own (`BackgroundHandler`): a write to stderr
blocks when what reads it is slow (a full pipe, the journal's back-pressure), and the agent's
event loop must not wait for it. What is queued is written before the process exits
(`logging.shutdown()`, which runs at exit and before the agent's `os._exit`); past MAX_QUEUED
records waiting, new ones are dropped and a line says how many.
"""

from __future__ import annotations

import copy
import json
import logging
import logging.handlers
import os
import queue
import sys
import threading
import time
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
# After writing what was queued, the writer waits this long before it looks again. Records
# logged meanwhile wait for it instead of waking it: in a burst, a wake per record (a futex
# wake, and the logging thread preempted by the writer) was 8 % of the event loop's time. An
# idle writer blocks, and the first record wakes it at once.
LINGER_SECONDS = 0.002


class _Writer(threading.Thread):
    """Hands queued records to `target` until it takes the sentinel (None)."""

    def __init__(self, records: queue.SimpleQueue[Any], target: logging.Handler) -> None:
        super().__init__(name="log-writer", daemon=True)
        self._records = records
        self._target = target

    def run(self) -> None:
        records = self._records
        while True:
            record = records.get()
            while record is not None:
                self._write(record)
                try:
                    record = records.get_nowait()
                except queue.Empty:
                    break
            else:
                return
            time.sleep(LINGER_SECONDS)

    def _write(self, record: logging.LogRecord) -> None:
        # As QueueListener with respect_handler_level: the target's own level applies.
        if record.levelno >= self._target.level:
            self._target.handle(record)


class BackgroundHandler(logging.handlers.QueueHandler):
    """Hands each record to `target` in a thread of its own; `close` writes what is queued
    first (logging.shutdown closes the handlers made last first: this one before its target),
    and a record logged after it goes to `target` directly."""

    def __init__(self, target: logging.Handler, max_queued: int = MAX_QUEUED) -> None:
        # A SimpleQueue: its put is C, and wakes nothing while the writer is not waiting.
        records: queue.SimpleQueue[Any] = queue.SimpleQueue()
        super().__init__(records)
        self._records = records
        self._max_queued = max_queued
        self._target = target
        self._dropped = 0
        self._writer: _Writer | None = _Writer(records, target)
        self._writer.start()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # The message made now (its arguments may change once the call returns); the rest, the
        # traceback included, formatted by the target's formatter, as it would be unqueued.
        record = copy.copy(record)
        record.msg, record.args = record.getMessage(), None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        if self._writer is None:
            self._target.handle(record)
            return
        if self._records.qsize() >= self._max_queued:
            self._dropped += 1
            return
        if self._dropped:
            self._records.put(self._dropped_note())
            self._dropped = 0
        self._records.put(record)

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
            if self._dropped:
                self._records.put(self._dropped_note())
                self._dropped = 0
            self._records.put(None)
            writer.join()
        super().close()


def setup(log_format: str, verbosity: int) -> None:
    handler = BackgroundHandler(make_handler(log_format))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # As klog's -v: 0-3 informational, 4 and up debug.
    root.setLevel(logging.DEBUG if verbosity >= 4 else logging.INFO)
    for noisy in ("aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
