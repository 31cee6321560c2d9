"""The client's end of the remote-command protocol over a WebSocket, as kubectl speaks it to a
kubelet: what `pykubelet exec` runs (and `pykubelet attach`: the same session on
`/attach/...`).

What it promises:
- The WebSocket offers `v5.channel.k8s.io`, then `v4.channel.k8s.io`. Messages carry their
  channel first: 0 stdin, 1 stdout, 2 stderr, 3 the outcome, 4 terminal sizes, 255 the close
  signal (v5).
- stdin (with `-i`) is sent as it is read; at its end, v5's close signal (`[255, 0]`) tells the
  node to close the command's stdin. v4 has no such signal: the command's stdin stays open.
- With a terminal: the local terminal is in raw mode for the session and restored after it
  (Ctrl-C, a signal, an error included); its size is sent at the start and on every SIGWINCH.
- The outcome is kubectl's (`outcome()`): the v1 Status on channel 3, `Success` exit 0,
  `NonZeroExitCode` with an `ExitCode` cause that code ("command terminated with exit code N"),
  any other failure its message, exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp

from pykubelet.cmd.nodeclient import CtlError, NodeClient
from pykubelet.cmd.terminal import Output, StdinReader, raw_terminal, terminal_size

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
STDIN, STDOUT, STDERR, ERROR, RESIZE = range(5)
CLOSE = 255
# The outcome is one Status: past this, the node is not speaking the protocol.
_ERROR_LIMIT = 1 << 20


@dataclass(frozen=True)
class Outcome:
    code: int
    # None when the command succeeded; else what kubectl prints ("command terminated with
    # exit code 3", or the node's message).
    message: str | None = None


def outcome(data: bytes, protocol: str = V5) -> Outcome:
    """What the error channel's content means for the exit code, as kubectl decodes it
    (v4 and later: a v1 Status; before: the error text)."""
    if not data:
        return Outcome(0)  # nothing on the error stream: success, for kubectl too
    if protocol not in (V4, V5):
        return Outcome(1, data.decode(errors="replace"))
    try:
        status = json.loads(data)
    except ValueError:
        return Outcome(1, f"error stream protocol error: {data.decode(errors='replace')!r}")
    if not isinstance(status, dict):
        return Outcome(1, "error stream protocol error: the outcome is not a Status")
    if status.get("status") == "Success":
        return Outcome(0)
    if status.get("status") != "Failure":
        return Outcome(1, "error stream protocol error: unknown error")
    if status.get("reason") == "NonZeroExitCode":
        causes = (status.get("details") or {}).get("causes")
        if causes is None:
            return Outcome(1, "error stream protocol error: details must be set")
        for cause in causes:
            if not isinstance(cause, dict) or cause.get("reason") != "ExitCode":
                continue
            text = str(cause.get("message", ""))
            if not text.isdigit() or int(text) > 255:
                return Outcome(1, f"error stream protocol error: invalid exit code value {text!r}")
            code = int(text)
            return Outcome(code, f"command terminated with exit code {code}")
        return Outcome(1, "error stream protocol error: no ExitCode cause given")
    return Outcome(1, str(status.get("message") or "the command failed (no message)"))


@dataclass(frozen=True)
class SessionOptions:
    stdin: bool
    tty: bool  # the remote command has a terminal, and so does our stdin (raw mode)


def _resize_message(size: tuple[int, int]) -> bytes:
    width, height = size
    return bytes([RESIZE]) + json.dumps({"Width": width, "Height": height}).encode()


@contextlib.contextmanager
def _signal_handler(sig: int, callback: object) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(sig, callback)  # type: ignore[arg-type]
    try:
        yield
    finally:
        loop.remove_signal_handler(sig)


async def run_session(
    client: NodeClient,
    path: str,
    opts: SessionOptions,
    *,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    stderr_fd: int = 2,
) -> Outcome:
    """Run one remote command session on `path` (an `/exec/...` URL with its query) until the
    node ends it; its outcome."""
    ws = await client.websocket(path, PROTOCOLS)
    protocol = ws.protocol or ""
    if protocol not in PROTOCOLS:
        await ws.close()
        raise CtlError(
            f"the node at {client.creds.server} speaks {protocol or 'no subprotocol'}, "
            f"not {' or '.join(PROTOCOLS)}"
        )
    with contextlib.ExitStack() as stack:
        if opts.tty:
            stack.enter_context(raw_terminal(stdin_fd))
            # A terminal's session ends with a signal too: the terminal is restored first.
            task = asyncio.current_task()
            assert task is not None
            for sig in (signal.SIGTERM, signal.SIGHUP):
                stack.enter_context(_signal_handler(sig, task.cancel))
        return await _session(ws, protocol, opts, stack, stdin_fd, stdout_fd, stderr_fd)
    raise AssertionError("unreachable")  # pragma: no cover - mypy's view of ExitStack


async def _session(
    ws: aiohttp.ClientWebSocketResponse,
    protocol: str,
    opts: SessionOptions,
    stack: contextlib.ExitStack,
    stdin_fd: int,
    stdout_fd: int,
    stderr_fd: int,
) -> Outcome:
    outputs = {STDOUT: Output(stdout_fd), STDERR: Output(stderr_fd)}
    tasks: list[asyncio.Task[None]] = []
    sizes: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    error = bytearray()
    try:
        if opts.stdin:
            reader = StdinReader(stdin_fd)
            stack.callback(reader.close)
            tasks.append(asyncio.create_task(_pump_stdin(ws, protocol, reader)))
        if opts.tty:
            if (size := terminal_size(stdin_fd)) is not None:
                sizes.put_nowait(size)

            def on_winch() -> None:
                if (size := terminal_size(stdin_fd)) is not None:
                    sizes.put_nowait(size)

            stack.enter_context(_signal_handler(signal.SIGWINCH, on_winch))
            tasks.append(asyncio.create_task(_pump_sizes(ws, sizes)))
        async for msg in ws:
            if msg.type is not aiohttp.WSMsgType.BINARY or not msg.data:
                continue
            channel, payload = msg.data[0], msg.data[1:]
            if channel in outputs and payload:
                await outputs[channel].write(payload)
            elif channel == ERROR:
                error += payload
                if len(error) > _ERROR_LIMIT:
                    raise CtlError("the node sent an outcome larger than a Status")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ws.close()
    if not error and ws.close_code not in (aiohttp.WSCloseCode.OK, None):
        raise CtlError(f"the connection to the node ended (WebSocket close code {ws.close_code})")
    return outcome(bytes(error), protocol)


async def _pump_stdin(
    ws: aiohttp.ClientWebSocketResponse, protocol: str, reader: StdinReader
) -> None:
    with contextlib.suppress(ConnectionError, aiohttp.ClientError):
        while data := await reader.read():
            await ws.send_bytes(bytes([STDIN]) + data)
        if protocol == V5:
            await ws.send_bytes(bytes([CLOSE, STDIN]))


async def _pump_sizes(
    ws: aiohttp.ClientWebSocketResponse, sizes: asyncio.Queue[tuple[int, int]]
) -> None:
    with contextlib.suppress(ConnectionError, aiohttp.ClientError):
        while True:
            await ws.send_bytes(_resize_message(await sizes.get()))
