"""A command run as in a running container with its stdio attached (`kubectl exec`): the process
runtime's ExecStream.

What this module promises:

- `start_exec` starts the command of an `ExecPlan` (spawn.py: the container's working directory,
  environment and, through the launcher, its mounts, user and cgroups) in a session of its own,
  with pipes for stdin (or /dev/null without `stdin`), stdout and stderr; with `tty`, a
  pseudo-terminal that is its controlling terminal for all three. It returns once the command
  was exec'd; one that cannot be is a RuntimeFailure, with nothing left running.
- Nothing is buffered here beyond one read. Output is read from the pipes (or the terminal) only
  while someone iterates `output()`: a reader that stops lets the pipe (64 KiB) or the terminal
  fill, and the command blocks in its writes. `write_stdin` writes as the pipe takes it, waiting
  while it is full. Every fd is non-blocking and waited on with one-shot readers and writers on
  the event loop, which nothing polls while nobody waits.
- The exit is watched through a pidfd on the loop and collected through it, never by pid. When
  the command exits, what is left of its process group dies with it, as exec_sync's commands do,
  before it is reaped (the zombie keeps the group id ours until then); output then ends at EOF,
  or EXIT_LINGER seconds after the exit if something that left the group still holds a pipe.
- `kill()` (the container exited) and `close()` kill the group if the command still runs;
  `close()` also collects it and closes every fd, and may be called twice.

Input written after `close_stdin`, or once the command has closed its end, is dropped: the
command no longer reads it, as the kubelet's own stream copy stops then.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import termios
from collections.abc import AsyncIterator, Callable

from pykubelet.runtime.base import STDERR, STDOUT, RuntimeFailure, TerminalSize
from pykubelet.runtime.process.processes import kill_group
from pykubelet.runtime.process.ptyio import read_terminal, set_terminal_size
from pykubelet.runtime.process.spawn import ExecPlan, spawn_attached

log = logging.getLogger(__name__)

CHUNK = 65536
# After the command exited, how long a pipe still held by an escaped descendant keeps output open.
EXIT_LINGER = 1.0
# After SIGKILL only a process stuck in the kernel (D state) lingers; past this close() returns.
KILL_TIMEOUT = 10.0
DEFAULT_EOF = b"\x04"  # ^D

Forget = Callable[["ProcessExecStream"], None]


async def start_exec(
    plan: ExecPlan,
    *,
    stdin: bool,
    tty: bool,
    size: TerminalSize | None = None,
    forget: Forget | None = None,
) -> ProcessExecStream:
    """Start `plan` with its stdio attached (a terminal of `size` from its first instruction,
    with `tty`); `forget(stream)` is called once it is closed."""
    loop = asyncio.get_running_loop()
    ours: list[int] = []  # kept by the stream
    theirs: list[int] = []  # the child's ends, closed here once it has them
    try:
        if tty:
            master, slave = os.openpty()
            ours.append(master)
            theirs.append(slave)
            if size is not None:
                set_terminal_size(master, size.width, size.height)
            child = (slave, slave, slave)
            outputs = {master: STDOUT}
            stdin_fd: int | None = master if stdin else None
        else:
            if stdin:
                in_r, in_w = os.pipe()
                ours.append(in_w)
                theirs.append(in_r)
                stdin_fd = in_w
            else:
                in_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                theirs.append(in_r)
                stdin_fd = None
            out_r, out_w = os.pipe()
            ours.append(out_r)
            theirs.append(out_w)
            err_r, err_w = os.pipe()
            ours.append(err_r)
            theirs.append(err_w)
            child = (in_r, out_w, err_w)
            outputs = {out_r: STDOUT, err_r: STDERR}
        for fd in ours:
            os.set_blocking(fd, False)
        pid, pidfd = await spawn_attached(plan, *child, tty=tty)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return ProcessExecStream(
        loop, pid, pidfd, fds=ours, outputs=outputs, stdin_fd=stdin_fd, tty=tty, forget=forget
    )


class ProcessExecStream:
    """The ExecStream of one command; built by `start_exec`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pid: int,
        pidfd: int,
        *,
        fds: list[int],
        outputs: dict[int, str],
        stdin_fd: int | None,
        tty: bool,
        forget: Forget | None,
    ) -> None:
        self.pid = pid
        self._loop = loop
        self._pidfd: int | None = pidfd
        self._fds = list(fds)  # every fd we own but the pidfd, closed by close()
        self._outputs = dict(outputs)  # fd -> STDOUT/STDERR, until its EOF
        self._stdin_fd = stdin_fd
        self._stdin_attached = stdin_fd is not None
        self._tty = tty
        self._master = next(iter(outputs)) if tty else None  # the terminal's side of ours
        self._forget = forget
        self._exit_code: int | None = None
        self._exited = asyncio.Event()
        self._lingered = False  # EXIT_LINGER has passed since the exit
        self._linger: asyncio.TimerHandle | None = None
        self._closing = False
        self._closed = False  # the fds are closed
        self._write_lock = asyncio.Lock()
        # One-shot waits registered on the loop: (is a writer, fd), and who waits for them.
        self._registered: set[tuple[bool, int]] = set()
        self._waiters: set[asyncio.Future[None]] = set()
        loop.add_reader(pidfd, self._on_exit)

    # --- the ExecStream protocol -----------------------------------------------------------------

    async def write_stdin(self, data: bytes) -> None:
        if not self._stdin_attached:
            raise RuntimeFailure("the command's standard input is not attached")
        async with self._write_lock:
            view = memoryview(data)
            while view:
                fd = self._stdin_fd
                if fd is None or self._closed:
                    return  # closed meanwhile: dropped (see the module's documentation)
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:
                    await self._wait(fd, writer=True)
                except (BrokenPipeError, OSError) as e:
                    # EPIPE: the command closed its end; EIO: the terminal's other end is gone.
                    if isinstance(e, BrokenPipeError) or e.errno == errno.EIO:
                        self._drop_stdin()
                        return
                    raise RuntimeFailure(f"cannot write to the command's input: {e}") from e

    async def close_stdin(self) -> None:
        if not self._stdin_attached:
            return
        if self._tty:
            # A terminal has no end to close: the command reads its EOF character, as typed.
            await self.write_stdin(self._eof_char())
            return
        async with self._write_lock:
            self._drop_stdin()

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        while self._outputs and not self._closed:
            got = False
            for fd, name in list(self._outputs.items()):
                data = self._read(fd)
                if data is None:
                    continue
                if not data:
                    del self._outputs[fd]
                    continue
                got = True
                yield name, data
                if self._closed:
                    return
            if not got and self._outputs:
                if self._lingered:
                    self._outputs.clear()  # exited long enough ago and nothing pending
                    return
                await self._wait_readable(list(self._outputs))

    async def resize(self, width: int, height: int) -> None:
        if self._master is None or self._closed:
            return
        with contextlib.suppress(OSError):  # gone with the command: nothing to resize
            set_terminal_size(self._master, width, height)

    async def wait(self) -> int | None:
        await self._exited.wait()
        return self._exit_code

    async def close(self) -> None:
        if self._closing:
            return  # the first close() does it
        self._closing = True
        try:
            if not self._exited.is_set():
                self.kill()
                try:
                    async with asyncio.timeout(KILL_TIMEOUT):
                        await self._exited.wait()
                except TimeoutError:
                    # Its pidfd stays watched: it is reaped whenever it goes.
                    log.warning(
                        "exec'd process %d still runs %g s after SIGKILL", self.pid, KILL_TIMEOUT
                    )
        finally:
            self._close_fds()
            if self._forget is not None:
                self._forget(self)

    def kill(self) -> None:
        """SIGKILL its process group if it still runs (the container it runs in exited)."""
        if self._pidfd is not None:  # not reaped: the group id is still its
            kill_group(self.pid, signal.SIGKILL)

    # --- inside ----------------------------------------------------------------------------------

    def _on_exit(self) -> None:
        pidfd = self._pidfd
        if pidfd is None:
            return
        self._loop.remove_reader(pidfd)
        # Leftovers die with it; until it is reaped, the zombie keeps the group id ours.
        kill_group(self.pid, signal.SIGKILL)
        try:
            status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            status = None
        os.close(pidfd)
        self._pidfd = None
        if status is not None and status.si_code == os.CLD_EXITED:
            self._exit_code = status.si_status
        self._exited.set()
        self._linger = self._loop.call_later(EXIT_LINGER, self._end_linger)

    def _end_linger(self) -> None:
        self._lingered = True
        self._wake_all()

    def _read(self, fd: int) -> bytes | None:
        """A chunk; b"" at its end; None if nothing is there now."""
        try:
            return read_terminal(fd, CHUNK) if self._tty else os.read(fd, CHUNK)
        except BlockingIOError:
            return None
        except OSError as e:
            raise RuntimeFailure(f"cannot read the command's output: {e}") from e

    def _drop_stdin(self) -> None:
        fd = self._stdin_fd
        self._stdin_fd = None
        if fd is None or self._tty:
            return  # the terminal's master is the output too: closed by close()
        self._unregister(True, fd)
        self._fds.remove(fd)
        os.close(fd)

    def _eof_char(self) -> bytes:
        try:
            assert self._master is not None
            eof = termios.tcgetattr(self._master)[6][termios.VEOF]
        except (OSError, termios.error, IndexError):
            return DEFAULT_EOF
        return eof if isinstance(eof, bytes) and eof else DEFAULT_EOF

    async def _wait(self, fd: int, *, writer: bool) -> None:
        await self._wait_ready([fd], writer=writer)

    async def _wait_readable(self, fds: list[int]) -> None:
        await self._wait_ready(fds, writer=False)

    async def _wait_ready(self, fds: list[int], *, writer: bool) -> None:
        """Until one of `fds` is ready, the linger ends, or the stream closes."""
        if self._closed:
            return
        ready: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        add = self._loop.add_writer if writer else self._loop.add_reader
        for fd in fds:
            add(fd, wake)
            self._registered.add((writer, fd))
        self._waiters.add(ready)
        try:
            await ready
        finally:
            self._waiters.discard(ready)
            for fd in fds:
                self._unregister(writer, fd)

    def _unregister(self, writer: bool, fd: int) -> None:
        # Only what is still registered: once close() closed an fd, its number may be
        # someone else's, with their own reader on it.
        if (writer, fd) in self._registered:
            self._registered.discard((writer, fd))
            if writer:
                self._loop.remove_writer(fd)
            else:
                self._loop.remove_reader(fd)

    def _wake_all(self) -> None:
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)

    def _close_fds(self) -> None:
        if self._closed:
            return
        for writer, fd in list(self._registered):
            self._unregister(writer, fd)
        self._closed = True
        self._wake_all()
        if self._linger is not None:
            self._linger.cancel()
        self._stdin_fd = None
        self._outputs.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
