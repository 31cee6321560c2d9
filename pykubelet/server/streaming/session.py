"""One streaming request of the kubelet API (exec or attach), from the upgrade to the end of the
session: the transport is chosen by the request (`Upgrade: websocket` or `Upgrade: SPDY/3.1`),
the protocol version is negotiated, the command is started in the container (or the container's
own stdio attached), and `remotecommand.serve_exec` (`serve_attach`) runs the session. Both verbs
go through `serve_stream`: they differ only in what is started and how the session ends.

SPDY, as the API server speaks it to kubelets: the client offers versions in
`X-Stream-Protocol-Version` headers (none: `channel.k8s.io`), the newest both speak is chosen
(none in common: 403, as the kubelet's handshake), then the client opens one stream per
`streamType` (error always; stdin, stdout, stderr as asked; resize with a terminal from v3),
each within 30 s of the upgrade (the kubelet's stream creation timeout).

An exec with a terminal starts its command once the client's first terminal size has come
(kubectl sends it as soon as its streams are open; a client that sends none waits
FIRST_SIZE_WAIT), with that size: the command never sees a 0x0 terminal.

A command that cannot start (the container stopped meanwhile, a program that is not there), or an
attach the runtime cannot make, ends the session with an InternalError Status on the error
stream, as the kubelet's exec and attach do.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from aiohttp import web

from pykubelet.common.spdy import SpdySession, SpdyStream
from pykubelet.runtime.base import (
    STDERR,
    STDOUT,
    ExecStream,
    RuntimeContainer,
    RuntimeFailure,
    TerminalSize,
)
from pykubelet.server.errors import status_response
from pykubelet.server.streaming.hijack import upgrade_to_spdy
from pykubelet.server.streaming.remotecommand import (
    SPDY_PROTOCOLS,
    V1,
    V2,
    V4,
    V5,
    Channels,
    ExecOptions,
    ResizeDecoder,
    TerminalSizes,
    error_status,
    serve_attach,
    serve_exec,
    status_text,
)
from pykubelet.server.streaming.websocket import WebSocketChannels, is_websocket

log = logging.getLogger(__name__)

Obj = dict[str, Any]

STREAM_CREATION_TIMEOUT = 30.0
PROTOCOL_HEADER = "X-Stream-Protocol-Version"

Verb = Literal["exec", "attach"]
# What the session runs: the command started (with a terminal of the client's size, if it sent
# one), or the container's stdio attached.
Start = Callable[[TerminalSize | None], Awaitable[ExecStream]]
# How long an exec with a terminal waits for the client's size before the command starts:
# kubectl sends it as soon as its streams are open; a client that sends none costs this once.
FIRST_SIZE_WAIT = 1.0


async def serve_stream(
    request: web.Request,
    verb: Verb,
    container: RuntimeContainer,
    start: Start,
    opts: ExecOptions,
    idle_timeout: float | None,
) -> web.StreamResponse:
    """`idle_timeout`: the kubelet's streamingConnectionIdleTimeout; a session without a frame
    (SPDY) or message (WebSocket) either way for so long is closed (None or 0: never)."""
    if is_websocket(request):
        ws = await WebSocketChannels.open(request, opts, idle_timeout)
        log.info(
            "%s in container %s of pod %s/%s over WebSocket (%s)",
            verb,
            container.name,
            container.pod_namespace,
            container.pod_name,
            ws.response.ws_protocol or "channel.k8s.io",
        )
        await _run(ws, verb, container, start, opts)
        return ws.response
    if request.headers.get("Upgrade", "").lower() != "spdy/3.1":
        return status_response(
            400,
            "BadRequest",
            f"{verb} needs a streaming upgrade: Upgrade: websocket or Upgrade: SPDY/3.1",
        )
    offered = [
        v.strip()
        for header in request.headers.getall(PROTOCOL_HEADER, [])
        for v in header.split(",")
        if v.strip()
    ]
    protocol = next((p for p in SPDY_PROTOCOLS if p in offered), None) if offered else V1
    if protocol is None:
        return status_response(
            403,
            "Forbidden",
            f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
            f"server supports {list(SPDY_PROTOCOLS)}",
        )
    headers = {PROTOCOL_HEADER: protocol} if offered else {}
    session = await upgrade_to_spdy(request, headers, idle_timeout)
    log.info(
        "%s in container %s of pod %s/%s over SPDY/3.1 (%s)",
        verb,
        container.name,
        container.pod_namespace,
        container.pod_name,
        protocol,
    )
    try:
        channels = await SpdyChannels.accept(session, opts, protocol)
    except TimeoutError:
        log.warning("%s: the client did not open its streams in %gs", verb, STREAM_CREATION_TIMEOUT)
        await session.close()
        return web.Response(status=101)
    try:
        await _run(channels, verb, container, start, opts)
    finally:
        await session.close()
    return web.Response(status=101)


async def _run(
    channels: WebSocketChannels | SpdyChannels,
    verb: Verb,
    container: RuntimeContainer,
    start: Start,
    opts: ExecOptions,
) -> None:
    # The kubelet's words for each.
    failed = (
        "error executing command in container"
        if verb == "exec"
        else ("error attaching to container")
    )
    sizes = TerminalSizes(channels) if opts.tty else None
    try:
        # A command started before the size is known would see a 0x0 terminal (`stty size`,
        # a full-screen program's first frame); an attached container has its terminal already.
        size = await sizes.first(FIRST_SIZE_WAIT) if sizes and verb == "exec" else None
        try:
            process = await start(size)
        except RuntimeFailure as exc:
            await channels.finish(error_status(f"{failed}: {exc}"))
            return
        if verb == "exec":
            await serve_exec(channels, process, opts, sizes)
        else:
            await serve_attach(channels, process, opts, sizes)
    except RuntimeFailure as exc:
        # The engine went away in the middle (its connection, a CRI call that failed).
        await channels.finish(error_status(f"{failed}: {exc}"))
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        log.info("%s in container %s ended with the client gone: %s", verb, container.name, exc)
    finally:
        if sizes is not None:
            await sizes.close()


class SpdyChannels:
    """The remote-command streams the client opened on a SPDY session."""

    def __init__(self, session: SpdySession, streams: dict[str, SpdyStream], protocol: str) -> None:
        self._session = session
        self._streams = streams
        self._protocol = protocol

    @classmethod
    async def accept(cls, session: SpdySession, opts: ExecOptions, protocol: str) -> SpdyChannels:
        wanted = {"error"}
        if opts.stdin:
            wanted.add("stdin")
        if opts.stdout:
            wanted.add("stdout")
        if opts.stderr:
            wanted.add("stderr")
        if opts.tty and protocol not in (V1, V2):
            wanted.add("resize")
        streams: dict[str, SpdyStream] = {}
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT):
            while not wanted <= set(streams):
                stream = await session.accept_stream()
                if stream is None:
                    raise TimeoutError("the client closed the session before opening its streams")
                kind = stream.headers.get("streamtype", "")
                await stream.reply()
                if kind in ("error", "stdin", "stdout", "stderr", "resize"):
                    streams[kind] = stream
                else:
                    log.info("exec: ignored a stream of unknown type %r", kind)
        return cls(session, streams, protocol)

    async def read_stdin(self) -> bytes:
        stream = self._streams.get("stdin")
        return await stream.read() if stream is not None else b""

    async def write(self, stream: str, data: bytes) -> None:
        target = self._streams.get("stdout" if stream == STDOUT else "stderr")
        if target is not None and stream in (STDOUT, STDERR):
            await target.write(data)

    async def resizes(self) -> AsyncIterator[tuple[int, int]]:
        stream = self._streams.get("resize")
        if stream is None:
            return
        decoder = ResizeDecoder()
        while data := await stream.read():
            for size in decoder.feed(data):
                yield size

    async def wait_gone(self) -> None:
        await self._session.wait_closed()

    async def finish(self, status: Obj) -> None:
        error = self._streams["error"]
        if self._protocol in (V4, V5):
            await error.write(json.dumps(status).encode())
        elif text := status_text(status):
            await error.write(text)
        for name in ("stdout", "stderr", "error"):
            if (stream := self._streams.get(name)) is not None:
                await stream.close()


# Both transports are Channels (checked by mypy).
_TRANSPORTS: tuple[type[Channels], ...] = (SpdyChannels, WebSocketChannels)
