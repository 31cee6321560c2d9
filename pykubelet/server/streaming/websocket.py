"""The remote-command session over a WebSocket (kubectl 1.30+, and clients such as the Python
client): channels `channel.k8s.io`, `v4.channel.k8s.io`, `v5.channel.k8s.io` and their
`base64.` forms.

Each message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 error (the outcome), 4
resize; `v5.channel.k8s.io` adds 255, the close signal (`[255, 0]`: the client closed stdin).
In the base64 protocols a message is text: the channel as a digit, then the data in base64. The
server sends an empty message on the lowest channel it writes to once the session is open, as
the kubelet does, and closes the WebSocket after the outcome, or once no message went either way
for the idle timeout (the kubelet's streamingConnectionIdleTimeout; `IdleWatch`, which the
port-forward channels use too).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import WSMsgType, web

from pykubelet.runtime.base import STDERR, STDOUT
from pykubelet.server.streaming.remotecommand import (
    V1,
    V4,
    V5,
    ExecOptions,
    ResizeDecoder,
    status_text,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

BASE64_V1 = "base64.channel.k8s.io"
BASE64_V4 = "v4.base64.channel.k8s.io"
# The server's order of preference.
WEBSOCKET_PROTOCOLS = (V5, V4, BASE64_V4, V1, BASE64_V1)

STDIN_CHANNEL, STDOUT_CHANNEL, STDERR_CHANNEL, ERROR_CHANNEL, RESIZE_CHANNEL = range(5)
CLOSE_SIGNAL = 255
_WRITE_CHANNELS = {STDOUT: STDOUT_CHANNEL, STDERR: STDERR_CHANNEL}
# Messages of stdin held while the command does not read: then the socket is not read either.
STDIN_QUEUE = 16


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


class IdleWatch:
    """Closes a WebSocket once no message went either way for `timeout` seconds (None or 0:
    never); whoever sends or receives one calls `touch`. Pings are not messages: aiohttp
    answers them below, as the kubelet's WebSocket library does."""

    def __init__(self, ws: web.WebSocketResponse, timeout: float | None, what: str) -> None:
        self._ws = ws
        self._timeout = timeout if timeout and timeout > 0 else None
        self._what = what
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._handle: asyncio.TimerHandle | None = None
        self._closing: asyncio.Task[None] | None = None
        self._arm()

    def touch(self) -> None:
        self._last = self._loop.time()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        if self._timeout is not None:
            self._handle = self._loop.call_at(self._last + self._timeout, self._check)

    def _check(self) -> None:
        self._handle = None
        if self._timeout is None or self._ws.closed:
            return
        if self._loop.time() < self._last + self._timeout:
            self._arm()  # touched meanwhile
            return
        log.info("%s idle for %gs: closing it", self._what, self._timeout)
        # Its reader (an `async for` over the WebSocket) ends, and the session with it.
        self._closing = asyncio.create_task(self._close(), name=f"{self._what} idle close")

    async def _close(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._ws.close(message=b"idle timeout")


class WebSocketChannels:
    def __init__(
        self, ws: web.WebSocketResponse, opts: ExecOptions, idle_timeout: float | None
    ) -> None:
        self._ws = ws
        self._idle = IdleWatch(ws, idle_timeout, "exec/attach WebSocket")
        self._opts = opts
        self._protocol = ws.ws_protocol or ""
        self._base64 = self._protocol.startswith("base64.") or ".base64." in self._protocol
        self._stdin: asyncio.Queue[bytes] = asyncio.Queue(STDIN_QUEUE)
        self._sizes: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue(STDIN_QUEUE)
        self._resize = ResizeDecoder()
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, request: web.Request, opts: ExecOptions, idle_timeout: float | None
    ) -> WebSocketChannels:
        """The WebSocket accepted; closed by the node after `idle_timeout` seconds without a
        message either way (None or 0: never)."""
        ws = web.WebSocketResponse(protocols=WEBSOCKET_PROTOCOLS, autoping=True)
        await ws.prepare(request)
        channels = cls(ws, opts, idle_timeout)
        # The kubelet's hello: an empty message on the lowest channel it will write.
        first = STDOUT_CHANNEL if opts.stdout else STDERR_CHANNEL if opts.stderr else ERROR_CHANNEL
        await channels._send(first, b"")
        channels._reader = asyncio.create_task(channels._read(), name="exec-websocket-reader")
        return channels

    @property
    def response(self) -> web.WebSocketResponse:
        return self._ws

    async def _send(self, channel: int, data: bytes) -> None:
        self._idle.touch()
        if self._base64:
            await self._ws.send_str(str(channel) + base64.b64encode(data).decode())
        else:
            await self._ws.send_bytes(bytes([channel]) + data)

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                self._idle.touch()
                if msg.type is WSMsgType.BINARY:
                    data: bytes = msg.data
                elif msg.type is WSMsgType.TEXT and self._base64 and msg.data:
                    try:
                        data = bytes([int(msg.data[0])]) + base64.b64decode(msg.data[1:])
                    except ValueError:
                        continue
                else:
                    continue
                if not data:
                    continue
                channel, payload = data[0], data[1:]
                if channel == STDIN_CHANNEL and payload:
                    await self._stdin.put(payload)
                elif channel == RESIZE_CHANNEL:
                    for size in self._resize.feed(payload):
                        await self._sizes.put(size)
                elif channel == CLOSE_SIGNAL and self._protocol == V5 and payload[:1] == b"\0":
                    await self._stdin.put(b"")
        finally:
            # The client went away: stdin and resizing end with it.
            with contextlib.suppress(asyncio.QueueFull):
                self._stdin.put_nowait(b"")
            with contextlib.suppress(asyncio.QueueFull):
                self._sizes.put_nowait(None)

    async def read_stdin(self) -> bytes:
        return await self._stdin.get()

    async def write(self, stream: str, data: bytes) -> None:
        await self._send(_WRITE_CHANNELS[stream], data)

    async def resizes(self) -> AsyncIterator[tuple[int, int]]:
        while (size := await self._sizes.get()) is not None:
            yield size

    async def wait_gone(self) -> None:
        if self._reader is not None:
            await asyncio.shield(self._reader)  # ends when the client's WebSocket closes

    async def finish(self, status: Obj) -> None:
        if self._protocol in (V4, V5, BASE64_V4):
            await self._send(ERROR_CHANNEL, json.dumps(status).encode())
        elif text := status_text(status):
            await self._send(ERROR_CHANNEL, text)
        await self.close()

    async def close(self) -> None:
        self._idle.stop()
        await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
