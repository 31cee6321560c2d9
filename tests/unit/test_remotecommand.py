"""The remote-command session (server/streaming/remotecommand.py) over WebSockets
(websocket.py): a real aiohttp server and client on 127.0.0.1, and a scripted process standing
in for the container's command (the runtime sits outside the unit)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer

from pykubelet.runtime.base import (
    STDERR,
    STDOUT,
    ContainerRunState,
    RuntimeContainer,
    TerminalSize,
)
from pykubelet.server.streaming.remotecommand import (
    ExecOptions,
    ResizeDecoder,
    TerminalSizes,
    exec_options,
    exit_status,
    serve_attach,
    serve_exec,
    success_status,
)
from pykubelet.server.streaming.session import serve_stream
from pykubelet.server.streaming.websocket import WebSocketChannels

Obj = dict[str, Any]


class EchoProcess:
    """`cat` with a twist: what comes in goes out on stdout, a line "err" goes to stderr,
    and it exits with `code` at the end of its input."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.sizes: list[tuple[int, int]] = []
        self.closed = False
        self._out: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

    async def write_stdin(self, data: bytes) -> None:
        for line in data.splitlines(keepends=True):
            await self._out.put((STDERR if line.strip() == b"err" else STDOUT, line))

    async def close_stdin(self) -> None:
        await self._out.put(None)

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        while (item := await self._out.get()) is not None:
            yield item

    async def resize(self, width: int, height: int) -> None:
        self.sizes.append((width, height))

    async def wait(self) -> int | None:
        return self.code

    async def close(self) -> None:
        self.closed = True


async def serve(
    process: EchoProcess, opts: ExecOptions, idle_timeout: float | None = None
) -> TestClient[web.Request, web.Application]:
    async def handler(request: web.Request) -> web.StreamResponse:
        channels = await WebSocketChannels.open(request, opts, idle_timeout)
        await serve_exec(channels, process, opts)
        return channels.response

    app = web.Application()
    app.router.add_get("/exec", handler)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


def test_exec_options_read_the_api_servers_parameters_and_refuse_nonsense() -> None:
    opts = exec_options(["sh"], {"input": "1", "output": "1", "error": "1"})
    assert (opts.stdin, opts.stdout, opts.stderr, opts.tty) == (True, True, True, False)
    direct = exec_options(["sh"], {"stdin": "true", "stdout": "true", "stderr": "true", "tty": "1"})
    assert (direct.stdin, direct.stdout, direct.stderr, direct.tty) == (True, True, False, True)
    with pytest.raises(ValueError, match="at least 1 of stdin, stdout, stderr"):
        exec_options(["sh"], {"tty": "1"})
    with pytest.raises(ValueError, match="command"):
        exec_options([], {"output": "1"})


def test_terminal_sizes_are_read_across_pieces_and_garbage_is_not_kept() -> None:
    decoder = ResizeDecoder()
    assert decoder.feed(b'{"Width": 80, "He') == []
    assert decoder.feed(b'ight": 24}{"Width":100,"Height":30}') == [(80, 24), (100, 30)]
    assert decoder.feed(b"x" * 5000) == []
    assert decoder.feed(b'{"Width": 1, "Height": 2}') == [(1, 2)]


async def test_a_websocket_without_messages_for_the_idle_timeout_is_closed() -> None:
    """Messages either way keep the session; then none for the timeout, and the node closes
    the WebSocket (the session ends as when the client goes: stdin ends)."""
    process = EchoProcess(code=0)
    opts = ExecOptions(["cat"], stdin=True, stdout=True, stderr=False, tty=False)
    client = await serve(process, opts, idle_timeout=0.5)
    try:
        async with client.ws_connect("/exec", protocols=("v5.channel.k8s.io",)) as ws:
            assert await ws.receive_bytes() == b"\x01"
            for i in range(6):  # 1.2 s of talk, a message every 0.2 s: longer than the timeout
                await ws.send_bytes(b"\x00" + f"{i}\n".encode())
                assert await ws.receive_bytes() == b"\x01" + f"{i}\n".encode()
                await asyncio.sleep(0.2)
            assert not ws.closed
            msg = await asyncio.wait_for(ws.receive(), 30)
            while msg.type is WSMsgType.BINARY:  # the outcome, if any, then the close
                msg = await asyncio.wait_for(ws.receive(), 30)
            assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING), msg
    finally:
        await client.close()


