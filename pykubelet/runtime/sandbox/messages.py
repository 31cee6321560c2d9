"""An exited container's termination message, for the sandbox backends: read once per exit
(runtime/termination.py's rules) into the entry the status cache keeps, so a relist or a status
never reads the file or the log again.

What it promises: `finish_exited` leaves `entry.message` as the kubelet's
convertToKubeContainerStatus makes it (the engine's message, enriched with the container's),
and marks the entry read; an entry that replaces one already read for the same exit takes its
message as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pykubelet.runtime.base import ContainerRunState
from pykubelet.runtime.sandbox.engine import ContainerEntry
from pykubelet.runtime.sandbox.views import exit_reason
from pykubelet.runtime.termination import (
    read_message_file,
    termination_message,
    with_engine_message,
)

# The last `lines` lines of one container's log (the engine's read_log, bound to the entry).
LogReader = Callable[[ContainerEntry, int], Awaitable[bytes]]


async def finish_exited(
    entry: ContainerEntry, before: ContainerEntry | None, read_log: LogReader
) -> None:
    if entry.state is not ContainerRunState.EXITED or entry.message_read:
        return
    if (
        before is not None
        and before.message_read
        and before.state is ContainerRunState.EXITED
        and before.finished_at == entry.finished_at
    ):
        entry.message, entry.message_read = before.message, True
        return
    message = await termination_message(
        entry.termination_file or None,
        entry.termination_message_policy,
        entry.exit_code,
        exit_reason(entry),
        read_file=lambda path: asyncio.to_thread(read_message_file, path),
        read_log=lambda lines: read_log(entry, lines),
    )
    entry.message = with_engine_message(entry.message, message) or ""
    entry.message_read = True
