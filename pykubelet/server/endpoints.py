"""The read-only HTTP API, as the kubelet's read-only port serves it, and what both ports share
(`add_node_routes`: /pods, /healthz, /metrics, /containerLogs; `HttpServer`). The secure port's
own routes and its authentication are in `secure.py`.

GET /                                       a status page for people (HTML)
GET /pods                                   v1 PodList of this node's pods with live status
GET /healthz                                ok
GET /containerLogs/{namespace}/{pod}/{c}    a container's log (tailLines, limitBytes, previous,
                                            follow, sinceSeconds or sinceTime, timestamps)
GET /events                                 v1 EventList of recent events
GET /metrics                                Prometheus metrics
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web

from pykubelet.api.model import Pod, PodStatus
from pykubelet.common import metrics
from pykubelet.common.allocatable import NodeResources
from pykubelet.common.events import EventRecorder
from pykubelet.runtime.base import LogTimes, LogUnsupported, Runtime, RuntimeContainer
from pykubelet.runtime.logfiles import parse_time
from pykubelet.server import status_page
from pykubelet.server.errors import status_response
from pykubelet.stats.types import UsageHistory

log = logging.getLogger(__name__)


class NodeView(Protocol):
    """What the server reads from the agent."""

    node_name: str
    runtime: Runtime
    recorder: EventRecorder

    def pods_with_status(self) -> list[tuple[Pod, PodStatus | None]]: ...

    def find_pod(self, namespace: str, name: str) -> Pod | None: ...

    def health_problems(self) -> list[str]: ...

    def node_resources(self) -> NodeResources: ...


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")), status=status, content_type="application/json"
    )


def _int_param(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}: must be an integer, got {raw!r}\n") from None
    if value < 0:
        raise web.HTTPBadRequest(text=f"{name}: must be >= 0\n")
    return value


class InvalidLogOptions(Exception):
    """Log options that decode but are not valid together (the kubelet answers 422)."""


def _log_times(request: web.Request) -> LogTimes:
    """sinceSeconds / sinceTime (RFC3339) / timestamps, validated as the API server's
    PodLogOptions are: at most one of the two since parameters, sinceSeconds at least 1."""
    since_seconds = _int_param(request, "sinceSeconds")
    raw_time = request.query.get("sinceTime") or None
    since_ns: int | None = None
    if raw_time is not None:
        parsed = parse_time(raw_time.encode())
        if parsed is None:
            raise web.HTTPBadRequest(
                text=f"sinceTime: must be an RFC3339 time (2006-01-02T15:04:05Z), got "
                f"{raw_time!r}\n"
            )
        since_ns = parsed[0]
    if since_seconds is not None:
        if raw_time is not None:
            raise InvalidLogOptions("at most one of `sinceTime` or `sinceSeconds` may be specified")
        if since_seconds < 1:
            raise InvalidLogOptions("sinceSeconds: Invalid value: must be greater than 0")
        since_ns = time.time_ns() - since_seconds * 1_000_000_000
    return LogTimes(since_ns=since_ns, timestamps=_bool_param(request, "timestamps"))


def _bool_param(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in {"true", "false", "1", "0", ""}:
        raise web.HTTPBadRequest(text=f"{name}: must be true or false, got {raw!r}\n")
    return raw in {"true", "1"}


def with_status(pod: Pod, status: PodStatus | None) -> Pod:
    return pod if status is None else pod.model_copy(update={"status": status})


class _PodJsonCache:
    """Each pod's JSON, kept while its spec and status objects stay the same.

    Serialising 1,000 pods on every GET /pods took ~60 ms of the event loop; most polls find
    nothing changed, and the merger and the status manager only replace objects that changed.
    A status changes far more often than its pod (a burst's pods each go Pending, then
    Running): the pod without its status and the status are encoded apart, and a new status
    costs only its own encoding. `status` is the model's last field, so the joined JSON is the
    whole pod's, in the same order.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _PodJson] = {}

    def encode(self, pods: list[tuple[Pod, PodStatus | None]]) -> bytes:
        fresh: dict[str, _PodJson] = {}
        for pod, status in pods:
            entry = self._entries.get(pod.uid)
            shown = pod.status if status is None else status
            if entry is None or entry.pod is not pod:
                entry = _PodJson(pod, _pod_without_status(pod), shown, _status_json(shown))
            elif entry.status is not shown:
                entry = _PodJson(pod, entry.pod_json, shown, _status_json(shown))
            fresh[pod.uid] = entry
        self._entries = fresh
        return b",".join(entry.whole() for entry in fresh.values())


@dataclass(slots=True)
class _PodJson:
    pod: Pod
    pod_json: bytes  # without its status: `{...}`
    status: PodStatus
    status_json: bytes

    def whole(self) -> bytes:
        return self.pod_json[:-1] + b',"status":' + self.status_json + b"}"


def _pod_without_status(pod: Pod) -> bytes:
    return json.dumps(pod.to_api(exclude={"status"}), separators=(",", ":")).encode()


def _status_json(status: PodStatus) -> bytes:
    return json.dumps(status.to_api(), separators=(",", ":")).encode()


