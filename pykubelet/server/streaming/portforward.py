"""`kubectl port-forward` on the kubelet API: TCP connections into a pod, carried over the
streaming connection the API server relays, in each of the forms Kubernetes speaks.

- **SPDY/3.1** (`Upgrade: SPDY/3.1`, protocol `portforward.k8s.io` in
  X-Stream-Protocol-Version): what kube-apiserver speaks to kubelets, also when kubectl reached
  it over a WebSocket. For each connection it forwards, the client opens two streams with the
  headers `streamType` (`error`, `data`), `port` and `requestID`; the pair of one request ID is
  one TCP connection to that port on the pod's loopback. Streams with a missing or bad header
  are reset; a pair not complete within 30 s is dropped (the kubelet's stream creation timeout).
  Any number of ports and connections share one session.
- **SPDY tunnelled in a WebSocket** (subprotocol `SPDY/3.1+portforward.k8s.io`, each binary
  message carrying SPDY bytes: client-go's tunneling connection): the same session, served
  here too, so the kubelet needs no translating proxy in front of it.
- **WebSocket channels** (`v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, also
  `portforward.k8s.io` or none): one connection per port given in the `port` query parameter
  (`?port=80,8080`), on channels 2i (data) and 2i+1 (error); the server's first message on
  each channel is the port, 16-bit little-endian. A WebSocket has no end-of-stream per
  channel: a connection ends with the pod's side or with the WebSocket.

What it promises, whatever the form:
- A connection that cannot be made (nothing listens, the sandbox is gone) is reported on its
  own error stream as the kubelet words it ("error forwarding port 80 to pod web_default,
  uid ...: dial tcp4 127.0.0.1:80: connect: connection refused"); the session and its other
  connections go on. A connection the pod resets in the middle is reset towards the client
  (its data stream), not reported as an error: newer kubelets keep the session for those too.
- Half-close: the client's end of stream (SPDY FIN) becomes a TCP shutdown towards the pod,
  and the pod's end of stream a FIN towards the client; the error stream is closed once both
  directions are done, which is what kubectl waits for.
- Bounded memory both ways: reads from the pod wait for the client to take the data (SPDY
  windows, or TCP under a peer that ignores them), writes to the pod wait for its socket to
  drain before the next read from the client (for SPDY: the stream's window, then TCP).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from pykubelet.common.spdy import SpdySession, SpdyStream
from pykubelet.common.spdy_frames import SpdyError, SpdyStreamReset
from pykubelet.runtime.base import RuntimeFailure
from pykubelet.server.streaming.hijack import is_spdy_upgrade, upgrade_to_spdy, upgraded_response
from pykubelet.server.streaming.websocket import IdleWatch, is_websocket

log = logging.getLogger(__name__)

PORT_FORWARD_PROTOCOL = "portforward.k8s.io"
TUNNEL_PROTOCOL = "SPDY/3.1+" + PORT_FORWARD_PROTOCOL
V4_BINARY = "v4.channel.k8s.io"
V4_BASE64 = "v4.base64.channel.k8s.io"
PROTOCOL_HEADER = "X-Stream-Protocol-Version"
STREAM_CREATION_TIMEOUT = 30.0
# What is read from one side before it is written to the other.
CHUNK = 32 * 1024
# WebSocket channels: messages of one port held while the pod does not read them; then the
# WebSocket is not read either (and TCP holds the client back).
CHANNEL_QUEUE = 16
# A socket pair's buffers (the tunnel's bridge): the kernel's default, bounded.
_TUNNEL_READ = 64 * 1024

PodConnection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
OpenPort = Callable[[int], Awaitable[PodConnection]]


def parse_ports(values: list[str]) -> list[int]:
    """The ports of the `port` query parameters (each may hold several, comma-separated);
    ValueError in the kubelet's words for one that is empty or not a port."""
    ports: list[int] = []
    for value in values:
        if not value:
            raise ValueError('query parameter "port" cannot be empty')
        for part in value.split(","):
            try:
                port = int(part, 10)
            except ValueError:
                raise ValueError(f'unable to parse "{value}" as a port') from None
            if not 0 < port < 65536:
                raise ValueError(f'port "{value}" must be > 0 and < 65536')
            ports.append(port)
    return ports


@dataclass(frozen=True)
class Target:
    """Where the connections go, and how the errors name it."""

    open_port: OpenPort
    pod: str  # as the kubelet names it: the pod's full name, <name>_<namespace>
    uid: str

    async def dial(self, port: int) -> PodConnection:
        """The pod's port; RuntimeFailure with the message for the client's error stream."""
        try:
            return await self.open_port(port)
        except (RuntimeFailure, OSError) as exc:
            message = f"error forwarding port {port} to pod {self.pod}, uid {self.uid}: {exc}"
            log.info("port-forward: %s", message)
            raise RuntimeFailure(message) from exc


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def _websocket_protocols(request: web.Request) -> list[str]:
    return [
        p.strip()
        for header in request.headers.getall("Sec-WebSocket-Protocol", [])
        for p in header.split(",")
        if p.strip()
    ]


