"""Port-forward (pykubelet/server/streaming/portforward.py) over real sockets on 127.0.0.1: an
aiohttp server running `serve_port_forward`, TCP servers standing in for the pod's ports, and
clients speaking each form as Kubernetes' clients do (SPDY streams in pairs, SPDY tunnelled in
WebSocket messages, v4 WebSocket channels). Also the dial helpers the runtimes use: a refused
dial in Go's words, and a socket made in a network namespace this test creates."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from pykubelet.common.spdy import SpdySession, SpdyStream
from pykubelet.common.spdy_frames import SpdyStreamReset
from pykubelet.runtime.base import RuntimeFailure, dial_local_port
from pykubelet.runtime.sandbox.netns import socket_in
from pykubelet.server.streaming import portforward
from pykubelet.server.streaming.portforward import (
    PORT_FORWARD_PROTOCOL,
    TUNNEL_PROTOCOL,
    V4_BASE64,
    V4_BINARY,
    parse_ports,
    serve_port_forward,
)
from tests.fakes.runtime import FakeRuntime
from tests.unit.test_fake_runtime_contract import make_pod

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter


# --- the pod's side: TCP servers on 127.0.0.1 ------------------------------------------------


@dataclass
class PodPorts:
    echo: int  # answers each line with "echo <line>", until the client's end of stream
    upper: int  # the same, "UPPER <line>"
    closed: int  # nothing listens
    dials: list[int]


async def _tagged(tag: bytes, reader: Reader, writer: Writer) -> None:
    try:
        while line := await reader.readline():
            writer.write(tag + b" " + line)
            await writer.drain()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def pod_ports() -> AsyncIterator[PodPorts]:
    echo = await asyncio.start_server(lambda r, w: _tagged(b"echo", r, w), "127.0.0.1", 0)
    upper = await asyncio.start_server(lambda r, w: _tagged(b"UPPER", r, w), "127.0.0.1", 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    try:
        yield PodPorts(
            echo.sockets[0].getsockname()[1], upper.sockets[0].getsockname()[1], closed, []
        )
    finally:
        for server in (echo, upper):
            server.close()


# --- the kubelet's side: serve_port_forward in an aiohttp server ------------------------------

OpenPort = Callable[[int], Awaitable[tuple[Reader, Writer]]]


@contextlib.asynccontextmanager
async def kubelet(open_port: OpenPort, idle_timeout: float | None = None) -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            ports = parse_ports(request.query.getall("port", []))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        return await serve_port_forward(
            request, open_port, ports, idle_timeout=idle_timeout, pod="web_default", uid="u-1"
        )

    app = web.Application()
    app.router.add_route("*", "/portForward", handler)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/portForward"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def setup(idle_timeout: float | None = None) -> AsyncIterator[tuple[PodPorts, str]]:
    async with pod_ports() as pod:

        async def open_port(port: int) -> tuple[Reader, Writer]:
            pod.dials.append(port)
            return await dial_local_port(port)

        async with kubelet(open_port, idle_timeout) as url:
            yield pod, url


# --- clients ---------------------------------------------------------------------------------


async def spdy_upgrade(
    url: str, protocols: tuple[str, ...] = (PORT_FORWARD_PROTOCOL,)
) -> tuple[int, dict[str, str], Reader, Writer]:
    """The upgrade request as client-go sends it; the status, headers and the connection."""
    parts = aiohttp.client.URL(url)
    reader, writer = await asyncio.open_connection(parts.host, parts.port)
    head = [
        f"POST {parts.path_qs} HTTP/1.1",
        f"Host: {parts.host}:{parts.port}",
        "Connection: Upgrade",
        "Upgrade: SPDY/3.1",
        *(f"X-Stream-Protocol-Version: {p}" for p in protocols),
        "Content-Length: 0",
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    headers: dict[str, str] = {}
    while (line := (await reader.readline()).strip()) != b"":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader, writer


@contextlib.asynccontextmanager
async def spdy_client(url: str) -> AsyncIterator[SpdySession]:
    status, headers, reader, writer = await spdy_upgrade(url)
    assert status == 101
    assert headers["x-stream-protocol-version"] == PORT_FORWARD_PROTOCOL
    session = SpdySession(reader, writer, server=False)
    try:
        yield session
    finally:
        await session.close()


class Forwarded:
    """One forwarded connection as kubectl makes it: the error stream (closed at once: the
    client never writes on it), then the data stream."""

    def __init__(self, error: SpdyStream, data: SpdyStream) -> None:
        self.error = error
        self.data = data

    @classmethod
    async def open(cls, session: SpdySession, port: int, request_id: int) -> Forwarded:
        headers = {"streamType": "error", "port": str(port), "requestID": str(request_id)}
        error = await session.open_stream(headers, fin=True)
        data = await session.open_stream({**headers, "streamType": "data"})
        return cls(error, data)

    async def read_all(self, stream: SpdyStream | None = None) -> bytes:
        stream = stream or self.data
        received = b""
        while chunk := await stream.read():
            received += chunk
        return received

    async def errors(self) -> bytes:
        return await asyncio.wait_for(self.read_all(self.error), 10)

    async def line(self) -> bytes:
        received = b""
        while not received.endswith(b"\n"):
            chunk = await asyncio.wait_for(self.data.read(1), 10)
            assert chunk, f"end of stream after {received!r}"
            received += chunk
        return received


# --- SPDY ------------------------------------------------------------------------------------


async def test_spdy_forwards_concurrent_connections_to_several_ports() -> None:
    async with setup() as (pod, url), spdy_client(url) as session:

        async def one(index: int) -> None:
            port, tag = (pod.echo, b"echo") if index % 2 else (pod.upper, b"UPPER")
            conn = await Forwarded.open(session, port, index)
            for n in range(3):
                await conn.data.write(f"{index}.{n}\n".encode())
                assert await conn.line() == tag + f" {index}.{n}\n".encode()
            # Half-close: the server sees the end of our stream, answers what is left, ends.
            await conn.data.write(b"last\n")
            await conn.data.close()
            assert await asyncio.wait_for(conn.read_all(), 10) == tag + b" last\n"
            assert await conn.errors() == b""

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(20))), 30)
        assert sorted(pod.dials) == sorted([pod.echo] * 10 + [pod.upper] * 10)


async def test_a_refused_connection_is_reported_on_its_error_stream_and_the_rest_goes_on() -> None:
    async with setup() as (pod, url), spdy_client(url) as session:
        before = await Forwarded.open(session, pod.echo, 1)
        await before.data.write(b"one\n")
        assert await before.line() == b"echo one\n"

        refused = await Forwarded.open(session, pod.closed, 2)
        message = (await refused.errors()).decode()
        assert message == (
            f"error forwarding port {pod.closed} to pod web_default, uid u-1: "
            f"dial tcp4 127.0.0.1:{pod.closed}: connect: connection refused"
        )
        assert await asyncio.wait_for(refused.read_all(), 10) == b""

        # The connection made before goes on, and new ones are made.
        await before.data.write(b"two\n")
        assert await before.line() == b"echo two\n"
        after = await Forwarded.open(session, pod.upper, 3)
        await after.data.write(b"three\n")
        assert await after.line() == b"UPPER three\n"


async def test_a_client_reset_ends_its_connection_to_the_pod() -> None:
    closed = asyncio.Event()

    async def serve(reader: Reader, writer: Writer) -> None:
        await reader.read()  # until the kubelet closes the connection
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, kubelet(dial_local_port) as url, spdy_client(url) as session:
        conn = await Forwarded.open(session, port, 1)
        await conn.data.write(b"hello")
        conn.data.reset()  # what kubectl does once the pod's side has ended, or on an error
        await asyncio.wait_for(closed.wait(), 10)
        assert await conn.errors() == b""


async def test_bad_streams_are_reset_and_old_clients_pair_by_stream_id() -> None:
    async with setup() as (pod, url), spdy_client(url) as session:
        for headers in (
            {"streamType": "data", "requestID": "1"},  # no port
            {"streamType": "data", "port": "0", "requestID": "1"},
            {"streamType": "data", "port": "http", "requestID": "1"},
            {"streamType": "other", "port": str(pod.echo), "requestID": "1"},
            {"port": str(pod.echo), "requestID": "1"},
        ):
            stream = await session.open_stream(headers)
            with pytest.raises(SpdyStreamReset):
                await asyncio.wait_for(stream.read(), 10)

        # No requestID (clients before 1.5): error then data, paired by their stream ids.
        error = await session.open_stream({"streamType": "error", "port": str(pod.echo)}, fin=True)
        data = await session.open_stream({"streamType": "data", "port": str(pod.echo)})
        conn = Forwarded(error, data)
        await conn.data.write(b"old\n")
        assert await conn.line() == b"echo old\n"

        # A second data stream for a request ID is an error on that request's error stream.
        first = await Forwarded.open(session, pod.echo, 7)
        again = await session.open_stream(
            {"streamType": "data", "port": str(pod.echo), "requestID": "7"}
        )
        await first.data.write(b"x\n")
        assert await first.line() == b"echo x\n"
        assert again.id > first.data.id


async def test_a_pair_left_incomplete_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(portforward, "STREAM_CREATION_TIMEOUT", 0.2)
    async with setup() as (pod, url), spdy_client(url) as session:
        error = await session.open_stream(
            {"streamType": "error", "port": str(pod.echo), "requestID": "9"}, fin=True
        )
        message = await asyncio.wait_for(Forwarded(error, error).read_all(error), 10)
        assert message == b"request 9: timed out waiting for streams"
        assert pod.dials == []


async def test_protocols_and_requests_that_are_not_upgrades() -> None:
    async with setup() as (_, url):
        status, headers, _, writer = await spdy_upgrade(url, ("v4.channel.k8s.io",))
        writer.close()
        assert status == 403
        assert headers["x-accepted-stream-protocol-versions"] == PORT_FORWARD_PROTOCOL
        # No protocol offered (Kubernetes 1.0's clients): taken, none answered.
        status, headers, _, writer = await spdy_upgrade(url, ())
        writer.close()
        assert status == 101 and "x-stream-protocol-version" not in headers
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as plain:
                assert plain.status == 400
                assert "streaming upgrade" in (await plain.json())["message"]
            # The channel protocol needs its ports up front.
            async with http.get(
                url,
                headers={
                    "Connection": "Upgrade",
                    "Upgrade": "websocket",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
                    "Sec-WebSocket-Protocol": V4_BINARY,
                },
            ) as missing:
                assert missing.status == 400
                assert (await missing.json())["message"] == 'query parameter "port" is required'


def test_ports_are_parsed_as_the_kubelet_parses_them() -> None:
    assert parse_ports(["80", "8080,9090"]) == [80, 8080, 9090]
    assert parse_ports([]) == []
    for bad, message in (
        ("", 'query parameter "port" cannot be empty'),
        ("http", 'unable to parse "http" as a port'),
        ("80,x", 'unable to parse "80,x" as a port'),
        ("0", 'port "0" must be > 0 and < 65536'),
        ("65536", 'port "65536" must be > 0 and < 65536'),
    ):
        with pytest.raises(ValueError) as failed:
            parse_ports([bad])
        assert str(failed.value) == message


# --- back-pressure ---------------------------------------------------------------------------


async def test_a_pod_that_does_not_read_holds_the_client_back() -> None:
    """The client's writes stop once the buffers between are full: nothing grows without
    bound in the kubelet while the pod does not read."""
    reading = asyncio.Event()
    taken = 0

    async def serve(reader: Reader, writer: Writer) -> None:
        nonlocal taken
        await reading.wait()
        while chunk := await reader.read(65536):
            taken += len(chunk)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    total = 32 * 1024 * 1024
    async with server, kubelet(dial_local_port) as url, spdy_client(url) as session:
        conn = await Forwarded.open(session, port, 1)

        async def send() -> None:
            block = b"z" * 65536
            for _ in range(total // len(block)):
                await conn.data.write(block)
            await conn.data.close()

        sender = asyncio.create_task(send())
        await asyncio.sleep(1.0)
        assert not sender.done(), "32 MiB went into buffers while the pod read nothing"
        reading.set()
        await asyncio.wait_for(sender, 30)
        await asyncio.wait_for(conn.read_all(), 30)
        assert taken == total


async def test_a_client_that_does_not_read_holds_the_pod_back() -> None:
    written = 0
    done = asyncio.Event()

    async def serve(reader: Reader, writer: Writer) -> None:
        nonlocal written
        block = b"y" * 65536
        try:
            for _ in range(512):  # 32 MiB
                writer.write(block)
                await writer.drain()
                written += len(block)
        finally:
            writer.close()
            done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, kubelet(dial_local_port) as url, spdy_client(url) as session:
        conn = await Forwarded.open(session, port, 1)
        await asyncio.sleep(1.0)
        # What sits in the socket buffers and one SPDY window, not the 32 MiB.
        assert written < 16 * 1024 * 1024, written
        received = await asyncio.wait_for(conn.read_all(), 30)
        assert len(received) == 512 * 65536
        await asyncio.wait_for(done.wait(), 10)


# --- SPDY in a WebSocket ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def tunnel_client(url: str) -> AsyncIterator[SpdySession]:
    """client-go's tunneling dialer: a WebSocket whose binary messages carry the SPDY bytes."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, protocols=[TUNNEL_PROTOCOL]) as ws,
    ):
        assert ws.protocol == TUNNEL_PROTOCOL
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        bridge_reader, bridge_writer = await asyncio.open_connection(sock=theirs)

        async def up() -> None:
            while data := await bridge_reader.read(65536):
                await ws.send_bytes(data)

        async def down() -> None:
            async for msg in ws:
                if msg.type is WSMsgType.BINARY:
                    bridge_writer.write(msg.data)
                    await bridge_writer.drain()
            bridge_writer.close()

        pumps = [asyncio.create_task(up()), asyncio.create_task(down())]
        session = SpdySession(reader, writer, server=False)
        try:
            yield session
        finally:
            await session.close()
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)


