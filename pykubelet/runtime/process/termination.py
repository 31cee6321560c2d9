"""The termination message on the process runtime: the file bound at terminationMessagePath in
the container's own mount namespace (the launcher's, as resolv.conf and etc-hosts are bound),
read once the process has exited (runtime/termination.py's rules).

What it promises:
- A process never writes the node's file at its terminationMessagePath: the bind makes the
  container start through the launcher, in a mount namespace of its own, as any bind does. An
  agent that is not root and cannot make mount namespaces starts it without the bind: its
  processes run as its own user, who cannot write the node's /dev, and the message stays empty
  (the log still serves FallbackToLogsOnError). An agent that is root without CAP_SYS_ADMIN
  cannot start it (CreateContainerConfigError naming the field): its root processes would
  write the node's file.
- The host file to read is the first bound at the path, as the kubelet looks in the mounts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from pykubelet.runtime.base import ContainerConfig, StartError
from pykubelet.runtime.process.records import ContainerRecord
from pykubelet.runtime.process.spawn import CAP_SYS_ADMIN, effective_capabilities
from pykubelet.runtime.termination import (
    is_message_file,
    read_message_file,
    termination_message,
    with_engine_message,
)

log = logging.getLogger(__name__)

_warned = False


def message_bind(config: ContainerConfig, pod_uid: str) -> tuple[ContainerConfig, str | None]:
    """(the config to start, the host file at its terminationMessagePath, None if none)."""
    path = config.termination_message_path
    if not path:
        return config, None
    host = next((m.host_path for m in config.mounts if m.container_path == path), None)
    ours = [
        m
        for m in config.mounts
        if m.container_path == path and is_message_file(m.host_path, pod_uid, config.name)
    ]
    if ours and not effective_capabilities() >> CAP_SYS_ADMIN & 1:
        if os.geteuid() == 0:
            raise StartError(
                "CreateContainerConfigError",
                f"terminationMessagePath {path}: the process runtime binds it in a mount "
                "namespace per container, which needs CAP_SYS_ADMIN; this agent runs as root "
                "without it, and its processes would write the node's file",
            )
        _warn_once()
        # The file stays (empty): read at the exit, it says what no file would.
        kept = [m for m in config.mounts if m not in ours]
        config = dataclasses.replace(config, mounts=kept)
    return config, host


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "terminationMessagePath is not bound: the agent runs as uid %d without "
            "CAP_SYS_ADMIN (no mount namespace per container); termination messages stay empty",
            os.geteuid(),
        )


async def exit_message(
    rec: ContainerRecord, read_log: Callable[[int], Awaitable[bytes]]
) -> str | None:
    """The exited container's message: its own reason's (an unknown exit's), enriched."""
    if rec.exit_code is None:
        return rec.message
    message = await termination_message(
        rec.termination_file,
        rec.termination_policy,
        rec.exit_code,
        rec.reason,
        read_file=lambda path: asyncio.to_thread(read_message_file, path),
        read_log=read_log,
    )
    return with_engine_message(rec.message, message)


def own_file(rec: ContainerRecord) -> list[Path]:
    """Its termination-log file if it is the one made for it (not a volume's): to delete."""
    path = rec.termination_file
    return [Path(path)] if path and is_message_file(path, rec.pod_uid, rec.name) else []
