"""A container's own stdio on the process runtime (`kubectl attach`).

What this module promises:

- `ContainerStdio.create` makes what a container whose spec has `stdin: true` or `tty: true`
  is started with: a pipe for its stdin (its output still goes straight to its log file), or,
  with `tty`, a pseudo-terminal that is its stdin, stdout and stderr. The agent keeps the pipe's
  write end (or the terminal's master) for the container's life; with a terminal it copies what
  the container writes to the log file, one chunk at a time (the terminal fills and the
  container blocks in its writes while the disk is slow, never memory).
- `ProcessAttachStream` is one attach: its output is the log file followed from where it ended
  when the attach began, until the attach is closed or the container has exited and all it
  wrote was read; its input goes to the container's stdin, one write at a time across attaches;
  resizes set the terminal's size. Closing it detaches: the container runs on. With
  `stdinOnce` the first attach with stdin that ends closes the container's stdin (EOF; with a
  terminal, input is refused from then on), as the kubelet's runtimes do.
- The stdin and terminal live in the agent's memory, not on disk: a container adopted after the
  agent restarted has neither (its attach sees its output and drops input), and a container with
  a terminal hangs up when the agent that held it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from pykubelet.common.lightevent import LightEvent
from pykubelet.runtime.base import STDOUT, RuntimeFailure
from pykubelet.runtime.process import statefile
from pykubelet.runtime.process.ptyio import read_terminal, set_terminal_size

log = logging.getLogger(__name__)

CHUNK = 65536
# How often an attach looks for new output: at first after output, then backing off to the
# longest (an attach is interactive; a quiet container costs little).
POLL_MIN = 0.02
POLL_MAX = 0.2


class ContainerStdio:
    """The stdin (and terminal) the agent keeps for one container."""

    def __init__(
        self, *, stdin_fd: int | None, master: int | None, stdin_once: bool, log_fd: int | None
    ) -> None:
        self._stdin_fd = stdin_fd  # the pipe's write end, or the master; None once closed
        self._master = master
        self._log_fd = log_fd  # the log file, appended to from the terminal
        self.stdin_once = stdin_once
        self._lock = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None
        self._closed = False
        self._writing = False
        self._close_later: int | None = None

    @classmethod
    def create(
        cls, *, stdin: bool, stdin_once: bool, tty: bool, log_path: Path
    ) -> tuple[ContainerStdio, int, int | None]:
        """(the stdio, the child's stdin fd, the child's terminal fd or None): the caller closes
        the child's fds once it has started (or failed to)."""
        if tty:
            statefile.ensure_dir(log_path.parent)
            log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                master, slave = os.openpty()
            except OSError:
                os.close(log_fd)
                raise
            os.set_blocking(master, False)
            stdio = cls(
                stdin_fd=master if stdin else None,
                master=master,
                stdin_once=stdin_once,
                log_fd=log_fd,
            )
            return stdio, slave, slave
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_end, False)
        return (
            cls(stdin_fd=write_end, master=None, stdin_once=stdin_once, log_fd=None),
            read_end,
            None,
        )

    @property
    def tty(self) -> bool:
        return self._master is not None

    def start(self) -> None:
        """The container runs: copy its terminal to its log file."""
        if self._master is not None and self._pump is None:
            self._pump = asyncio.create_task(self._copy_terminal(), name="tty-to-log")

    async def write(self, data: bytes) -> None:
        """To the container's stdin, waiting while it is full; dropped once it is closed."""
        async with self._lock:
            self._writing = True
            try:
                await self._write_locked(memoryview(data))
            finally:
                self._writing = False
                if self._close_later is not None:
                    os.close(self._close_later)
                    self._close_later = None

    async def _write_locked(self, view: memoryview) -> None:
        while view:
            fd = self._stdin_fd
            if fd is None:
                return  # closed meanwhile: dropped
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                await _ready(fd, writer=True)
            except OSError as e:
                # EPIPE: the container closed its stdin; EIO: its terminal is gone.
                if e.errno in (errno.EPIPE, errno.EIO):
                    self.close_stdin()
                    return
                raise RuntimeFailure(f"cannot write to the container's stdin: {e}") from e

    def close_stdin(self) -> None:
        """EOF on a pipe; a terminal has no end to close: its input is refused from now on."""
        fd, self._stdin_fd = self._stdin_fd, None
        if fd is None or fd == self._master:
            return
        if self._writing:
            # A write waits on it: closed when that write returns, so that the number is not
            # reused under its registration.
            self._close_later = fd
        else:
            os.close(fd)

    def resize(self, width: int, height: int) -> None:
        if self._master is None or self._closed:
            return
        with contextlib.suppress(OSError):  # gone with the container: nothing to resize
            set_terminal_size(self._master, width, height)

    async def close(self) -> None:
        """Release it all (the container exited, or the runtime closes)."""
        if self._closed:
            return
        self.close_stdin()
        if self._pump is not None:
            if not self._pump.done():
                # What is in the terminal still reaches the log: the pump ends at its EOF (the
                # container's exit), or now if it hangs on.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await asyncio.shield(self._pump)
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        self._closed = True
        for fd in (self._master, self._log_fd):
            if fd is not None:
                os.close(fd)
        self._master = self._log_fd = None

    async def _copy_terminal(self) -> None:
        master, log_fd = self._master, self._log_fd
        assert master is not None and log_fd is not None
        while True:
            try:
                data = read_terminal(master, CHUNK)
            except BlockingIOError:
                await _ready(master, writer=False)
                continue
            except OSError as e:
                log.warning("cannot read a container's terminal: %s", e)
                return
            if not data:
                return
            try:
                await asyncio.to_thread(_write_all, log_fd, data)
            except OSError as e:
                log.warning("cannot write a container's terminal to its log: %s", e)


