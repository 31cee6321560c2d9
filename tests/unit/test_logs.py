from __future__ import annotations

import json
import logging

from pykubelet.cmd.logs import JsonFormatter, LogfmtFormatter, TextFormatter


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
