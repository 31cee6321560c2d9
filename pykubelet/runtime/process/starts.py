"""A container's process started, by the route its configuration needs (the process runtime's
`start_container` records it).

- plain (no launcher, stdin or terminal): asked of a spawn server from the loop (the start
  marker, the log's directory and file and the fork+exec in that process), the pidfd opened
  here; without a server, all of it in one thread hop (posix_spawn without the interpreter
  lock);
- with mounts alone (a pod with volumes; no cgroups, stdin, terminal, user or capabilities):
  asked of a spawn server from the loop as a plain start is, the server making its mount
  namespace (spawnserver.py); without a server, as the next;
- through the launch server, without cgroups of its own, stdin or terminal: the marker and
  the log's directory in the launch's own thread hop, before the fork;
- with cgroups, stdin or a terminal: the marker and the log's directory in a thread hop, then the
  cgroups, the stdio and the fork+exec (through the launcher, or on the loop).

What this module promises: `ContainerStarts.start` returns a started process (its pid, pidfd,
/proc start time when read, cgroups, stdio), or raises having left nothing of the start behind
(its marker, log fd, cgroups and stdio removed or closed), cancelled by a kill too: a thread hop
under way is let finish first. The marker (`<container id>.starting`) stays on success: the
caller removes it once the container's state file is durable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

from pykubelet.api.model import Pod
from pykubelet.api.qos import qos_class
from pykubelet.common import lockedio
from pykubelet.runtime.base import ContainerConfig, RuntimeFailure, StartError
from pykubelet.runtime.process import statefile
from pykubelet.runtime.process.attach import ContainerStdio
from pykubelet.runtime.process.cgroups import Cgroups, Settings
from pykubelet.runtime.process.launcher import spawnable
from pykubelet.runtime.process.launchserver import LaunchServer
from pykubelet.runtime.process.processes import settle
from pykubelet.runtime.process.records import SANDBOX_FILE
from pykubelet.runtime.process.spawn import (
    Stdio,
    exec_error,
    launch_error,
    open_log,
    os_reason,
    spawn,
    spawn_launched,
    spawn_prepared,
    spawns_unlocked,
    state_write_error,
)
from pykubelet.runtime.process.spawnserver import (
    LaunchFailed,
    RequestTooLarge,
    ServerUnavailable,
    SpawnFailed,
    SpawnServers,
)

log = logging.getLogger(__name__)


class Start(NamedTuple):
    """What one container's start is given."""

    pod: Pod
    config: ContainerConfig
    container_id: str
    settings: Settings | None  # its cgroups' (`ContainerStarts.cgroup_settings`)
    launch: dict[str, Any] | None  # the launcher's instructions, if it needs one
    starting: Path  # its start marker
    log_path: Path
    argv: list[str]
    cwd: str
    env: dict[str, str]


class Spawned(NamedTuple):
    """A container's process, started."""

    pid: int
    pidfd: int
    start_time: int  # /proc start time, 0 if not read yet
    cgroup: bool  # in cgroups of its own
    stdio: ContainerStdio | None  # its stdin or terminal, served by the agent


def _prepare_start(marker: Path, log_path: Path, with_log: bool, cwd: str) -> int | None:
    """The start marker and the log's directory made; `with_log`: the log file opened for
    spawn too (None if it cannot be, or the working directory is missing: spawn tries again
    and says why, naming the file or the directory)."""
    # No fsync: it guards against the agent dying, not the machine (whose processes die too).
    # Only the marker's name is ever read: a hard link to the pod's sandbox record makes it
    # without a new inode, and dropping it frees none (on an ext4 without a journal, as here,
    # each new inode is a scan past the recently freed ones: a burst's largest kernel cost).
    # `os`, letting the interpreter lock go: a new inode on a disk takes long enough that
    # keeping the lock through it stalls the loop (bench/HISTORY.md, sessions 15 and 21).
    try:
        os.link(marker.with_name(SANDBOX_FILE), marker)
    except FileExistsError:
        pass
    except OSError:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    try:
        statefile.ensure_dir(log_path.parent)
        return open_log(log_path) if with_log and lockedio.is_dir(cwd) else None
    except (OSError, StartError):
        return None  # spawn tries again and says why, naming the log file


def _start_error(failed: SpawnFailed, start: Start) -> Exception:
    """A spawn server's failure, as the start in a thread here words it (`_spawn_plain_here`)."""
    program, cwd, error = start.argv[0], start.cwd, failed.error
    if failed.stage == "cwd":
        return StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    if isinstance(error, str):  # "value": a NUL byte, or "=" in a variable name
        return StartError("CreateContainerConfigError", f"cannot start {program!r}: {error}")
    if failed.stage == "log":
        return StartError("CreateContainerError", f"cannot create the log file: {os_reason(error)}")
    if failed.stage == "exec":
        return exec_error(program, cwd, error)
    return state_write_error(error)  # the marker's


