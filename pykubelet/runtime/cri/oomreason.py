"""An OOM-killed container's reason, once the runtime has caught up with it.

containerd (1.6, and later ones under load) hears of a container's exit and of its OOM kill
separately: the shim's reaper reports the exit, its cgroup watcher the kill, and the two events
may reach the CRI plugin in either order. Until the kill's event is handled, ContainerStatus says
reason "Error" for a container the kernel killed; once it is, "OOMKilled". The kubelet does not
look again at a terminated container whose state did not change, and a pod that ends with it
(restartPolicy Never) keeps the status it ended with, so the first reason read is the one a
user sees. (A kill that comes while StartContainer has not returned yet is lost by containerd
1.6 altogether, containerd#8180: that container stays an Error, as under the kubelet.)

What it promises: `may_trail` picks the exits whose reason can still change (exit code 137, the
SIGKILL, not said to be an OOM kill, finished less than `wait` seconds ago); `settle` asks the
runtime again until it says OOMKilled, the container is gone or `wait` seconds have passed since
the exit; `unfinished` is the entry as it was before the exit, what the engine reports meanwhile
(engine.py), so that nothing waits for the settling but that exit.
A container the agent stops is not waited for (its SIGKILL is the agent's own): one stopped
in the moment between an OOM kill and the runtime's report of its exit is told as an Error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from pykubelet.runtime.base import ContainerRunState
from pykubelet.runtime.sandbox.engine import ContainerEntry

SIGKILL_EXIT_CODE = 137  # 128 + SIGKILL: how the kernel's OOM kill shows in an exit code
# How long after the exit the runtime is given to hear of the kill. 2 s was not enough for
# containerd 1.6 under `make test`'s load (its CRI plugin handles events one at a time, a
# task's deletion among them). A SIGKILL from elsewhere is told this late. An exit older
# than this was looked at before (or is an adopted one): its reason is settled.
WAIT_SECONDS = 10.0
POLL_SECONDS = 0.05


def may_trail(
    entry: ContainerEntry, now: datetime | None = None, wait: float = WAIT_SECONDS
) -> bool:
    """A SIGKILLed container the runtime does not (yet) call OOM-killed, exited less than
    `wait` seconds ago."""
    if (
        entry.state is not ContainerRunState.EXITED
        or entry.exit_code != SIGKILL_EXIT_CODE
        or entry.oom_killed
        or entry.finished_at is None
    ):
        return False
    return _age(entry.finished_at, now) < wait


async def settle(
    inspect: Callable[[], Awaitable[ContainerEntry | None]],
    finished_at: datetime,
    wait: float = WAIT_SECONDS,
    poll: float = POLL_SECONDS,
) -> None:
    """Inspect again every `poll` seconds until the runtime says OOMKilled or the container is
    gone, until `wait` seconds after `finished_at`; the caller then looks at it as it is."""
    deadline = time.monotonic() + max(wait - _age(finished_at), 0.0)
    while time.monotonic() < deadline:
        await asyncio.sleep(poll)
        again = await inspect()
        if again is None or again.oom_killed:
            return


def _age(finished_at: datetime, now: datetime | None = None) -> float:
    return ((now or datetime.now(UTC)) - finished_at).total_seconds()


def unfinished(entry: ContainerEntry) -> ContainerEntry:
    """The exited container as it was running: its exit told once its reason is settled."""
    return dataclasses.replace(
        entry, state=ContainerRunState.RUNNING, finished_at=None, exit_code=None
    )
