"""The in-memory runtime's streamed command (exec or attach): `FakeExecStream`.

A command a test, or its script, drives: what it was sent (`stdin`, `stdin_closed`, `sizes`),
what it writes (`emit`), how it ends (`exit`, `kill`, or when it is closed). Its output is
bounded as a pipe's (`PENDING` chunks ahead of the reader); input after its end is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from pykubelet.runtime.base import STDOUT, RuntimeContainer, RuntimeFailure

log = logging.getLogger(__name__)

ExecScript = Callable[["FakeExecStream"], Awaitable[None]]


class FakeExecStream:
    """A command started by `exec_stream`, as the test (or its script) drives it. What it was
    sent: `stdin`, `stdin_closed`, `sizes`; how it ended: `exit_code`, `killed`, `closed`."""

    PENDING = 16  # chunks of output written ahead of the reader, as a pipe's buffer

    def __init__(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        *,
        stdin: bool,
        tty: bool,
    ) -> None:
        self.container = container
        self.command = command
        self.env = env
        self.stdin_attached = stdin
        self.tty = tty
        self.stdin = bytearray()
        self.stdin_closed = False
        self.sizes: list[tuple[int, int]] = []
        self.exit_code: int | None = None
        self.killed = False
        self.closed = False
        self._chunks: collections.deque[tuple[str, bytes]] = collections.deque()
        self._input: collections.deque[bytes] = collections.deque()  # b"": its EOF
        self._changed = asyncio.Event()
        self._exited = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    # --- the command's side (the test's or its script's) --------------------------------------

    async def emit(self, data: bytes, stream: str = STDOUT) -> None:
        """Write `data` to STDOUT or STDERR (STDOUT with a terminal), waiting while the reader
        is `PENDING` chunks behind; nothing is written once it has exited."""
        while len(self._chunks) >= self.PENDING and not self.exited:
            await self._change()
        if not self.exited and data:
            self._chunks.append((STDOUT if self.tty else stream, bytes(data)))
            self._wake()

    async def read_stdin(self) -> bytes:
        """The next bytes written to its stdin; b"" at EOF (closed, or not attached)."""
        while not self._input:
            if not self.stdin_attached or self.exited:
                return b""
            await self._change()
        data = self._input.popleft()
        if not data:
            self._input.appendleft(data)  # EOF stays EOF
        self._wake()
        return data

    def exit(self, code: int | None = 0) -> None:
        """It exits with `code` (None: killed by a signal); its output ends once read."""
        if self.exited:
            return
        self.exit_code = code
        self._exited.set()
        self._wake()

    def kill(self) -> None:
        if not self.exited:
            self.killed = True
            self.exit(None)

    # --- the ExecStream protocol --------------------------------------------------------------

    async def write_stdin(self, data: bytes) -> None:
        if not self.stdin_attached:
            raise RuntimeFailure("the command's standard input is not attached")
        while len(self._input) >= self.PENDING and not (self.exited or self.stdin_closed):
            await self._change()
        if self.exited or self.stdin_closed or self.closed:
            return  # nobody reads it any more
        self.stdin += data
        self._input.append(bytes(data))
        self._wake()

    async def close_stdin(self) -> None:
        if self.stdin_attached and not self.stdin_closed:
            self.stdin_closed = True
            self._input.append(b"")
            self._wake()

    async def output(self) -> AsyncGenerator[tuple[str, bytes], None]:
        while True:
            if self._chunks:
                item = self._chunks.popleft()
                self._wake()
                yield item
                continue
            if self.exited or self.closed:
                return
            await self._change()

    async def resize(self, width: int, height: int) -> None:
        if self.tty:
            self.sizes.append((width, height))

    async def wait(self) -> int | None:
        await self._exited.wait()
        return self.exit_code

    async def close(self) -> None:
        self.kill()
        self.closed = True
        self._chunks.clear()
        self._wake()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- inside -------------------------------------------------------------------------------

    def start(self, script: ExecScript) -> None:
        async def run() -> None:
            try:
                await script(self)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the fake exec script of %s failed", self.command)
                self.exit(None)
            self.exit(0)

        self._task = asyncio.get_running_loop().create_task(run())

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _change(self) -> None:
        await self._changed.wait()