async def serve_port_forward(
    request: web.Request,
    open_port: OpenPort,
    ports: list[int],
    *,
    idle_timeout: float | None,
    pod: str = "",
    uid: str = "",
) -> web.StreamResponse:
    """Serve one port-forward request until the client (or the idle timeout) ends it.
    `open_port(port)` dials the pod (RuntimeFailure when it cannot); `ports` are those of the
    query (only the WebSocket channel form needs them: SPDY streams name their port);
    `idle_timeout` the kubelet's streamingConnectionIdleTimeout (a session without a frame or
    message either way for so long is closed; None or 0: never); `pod` and `uid` name the pod
    in error messages."""
    target = Target(open_port, pod, uid)
    if is_websocket(request):
        if TUNNEL_PROTOCOL in _websocket_protocols(request):
            return await _serve_tunnel(request, target, idle_timeout)
        if not ports:
            return _status(400, "BadRequest", 'query parameter "port" is required')
        return await _serve_channels(request, target, ports, idle_timeout)
    if not is_spdy_upgrade(request):
        return _status(
            400,
            "BadRequest",
            "port-forward needs a streaming upgrade: Upgrade: SPDY/3.1 or Upgrade: websocket",
        )
    offered = [
        v.strip()
        for header in request.headers.getall(PROTOCOL_HEADER, [])
        for v in header.split(",")
        if v.strip()
    ]
    # Clients of Kubernetes 1.0 offered no protocol: the kubelet still takes them.
    if offered and PORT_FORWARD_PROTOCOL not in offered:
        response = _status(
            403,
            "Forbidden",
            f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
            f"server accepts {[PORT_FORWARD_PROTOCOL]}",
        )
        response.headers["X-Accepted-Stream-Protocol-Versions"] = PORT_FORWARD_PROTOCOL
        return response
    headers = {PROTOCOL_HEADER: PORT_FORWARD_PROTOCOL} if offered else {}
    session = await upgrade_to_spdy(request, headers, idle_timeout)
    log.info("port-forward to pod %s over SPDY/3.1", pod)
    try:
        await SpdyForwarder(session, target).run()
    finally:
        await session.close()
    return upgraded_response(request)


# --- SPDY -----------------------------------------------------------------------------------


@dataclass
class _Pair:
    request_id: str
    error: SpdyStream | None = None
    data: SpdyStream | None = None
    timer: asyncio.TimerHandle | None = None

    @property
    def complete(self) -> bool:
        return self.error is not None and self.data is not None


def _header_problem(headers: dict[str, str]) -> str | None:
    port = headers.get("port", "")
    if not port:
        return '"port" header is required'
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return f'unable to parse "{port}" as a port'
    kind = headers.get("streamtype", "")
    if not kind:
        return '"streamType" header is required'
    if kind not in ("error", "data"):
        return f'invalid stream type "{kind}"'
    return None