async def test_spdy_tunnelled_in_a_websocket() -> None:
    async with setup() as (pod, url), tunnel_client(url) as session:
        conns = [await Forwarded.open(session, p, i) for i, p in enumerate([pod.echo, pod.upper])]
        for conn, tag in zip(conns, (b"echo", b"UPPER"), strict=True):
            await conn.data.write(b"through\n")
            assert await conn.line() == tag + b" through\n"
        refused = await Forwarded.open(session, pod.closed, 5)
        assert b"connection refused" in await refused.errors()
        await conns[0].data.write(b"still\n")
        assert await conns[0].line() == b"echo still\n"


# --- WebSocket channels ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [V4_BINARY, V4_BASE64])
async def test_websocket_channels_one_connection_per_port(protocol: str) -> None:
    encoded = protocol == V4_BASE64

    def frame(channel: int, data: bytes) -> bytes | str:
        if encoded:
            return chr(ord("0") + channel) + base64.b64encode(data).decode()
        return bytes([channel]) + data

    def unframe(msg: aiohttp.WSMessage) -> tuple[int, bytes]:
        if encoded:
            assert msg.type is WSMsgType.TEXT
            return ord(msg.data[0]) - ord("0"), base64.b64decode(msg.data[1:])
        assert msg.type is WSMsgType.BINARY
        return msg.data[0], msg.data[1:]

    async with setup() as (pod, url), aiohttp.ClientSession() as http:
        ports = [pod.echo, pod.closed, pod.upper]
        target = f"{url}?port={pod.echo},{pod.closed}&port={pod.upper}"
        async with http.ws_connect(target, protocols=[protocol]) as ws:
            assert ws.protocol == protocol
            received: dict[int, bytes] = {}

            async def until(check: Callable[[], bool]) -> None:
                while not check():
                    channel, data = unframe(await asyncio.wait_for(ws.receive(), 10))
                    received[channel] = received.get(channel, b"") + data

            # Each channel starts with its port, 16-bit little-endian.
            await until(lambda: all(len(received.get(c, b"")) >= 2 for c in range(6)))
            for index, port in enumerate(ports):
                assert received[2 * index][:2] == struct.pack("<H", port)
                assert received[2 * index + 1][:2] == struct.pack("<H", port)
            for channel in received:
                received[channel] = received[channel][2:]

            for index in (0, 2):
                send = ws.send_str if encoded else ws.send_bytes
                await send(frame(2 * index, b"over the channel\n"))  # type: ignore[operator]
            await until(lambda: received[0].endswith(b"\n") and received[4].endswith(b"\n"))
            assert received[0] == b"echo over the channel\n"
            assert received[4] == b"UPPER over the channel\n"
            await until(lambda: b"refused" in received[3])
            assert (
                received[3]
                .decode()
                .startswith(f"error forwarding port {pod.closed} to pod web_default, uid u-1: ")
            )


