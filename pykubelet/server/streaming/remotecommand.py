"""`kubectl exec` and `kubectl attach` on the kubelet API: the remote-command protocol, whatever
carries it.

The request (`/exec/{namespace}/{pod}/[{uid}/]{container}`, GET or POST) names the command
(`command`, repeated) and the streams the client wants, as the API server forwards them:
`input`, `output`, `error`, `tty` set to `1` (`stdin`/`stdout`/`stderr` and `true` are taken
too, for clients that talk to the kubelet directly). A terminal has no separate stderr.

The session, over WebSocket channels (`websocket.py`) or SPDY streams (`spdy_channels.py`):
stdin goes to the command, its stdout and stderr come back on their own streams, terminal sizes
(`{"Width": 80, "Height": 24}`, one JSON object after another) resize its terminal, and at the
end the error stream carries the outcome: from `v4.channel.k8s.io` on a v1 Status (Success, or
Failure with reason `NonZeroExitCode` and the exit code as the `ExitCode` cause, which kubectl
turns into its own exit code); before v4 the error text alone, nothing on success.

An attach (`/attach/{namespace}/{pod}/[{uid}/]{container}`, the same streams, no command) is the
same session over the container's own stdio: it ends when the container exits (Success, as the
kubelet reports it, whatever the exit code) or when the client goes, which detaches and leaves
the container running. A session whose client has gone ends either way: an exec's command is
killed then, as the kubelet's stream copy ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pykubelet.runtime.base import STDERR, STDOUT, ExecStream, TerminalSize

log = logging.getLogger(__name__)

Obj = dict[str, Any]

V5, V4, V3, V2, V1 = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)
# Newest first: the first the client also speaks is chosen.
SPDY_PROTOCOLS = (V5, V4, V3, V2, V1)


@dataclass(frozen=True)
class ExecOptions:
    command: list[str]
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def _flag(query: Mapping[str, str], *names: str) -> bool:
    return any(query.get(name, "").lower() in ("1", "true") for name in names)


def exec_options(command: Sequence[str], query: Mapping[str, str]) -> ExecOptions:
    """The options of an exec request; ValueError with the kubelet's reason if unusable."""
    if not command:
        raise ValueError("you must specify a command (the command parameter)")
    tty = _flag(query, "tty")
    opts = ExecOptions(
        command=list(command),
        stdin=_flag(query, "input", "stdin"),
        stdout=_flag(query, "output", "stdout"),
        # A terminal carries stderr in its one output stream.
        stderr=_flag(query, "error", "stderr") and not tty,
        tty=tty,
    )
    if not (opts.stdin or opts.stdout or opts.stderr):
        raise ValueError("you must specify at least 1 of stdin, stdout, stderr")
    return opts


def attach_options(query: Mapping[str, str]) -> ExecOptions:
    """The options of an attach request (the streams of an exec, no command)."""
    return exec_options(["attach"], query)


def success_status() -> Obj:
    return {"metadata": {}, "status": "Success"}


def exit_status(code: int, command: Sequence[str]) -> Obj:
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"{list(command)}, exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def error_status(message: str) -> Obj:
    return {
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    }


def status_text(status: Obj) -> bytes:
    """What a client before v4 gets on the error stream: the message of a failure only."""
    if status.get("status") == "Success":
        return b""
    return str(status.get("message", "")).encode()


class Channels(Protocol):
    """The client's side of a session, as the transport delivers it."""

    async def read_stdin(self) -> bytes:
        """The next bytes the client sent to stdin; b"" once it closed stdin."""
        ...

    async def write(self, stream: str, data: bytes) -> None:
        """Bytes for STDOUT or STDERR (waits while the client does not keep up)."""

    def resizes(self) -> AsyncIterator[tuple[int, int]]:
        """(width, height) as the client's terminal changes size."""
        ...

    async def finish(self, status: Obj) -> None:
        """End the session with this outcome (how depends on the protocol version)."""

    async def wait_gone(self) -> None:
        """Return once the client's connection is gone."""