class ProcessAttachStream:
    """One attach to a running container (see the module's documentation)."""

    def __init__(
        self,
        *,
        read_from: Callable[[int], Awaitable[tuple[bytes, int]]],
        offset: int,
        exited: LightEvent,
        exit_code: Callable[[], int | None],
        stdio: ContainerStdio | None,
        stdin: bool,
    ) -> None:
        # What the log holds after an offset, and the offset after that (the runtime's
        # reader, which keeps offsets right across a rotation of the file).
        self._read_from = read_from
        self._offset = offset
        self._exited = exited
        self._exit_code = exit_code
        self._stdio = stdio
        self._stdin = stdin and stdio is not None
        self._closed = asyncio.Event()

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin and self._stdio is not None and not self._closed.is_set():
            await self._stdio.write(data)

    async def close_stdin(self) -> None:
        """The client's stdin ended: the container's closes with it only with stdinOnce (a
        later attach would find it open otherwise, as with the engines)."""
        if self._stdin and self._stdio is not None and self._stdio.stdin_once:
            self._stdio.close_stdin()

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        delay = POLL_MIN
        while not self._closed.is_set():
            done = self._exited.is_set()
            chunk, self._offset = await self._read_from(self._offset)
            if chunk:
                delay = POLL_MIN
                yield STDOUT, chunk
                continue
            if done:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closed.wait()
            delay = min(delay * 2, POLL_MAX)

    async def resize(self, width: int, height: int) -> None:
        if self._stdio is not None:
            self._stdio.resize(width, height)

    async def wait(self) -> int | None:
        await self._exited.wait()
        return self._exit_code()

    async def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._stdin and self._stdio is not None and self._stdio.stdin_once:
            self._stdio.close_stdin()


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def _ready(fd: int, *, writer: bool) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add, remove = (
        (loop.add_writer, loop.remove_writer)
        if writer
        else (
            loop.add_reader,
            loop.remove_reader,
        )
    )
    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
