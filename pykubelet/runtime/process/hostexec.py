"""Run a short command on the host and collect its exit code and output, without blocking.

Used for exec probes and hooks of the process runtime. Like the runtime's containers, it forks
with Popen and watches the exit through a pidfd on the event loop: asyncio's subprocess support
would cost a watcher thread per child on Python 3.11.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping

from pykubelet.runtime.base import MAX_EXEC_OUTPUT as MAX_OUTPUT
from pykubelet.runtime.base import ExecResult


async def run_command(
    argv: list[str],
    cwd: str,
    env: Mapping[str, str],
    timeout_seconds: float,
    pass_fds: tuple[int, ...] = (),
) -> ExecResult:
    """Raises OSError if the command cannot be started (not found, not executable)."""
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    try:
        # fork+exec only; returns once the child has exec'd, as asyncio's own subprocess does.
        proc = subprocess.Popen(  # noqa: ASYNC220
            argv,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    proc.returncode = 0  # reaped through the pidfd below, never by subprocess' own cleanup
    pidfd = os.pidfd_open(proc.pid)
    os.set_blocking(read_fd, False)
    output = bytearray()
    exited = asyncio.Event()
    eof = asyncio.Event()

    def on_output() -> None:
        try:
            chunk = os.read(read_fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            loop.remove_reader(read_fd)
            eof.set()
            return
        if len(output) < MAX_OUTPUT:
            output.extend(chunk[: MAX_OUTPUT - len(output)])

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        exited.set()

    loop.add_reader(read_fd, on_output)
    loop.add_reader(pidfd, on_exit)
    code: int | None = None
    reaped = False
    try:
        try:
            async with asyncio.timeout(timeout_seconds):
                await exited.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await exited.wait()
        else:
            code = -1
        # The pidfd said it exited: this reaps at once.
        status = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)  # noqa: ASYNC222
        reaped = True
        if code is not None and status is not None:
            code = status.si_status if status.si_code == os.CLD_EXITED else 128 + status.si_status
        # Children of the command may still hold the pipe: give them a moment, not forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await eof.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        loop.remove_reader(read_fd)
        loop.remove_reader(pidfd)
        os.close(read_fd)
        if reaped:
            os.close(pidfd)
        else:
            # Cancelled (a probe stopped, a hook timed out): reap the killed child once it is
            # gone, or it would stay a zombie.
            loop.add_reader(pidfd, _reap_and_close, loop, pidfd)
    return ExecResult(code, bytes(output))


def _reap_and_close(loop: asyncio.AbstractEventLoop, pidfd: int) -> None:
    loop.remove_reader(pidfd)
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    os.close(pidfd)