def add_node_routes(app: web.Application, node: NodeView) -> None:
    """The routes both ports serve: /pods, /healthz, /metrics, /containerLogs."""
    pod_json = _PodJsonCache()

    async def pods(request: web.Request) -> web.Response:
        items = pod_json.encode(node.pods_with_status())
        body = b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[' + items + b"]}"
        return web.Response(body=body, content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        problems = node.health_problems()
        if problems:
            return web.Response(text="\n".join(problems) + "\n", status=500)
        return web.Response(text="ok")

    async def container_logs(request: web.Request) -> web.StreamResponse:
        namespace = request.match_info["namespace"]
        pod_name = request.match_info["pod"]
        container_name = request.match_info["container"]
        tail_lines = _int_param(request, "tailLines")
        limit_bytes = _int_param(request, "limitBytes")
        previous = _bool_param(request, "previous")
        follow = _bool_param(request, "follow")
        try:
            times = _log_times(request)
        except InvalidLogOptions as e:
            return status_response(422, "Invalid", f"PodLogOptions is invalid: {e}")
        pod = node.find_pod(namespace, pod_name)
        if pod is None:
            return status_response(404, "NotFound", f'pod "{namespace}/{pod_name}" not found')
        if container_name not in {c.name for c in pod.all_containers()}:
            return status_response(
                404,
                "NotFound",
                f'container "{container_name}" not found in pod "{namespace}/{pod_name}"',
            )
        runtime_pod = await node.runtime.get_pod(pod.uid)
        history: list[RuntimeContainer] = [
            c for c in (runtime_pod.containers if runtime_pod else []) if c.name == container_name
        ]
        if previous:
            history = history[:-1]
        if not history:
            which = "previous terminated" if previous else "started"
            return status_response(
                400,
                "BadRequest",
                f'container "{container_name}" in pod "{namespace}/{pod_name}" has no {which} '
                "instance yet",
            )
        try:
            if follow:
                return await _stream_log(request, node.runtime, history[-1], tail_lines, times)
            data = await node.runtime.read_log(history[-1], tail_lines, limit_bytes, times)
        except LogUnsupported as e:
            return status_response(400, "BadRequest", f'container "{container_name}": {e}')
        return web.Response(body=data, content_type="text/plain", charset="utf-8")

    async def metrics_view(request: web.Request) -> web.Response:
        return web.Response(
            body=metrics.exposition(), headers={"Content-Type": metrics.CONTENT_TYPE}
        )

    async def resources(request: web.Request) -> web.Response:
        # pykubelet's own (the kubelet has no such path): the Node status's capacity and
        # allocatable, for `pykubelet top node` (kubectl reads them from the Node object).
        r = node.node_resources()
        return _json(
            {
                "capacity": r.node_quantities("capacity"),
                "allocatable": r.node_quantities("allocatable"),
            }
        )

    app.router.add_get("/pods", pods)
    app.router.add_get("/pods/", pods)
    app.router.add_get("/resources", resources)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)


def counting(on_request: Callable[[str, str, int], None] | None) -> Any:
    """A middleware that reports each request's method, path and status code."""

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            if on_request:
                on_request(request.method, request.path, exc.status)
            raise
        if on_request:
            on_request(request.method, request.path, response.status)
        return response

    return count


class PressureView(Protocol):
    """The node's pressure conditions that are True (the eviction manager's), for the page."""

    def pressure_conditions(self) -> frozenset[str]: ...


def build_app(
    node: NodeView,
    on_request: Callable[[str, str, int], None] | None = None,
    history: UsageHistory | None = None,
    pressure: PressureView | None = None,
) -> web.Application:
    """The read-only port: the node's routes, the status page at / (with each pod's usage
    history and the node's pressure conditions, when given) and /events."""

    async def events(request: web.Request) -> web.Response:
        items = [e.to_api(node.node_name) for e in node.recorder.events()]
        return _json({"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def index(request: web.Request) -> web.Response:
        page = status_page.render(
            node.node_name,
            [with_status(pod, status).to_api() for pod, status in node.pods_with_status()],
            [e.to_api(node.node_name) for e in node.recorder.events()],
            datetime.now(UTC),
            node.node_resources(),
            history,
            pressure.pressure_conditions if pressure is not None else None,
        )
        return web.Response(text=page, content_type="text/html")

    app = web.Application(middlewares=[counting(on_request)])
    app.router.add_get("/", index)
    app.router.add_get("/events", events)
    add_node_routes(app, node)
    return app


async def _stream_log(
    request: web.Request,
    runtime: Runtime,
    container: RuntimeContainer,
    tail_lines: int | None,
    times: LogTimes,
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    chunks = runtime.follow_log(container, tail_lines, times)
    async with contextlib.aclosing(chunks):
        # The head is waited for a moment before the headers go, so that options the runtime
        # refuses (LogUnsupported, raised before its first chunk) are answered with the error.
        first = asyncio.ensure_future(anext(chunks, b""))
        try:
            await asyncio.wait({first}, timeout=HEAD_WAIT_SECONDS)
            if first.done():
                first.result()
            await response.prepare(request)
            head = await first
        finally:
            if not first.done():
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
        if head:
            await response.write(head)
        async for chunk in chunks:
            await response.write(chunk)
    await response.write_eof()
    return response


# How long a follower's first chunk is waited for before its headers are sent anyway.
HEAD_WAIT_SECONDS = 1.0
SHUTDOWN_SECONDS = 2.0


class HttpServer:
    """Serves an aiohttp app on address:port (0: a free port), over TLS with `ssl_context`."""

    def __init__(
        self,
        app: web.Application,
        address: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        # handler_cancellation: a `logs -f` client that goes away ends its handler (and the
        # follow loop), instead of leaving it polling the log forever.
        # shutdown_timeout: an exec or port-forward session still open when the agent stops is
        # cancelled after 2 s, not aiohttp's 60 s.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=SHUTDOWN_SECONDS
        )
        self._address = address
        self._port = port
        self._ssl = ssl_context
        self.url = ""
        self.port = 0

    async def start(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self._address, self._port, reuse_address=True, ssl_context=self._ssl
        )
        await site.start()
        host, port = self._runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        self.port = int(port)
        self.url = f"{'https' if self._ssl else 'http'}://{shown}:{port}"
        return self.url

    async def stop(self) -> None:
        await self._runner.cleanup()