async def test_websocket_channels_left_idle_are_closed_by_the_node() -> None:
    """Messages either way keep the session (longer than the timeout); then none for the
    timeout, and the node closes the WebSocket."""
    async with (
        setup(idle_timeout=0.5) as (pod, url),
        aiohttp.ClientSession() as http,
        http.ws_connect(f"{url}?port={pod.echo}", protocols=[V4_BINARY]) as ws,
    ):
        for _ in range(2):  # the port on each channel
            await asyncio.wait_for(ws.receive(), 10)
        for i in range(6):  # 1.2 s of talk, a message every 0.2 s
            await ws.send_bytes(b"\x00" + f"{i}\n".encode())
            reply = await asyncio.wait_for(ws.receive_bytes(), 10)
            assert reply == b"\x00echo " + f"{i}\n".encode()
            await asyncio.sleep(0.2)
        assert not ws.closed
        msg = await asyncio.wait_for(ws.receive(), 30)
        assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING), msg


# --- dialling ----------------------------------------------------------------------------------


async def test_a_refused_dial_says_so_in_gos_words() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RuntimeFailure) as failed:
        await dial_local_port(port)
    assert str(failed.value) == f"dial tcp4 127.0.0.1:{port}: connect: connection refused"


async def test_the_fake_runtime_forwards_to_what_serves_the_port() -> None:
    fake = FakeRuntime(started=True)

    async def serve(reader: Reader, writer: Writer) -> None:
        writer.write(b"hi " + await reader.readline())
        await writer.drain()

    fake.serve_port(8080, serve)
    pod = make_pod()
    with pytest.raises(RuntimeFailure, match="no ready sandbox"):
        await fake.port_forward(pod.uid, 8080)
    await fake.run_sandbox(pod)
    reader, writer = await fake.port_forward(pod.uid, 8080)
    writer.write(b"there\n")
    assert await asyncio.wait_for(reader.read(), 10) == b"hi there\n"
    writer.close()
    with pytest.raises(RuntimeFailure, match="connection refused"):
        await fake.port_forward(pod.uid, 9090)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
    reason="creating a network namespace needs root, unshare and ip",
)
async def test_a_socket_made_in_a_network_namespace_reaches_its_loopback() -> None:
    """The sandbox runtimes' dial: a server on 127.0.0.1 in a namespace of its own is reached
    through the namespace, and not from the agent's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = (
        f"import socket;s=socket.socket();s.bind(('127.0.0.1',{port}));s.listen();print('up',"
        "flush=True);c,_=s.accept();c.sendall(b'inside '+c.recv(100));c.close()"
    )
    script = f'ip link set lo up && exec {sys.executable} -c "$0"'
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--net", "sh", "-c", script, server, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 10) == b"up\n"
        with pytest.raises(RuntimeFailure, match="connection refused"):
            await dial_local_port(port)  # the agent's own loopback: nothing there
        sock = await socket_in(f"/proc/{proc.pid}/ns/net")
        reader, writer = await dial_local_port(port, sock)
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.read(), 10) == b"inside hello"
        writer.close()
        with pytest.raises(OSError, match="No such file"):
            await socket_in("/proc/no-such-pid/ns/net")
    finally:
        with contextlib.suppress(ProcessLookupError):  # it exits after its one connection
            proc.kill()
        await proc.wait()
