"""OOM kills seen in a container's cgroup v1 memory controller, for engines that miss them.

On a cgroup v1 host (this one mounts the v1 controllers next to an empty v2 hierarchy) Podman
reports `OOMKilled: false` and exit code 137 for a container the kernel killed for exceeding its
memory limit. The kernel itself tells: an eventfd registered through `cgroup.event_control` on
`memory.oom_control` is signalled whenever the cgroup runs out of memory, and once more when the
cgroup is removed. The notification comes as the OOM starts, before `oom_kill` is counted, so any
notification while the cgroup still exists counts as an OOM.

Setting up a watcher reads procfs and cgroupfs (memory-backed, never blocking on a disk), and runs
in a thread anyway; the wake-up runs on the event loop because it must look at the cgroup before
the engine removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)


@cache
def memory_v1_mount() -> tuple[Path, str] | None:
    """(mount point, root within the hierarchy) of the cgroup v1 memory controller, if any."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        # <id> <parent> <maj:min> <root> <mount point> <options> [optional...] - <fs> <src> <super>
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup":
            continue
        if "memory" in tail[2].split(","):
            return Path(fields[4]), fields[3]
    return None


def memory_cgroup_of(pid: int) -> Path | None:
    """The directory of `pid`'s v1 memory cgroup, or None (cgroup v2, no such pid, ...)."""
    mount = memory_v1_mount()
    if mount is None:
        return None
    mount_point, root = mount
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" not in controllers.split(","):
            continue
        if root != "/" and path.startswith(root):
            path = path[len(root) :]
        directory = mount_point / path.lstrip("/")
        return directory if (directory / "memory.oom_control").exists() else None
    return None


class OomWatcher:
    """Calls `on_oom()` (on the loop) when the cgroup runs out of memory; stops by itself when
    the cgroup is removed, or on close()."""

    def __init__(self, cgroup: Path, event_fd: int, control_fd: int) -> None:
        self.cgroup = cgroup
        self._event_fd: int | None = event_fd
        self._control_fd = control_fd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_oom: Callable[[], None] | None = None
        self.oom_seen = False

    @classmethod
    def open(cls, pid: int) -> OomWatcher | None:
        """Register with `pid`'s memory cgroup (blocking; call it in a thread). None where cgroup
        v1 is not there to watch."""
        cgroup = memory_cgroup_of(pid)
        if cgroup is None:
            return None
        event_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            control_fd = os.open(cgroup / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(event_fd)
            return None
        try:
            with open(cgroup / "cgroup.event_control", "w") as f:
                f.write(f"{event_fd} {control_fd}")
        except OSError as e:
            log.debug("cannot watch %s for OOM kills: %s", cgroup, e)
            os.close(event_fd)
            os.close(control_fd)
            return None
        return cls(cgroup, event_fd, control_fd)

    def attach(self, loop: asyncio.AbstractEventLoop, on_oom: Callable[[], None]) -> None:
        if self._event_fd is None:
            return
        self._loop, self._on_oom = loop, on_oom
        loop.add_reader(self._event_fd, self._wake)

    def poll(self) -> None:
        """Take in a notification that is pending (before closing, say)."""
        self._wake()

    def _wake(self) -> None:
        if self._event_fd is None:
            return
        try:
            count = os.eventfd_read(self._event_fd)
        except BlockingIOError:
            return
        alive = (self.cgroup / "memory.oom_control").exists()
        # Signals add up: gone with a count above one means an OOM came just before the removal.
        if alive or count > 1:
            if not self.oom_seen:
                log.info("OOM in memory cgroup %s", self.cgroup)
            self.oom_seen = True
            if self._on_oom is not None:
                self._on_oom()
        if not alive:
            self.close()

    def close(self) -> None:
        if self._event_fd is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._event_fd)
        os.close(self._event_fd)
        os.close(self._control_fd)
        self._event_fd = None