class TerminalSizes:
    """The client's terminal sizes, read from the start of the session, so that the first one
    can be had before the command starts (kubectl sends it as soon as its streams are open)
    and the command's terminal never shows 0x0. Only the latest unapplied size is kept: a
    size replaces the one before, so a client that sends many holds no memory."""

    def __init__(self, channels: Channels) -> None:
        self._pending: tuple[int, int] | None = None
        self._ended = False
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(channels), name="terminal sizes")

    async def _read(self, channels: Channels) -> None:
        try:
            async for size in channels.resizes():
                self._pending = size
                self._changed.set()
        finally:
            self._ended = True
            self._changed.set()

    async def next(self) -> tuple[int, int] | None:
        """The latest size not yet returned, once there is one; None once the client can
        send no more."""
        while self._pending is None and not self._ended:
            self._changed.clear()
            await self._changed.wait()
        size, self._pending = self._pending, None
        return size

    async def first(self, within: float) -> TerminalSize | None:
        """The client's size, if it sends one within `within` seconds."""
        try:
            async with asyncio.timeout(within):
                size = await self.next()
        except TimeoutError:
            return None
        return None if size is None else TerminalSize(*size)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


async def serve_exec(
    channels: Channels, process: ExecStream, opts: ExecOptions, sizes: TerminalSizes | None = None
) -> int | None:
    """Run the session until the command has exited and its output was sent (or the client
    went); returns the exit code. The process is closed (killed if still running) when the
    session ends. `sizes`: the client's terminal sizes if they are read already (read from
    `channels` otherwise)."""
    try:
        await _copy(channels, process, opts, sizes)
        code = await process.wait()
    finally:
        await process.close()
    if code == 0:
        await channels.finish(success_status())
    elif code is None:
        await channels.finish(error_status("the command was killed by a signal"))
    else:
        await channels.finish(exit_status(code, opts.command))
    return code


async def serve_attach(
    channels: Channels, stream: ExecStream, opts: ExecOptions, sizes: TerminalSizes | None = None
) -> None:
    """Run an attach until the container's output ends (it exited) or the client goes; then
    detach (the stream is closed, the container runs on) and report Success."""
    try:
        await _copy(channels, stream, opts, sizes)
    finally:
        await stream.close()
    await channels.finish(success_status())


async def _copy(
    channels: Channels, process: ExecStream, opts: ExecOptions, sizes: TerminalSizes | None
) -> None:
    """Copy stdin, resizes and output until the output ends; ConnectionResetError if the client
    went first (the caller closes the process)."""
    tasks = [asyncio.create_task(channels.wait_gone())]
    if opts.stdin:
        tasks.append(asyncio.create_task(_pump_stdin(channels, process)))
    if opts.tty:
        tasks.append(asyncio.create_task(_pump_resizes(sizes or TerminalSizes(channels), process)))
    copy = asyncio.create_task(_copy_output(channels, process, opts))
    try:
        await asyncio.wait({copy, tasks[0]}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*tasks, copy):
            task.cancel()
        results = await asyncio.gather(copy, *tasks, return_exceptions=True)
    if not copy.cancelled() and copy.exception() is None:
        return
    if isinstance(results[0], BaseException) and not isinstance(results[0], asyncio.CancelledError):
        raise results[0]
    raise ConnectionResetError("the client went away")


async def _copy_output(channels: Channels, process: ExecStream, opts: ExecOptions) -> None:
    async for stream, data in process.output():
        if stream == STDERR and opts.stderr:
            await channels.write(STDERR, data)
        elif opts.stdout:
            await channels.write(STDOUT, data)


async def _pump_stdin(channels: Channels, process: ExecStream) -> None:
    while data := await channels.read_stdin():
        await process.write_stdin(data)
    await process.close_stdin()


async def _pump_resizes(sizes: TerminalSizes, process: ExecStream) -> None:
    try:
        while (size := await sizes.next()) is not None:
            with contextlib.suppress(OSError):
                await process.resize(*size)
    finally:
        await sizes.close()


# A terminal size is a few dozen bytes: more that parses as nothing is dropped, not kept.
RESIZE_BUFFER = 4096


class ResizeDecoder:
    """Terminal sizes from a byte stream of JSON objects, one after another."""

    def __init__(self) -> None:
        self._buf = ""
        self._decoder = json.JSONDecoder()

    def feed(self, data: bytes) -> list[tuple[int, int]]:
        self._buf += data.decode(errors="replace")
        if len(self._buf) > RESIZE_BUFFER:
            log.debug("dropped %d bytes of terminal sizes that do not parse", len(self._buf))
            self._buf = ""
        sizes: list[tuple[int, int]] = []
        while True:
            text = self._buf.lstrip()
            if not text:
                self._buf = ""
                return sizes
            try:
                obj, end = self._decoder.raw_decode(text)
            except ValueError:
                self._buf = text
                return sizes
            self._buf = text[end:]
            if isinstance(obj, dict):
                try:
                    sizes.append((int(obj.get("Width", 0)), int(obj.get("Height", 0))))
                except (TypeError, ValueError):
                    log.debug("ignored a terminal size that is not numbers: %r", obj)
