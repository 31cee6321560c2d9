"""Host processes by pid and pidfd, handled so that a recycled pid never makes us touch someone
else's process.

What this module promises:

- a process is known by its pid, its start time (/proc/<pid>/stat) and the boot it started in:
  `reopen` gives a pidfd on it only while those still match;
- `kill_group` never signals init, every process (0, -1) or the agent's own group, whatever a
  corrupt state file says;
- `reap` collects an exit status through a pidfd, never through a pid; `readable` waits on the
  event loop for a pidfd (its process exited) or a pipe to poll readable, and `settle` for a
  future through any cancellation of its waiter (a start under way is never abandoned);
- `kill_tagged` finds a container's processes by the ID in their environment (`ID_VARIABLE`),
  when its state file is lost.

Reading /proc blocks briefly; `kill_tagged` reads every process's environment and runs in a
thread with the rest of loading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from functools import cache
from pathlib import Path
from typing import Any

from pykubelet.common import lockedio

log = logging.getLogger(__name__)

# Set in each container's environment: finds its processes when the state file is lost.
ID_VARIABLE = "PYKUBELET_CONTAINER_ID"


@cache
def boot_id() -> str:
    """Identifies this boot: pids and /proc start times restart from zero after a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None if there is no such pid."""
    # One open and one read, not pathlib's layers: it is read after each fork (measured right
    # after a spawn: 20 µs against 60-100 µs at the median), in a start's thread keeping the
    # interpreter lock (common/lockedio.py).
    try:
        data = lockedio.read_file(f"/proc/{pid}/stat", 4096)
    except OSError:  # ENOENT, or ESRCH when the process vanishes while being read
        return None
    # Field 2 (comm) is in parentheses and may itself contain spaces and parentheses.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])  # rest[0] is field 3


def kill_group(pgid: int, sig: int) -> None:
    # A corrupt state file must never make us signal init, everyone (0, -1) or ourselves.
    if pgid <= 1 or pgid == os.getpgrp():
        log.error("refusing to signal process group %d", pgid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def reap(pidfd: int) -> int | None:
    """The Kubernetes exit code of the exited process behind `pidfd`, if we can know it.

    waitid on the pidfd, not waitpid on the pid, so a recycled pid can never make us reap
    someone else. It fails with ECHILD for processes that are not our children (adopted after a
    restart): their parent was the previous agent, and their status went with it.
    """
    try:
        result = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        return None
    if result is None:  # not expected: a pidfd polls readable only once the process is gone
        log.warning("an exited child was not waitable yet; its exit code is unknown")
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status
    return 128 + result.si_status  # killed by signal N: Kubernetes reports 128 + N


def exit_code(status: int | None) -> int | None:
    """The Kubernetes exit code of a wait status (None: unknown)."""
    if status is None:
        return None
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)  # killed by signal N: Kubernetes reports 128 + N
    return None


def reopen(pid: int, start_time: int, boot: str) -> int | None:
    """A pidfd on the process recorded as (`pid`, `start_time`, `boot`) if it still exists (a
    zombie counts: its exit is then seen at once), None if it is gone or its pid now belongs to
    another process."""
    if boot != boot_id():
        return None
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        # Processes left in its group might still run; they are not killed, since nothing proves
        # the group id was not recycled while the agent was away.
        return None
    # Opened first, checked second: if the start time matches, the pidfd is on our process.
    if proc_start_time(pid) != start_time:
        os.close(pidfd)
        return None
    return pidfd


def kill_tagged(container_id: str) -> None:
    """Kill a process whose state file is lost, found by the ID in its environment.

    Without its state nothing tells how it was started (attempt, spec): it is killed, and the
    pod sync starts the container again, so it never runs twice.
    """
    needle = f"{ID_VARIABLE}={container_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ:
            pid = int(entry)
            log.warning(
                "killing process %d of container %s: its state file is corrupt", pid, container_id
            )
            kill_group(pid, signal.SIGKILL)


async def readable(fd: int) -> None:
    """Until `fd` polls readable: a pidfd once its process exited, a pipe with data or EOF."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def settle(awaitable: asyncio.Future[Any]) -> None:
    """Wait for `awaitable` through any number of cancellations (the caller re-raises after)."""
    while not awaitable.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(awaitable)
