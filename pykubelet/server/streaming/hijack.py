"""Taking an HTTP/1.1 connection over from aiohttp for an upgraded protocol (SPDY/3.1).

`upgrade(request, headers)` answers ``101 Switching Protocols`` and hands back an asyncio
StreamReader/StreamWriter pair over the raw connection (TLS included: it is the connection's
own transport), the way Go's http.Hijacker does for Kubernetes' kubelet. It works the way
aiohttp's WebSocketResponse takes a connection over (web_ws.py): aiohttp's RequestHandler stays
the transport's protocol, so its bookkeeping (connection_lost, server shutdown) stays right,
but `set_parser` points every byte that arrives to our reader instead of the HTTP parser, and
the writer writes to the transport directly, with aiohttp's own flow control for drain().

The connection is the caller's until it closes the writer (a SpdySession does on close).
Keep the handler running as long as the connection lives, then return
`upgraded_response(request)` (the 101 already sent; aiohttp then closes the connection). A
`web.Response` returned instead is harmless too: the HTTP response writer is finished, so
nothing of it reaches the upgraded stream.

Bytes the client sent behind the request head before we took over: aiohttp 3.14's C parser
recognises only WebSocket upgrades, so it drops bytes that came in the same read as the head
of a SPDY upgrade request, and parses later ones as new HTTP requests. The second case is
detected (`HijackError`, never a silently corrupted stream); bytes the pure-Python parser
holds back are handed over. Kubernetes' clients wait for the 101 before they send anything
(httpstream/spdy roundtripper.go), so neither case arises with them.

`upgrade_to_spdy` checks the request asks for SPDY/3.1 and builds the server `SpdySession`.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiohttp import web

from pykubelet.common.spdy import SpdySession

SPDY_31 = "SPDY/3.1"

# Past this much buffered and unread, our reader pauses the transport (asyncio pauses at
# twice the limit): a slow consumer holds the client back through TCP, not memory.
_READ_LIMIT = 1 << 16
_RESPONSE_KEY = web.RequestKey("pykubelet.streaming.hijack.response", web.StreamResponse)


class HijackError(ConnectionError):
    """The connection cannot be handed over intact."""


class NotSpdyUpgrade(web.HTTPBadRequest):
    """400: the request does not ask for ``Connection: Upgrade`` to ``Upgrade: SPDY/3.1``."""


class _Feeder:
    """Where aiohttp's RequestHandler puts the connection's bytes once set_parser made us its
    payload parser (the place a WebSocketReader takes for WebSockets)."""

    def __init__(self, reader: asyncio.StreamReader, closed: asyncio.Future[None]) -> None:
        self._reader = reader
        self._closed = closed

    def feed_data(self, data: bytes | bytearray | memoryview) -> tuple[bool, bytes]:
        if data:
            self._reader.feed_data(bytes(data))
        # (False: not at the end of a message; b"": nothing left for the HTTP parser.)
        return False, b""

    def feed_eof(self) -> None:
        # aiohttp calls this from connection_lost.
        self._reader.feed_eof()
        if not self._closed.done():
            self._closed.set_result(None)


class _WriterProtocol(asyncio.BaseProtocol):
    """What asyncio.StreamWriter asks of its protocol (drain, the close wait), answered from
    aiohttp's RequestHandler, which stays the transport's protocol and gets pause_writing."""

    def __init__(self, handler: Any, closed: asyncio.Future[None]) -> None:
        self._handler = handler
        self._closed = closed

    async def _drain_helper(self) -> None:
        # Raises ConnectionResetError once the connection is lost; waits while paused.
        await self._handler._drain_helper()

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed


def _take_early_bytes(protocol: Any) -> bytes:
    """What the client sent behind the request head that aiohttp still holds."""
    queued = getattr(protocol, "_messages", None)
    parser = getattr(protocol, "_parser", None)
    if queued or getattr(parser, "_lines", None):
        raise HijackError(
            "the client sent bytes behind the upgrade request before the 101 response, "
            "and aiohttp parsed them as HTTP: they cannot be handed over"
        )
    # The pure-Python parser keeps an unfinished "request line" here (the C parser keeps
    # nothing we can reach).
    tail = getattr(parser, "_tail", b"")
    if tail and parser is not None:
        parser._tail = b""
    return bytes(tail)


async def upgrade(
    request: web.Request, response_headers: dict[str, str]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Answer 101 Switching Protocols with `response_headers` (``Connection: Upgrade`` unless
    given) and return a reader and writer over the raw connection, starting with any bytes
    the client sent behind the request head. ConnectionResetError if the client is gone,
    HijackError if the connection cannot be handed over intact."""
    protocol: Any = request.protocol
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client went away before the upgrade")
    if getattr(protocol, "_payload_parser", None) is not None:
        raise HijackError("the connection has been taken over already")
    if request.body_exists:
        # The HTTP parser would keep reading it as the body: not a raw stream from the head.
        raise HijackError("an upgrade request must not carry a body")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_LIMIT, loop=loop)
    closed: asyncio.Future[None] = loop.create_future()
    early = _take_early_bytes(protocol)
    if early:
        reader.feed_data(early)
    # From here on every byte goes to the reader, not the HTTP parser (bytes aiohttp kept for
    # an upgrade it knows, its _message_tail, are fed first by set_parser itself).
    protocol.set_parser(cast(Any, _Feeder(reader, closed)))
    protocol.keep_alive(False)
    reader.set_transport(transport)

    response = web.StreamResponse(status=101, reason="Switching Protocols")
    for name, value in response_headers.items():
        response.headers[name] = value
    response.headers.setdefault("Connection", "Upgrade")
    response.force_close()
    await response.prepare(request)
    # Ends the HTTP response: a response the handler returns later finds it finished and
    # writes nothing into the upgraded stream.
    await response.write_eof()
    request[_RESPONSE_KEY] = response
    writer = asyncio.StreamWriter(transport, _WriterProtocol(protocol, closed), reader, loop)
    return reader, writer


def upgraded_response(request: web.Request) -> web.StreamResponse:
    """The 101 response `upgrade` sent, for the handler to return."""
    try:
        return request[_RESPONSE_KEY]
    except KeyError:
        raise RuntimeError("the request was not upgraded") from None


def is_spdy_upgrade(request: web.Request) -> bool:
    """The request asks for ``Connection: Upgrade`` and ``Upgrade: SPDY/3.1`` (compared as
    Kubernetes' upgrade.go does: lowercased, as substrings)."""
    connection = ",".join(request.headers.getall("Connection", [])).lower()
    upgrade_to = ",".join(request.headers.getall("Upgrade", [])).lower()
    return "upgrade" in connection and SPDY_31.lower() in upgrade_to


async def upgrade_to_spdy(
    request: web.Request, protocol_headers: dict[str, str], idle_timeout: float | None
) -> SpdySession:
    """Upgrade to SPDY/3.1 and start the server session. `protocol_headers` go into the 101
    (``X-Stream-Protocol-Version``: the caller negotiates it). Raises NotSpdyUpgrade (a 400
    the caller may let through or answer its own way) if the request does not ask for it."""
    if not is_spdy_upgrade(request):
        raise NotSpdyUpgrade(
            text="unable to upgrade: missing upgrade headers in request "
            "(Connection: Upgrade, Upgrade: SPDY/3.1)"
        )
    headers = {"Connection": "Upgrade", "Upgrade": SPDY_31}
    headers.update(protocol_headers)
    reader, writer = await upgrade(request, headers)
    return SpdySession(reader, writer, server=True, idle_timeout=idle_timeout)
