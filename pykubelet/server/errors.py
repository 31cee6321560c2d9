"""The kubelet API's error answers: a v1 Status with its HTTP code, reason and message."""

from __future__ import annotations

import json

from aiohttp import web


def status_response(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.Response(
        text=json.dumps(body, separators=(",", ":")), status=code, content_type="application/json"
    )