async def test_no_idle_timeout_means_none() -> None:
    process = EchoProcess(code=0)
    opts = ExecOptions(["cat"], stdin=True, stdout=True, stderr=False, tty=False)
    client = await serve(process, opts, idle_timeout=0)
    try:
        async with client.ws_connect("/exec", protocols=("v5.channel.k8s.io",)) as ws:
            assert await ws.receive_bytes() == b"\x01"
            await asyncio.sleep(0.5)
            await ws.send_bytes(b"\x00still here\n")
            assert await ws.receive_bytes() == b"\x01still here\n"
    finally:
        await client.close()


async def test_v5_stdin_close_signal_output_apart_and_the_exit_code() -> None:
    process = EchoProcess(code=3)
    opts = ExecOptions(["cat"], stdin=True, stdout=True, stderr=True, tty=False)
    client = await serve(process, opts)
    try:
        async with client.ws_connect("/exec", protocols=("v5.channel.k8s.io",)) as ws:
            assert ws.protocol == "v5.channel.k8s.io"
            assert await ws.receive_bytes() == b"\x01"  # the kubelet's hello on stdout
            await ws.send_bytes(b"\x00hello\nerr\n")
            await ws.send_bytes(b"\xff\x00")  # v5: stdin closed
            got: dict[int, bytes] = {}
            while True:
                msg = await ws.receive()
                if msg.type is not aiohttp.WSMsgType.BINARY:
                    break
                got[msg.data[0]] = got.get(msg.data[0], b"") + msg.data[1:]
        assert got[1] == b"hello\n" and got[2] == b"err\n"
        assert json.loads(got[3]) == exit_status(3, ["cat"])
        assert json.loads(got[3])["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
        assert process.closed
    finally:
        await client.close()


async def test_base64_protocol_and_resizes() -> None:
    process = EchoProcess()
    opts = ExecOptions(["sh"], stdin=True, stdout=True, stderr=False, tty=True)
    client = await serve(process, opts)
    try:
        async with client.ws_connect("/exec", protocols=("v4.base64.channel.k8s.io",)) as ws:
            assert await ws.receive_str() == "1"
            await ws.send_str("4" + base64.b64encode(b'{"Width":120,"Height":40}').decode())
            await ws.send_str("0" + base64.b64encode(b"hi\n").decode())
            frames = [await ws.receive_str()]
            await asyncio.sleep(0.05)
            assert process.sizes == [(120, 40)]
            await ws.close()  # before v5, stdin ends with the connection
        assert frames[0][0] == "1" and base64.b64decode(frames[0][1:]) == b"hi\n"
    finally:
        await client.close()


async def test_before_v4_a_failure_is_its_message_and_success_says_nothing() -> None:
    for code, expected in ((0, None), (2, b"command terminated with non-zero exit code")):
        process = EchoProcess(code=code)
        opts = ExecOptions(["false"], stdin=True, stdout=True, stderr=False, tty=False)
        client = await serve(process, opts)
        try:
            async with client.ws_connect("/exec", protocols=("channel.k8s.io",)) as ws:
                await ws.receive_bytes()
                await ws.send_bytes(b"\x00x\n")
                await ws.receive_bytes()
                await process.close_stdin()  # the command ends
                error: bytes | None = None
                while True:
                    msg = await ws.receive()
                    if msg.type is not aiohttp.WSMsgType.BINARY:
                        break
                    if msg.data[0] == 3:
                        error = msg.data[1:]
            if expected is None:
                assert error is None
            else:
                assert error is not None and error.startswith(expected)
        finally:
            await client.close()


class QuietProcess(EchoProcess):
    """A container that keeps its stdin open when the client's ends (no stdinOnce)."""

    async def close_stdin(self) -> None:
        pass


async def test_attach_reports_success_and_a_client_that_leaves_detaches() -> None:
    # Ends with its output: Success, whatever the exit code (the kubelet's attach).
    process = EchoProcess(code=3)
    opts = ExecOptions(["attach"], stdin=True, stdout=True, stderr=True, tty=False)
    done: asyncio.Event = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        channels = await WebSocketChannels.open(request, opts, None)
        try:
            await serve_attach(channels, process, opts)
        except ConnectionError:
            pass  # the client left: session.py logs it
        finally:
            done.set()  # (aiohttp may cancel the handler of a client that left)
        return channels.response

    app = web.Application()
    app.router.add_get("/attach", handler)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        async with client.ws_connect("/attach", protocols=("v5.channel.k8s.io",)) as ws:
            assert await ws.receive_bytes() == b"\x01"
            await ws.send_bytes(b"\x00hi\n")
            assert await ws.receive_bytes() == b"\x01hi\n"
            await ws.send_bytes(b"\xff\x00")
            status = await ws.receive_bytes()
        assert json.loads(status[1:]) == success_status()
        assert process.closed
        # A client that goes away while the container is quiet: the attach ends (detached).
        quiet = QuietProcess()
        process = quiet
        async with client.ws_connect("/attach", protocols=("v5.channel.k8s.io",)) as ws:
            assert await ws.receive_bytes() == b"\x01"
        async with asyncio.timeout(5):
            while not quiet.closed:  # closed by its session's end, not by a handler we await
                await done.wait()
                done.clear()
    finally:
        await client.close()


def _container() -> RuntimeContainer:
    return RuntimeContainer(
        id="c1",
        runtime="process",
        pod_uid="u1",
        pod_name="web",
        pod_namespace="default",
        name="main",
        attempt=0,
        spec_hash="h",
        image="busybox",
        state=ContainerRunState.RUNNING,
        created_at=datetime.now(UTC),
    )


async def _session_server(
    opts: ExecOptions, started: list[TerminalSize | None], process: EchoProcess
) -> TestClient[web.Request, web.Application]:
    async def start(size: TerminalSize | None) -> EchoProcess:
        started.append(size)
        return process

    async def handler(request: web.Request) -> web.StreamResponse:
        return await serve_stream(request, "exec", _container(), start, opts, None)

    app = web.Application()
    app.router.add_get("/exec", handler)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


async def test_a_terminals_command_starts_with_the_clients_first_size() -> None:
    process = EchoProcess()
    started: list[TerminalSize | None] = []
    opts = ExecOptions(["sh"], stdin=True, stdout=True, stderr=False, tty=True)
    client = await _session_server(opts, started, process)
    try:
        async with client.ws_connect("/exec", protocols=("v5.channel.k8s.io",)) as ws:
            assert await ws.receive_bytes() == b"\x01"  # open; the command is not started yet
            await asyncio.sleep(0.1)
            assert started == []
            await ws.send_bytes(b'\x04{"Width":132,"Height":43}')  # kubectl's first message
            await ws.send_bytes(b"\x00hi\n")
            assert await ws.receive_bytes() == b"\x01hi\n"
            await ws.send_bytes(b'\x04{"Width":100,"Height":40}')
            await ws.send_bytes(b"\x00again\n")
            assert await ws.receive_bytes() == b"\x01again\n"
            await asyncio.sleep(0.05)
            await ws.send_bytes(b"\xff\x00")  # v5: stdin closed, the command ends
            assert json.loads((await ws.receive_bytes())[1:]) == success_status()
        assert started == [TerminalSize(132, 43)]
        assert process.sizes == [(100, 40)]  # later sizes resize it
    finally:
        await client.close()


async def test_a_client_that_sends_no_size_has_its_command_started_all_the_same() -> None:
    process = EchoProcess()
    started: list[TerminalSize | None] = []
    opts = ExecOptions(["sh"], stdin=True, stdout=True, stderr=False, tty=True)
    client = await _session_server(opts, started, process)
    try:
        async with client.ws_connect("/exec", protocols=("v5.channel.k8s.io",)) as ws:
            assert await ws.receive_bytes() == b"\x01"
            await ws.send_bytes(b"\x00hi\n")
            assert await ws.receive_bytes() == b"\x01hi\n"  # after FIRST_SIZE_WAIT
            await ws.send_bytes(b"\xff\x00")
            assert json.loads((await ws.receive_bytes())[1:]) == success_status()
        assert started == [None] and process.sizes == []
    finally:
        await client.close()


async def test_terminal_sizes_keep_only_the_latest_unapplied_one() -> None:
    class Sizes:
        def __init__(self) -> None:
            self.queue: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()

        async def resizes(self) -> AsyncIterator[tuple[int, int]]:
            while (size := await self.queue.get()) is not None:
                yield size

    channels = Sizes()
    sizes = TerminalSizes(channels)  # type: ignore[arg-type]
    for n in range(1, 1001):
        channels.queue.put_nowait((n, n))
    await asyncio.sleep(0.01)
    assert await sizes.next() == (1000, 1000)
    assert await sizes.first(0.05) is None  # nothing new
    channels.queue.put_nowait(None)  # the client can send no more
    assert await sizes.next() is None
    await sizes.close()