class SpdyForwarder:
    """The port-forward streams of one SPDY session: paired by request ID, each pair
    forwarded in its own task, until the session ends."""

    def __init__(self, session: SpdySession, target: Target) -> None:
        self._session = session
        self._target = target
        self._pairs: dict[str, _Pair] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        try:
            while (stream := await self._session.accept_stream()) is not None:
                try:
                    await self._accept(stream)
                except SpdyError as exc:
                    # That stream was reset, or the session ended: the next accept says which.
                    log.debug("port-forward: stream %d not taken: %s", stream.id, exc)
        finally:
            for pair in self._pairs.values():
                if pair.timer is not None:
                    pair.timer.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, stream: SpdyStream) -> None:
        problem = _header_problem(stream.headers)
        if problem is not None:
            # As the kubelet's stream handler refusing it: the stream is reset.
            log.info("port-forward: refused stream %d: %s", stream.id, problem)
            stream.reset()
            return
        await stream.reply()
        request_id = stream.headers.get("requestid", "")
        kind = stream.headers["streamtype"]
        if not request_id:
            # Clients before request IDs open error then data, one pair at a time: the
            # kubelet pairs them by stream id.
            request_id = str(stream.id if kind == "error" else stream.id - 2)
        pair = self._pairs.get(request_id)
        if pair is None:
            pair = self._pairs[request_id] = _Pair(request_id)
            loop = asyncio.get_running_loop()
            pair.timer = loop.call_later(STREAM_CREATION_TIMEOUT, self._expire, pair)
        if getattr(pair, kind) is not None:
            message = (
                f"error processing stream for request {request_id}: {kind} stream already assigned"
            )
            log.info("port-forward: %s", message)
            self._spawn(
                self._print_error(pair, message, close=False), f"port-forward error {request_id}"
            )
            return
        setattr(pair, kind, stream)
        if pair.complete:
            if pair.timer is not None:
                pair.timer.cancel()
            # The request ID may be used again by a later pair, as with the kubelet.
            del self._pairs[request_id]
            self._spawn(self._forward(pair), f"port-forward {request_id}")

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def run() -> None:
            await coro

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _expire(self, pair: _Pair) -> None:
        if self._pairs.get(pair.request_id) is pair:
            del self._pairs[pair.request_id]
        message = f"request {pair.request_id}: timed out waiting for streams"
        log.info("port-forward: %s", message)
        self._spawn(
            self._print_error(pair, message, close=True), f"port-forward expire {pair.request_id}"
        )

    async def _print_error(self, pair: _Pair, message: str, *, close: bool) -> None:
        with contextlib.suppress(SpdyError):
            if pair.error is not None:
                await pair.error.write(message.encode())
                if close:  # the pair is dropped: nothing else will write on it
                    await pair.error.close()

    async def _forward(self, pair: _Pair) -> None:
        assert pair.error is not None and pair.data is not None
        error, data = pair.error, pair.data
        port = int(data.headers["port"])
        try:
            try:
                reader, writer = await self._target.dial(port)
            except RuntimeFailure as exc:
                await error.write(str(exc).encode())
                return
            try:
                await relay_spdy(data, reader, writer)
            except OSError as exc:
                # The pod's side failed (reset, broken pipe): this connection ends, the
                # session does not.
                log.info("port-forward: connection %s to port %d: %s", pair.request_id, port, exc)
                data.reset()
            finally:
                writer.close()
        except SpdyError as exc:
            log.debug("port-forward: connection %s ended by the client: %s", pair.request_id, exc)
        finally:
            # The data stream first: kubectl reads the error stream to its end only after the
            # data stream's.
            with contextlib.suppress(SpdyError):
                await data.close()
            with contextlib.suppress(SpdyError):
                await error.close()


