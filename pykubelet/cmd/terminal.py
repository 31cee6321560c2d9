"""The local end of a remote command: stdin read, stdout/stderr written and the terminal handled
without blocking the event loop.

- `StdinReader`: what is typed or piped, as it comes. Pipes, terminals and sockets are watched by
  the event loop (`add_reader`); what epoll refuses (regular files, /dev/null) never blocks on a
  read, so those are read in a thread.
- `Output`: writes to a file descriptor in a thread, one at a time, so a slow reader of our
  stdout holds the remote command back (the session waits) instead of the event loop.
- `raw_terminal`: the terminal in raw mode (keys such as Ctrl-C go to the remote command, as
  with kubectl exec -t), restored when the block ends, however it ends.
- `terminal_size`: (width, height) of a terminal, for the resize channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import struct
import termios
import tty
from collections.abc import Iterator

CHUNK = 32 * 1024


class StdinReader:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._watched = False
        try:
            self._loop.add_reader(fd, self._ready.set)
            self._watched = True
        except (PermissionError, ValueError, OSError):
            # epoll takes no regular files: their reads do not block, a thread does them.
            self._watched = False

    async def read(self) -> bytes:
        """The next bytes; b"" at the end of the input."""
        if not self._watched:
            return await asyncio.to_thread(os.read, self._fd, CHUNK)
        while True:
            await self._ready.wait()
            self._ready.clear()
            # The loop's readiness callback may have run again after the last read took the
            # data: ask once more (without waiting), for a read of a blocking descriptor that
            # has nothing would stop the loop. (O_NONBLOCK is not set: it would change the
            # terminal for the shell that shares it.)
            if not select.select([self._fd], [], [], 0)[0]:
                continue
            try:
                return os.read(self._fd, CHUNK)
            except BlockingIOError:
                continue  # someone else took it (a shared, non-blocking descriptor)
            except OSError:
                return b""  # a terminal hung up: the input is over

    def close(self) -> None:
        if self._watched:
            self._loop.remove_reader(self._fd)
            self._watched = False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            # The descriptor is non-blocking (shared with another process): wait till it drains.
            select.select([], [fd], [])
            continue
        view = view[written:]


class Output:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = asyncio.Lock()

    async def write(self, data: bytes) -> None:
        async with self._lock:
            await asyncio.to_thread(_write_all, self._fd, data)


def is_terminal(fd: int) -> bool:
    return os.isatty(fd)


def terminal_size(fd: int) -> tuple[int, int] | None:
    """(width, height) of the terminal at `fd`, None if it is not one (or has no size)."""
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    except OSError:
        return None
    return (cols, rows) if rows and cols else None


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    tty.setraw(fd, termios.TCSANOW)
    try:
        yield
    finally:
        # TCSAFLUSH would drop keys typed after the command ended; TCSADRAIN keeps them.
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
