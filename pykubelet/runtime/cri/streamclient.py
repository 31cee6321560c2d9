"""Exec and attach on a CRI runtime's own streaming server: the client of the URL that the CRI's
Exec and Attach calls answer with (containerd 1.6: k8s.io/kubelet/pkg/cri/streaming, vendored as
pkg/cri/streaming, on stream_server_address:stream_server_port).

What it promises:

* One HTTP/1.1 request (`POST <url>`, `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version:
  v4.channel.k8s.io`), answered with 101; then one SPDY/3.1 session (common/spdy.py, the client
  end) with the remote-command streams as client-go opens them: `streamType` error, then stdin,
  stdout, stderr (not with a terminal) and resize (with one), each waited on until the server
  replied (it starts the command only once all of them are there).
* SPDY and not the server's WebSocket channels: `v4.channel.k8s.io` over a WebSocket has no way
  to close stdin alone (v5's close signal came after containerd 1.6's copy of the server), so
  `kubectl exec -i ... -- cat` would never see its end of input. A SPDY stream half-closes.
* Output is bounded: each stream is read in chunks of at most `CHUNK` bytes into a queue of
  `OUTPUT_QUEUE` chunks; a reader that does not keep up stops the reads, the session stops
  reading the connection, and the runtime's writes (the command's) wait.
* The outcome is the v4 error stream's Status: `Success` is 0, `NonZeroExitCode` its `ExitCode`
  cause; another failure (the command could not start) is a RuntimeFailure with the runtime's
  message; no Status at all (the connection broke) is None, unknown.
* Terminal sizes go to the resize stream as client-go writes them: `{"Width":..,"Height":..}`.
* close() ends the session: the command's stdin ends and its output has nowhere to go. The CRI
  has no call that kills an exec; a command that ignores both runs on, as under the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pykubelet.common.spdy import SpdySession, SpdyStream
from pykubelet.common.spdy_frames import SpdyError
from pykubelet.runtime.base import STDERR, STDOUT, RuntimeFailure

log = logging.getLogger(__name__)

PROTOCOL = "v4.channel.k8s.io"
CONNECT_TIMEOUT = 10.0
# containerd's stream creation timeout is 30 s: past it, it gives up on the streams anyway.
STREAMS_TIMEOUT = 30.0
HEAD_LIMIT = 16 * 1024  # the 101 response's head
BODY_LIMIT = 4096  # of a refusal's body, for its message
STATUS_LIMIT = 64 * 1024  # a v4 Status is a few hundred bytes
CHUNK = 32 * 1024
OUTPUT_QUEUE = 8  # chunks waiting for the reader, both streams together

# The prefixes the Kubernetes streaming server puts before the runtime's message; the kubelet
# API puts its own ("error executing command in container: ...") before ours.
_PREFIXES = ("error executing command in container: ", "error attaching to container: ")


@dataclass(frozen=True)
class Streams:
    """The streams of one exec or attach, as its CRI request asked for them."""

    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def exit_code_of(status_bytes: bytes) -> int | None:
    """The exit code a v4 error stream's Status carries: 0 for Success, the `ExitCode` cause of
    a `NonZeroExitCode`; None without a Status. RuntimeFailure with its message for any other
    failure (the runtime could not run the command)."""
    if not status_bytes.strip():
        return None
    try:
        status = json.loads(status_bytes)
    except ValueError:
        raise RuntimeFailure(
            f"the runtime's error stream is not a Status: {status_bytes[:200]!r}"
        ) from None
    if not isinstance(status, dict):
        raise RuntimeFailure(f"the runtime's error stream is not a Status: {status!r:.200}")
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        details = status.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        for cause in causes if isinstance(causes, list) else []:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                with contextlib.suppress(TypeError, ValueError):
                    return int(cause.get("message", ""))
        return None
    message = str(status.get("message") or status.get("reason") or "the runtime gave no reason")
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    raise RuntimeFailure(message)


class RemoteCommandStream:
    """An ExecStream over one SPDY session with the runtime's streaming server.

    `ended`, for an attach: how the container ended (its exit code), asked once the session
    is over; without it wait() is the command's outcome on the error stream.
    `drop_input`: stdin written without a stdin stream is dropped (an attach to a container
    without stdin), not refused."""

    def __init__(
        self,
        session: SpdySession,
        streams: dict[str, SpdyStream],
        what: str,
        *,
        drop_input: bool = False,
        ended: Callable[[], Awaitable[int | None]] | None = None,
    ) -> None:
        self._session = session
        self._what = what
        self._drop_input = drop_input
        self._ended = ended
        self._stdin = streams.get("stdin")
        self._resize = streams.get("resize")
        self._stdin_closed = False
        self._queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(OUTPUT_QUEUE)
        self._pumps = [
            asyncio.create_task(self._pump(name, streams[key]), name=f"{what} {key}")
            for key, name in (("stdout", STDOUT), ("stderr", STDERR))
            if key in streams
        ]
        self._open_outputs = len(self._pumps)
        self._status = asyncio.create_task(
            self._read_status(streams["error"]), name=f"{what} error"
        )

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin is None:
            if self._drop_input:
                return
            raise RuntimeFailure("the command's standard input is not attached")
        if self._stdin_closed or not data:
            return
        try:
            await self._stdin.write(data)
        except SpdyError as e:
            # The command is gone or closed its input: what follows has nowhere to go.
            log.debug("%s: stdin ended: %s", self._what, e)
            self._stdin_closed = True

    async def close_stdin(self) -> None:
        if self._stdin is None or self._stdin_closed:
            return
        self._stdin_closed = True
        with contextlib.suppress(SpdyError):
            await self._stdin.close()  # our FIN: the command reads its end of input

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        while self._open_outputs:
            item = await self._queue.get()
            if item is None:
                self._open_outputs -= 1
                continue
            yield item

    async def resize(self, width: int, height: int) -> None:
        if self._resize is None:
            return
        size = json.dumps({"Width": width, "Height": height}, separators=(",", ":"))
        try:
            await self._resize.write(size.encode() + b"\n")
        except SpdyError as e:
            log.debug("%s: cannot resize its terminal: %s", self._what, e)

    async def wait(self) -> int | None:
        code = await asyncio.shield(self._status)
        if self._ended is not None:
            return await self._ended()
        return code

    async def close(self) -> None:
        for task in (*self._pumps, self._status):
            task.cancel()
        await asyncio.gather(*self._pumps, self._status, return_exceptions=True)
        await self._session.close()

    async def _pump(self, name: str, stream: SpdyStream) -> None:
        """One output stream into the queue, until its end (or the session's); then its end
        marker (close() is the only canceller, and nobody reads after it)."""
        try:
            while data := await stream.read(CHUNK):
                await self._queue.put((name, data))
        except SpdyError as e:
            log.debug("%s: %s ended: %s", self._what, name, e)
        await self._queue.put(None)

    async def _read_status(self, stream: SpdyStream) -> int | None:
        data = bytearray()
        with contextlib.suppress(SpdyError):
            while len(data) <= STATUS_LIMIT and (chunk := await stream.read(CHUNK)):
                data += chunk
        return exit_code_of(bytes(data))


async def open_stream(
    url: str,
    streams: Streams,
    what: str,
    *,
    drop_input: bool = False,
    ended: Callable[[], Awaitable[int | None]] | None = None,
) -> RemoteCommandStream:
    """Connect to `url` (an Exec or Attach answer), upgrade to SPDY, open the streams and wait
    until the server has them all. RuntimeFailure saying why when it cannot."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise RuntimeFailure(
            f"{what}: the runtime's streaming URL {url!r} is not plain http (pykubelet does not "
            "speak TLS to the runtime's streaming server: run it on a local address without TLS)"
        )
    port = parts.port or 80
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            reader, writer = await asyncio.open_connection(parts.hostname, port, limit=HEAD_LIMIT)
    except (OSError, TimeoutError) as e:
        raise RuntimeFailure(
            f"{what}: cannot connect to the runtime's streaming server at {parts.netloc}: "
            f"{e or 'no connection in time'}"
        ) from None
    try:
        writer.write(
            (
                f"POST {target} HTTP/1.1\r\n"
                f"Host: {parts.netloc}\r\n"
                "Connection: Upgrade\r\n"
                "Upgrade: SPDY/3.1\r\n"
                f"X-Stream-Protocol-Version: {PROTOCOL}\r\n"
                "Content-Length: 0\r\n"
                "\r\n"
            ).encode()
        )
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await writer.drain()
            status, headers = await _read_head(reader, what)
            if status != 101:
                body = await _read_body(reader, headers)
                raise RuntimeFailure(
                    f"{what}: the runtime's streaming server answered {status}"
                    + (f": {body}" if body else "")
                )
        protocol = headers.get("x-stream-protocol-version", "")
        if protocol != PROTOCOL:
            raise RuntimeFailure(
                f"{what}: the runtime's streaming server chose protocol {protocol or 'none'!r}, "
                f"not {PROTOCOL}"
            )
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        writer.close()
        raise RuntimeFailure(
            f"{what}: the runtime's streaming server did not answer the upgrade: "
            f"{e or 'no answer in time'}"
        ) from None
    except BaseException:
        writer.close()
        raise
    session = SpdySession(reader, writer, server=False)
    try:
        opened = await _open_streams(session, streams)
    except (SpdyError, TimeoutError) as e:
        await session.close()
        raise RuntimeFailure(
            f"{what}: the runtime's streaming server did not take the streams: "
            f"{e or 'no answer in time'}"
        ) from None
    except BaseException:
        await session.close()
        raise
    return RemoteCommandStream(session, opened, what, drop_input=drop_input, ended=ended)


async def _open_streams(session: SpdySession, streams: Streams) -> dict[str, SpdyStream]:
    wanted = ["error"]
    if streams.stdin:
        wanted.append("stdin")
    if streams.stdout:
        wanted.append("stdout")
    if streams.stderr and not streams.tty:
        wanted.append("stderr")
    if streams.tty:
        wanted.append("resize")
    opened: dict[str, SpdyStream] = {}
    for name in wanted:
        opened[name] = await session.open_stream({"streamType": name})
    async with asyncio.timeout(STREAMS_TIMEOUT):
        for stream in opened.values():
            await stream.wait_reply()
    return opened


async def _read_head(reader: asyncio.StreamReader, what: str) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = lines[0].split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
        raise RuntimeFailure(f"{what}: the runtime's streaming server answered {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(fields[1]), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> str:
    try:
        length = int(headers.get("content-length", ""))
    except ValueError:
        length = BODY_LIMIT
    body = await reader.read(min(max(length, 0), BODY_LIMIT))
    return body.decode(errors="replace").strip()
