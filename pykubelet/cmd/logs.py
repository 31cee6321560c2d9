"""Structured logs: one line per record, as text (for people), logfmt or JSON (for machines), or
journal entries (`journal.py`): chosen by itself for `text` when stderr is systemd's journal
stream, so `journalctl -u pykubelet` has each record's priority and fields."""

from __future__ import annotations

import json
import logging
import os
import sys
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


def setup(log_format: str, verbosity: int) -> None:
    handler = make_handler(log_format)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # As klog's -v: 0-3 informational, 4 and up debug.
    root.setLevel(logging.DEBUG if verbosity >= 4 else logging.INFO)
    for noisy in ("aiohttp.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
