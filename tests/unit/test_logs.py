from __future__ import annotations

import json
import logging
import threading
import time

from pykubelet.cmd.logs import BackgroundHandler, JsonFormatter, LogfmtFormatter, TextFormatter


def record(msg: str, **fields: str) -> logging.LogRecord:
    rec = logging.LogRecord("pykubelet.x", logging.WARNING, __file__, 1, msg, (), None)
    if fields:
        rec.fields = fields
    return rec


def test_formats_one_line_each() -> None:
    rec = record(
        "pod default/web FailedValidation: bad", reason="FailedValidation", object="default/web"
    )
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["level"] == "warning" and doc["reason"] == "FailedValidation"
    assert doc["msg"] == "pod default/web FailedValidation: bad"
    line = LogfmtFormatter().format(rec)
    assert 'msg="pod default/web FailedValidation: bad"' in line
    assert "reason=FailedValidation object=default/web" in line and "\n" not in line
    assert "WARNING pykubelet.x: pod default/web" in TextFormatter().format(rec)


class _Blocked(logging.Handler):
    """A target whose writes wait until `go` is set: a full pipe, a stalled journal."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.lines: list[str] = []
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.go.wait(10)
        self.lines.append(self.format(record))


def test_a_blocked_output_does_not_block_the_logger_and_close_writes_what_is_queued() -> None:
    target = _Blocked()
    handler = BackgroundHandler(target)
    logger = logging.getLogger("pykubelet.test-background")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        started = time.monotonic()
        args = ["web"]
        logger.warning("pod %s started", args, extra={"fields": {"reason": "Started"}})
        args.append("changed after the call")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("sync of pod %s failed", "web")
        assert time.monotonic() - started < 1.0 and target.lines == []
        target.go.set()
        handler.close()  # as logging.shutdown() does at exit
        first, second = (json.loads(line) for line in target.lines)
        assert first["msg"] == "pod ['web'] started" and first["reason"] == "Started"
        assert second["msg"] == "sync of pod web failed"
        assert "ValueError: boom" in json.dumps(second)
    finally:
        logger.removeHandler(handler)


def test_an_output_that_does_not_keep_up_loses_counted_records_and_close_is_not_the_end() -> None:
    target = _Blocked()
    handler = BackgroundHandler(target, max_queued=2)
    logger = logging.getLogger("pykubelet.test-background-full")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(10):
            logger.warning("line %d", i)
        target.go.set()
        deadline = time.monotonic() + 5
        while not handler.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        logger.warning("after the stall")
        handler.close()
        logger.warning("after close")  # at exit, after logging.shutdown(): written at once
        messages = [json.loads(line)["msg"] for line in target.lines]
        dropped = [m for m in messages if "log records dropped" in m]
        assert len(dropped) == 1 and dropped[0].endswith("the log output did not keep up")
        kept = [m for m in messages if m.startswith("line ")]
        assert int(dropped[0].split()[0]) == 10 - len(kept) and len(kept) <= 3
        assert messages[-2:] == ["after the stall", "after close"]
    finally:
        logger.removeHandler(handler)