async def relay_spdy(
    stream: SpdyStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Copy both ways between a data stream and a connection to the pod, with half-closes,
    until both directions are done; stops early if the client resets the stream. OSError if
    the pod's side fails, SpdyError if the client's does."""

    async def to_pod() -> bool:
        """False when the client reset the stream (it gave up on the connection)."""
        try:
            while data := await stream.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except SpdyStreamReset:
            return False
        if writer.can_write_eof():
            writer.write_eof()
        return True

    async def from_pod() -> bool:
        while data := await reader.read(CHUNK):
            await stream.write(data)
        await stream.close()
        return True

    await _both_ways(to_pod(), from_pod())


async def _both_ways(*directions: Awaitable[bool]) -> None:
    """Run the copies until each is done; the first that fails (raises) or gives up (False)
    stops the others, and what it raised is raised."""
    tasks = [asyncio.ensure_future(d) for d in directions]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(t.exception() is not None or not t.result() for t in done):
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


# --- SPDY in a WebSocket --------------------------------------------------------------------


async def _serve_tunnel(
    request: web.Request, target: Target, idle_timeout: float | None
) -> web.StreamResponse:
    """The client's SPDY session, one WebSocket binary message per write. A socket pair
    bridges the messages to the SpdySession (which reads a byte stream): its kernel buffers
    are bounded, and the session sees the same flow control as over TCP."""
    ws = web.WebSocketResponse(protocols=(TUNNEL_PROTOCOL,), autoping=True)
    await ws.prepare(request)
    log.info("port-forward to pod %s over SPDY/3.1 in a WebSocket", target.pod)
    ours, theirs = socket.socketpair()
    try:
        reader, writer = await asyncio.open_connection(sock=ours, limit=_TUNNEL_READ)
        bridge_reader, bridge_writer = await asyncio.open_connection(
            sock=theirs, limit=_TUNNEL_READ
        )
    except BaseException:
        ours.close()
        theirs.close()
        raise

    async def from_client() -> None:
        try:
            async for msg in ws:
                if msg.type is WSMsgType.BINARY:
                    bridge_writer.write(msg.data)
                    await bridge_writer.drain()
        finally:
            # The WebSocket is over: so is the session's byte stream.
            with contextlib.suppress(OSError, RuntimeError):
                bridge_writer.write_eof()

    async def to_client() -> None:
        while data := await bridge_reader.read(_TUNNEL_READ):
            await ws.send_bytes(data)

    session = SpdySession(reader, writer, server=True, idle_timeout=idle_timeout)
    pumps = [asyncio.create_task(from_client()), asyncio.create_task(to_client())]
    try:
        await SpdyForwarder(session, target).run()
    finally:
        await session.close()
        # What the session wrote last (its GOAWAY) goes out before the WebSocket closes.
        with contextlib.suppress(TimeoutError, ConnectionError, RuntimeError):
            await asyncio.wait_for(asyncio.shield(pumps[1]), 1.0)
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        bridge_writer.close()
        await ws.close()
    return ws


# --- WebSocket channels ---------------------------------------------------------------------


class _Channels:
    """The v4 channel protocol of a port-forward WebSocket: data on 2i, errors on 2i+1."""

    def __init__(
        self, ws: web.WebSocketResponse, ports: list[int], idle_timeout: float | None
    ) -> None:
        self._ws = ws
        self.idle = IdleWatch(ws, idle_timeout, "port-forward WebSocket")
        self._base64 = ws.ws_protocol == V4_BASE64
        self.ports = ports
        self.inbound: list[asyncio.Queue[bytes | None]] = [
            asyncio.Queue(CHANNEL_QUEUE) for _ in ports
        ]

    async def send(self, channel: int, data: bytes) -> None:
        self.idle.touch()
        if self._base64:
            # The channel as one character, '0' + channel, as wsstream writes it.
            await self._ws.send_str(chr(ord("0") + channel) + base64.b64encode(data).decode())
        else:
            await self._ws.send_bytes(bytes([channel]) + data)

    async def read(self) -> None:
        """Hand what the client sends on each data channel to its port, until the WebSocket
        ends; then every port's input ends."""
        try:
            async for msg in self._ws:
                self.idle.touch()
                if msg.type is WSMsgType.BINARY and not self._base64:
                    raw: bytes = msg.data
                    if not raw:
                        continue
                    channel, payload = raw[0], raw[1:]
                elif msg.type is WSMsgType.TEXT and self._base64 and msg.data:
                    try:
                        channel = ord(msg.data[0]) - ord("0")
                        payload = base64.b64decode(msg.data[1:], validate=True)
                    except ValueError:
                        continue
                else:
                    continue
                index, kind = divmod(channel, 2)
                # Writes to an error channel, or to a channel there is no port for, are
                # ignored, as the kubelet's write-only channels ignore them.
                if kind == 0 and 0 <= index < len(self.ports) and payload:
                    await self.inbound[index].put(payload)
        finally:
            for queue in self.inbound:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(None)


async def _serve_channels(
    request: web.Request, target: Target, ports: list[int], idle_timeout: float | None
) -> web.StreamResponse:
    ws = web.WebSocketResponse(
        protocols=(V4_BINARY, V4_BASE64, PORT_FORWARD_PROTOCOL), autoping=True
    )
    await ws.prepare(request)
    log.info(
        "port-forward to pod %s over WebSocket (%s), ports %s",
        target.pod,
        ws.ws_protocol or "no subprotocol",
        ",".join(map(str, ports)),
    )
    channels = _Channels(ws, ports, idle_timeout)
    reader = asyncio.create_task(channels.read(), name="port-forward websocket reader")
    try:
        for index, port in enumerate(ports):
            prefix = struct.pack("<H", port)
            await channels.send(2 * index, prefix)
            await channels.send(2 * index + 1, prefix)
        forwards = [
            asyncio.create_task(_forward_channel(channels, target, index))
            for index in range(len(ports))
        ]
        try:
            # Every port's connection ends with the pod's side or with the WebSocket.
            await asyncio.gather(*forwards)
        finally:
            for task in forwards:
                task.cancel()
            await asyncio.gather(*forwards, return_exceptions=True)
    except ConnectionError as exc:
        log.info("port-forward to pod %s: the client went away: %s", target.pod, exc)
    finally:
        channels.idle.stop()
        await ws.close()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return ws


async def _forward_channel(channels: _Channels, target: Target, index: int) -> None:
    port = channels.ports[index]
    inbound = channels.inbound[index]
    try:
        reader, writer = await target.dial(port)
    except RuntimeFailure as exc:
        await channels.send(2 * index + 1, str(exc).encode())
        return

    async def to_pod() -> bool:
        while (data := await inbound.get()) is not None:
            writer.write(data)
            await writer.drain()
        return False  # the WebSocket ended: so does the connection

    async def from_pod() -> bool:
        while data := await reader.read(CHUNK):
            await channels.send(2 * index, data)
        return False  # no end-of-stream to send on a channel: the connection is over

    try:
        await _both_ways(to_pod(), from_pod())
    except OSError as exc:
        log.info("port-forward: connection to port %d of pod %s: %s", port, target.pod, exc)
    finally:
        writer.close()
