"""The client of a CRI runtime's streaming server (runtime/cri/streamclient.py) against a small
aiohttp server on 127.0.0.1 that speaks as the Kubernetes streaming server in containerd 1.6
does: SPDY/3.1 after a 101, remote-command v4 streams, the Status on the error stream (which it
resets right behind it), then the session closed."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from pykubelet.common.spdy import SpdyStream
from pykubelet.runtime.base import STDERR, STDOUT, RuntimeFailure
from pykubelet.runtime.cri.streamclient import (
    PROTOCOL,
    RemoteCommandStream,
    Streams,
    exit_code_of,
    open_stream,
)
from pykubelet.server.streaming.hijack import upgrade_to_spdy

Command = Callable[[dict[str, SpdyStream]], Awaitable[bytes]]

SUCCESS = json.dumps({"metadata": {}, "status": "Success"}).encode()


def exit_status(code: int) -> bytes:
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


class StreamingServer:
    """One exec/attach endpoint: `command` runs once the expected streams are there and
    returns the Status for the error stream (b"": none, the connection just ends)."""

    def __init__(self, expected: int, command: Command) -> None:
        self.expected = expected
        self.command = command
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.stream_types: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        if request.match_info["token"] != "good":
            return web.Response(status=404, text="token not found")
        session = await upgrade_to_spdy(request, {"X-Stream-Protocol-Version": PROTOCOL}, None)
        streams: dict[str, SpdyStream] = {}
        while len(streams) < self.expected:
            stream = await session.accept_stream()
            assert stream is not None
            kind = stream.headers["streamtype"]
            self.stream_types.append(kind)
            streams[kind] = stream
            await stream.reply()
        status = await self.command(streams)
        if status:
            await streams["error"].write(status)
            # As k8s.io/apimachinery's spdy connection Close: every stream reset, at once.
            for stream in streams.values():
                stream.reset()
        await session.close()
        return web.Response(text="not written")


@contextlib.asynccontextmanager
async def serving(server: StreamingServer) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/exec/{token}", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def read_all(stream: RemoteCommandStream) -> list[tuple[str, bytes]]:
    joined: list[tuple[str, bytes]] = []
    async for name, data in stream.output():
        if joined and joined[-1][0] == name:
            joined[-1] = (name, joined[-1][1] + data)
        else:
            joined.append((name, data))
    return joined


async def test_exec_with_stdin_its_end_and_the_exit_code() -> None:
    async def cat(streams: dict[str, SpdyStream]) -> bytes:
        while data := await streams["stdin"].read():
            await streams["stdout"].write(data)
        await streams["stderr"].write(b"done\n")
        await streams["stdout"].close()
        await streams["stderr"].close()
        return exit_status(3)

    server = StreamingServer(4, cat)
    async with serving(server) as base:
        stream = await open_stream(
            f"{base}/exec/good", Streams(stdin=True, stdout=True, stderr=True, tty=False), "exec"
        )
        try:
            await stream.write_stdin(b"one\n")
            await stream.write_stdin(b"two\n")
            await stream.close_stdin()
            assert await read_all(stream) == [(STDOUT, b"one\ntwo\n"), (STDERR, b"done\n")]
            assert await stream.wait() == 3
        finally:
            await stream.close()
    method, path, headers = server.requests[0]
    assert (method, path) == ("POST", "/exec/good")
    assert headers["Upgrade"] == "SPDY/3.1"
    assert headers["X-Stream-Protocol-Version"] == PROTOCOL
    # As client-go opens them: the error stream first.
    assert server.stream_types == ["error", "stdin", "stdout", "stderr"]


async def test_a_terminal_has_a_resize_stream_and_no_stderr() -> None:
    sizes: list[bytes] = []

    async def shell(streams: dict[str, SpdyStream]) -> bytes:
        sizes.append(await streams["resize"].read())
        await streams["stdout"].write(b"sized\r\n")
        await streams["stdout"].close()
        return SUCCESS

    server = StreamingServer(3, shell)
    async with serving(server) as base:
        stream = await open_stream(
            f"{base}/exec/good", Streams(stdin=False, stdout=True, stderr=True, tty=True), "exec"
        )
        try:
            await stream.resize(80, 24)
            assert await read_all(stream) == [(STDOUT, b"sized\r\n")]
            assert await stream.wait() == 0
            with pytest.raises(RuntimeFailure, match="standard input is not attached"):
                await stream.write_stdin(b"x")
        finally:
            await stream.close()
    assert server.stream_types == ["error", "stdout", "resize"]
    assert sizes == [b'{"Width":80,"Height":24}\n']


async def test_a_slow_reader_stops_the_reads() -> None:
    total = 4 * 1024 * 1024
    written = [0]

    async def flood(streams: dict[str, SpdyStream]) -> bytes:
        block = b"x" * 16384
        while written[0] < total:
            await streams["stdout"].write(block)
            written[0] += len(block)
        await streams["stdout"].close()
        return SUCCESS

    async with serving(StreamingServer(2, flood)) as base:
        stream = await open_stream(
            f"{base}/exec/good", Streams(stdin=False, stdout=True, stderr=False, tty=False), "x"
        )
        try:
            # Nobody reads: the server's writes stop, far short of the whole.
            last = -1
            while written[0] != last:
                last = written[0]
                await asyncio.sleep(0.2)
            assert written[0] < 1024 * 1024
            received = sum(len(data) for _, data in await read_all(stream))
            assert received == total
            assert await stream.wait() == 0
        finally:
            await stream.close()


async def test_a_command_that_cannot_start_fails_with_the_runtime_message() -> None:
    async def missing(streams: dict[str, SpdyStream]) -> bytes:
        await streams["stdout"].close()
        message = (
            "error executing command in container: failed to exec in container: "
            'exec: "nope": executable file not found in $PATH'
        )
        return json.dumps(
            {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"}
        ).encode()

    async with serving(StreamingServer(2, missing)) as base:
        stream = await open_stream(
            f"{base}/exec/good", Streams(stdin=False, stdout=True, stderr=False, tty=False), "x"
        )
        try:
            assert await read_all(stream) == []
            with pytest.raises(RuntimeFailure) as failure:
                await stream.wait()
            assert str(failure.value) == (
                'failed to exec in container: exec: "nope": executable file not found in $PATH'
            )
        finally:
            await stream.close()


async def test_no_status_is_an_unknown_exit_code() -> None:
    async def vanish(streams: dict[str, SpdyStream]) -> bytes:
        await streams["stdout"].write(b"partial")
        return b""

    async with serving(StreamingServer(2, vanish)) as base:
        stream = await open_stream(
            f"{base}/exec/good", Streams(stdin=False, stdout=True, stderr=False, tty=False), "x"
        )
        try:
            assert await read_all(stream) == [(STDOUT, b"partial")]
            assert await stream.wait() is None
        finally:
            await stream.close()


async def test_an_attach_ends_with_its_container_and_drops_input_without_stdin() -> None:
    async def attached(streams: dict[str, SpdyStream]) -> bytes:
        await streams["stdout"].write(b"log line\n")
        await streams["stdout"].close()
        return SUCCESS

    async def ended() -> int:
        return 7

    async with serving(StreamingServer(2, attached)) as base:
        stream = await open_stream(
            f"{base}/exec/good",
            Streams(stdin=False, stdout=True, stderr=False, tty=False),
            "attach",
            drop_input=True,
            ended=ended,
        )
        try:
            await stream.write_stdin(b"dropped")
            assert await read_all(stream) == [(STDOUT, b"log line\n")]
            assert await stream.wait() == 7
        finally:
            await stream.close()
        await stream.close()  # twice is safe


async def test_refusals_say_why() -> None:
    async def unused(streams: dict[str, SpdyStream]) -> bytes:
        raise AssertionError("not reached")

    streams = Streams(stdin=False, stdout=True, stderr=False, tty=False)
    async with serving(StreamingServer(2, unused)) as base:
        with pytest.raises(RuntimeFailure, match="answered 404: token not found"):
            await open_stream(f"{base}/exec/expired", streams, "exec of 'ls' in container c")
    with pytest.raises(RuntimeFailure, match="cannot connect to the runtime's streaming server"):
        await open_stream(base + "/exec/good", streams, "exec")  # nothing listens any more
    with pytest.raises(RuntimeFailure, match="not plain http"):
        await open_stream("https://127.0.0.1:1/exec/x", streams, "exec")


def test_exit_codes_from_the_status() -> None:
    assert exit_code_of(SUCCESS) == 0
    assert exit_code_of(exit_status(137)) == 137
    assert exit_code_of(b"") is None
    no_cause = {"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": []}}
    assert exit_code_of(json.dumps(no_cause).encode()) is None
    with pytest.raises(RuntimeFailure, match="not a Status"):
        exit_code_of(b"<html>")
