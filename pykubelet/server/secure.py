"""The kubelet API on the secure port (--port, 10250): what the API server proxies `kubectl
logs` to, and what `kubectl top` reads through a metrics-server.

Every request is authenticated and authorized first (`auth.py`); then it is served:

GET /pods, /pods/                        v1 PodList of this node's pods with live status
GET /runningpods/                        v1 PodList of the pods and containers running
GET /healthz                             ok
GET /containerLogs/{ns}/{pod}/{c}        a container's log (tailLines, limitBytes, previous,
                                         follow, sinceSeconds/sinceTime, timestamps)
GET /configz                             {"kubeletconfig": ...}: the configuration in effect
GET /metrics                             Prometheus metrics
GET|POST /exec/{ns}/{pod}/[{uid}/]{c}    a command in the container (streaming/: WebSocket or
                                         SPDY, stdin, tty, exit code)
GET|POST /attach/{ns}/{pod}/[{uid}/]{c}  the container's own stdio (the same protocol)
GET|POST /portForward/{ns}/{pod}[/{uid}] TCP connections to the pod's ports (streaming/
                                         portforward.py: SPDY, SPDY in a WebSocket, channels)
GET /metrics/resource, /stats/summary    usage, from stats/ (server/stats.py)

Exec, attach and port-forward sessions are closed after `streaming_idle_timeout` without a
frame either way (the kubelet's streamingConnectionIdleTimeout). Their modules (streaming/, the
SPDY sessions: 0.5 MiB) are imported by the first such request, in a thread: an agent nobody
execs into does not hold them.

/run and the other /stats paths are not served yet: they answer 501 with a Status
naming what is missing, never a silent 404.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from pykubelet.runtime.base import ContainerRunState, RuntimeContainer
from pykubelet.server.auth import (
    Authenticator,
    Authorizer,
    ReviewError,
    request_attributes,
)
from pykubelet.server.endpoints import NodeView, add_node_routes, counting
from pykubelet.server.errors import status_response

STREAMING_MODULES = (
    "pykubelet.server.streaming.portforward",
    "pykubelet.server.streaming.remotecommand",
    "pykubelet.server.streaming.session",
)


_streaming_loaded = False  # set once the imports below have completed


def _import_streaming() -> None:
    global _streaming_loaded
    for name in STREAMING_MODULES:
        importlib.import_module(name)
    _streaming_loaded = True


async def _streaming_imported() -> None:
    """The streaming modules loaded; until they are, each call imports them in a thread (an
    import reads and compiles files: not on the loop; a second request meanwhile waits in its
    thread for the first's import, never on the loop)."""
    if not _streaming_loaded:
        await asyncio.to_thread(_import_streaming)


log = logging.getLogger(__name__)

Obj = dict[str, Any]

NOT_YET = {
    "run": "run",
    "stats": "this part of the stats API",
}


def authenticating(authenticator: Authenticator, authorizer: Authorizer, node_name: str) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        peercert = request.transport.get_extra_info("peercert") if request.transport else None
        user = await authenticator.authenticate(peercert, request.headers.get("Authorization"))
        if user is None:
            return status_response(401, "Unauthorized", "Unauthorized")
        attrs = request_attributes(request.method, request.path, node_name)
        try:
            allowed = await authorizer.authorize(user, attrs)
        except ReviewError as exc:
            log.warning("authorization of %s failed: %s", attrs.describe(user), exc)
            return status_response(
                500, "InternalError", f"Authorization error ({attrs.describe(user)})"
            )
        if not allowed:
            return status_response(403, "Forbidden", f"Forbidden ({attrs.describe(user)})")
        response: web.StreamResponse = await handler(request)
        return response

    return check


class ExecTargets(Protocol):
    async def running_container(
        self, namespace: str, name: str, container: str, uid: str | None = None
    ) -> tuple[RuntimeContainer, list[tuple[str, str]]]:
        """The running container and its environment; LookupError naming what is missing."""
        ...


class SecureNode(NodeView, ExecTargets, Protocol):
    """What the secure port reads from the agent."""


def build_secure_app(
    node: SecureNode,
    authenticator: Authenticator,
    authorizer: Authorizer,
    configz: Callable[[], Obj],
    on_request: Callable[[str, str, int], None] | None = None,
    *,
    streaming_idle_timeout: float | None,
) -> web.Application:
    """`streaming_idle_timeout`: the kubelet's streamingConnectionIdleTimeout, for every exec,
    attach and port-forward session (None or 0: never)."""

    async def running_pods(request: web.Request) -> web.Response:
        items = []
        for runtime_pod in await node.runtime.list_pods():
            running = [c for c in runtime_pod.containers if c.state is ContainerRunState.RUNNING]
            if not running:
                continue
            items.append(
                {
                    "metadata": {
                        "name": runtime_pod.name,
                        "namespace": runtime_pod.namespace,
                        "uid": runtime_pod.uid,
                    },
                    "spec": {
                        "containers": [
                            {"name": c.name, "image": c.image} for c in runtime_pod.containers
                        ]
                    },
                }
            )
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        return web.json_response(body)

    async def config(request: web.Request) -> web.Response:
        return web.json_response({"kubeletconfig": configz()})

    async def not_yet(request: web.Request) -> web.Response:
        first = request.path.lstrip("/").split("/", 1)[0]
        what = NOT_YET.get(first, first)
        return status_response(
            501, "NotImplemented", f"{what} is not supported by pykubelet yet ({request.path})"
        )

    async def exec_command(request: web.Request) -> web.StreamResponse:
        await _streaming_imported()
        from pykubelet.server.streaming.remotecommand import exec_options
        from pykubelet.server.streaming.session import serve_stream

        info = request.match_info
        try:
            opts = exec_options(request.query.getall("command", []), request.query)
        except ValueError as exc:
            return status_response(400, "BadRequest", str(exc))
        try:
            container, env = await node.running_container(
                info["namespace"], info["pod"], info["container"], info.get("uid")
            )
        except LookupError as exc:
            return status_response(404, "NotFound", str(exc))
        return await serve_stream(
            request,
            "exec",
            container,
            lambda size: node.runtime.exec_stream(
                container, opts.command, env, stdin=opts.stdin, tty=opts.tty, size=size
            ),
            opts,
            streaming_idle_timeout,
        )

    async def attach(request: web.Request) -> web.StreamResponse:
        await _streaming_imported()
        from pykubelet.server.streaming.remotecommand import attach_options
        from pykubelet.server.streaming.session import serve_stream

        info = request.match_info
        try:
            opts = attach_options(request.query)
        except ValueError as exc:
            return status_response(400, "BadRequest", str(exc))
        try:
            container, _ = await node.running_container(
                info["namespace"], info["pod"], info["container"], info.get("uid")
            )
        except LookupError as exc:
            return status_response(404, "NotFound", str(exc))
        return await serve_stream(
            request,
            "attach",
            container,
            lambda _size: node.runtime.attach(container, stdin=opts.stdin, tty=opts.tty),
            opts,
            streaming_idle_timeout,
        )

    async def port_forward(request: web.Request) -> web.StreamResponse:
        await _streaming_imported()
        from pykubelet.server.streaming.portforward import parse_ports, serve_port_forward

        info = request.match_info
        namespace, name, uid = info["namespace"], info["pod"], info.get("uid")
        try:
            ports = parse_ports(request.query.getall("port", []))
        except ValueError as exc:
            return status_response(400, "BadRequest", str(exc))
        pod = node.find_pod(namespace, name)
        if pod is None or (uid and pod.uid != uid):
            return status_response(404, "NotFound", f'pod "{namespace}/{name}" not found')
        runtime_pod = await node.runtime.get_pod(pod.uid)
        if runtime_pod is None or not any(
            c.state is ContainerRunState.RUNNING for c in runtime_pod.containers
        ):
            return status_response(400, "BadRequest", f'pod "{namespace}/{name}" is not running')
        pod_uid = pod.uid
        return await serve_port_forward(
            request,
            lambda port: node.runtime.port_forward(pod_uid, port),
            ports,
            idle_timeout=streaming_idle_timeout,
            pod=f"{name}_{namespace}",  # the kubelet's full name of the pod
            uid=pod_uid,
        )

    app = web.Application(
        middlewares=[
            counting(on_request),
            authenticating(authenticator, authorizer, node.node_name),
        ]
    )
    add_node_routes(app, node)
    app.router.add_get("/runningpods/", running_pods)
    app.router.add_get("/configz", config)
    for path in (
        "/exec/{namespace}/{pod}/{container}",
        "/exec/{namespace}/{pod}/{uid}/{container}",
    ):
        app.router.add_route("GET", path, exec_command)
        app.router.add_route("POST", path, exec_command)
    for path in (
        "/attach/{namespace}/{pod}/{container}",
        "/attach/{namespace}/{pod}/{uid}/{container}",
    ):
        app.router.add_route("GET", path, attach)
        app.router.add_route("POST", path, attach)
    for path in ("/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"):
        app.router.add_route("GET", path, port_forward)
        app.router.add_route("POST", path, port_forward)
    for prefix in NOT_YET:
        app.router.add_route("*", f"/{prefix}/{{tail:.*}}", not_yet)
    return app