def _close_opened(done: asyncio.Future[int | None]) -> None:
    if not done.cancelled() and done.exception() is None:
        fd = done.result()
        if fd is not None:
            os.close(fd)


class ContainerStarts:
    """Starts containers' processes with the runtime's cgroups, launch server and spawn servers;
    pods' volumes are mounted under `volumes_dir`, which launched containers' namespaces leave
    out."""

    def __init__(
        self, cgroups: Cgroups, launcher: LaunchServer, spawns: SpawnServers, volumes_dir: Path
    ) -> None:
        self._cgroups = cgroups
        self._launcher = launcher
        self._spawns = spawns
        self._volumes_dir = volumes_dir

    def cgroup_settings(self, config: ContainerConfig) -> Settings | None:
        """The container's cgroup limits, or None if it needs none or cgroups are unusable."""
        if not self._cgroups.wanted(config.limits, config.requests):
            return None
        try:
            settings = Settings.of(config.limits, config.requests)
        except ValueError as e:
            raise StartError("CreateContainerConfigError", f"resources: {e}") from e
        return settings if self._cgroups.warn_once() else None

    async def start(self, start: Start) -> Spawned:
        """The container's process, by its route (above)."""
        stdio = start.config.stdin or start.config.tty
        if start.launch is None and not stdio and spawns_unlocked():
            return await self._spawn_plain(start)
        if start.launch is not None and start.settings is None and not stdio:
            return await self._spawn_launched(start, start.launch)
        return await self._spawn_with(start)

    async def _spawn_plain(self, start: Start) -> Spawned:
        """The common start: no launcher, no stdin, no terminal. Asked of a spawn server from
        the loop (spawnserver.py): the marker, the log's directory and file and the fork+exec
        in that process, the pidfd opened here. Where no server answers, or the command and
        its environment do not fit in one request, in a thread hop of the agent's own. Its
        start time is read with the state file."""
        spawned = await self._served(start, None)
        return spawned if spawned is not None else await self._spawn_plain_here(start)

    async def _served(self, start: Start, launch: dict[str, Any] | None) -> Spawned | None:
        """The container started by a spawn server (plainly, or following `launch`); None if
        no server could (nothing of it runs then: a server lost mid-request had what it may
        have started killed by its tag), and the caller starts it itself."""
        starting = start.starting
        marker, sandbox = str(starting), str(starting.with_name(SANDBOX_FILE))
        log_path = str(start.log_path)
        try:
            if launch is None:
                pid = await self._spawns.spawn(
                    start.container_id,
                    marker,
                    sandbox,
                    log_path,
                    start.argv,
                    start.env,
                    start.cwd,
                )
            else:
                pid = await self._spawns.launch(
                    start.container_id, marker, sandbox, log_path, launch
                )
        except (RequestTooLarge, ServerUnavailable):
            return None
        except BaseException as e:
            await asyncio.to_thread(statefile.remove, starting)
            if isinstance(e, SpawnFailed):
                raise _start_error(e, start) from None
            if isinstance(e, LaunchFailed) and launch is not None:
                raise launch_error(e.report, launch) from None
            raise
        try:
            pidfd = lockedio.pidfd_open(pid)
        except OSError as e:
            await self._spawns.kill(pid, start.container_id)
            await asyncio.to_thread(statefile.remove, starting)
            raise RuntimeFailure(f"cannot watch process {pid} ({e}); it was killed") from e
        return Spawned(pid, pidfd, 0, False, None)

    async def _spawn_plain_here(self, start: Start) -> Spawned:
        """A plain start in the agent: the marker, the log's directory and file, the fork+exec
        and the pidfd in one thread hop, the fork+exec without the GIL (spawn_prepared)."""
        starting, log_path, cwd = start.starting, start.log_path, start.cwd
        prepare = functools.partial(_prepare_start, starting, log_path, True, cwd)
        try:
            pid, pidfd = await spawn_prepared(prepare, start.argv, cwd, start.env, log_path)
        except BaseException as e:
            await asyncio.to_thread(statefile.remove, starting)
            if isinstance(e, OSError):
                raise state_write_error(e) from e
            raise
        return Spawned(pid, pidfd, 0, False, None)

    async def _spawn_launched(self, start: Start, launch: dict[str, Any]) -> Spawned:
        """A start through the launcher without cgroups of its own, stdin or terminal (a pod
        with volumes, say). One that asks for its mounts alone is asked of a spawn server from
        the loop, as a plain one is; else, or without a server, the marker and the log's
        directory are made in the launch's own thread hop, before the fork (each hop is a wake
        of a thread and then of the loop)."""
        starting, log_path, cwd = start.starting, start.log_path, start.cwd
        launch["pods_dir"] = str(self._volumes_dir)
        launch["cgroups"] = []
        if spawnable(launch):
            spawned = await self._served(start, launch)
            if spawned is not None:
                return spawned
        prepare = functools.partial(_prepare_start, starting, log_path, False, cwd)
        try:
            pid, pidfd, start_time = await spawn_launched(
                launch, log_path, None, self._launcher, prepare
            )
        except BaseException:
            await asyncio.to_thread(statefile.remove, starting)
            raise
        return Spawned(pid, pidfd, start_time, False, None)

    async def _spawn_with(self, start: Start) -> Spawned:
        """A start through the launcher, or with the container's stdin or terminal: the
        marker and the log's directory in a thread hop, then the cgroups, the stdio and the
        fork+exec (its /proc start time 0 when it is read with the state file)."""
        pod, config, container_id = start.pod, start.config, start.container_id
        settings, launch = start.settings, start.launch
        starting, log_path = start.starting, start.log_path
        argv, cwd, env = start.argv, start.cwd, start.env
        try:
            # The log's directory too, and the log file of a process spawned here: one thread
            # hop, and no new inode on the loop in spawn.
            prepared = asyncio.ensure_future(
                asyncio.to_thread(_prepare_start, starting, log_path, launch is None, cwd)
            )
            try:
                log_fd = await asyncio.shield(prepared)
            except asyncio.CancelledError:
                # A kill cancelled the sync: the hop is let finish before the pod's lock goes,
                # as the other starts' are, then its log file is closed and its marker removed.
                await settle(prepared)
                _close_opened(prepared)
                await settle(asyncio.ensure_future(asyncio.to_thread(statefile.remove, starting)))
                raise
        except OSError as e:
            raise state_write_error(e) from e
        if launch is not None:
            launch["pods_dir"] = str(self._volumes_dir)
        procs: list[str] = []
        if settings is not None:
            try:
                procs = await asyncio.to_thread(
                    self._cgroups.create, pod.uid, container_id, settings, qos_class(pod)
                )
            except OSError as e:
                if log_fd is not None:
                    os.close(log_fd)
                raise StartError(
                    "RunContainerError",
                    f"cannot create the cgroups of container {config.name}: {e}",
                ) from e
        stdio: ContainerStdio | None = None
        child: list[int] = []  # the child's ends of its stdin or terminal, closed once started
        try:
            spawn_stdio = None
            if config.stdin or config.tty:
                try:
                    stdio, child_in, terminal = ContainerStdio.create(
                        stdin=config.stdin,
                        stdin_once=config.stdin_once,
                        tty=config.tty,
                        log_path=log_path,
                    )
                except OSError as e:
                    raise RuntimeFailure(
                        f"cannot make the stdin of container {config.name}: {e}"
                    ) from e
                child.append(child_in)
                spawn_stdio = Stdio(stdin=child_in, terminal=terminal)
            if launch is None:
                # The start time is read in the state files' thread: right after the fork the
                # read waits for the child's exec (9 % of the loop in a burst of 1,000).
                # spawn closes the log file, whatever becomes of the start.
                fd, log_fd = log_fd, None
                pid, pidfd, start_time = spawn(
                    argv, cwd, env, log_path, stdio=spawn_stdio, start_time=False, log_fd=fd
                )
            else:
                launch["cgroups"] = procs
                pid, pidfd, start_time = await spawn_launched(
                    launch, log_path, spawn_stdio, self._launcher
                )
        except BaseException:
            if log_fd is not None:
                os.close(log_fd)
            if stdio is not None:
                await stdio.close()
            if procs:
                await self._remove_cgroups(pod.uid, container_id)
            await asyncio.to_thread(statefile.remove, starting)
            raise
        finally:
            for fd in child:
                os.close(fd)
        return Spawned(pid, pidfd, start_time, bool(procs), stdio)

    async def _remove_cgroups(self, uid: str, container_id: str) -> None:
        try:
            await asyncio.to_thread(self._cgroups.remove, uid, container_id)
        except OSError as e:
            log.error("cannot remove the cgroups of container %s: %s", container_id, e)
