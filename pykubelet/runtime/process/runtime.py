"""Containers as host processes: the embedded default runtime (`--container-runtime=process`).

A pod is a directory, its sandbox a JSON file, and each container instance a process group whose
state lives in a JSON file beside it (records.py), so that an agent started again adopts what
still runs. Each attempt's output goes to a plain log file the process writes itself:

    <root>/runtime/process/<pod uid>/logs/<container name>/<attempt>.log

There is no isolation: processes share the host's network, filesystem and users. The image is only
recorded; the command comes from the pod spec. Each container's process is started by the route
it needs (starts.py): the launcher for cgroups, mounts or another user (spawn.py, launcher.py);
limits are cgroups (cgroups.py). A command run in a container (exec probes and hooks, `kubectl
exec` with its stdio attached: execstream.py) sees the machine as the container's main process
does, and dies with it. A container with `stdin` or `tty` gets a pipe or a terminal the agent
keeps for `kubectl attach` (attach.py).

This module is the `ProcessRuntime` class: the Runtime protocol over those pieces, the locking
that orders starts, stops and removals of a pod, and the handling of exits. Exits are watched with
pidfds (Linux >= 5.3) registered on the event loop: no thread per child, and the same mechanism
serves our own children and processes adopted after a restart. asyncio's subprocess support is
deliberately not used. Its default watcher is a thread per child; with PidfdChildWatcher instead,
closing the loop drops the subprocess transports, and a transport's __del__ kills its child if it
still runs: an agent that exits would take its containers with it, leaving nothing to adopt.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import shutil
import signal
import threading
from collections.abc import AsyncGenerator, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pykubelet import __version__
from pykubelet.api.model import Pod
from pykubelet.common.ids import random_hex
from pykubelet.runtime import logrotation
from pykubelet.runtime.base import (
    NO_LOG_TIMES,
    ChangeListener,
    ContainerConfig,
    ContainerStorage,
    ExecResult,
    ExecStream,
    LogRotationPolicy,
    LogTimes,
    RuntimeContainer,
    RuntimeFailure,
    RuntimeImage,
    RuntimePod,
    RuntimeSandbox,
    RuntimeVersion,
    SandboxConfig,
    StartError,
    TerminalSize,
    dial_local_port,
)
from pykubelet.runtime.process import records, statefile
from pykubelet.runtime.process.attach import ContainerStdio, ProcessAttachStream
from pykubelet.runtime.process.cgroups import Cgroups, PodsLimits, ReservedCgroup
from pykubelet.runtime.process.execplan import check_running, exec_plan
from pykubelet.runtime.process.execstream import ProcessExecStream, start_exec
from pykubelet.runtime.process.hostexec import run_command
from pykubelet.runtime.process.launchserver import SERVER_ARGV, LaunchServer
from pykubelet.runtime.process.logread import follow_plain_log, read_plain_log
from pykubelet.runtime.process.logrotate import LogRotator
from pykubelet.runtime.process.podsmount import make_pods_mount, release_pods_mount
from pykubelet.runtime.process.processes import (
    ID_VARIABLE,
    boot_id,
    kill_group,
    proc_start_time,
    reap,
)
from pykubelet.runtime.process.records import (
    NAME,
    SANDBOX_FILE,
    STARTING_SUFFIX,
    ContainerRecord,
    PodRecord,
    SandboxRecord,
    check_component,
)
from pykubelet.runtime.process.security import check_container, check_pod
from pykubelet.runtime.process.spawn import (
    LAUNCHER_ENV,
    ExecPlan,
    container_env,
    exec_launched,
    launch_config,
    os_reason,
    reap_exited,
)
from pykubelet.runtime.process.spawnserver import SpawnServers
from pykubelet.runtime.process.starts import ContainerStarts, Start
from pykubelet.runtime.process.statewriter import StateWriter
from pykubelet.runtime.process.termination import exit_message, message_bind, own_file

log = logging.getLogger(__name__)

# The kubelet's ContainerStatusUnknown: the container is gone and nobody can tell how it ended.
UNKNOWN_REASON = "ContainerStatusUnknown"
UNKNOWN_EXIT_CODE = 137
UNKNOWN_MESSAGE = "the process exited while the agent was not its parent; its exit code is unknown"
# After SIGKILL only a process stuck in the kernel (D state) lingers; past this we give up waiting.
KILL_TIMEOUT = 10.0


def _now() -> datetime:
    return datetime.now(UTC)


class ProcessRuntime:
    """The Runtime protocol over host processes.

    Blocking work that can take long (fsync of state files, reading logs, deleting a pod's files,
    loading the state at start) runs in asyncio's default thread pool: a bounded pool, never a
    thread per container. A plain container's fork+exec runs there too (posix_spawn, without
    the GIL); one with stdin or a terminal is fork+exec'd on the loop, as asyncio's own
    subprocess support does (it returns as soon as the child has exec'd); one that needs the
    launcher is forked by the launch server (asked from a thread of its own).
    """

    name = NAME

    def __init__(
        self,
        root_dir: Path,
        node_ip: str = "127.0.0.1",
        pod_pids_limit: int = -1,
        pods_limits: PodsLimits | None = None,
        reserved_cgroups: tuple[ReservedCgroup, ...] = (),
        cgroup_root: str = "",
    ) -> None:
        self._cgroups = Cgroups(pod_pids_limit, pods_limits=pods_limits, cgroup_root=cgroup_root)
        self._reserved_cgroups = reserved_cgroups
        self._dir = root_dir / "runtime" / "process"
        # Where the volumes of pods are mounted (pykubelet.pod.volumes): no container's namespace
        # keeps a copy of those mounts.
        self._volumes_dir = root_dir / "pods"
        self._made_pods_mount = False  # podsmount.py: bound onto itself by this runtime
        self._node_ip = node_ip
        self._pods: dict[str, PodRecord] = {}
        # list_pods' answer while no record changed: the relists (PLEG each second, housekeeping,
        # stats) ask for every pod, and an idle node's pods never change. Every change to what a
        # view shows (a pod, its sandbox, a container added, exited or removed) calls _changed.
        self._listing: list[RuntimePod] | None = None
        self._pod_locks: dict[str, asyncio.Lock] = {}
        # Held while a container's start time is read and recorded (`_know_start_time`).
        self._start_time_lock = threading.Lock()
        self._listeners: list[ChangeListener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The exec streams open in each container (by its id): killed when it exits.
        self._execs: dict[str, set[ProcessExecStream]] = {}
        # The stdin (or terminal) kept for each container started with one (attach.py).
        self._stdio: dict[str, ContainerStdio] = {}
        self._rotator = LogRotator()
        self._state = StateWriter()
        # Start the plain containers and those with mounts alone (spawnserver.py), and fork
        # the launchers of those that need one (launchserver.py), which also answers for the
        # spawn servers' children.
        self._spawns = SpawnServers(
            SERVER_ARGV, dict(LAUNCHER_ENV), pods_dir=str(self._volumes_dir)
        )
        self._launcher = LaunchServer(
            dict(LAUNCHER_ENV), pods_dir=str(self._volumes_dir), spawns=self._spawns
        )
        self._starts = ContainerStarts(
            self._cgroups, self._launcher, self._spawns, self._volumes_dir
        )

    # --- lifecycle ------------------------------------------------------------------------------

    async def version(self) -> RuntimeVersion:
        # No engine: the runtime is pykubelet itself.
        return RuntimeVersion(NAME, __version__)

    async def images(self) -> list[RuntimeImage]:
        return []  # processes run from the host's files, not images

    def image_service(self) -> None:
        """Host processes run the node's own files: there are no images to collect."""
        return None

    async def start(self) -> None:
        if self._loop is not None:
            return
        if not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD"):
            raise RuntimeFailure("the process runtime needs Linux >= 5.3 (pidfd_open, P_PIDFD)")
        try:
            await asyncio.to_thread(self._cgroups.detect)
            if self._reserved_cgroups:
                await asyncio.to_thread(self._cgroups.enforce_reserved, self._reserved_cgroups)
            loaded = await asyncio.to_thread(records.load, self._dir, self._cgroups)
        except ValueError as e:
            raise RuntimeFailure(str(e)) from None
        except OSError as e:
            raise RuntimeFailure(f"cannot load the process runtime's state: {e}") from e
        try:
            self._made_pods_mount = await asyncio.to_thread(make_pods_mount, self._volumes_dir)
        except OSError as e:  # only slower starts: each launcher detaches volumes one by one
            log.warning("cannot make %s a mount of its own: %s", self._volumes_dir, e)
        self._loop = asyncio.get_running_loop()
        # Started now, in the background: the first burst's starts would otherwise wait for
        # their Python to start (spawnserver.py).
        self._spawns.start_all()
        self._changed()
        for item in loaded:
            self._pods[item.pod.uid] = item.pod
            if item.pod.sandbox is not None and not item.pod.containers:
                # Maybe never synced (an agent killed between the sandbox's record and its
                # first container's): synced with the next container record, as when new.
                self._state.unsynced(self._pod_dir(item.pod.uid) / SANDBOX_FILE)
            for rec in item.pod.containers.values():
                if not rec.running:
                    rec.exited.set()
                elif rec.id in item.alive:
                    rec.pidfd = item.alive[rec.id]
                    self._watch(rec)
                    log.info(
                        "adopted container %s of pod %s/%s (pid %d)",
                        rec.name,
                        rec.pod_namespace,
                        rec.pod_name,
                        rec.pid,
                    )
                else:
                    log.info(
                        "container %s of pod %s/%s (pid %d) ended while the agent was away",
                        rec.name,
                        rec.pod_namespace,
                        rec.pod_name,
                        rec.pid,
                    )
                    self._record_code(rec, None, rec.id in item.oom)

    async def close(self) -> None:
        """Stop watching; the processes keep running and the next start() adopts them."""
        for pod in self._pods.values():
            for rec in pod.containers.values():
                self._unwatch(rec)
        # Held in memory only: a container's stdin sees EOF, its terminal hangs up.
        stdios, self._stdio = list(self._stdio.values()), {}
        for stdio in stdios:
            await stdio.close()
        while self._tasks:
            # Exits already seen still reach their state files.
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # Its children run on: reaped by init once it is gone, as after an agent's SIGKILL.
        self._spawns.detach()
        await asyncio.to_thread(self._spawns.close)
        await asyncio.to_thread(self._launcher.close)
        await asyncio.to_thread(self._state.close)
        self._pods.clear()
        self._changed()
        self._pod_locks.clear()
        self._loop = None
        if self._made_pods_mount:
            self._made_pods_mount = False
            try:
                await asyncio.to_thread(release_pods_mount, self._volumes_dir)
            except OSError as e:
                log.warning("cannot release the mount %s: %s", self._volumes_dir, e)

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # --- queries --------------------------------------------------------------------------------

    async def list_pods(self) -> list[RuntimePod]:
        listing = self._listing
        if listing is None:
            listing = [self._view(pod) for _, pod in sorted(self._pods.items())]
            self._listing = listing
        return list(listing)

    async def get_pod(self, uid: str) -> RuntimePod | None:
        pod = self._pods.get(uid)
        return None if pod is None else self._view(pod)

    async def container_storage(
        self, containers: list[RuntimeContainer]
    ) -> dict[str, ContainerStorage]:
        # No writable layer: a host process writes to the host's own file system (its files
        # are nobody's in particular, so no rootfs is reported); its logs are the container's
        # directory of them (every attempt, rotated files too).
        return {
            c.id: ContainerStorage(log_paths=(self._log_dir(c.pod_uid, c.name),))
            for c in containers
            if c.pod_uid in self._pods
        }

    def log_path(self, container: RuntimeContainer) -> Path:
        """Where that attempt's stdout and stderr go (appended, also across agent restarts)."""
        return self._log_path(container.pod_uid, container.name, container.attempt)

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> bytes:
        """The plain file the process writes itself (logread.py): `times` is honoured only
        where it keeps all of it or none."""
        return await read_plain_log(
            self.log_path(container), container.created_at, tail_lines, limit_bytes, times
        )

    def follow_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> AsyncGenerator[bytes, None]:
        """Polling the file's end until the container has exited (logread.py)."""
        rec = self._find(container)
        return follow_plain_log(
            self._rotator,
            container.id,
            self.log_path(container),
            container.created_at,
            None if rec is None else rec.exited,
            tail_lines,
            times,
        )

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        """As the container's main process sees the machine: its working directory, its
        environment, and, if it has them, its mount namespace (its volumes) and its user."""
        _, plan = await self._exec_plan(container, command, env)
        if plan.direct:
            try:
                return await run_command(plan.argv, plan.cwd, plan.env, timeout_seconds)
            except (OSError, ValueError) as e:
                raise RuntimeFailure(f"cannot run {command[0]!r}: {e}") from e
        return await exec_launched(plan.enter, timeout_seconds)

    async def exec_stream(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        *,
        stdin: bool,
        tty: bool,
        size: TerminalSize | None = None,
    ) -> ExecStream:
        """As exec_sync runs it, with pipes or a terminal (of `size` before it starts) for its
        stdio (execstream.py). It dies with the container, as a process in the container's
        PID namespace would."""
        rec, plan = await self._exec_plan(container, command, env)
        stream = await start_exec(plan, stdin=stdin, tty=tty, size=size, forget=self._forget_exec)
        # The container may have exited while the command started: it must not outlive it.
        if not rec.running or rec.finishing:
            await stream.close()
            raise RuntimeFailure(f"container {container.name} is not running")
        self._execs.setdefault(rec.id, set()).add(stream)
        return stream

    async def attach(self, container: RuntimeContainer, *, stdin: bool, tty: bool) -> ExecStream:
        """Its log followed from its end, its stdin pipe or terminal (attach.py)."""
        rec = check_running(self._find(container), container)
        path = self.log_path(container)
        offset = await self._rotator.end(container.id, path)
        return ProcessAttachStream(
            read_from=lambda offset: self._rotator.read_from(container.id, path, offset),
            offset=offset,
            exited=rec.exited,
            exit_code=lambda: rec.exit_code,
            stdio=self._stdio.get(rec.id),
            stdin=stdin,
        )

    async def port_forward(
        self, pod_uid: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Containers here share the host's network (as hostNetwork pods do): the pod's port
        is the host's, on 127.0.0.1."""
        pod = self._pods.get(pod_uid)
        if pod is None or pod.sandbox is None:
            raise RuntimeFailure(f"pod {pod_uid} has no sandbox on this node")
        return await dial_local_port(port)

    async def _exec_plan(
        self, container: RuntimeContainer, command: list[str], env: list[tuple[str, str]]
    ) -> tuple[ContainerRecord, ExecPlan]:
        return await exec_plan(
            self._find(container),
            container,
            command,
            env,
            pod_dir=self._pod_dir(container.pod_uid),
            procs_files=self._cgroups.procs_files,
        )

    def _forget_exec(self, stream: ProcessExecStream) -> None:
        for streams in self._execs.values():
            streams.discard(stream)

    # --- sandboxes ------------------------------------------------------------------------------

    async def run_sandbox(self, pod: Pod, config: SandboxConfig | None = None) -> RuntimeSandbox:
        # Every pod here is on the node's network and keeps its hostname: the hostname and the
        # DNS of `config` are the node's (the agent tells pykubelet.pod.network so), and a
        # pod's own resolv.conf or hosts file reaches its containers as binds.
        check_component("pod UID", pod.uid)
        async with self._pod_lock(pod.uid):
            state = self._pods.get(pod.uid)
            if state is not None and state.sandbox is not None:
                return state.sandbox.view(self._node_ip)
            sandbox = SandboxRecord(
                id=random_hex(),
                pod_uid=pod.uid,
                pod_name=pod.metadata.name,
                pod_namespace=pod.metadata.namespace,
                created_at=_now(),
            )
            pod_dir = self._pod_dir(pod.uid)
            try:
                # In the state files' batch: a burst's sandboxes share their thread hops. Not
                # synced until the pod's first container record is (statefile.py says why).
                await self._state.write(
                    pod_dir / SANDBOX_FILE, sandbox.to_json(), make_dir=True, durable=False
                )
            except OSError as e:
                why = os_reason(e, pod_dir)
                raise RuntimeFailure(f"cannot write the sandbox's state: {why}") from e
            if state is None:
                state = self._pods.setdefault(
                    pod.uid, PodRecord(pod.uid, pod.metadata.name, pod.metadata.namespace)
                )
            state.name, state.namespace = pod.metadata.name, pod.metadata.namespace
            state.sandbox = sandbox
            self._changed()
            return sandbox.view(self._node_ip)

    async def remove_pod(self, uid: str) -> None:
        check_component("pod UID", uid)
        async with self._pod_lock(uid):
            pod = self._pods.get(uid)
            if pod is not None:
                running = [rec for rec in pod.containers.values() if not rec.exited.is_set()]
                for rec in running:
                    if rec.running:
                        kill_group(rec.pid, signal.SIGKILL)
                try:
                    async with asyncio.timeout(KILL_TIMEOUT):
                        await asyncio.gather(*(rec.exited.wait() for rec in running))
                except TimeoutError:
                    raise RuntimeFailure(
                        f"pod {uid}: processes still running {KILL_TIMEOUT:g} s after SIGKILL"
                    ) from None
                for rec in pod.containers.values():
                    async with rec.lock:
                        rec.removed = True
            try:
                await asyncio.to_thread(self._cgroups.remove_pod, uid)
            except OSError as e:
                raise RuntimeFailure(f"cannot remove the cgroups of pod {uid}: {e}") from e
            try:
                await asyncio.to_thread(_remove_tree, self._pod_dir(uid))
            except OSError as e:
                raise RuntimeFailure(f"cannot delete the files of pod {uid}: {e}") from e
            self._state.forget(self._pod_dir(uid))
            self._pods.pop(uid, None)
            self._changed()
        self._pod_locks.pop(uid, None)

    # --- containers -----------------------------------------------------------------------------

    async def start_container(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig
    ) -> RuntimeContainer:
        # With no command the args run as the command, as they would after an image entrypoint
        # that is empty.
        argv = [*config.command, *config.args]
        if not argv:
            raise StartError(
                "CreateContainerConfigError",
                "the process runtime needs command or args: there is no image entrypoint "
                f"(image {config.image} is not pulled)",
            )
        check_pod(pod)
        check_container(pod, config)
        # Under the pod's lock, so that a remove_pod running meanwhile cannot miss the process.
        async with self._pod_lock(pod.uid):
            return await self._start_locked(pod, sandbox, config, argv)

    async def _start_locked(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig, argv: list[str]
    ) -> RuntimeContainer:
        state = self._pods.get(pod.uid)
        if state is None or state.sandbox is None or state.sandbox.id != sandbox.id:
            raise RuntimeFailure(f"pod {pod.key} has no sandbox {sandbox.id} in this runtime")
        check_component("container name", config.name)
        if self._loop is None:
            raise RuntimeFailure("the process runtime is not started")

        pod_dir = self._pod_dir(pod.uid)
        cwd = config.working_dir or str(pod_dir)
        if not os.path.isabs(cwd):
            raise StartError(
                "RunContainerError",
                f'the working directory "{cwd}" is invalid: it needs to be an absolute path',
            )
        env = container_env(pod.metadata.name, config.env)

        log_path = self._log_path(pod.uid, config.name, config.attempt)
        created_at = _now()
        container_id = random_hex()
        env[ID_VARIABLE] = container_id
        settings = self._starts.cgroup_settings(config)
        config, message_file = message_bind(config, pod.uid)
        launch = launch_config(config, argv, cwd, env, settings is not None)
        # Written before the fork, removed once the state file is: an agent killed in between
        # finds the marker at its next start and kills the process by its ID, which would
        # otherwise run on, unknown (found by the SIGKILL churn soak).
        starting = pod_dir / f"{container_id}{STARTING_SUFFIX}"
        spawned = await self._starts.start(
            Start(pod, config, container_id, settings, launch, starting, log_path, argv, cwd, env)
        )
        pid = spawned.pid
        rec = ContainerRecord(
            id=container_id,
            pod_uid=pod.uid,
            pod_name=pod.metadata.name,
            pod_namespace=pod.metadata.namespace,
            name=config.name,
            attempt=config.attempt,
            spec_hash=config.spec_hash,
            image=config.image,
            pid=pid,
            proc_start_time=spawned.start_time,
            boot_id=boot_id(),
            created_at=created_at,
            started_at=_now(),
            pidfd=spawned.pidfd,
            cgroup=spawned.cgroup,
            launched=launch is not None,
            termination_file=message_file,
            termination_policy=config.termination_message_policy,
        )
        state.containers[rec.id] = rec
        self._changed()
        if spawned.stdio is not None:
            self._stdio[rec.id] = spawned.stdio
            spawned.stdio.start()
        self._watch(rec)
        started = rec.view()
        try:
            # The marker goes once the state file is durable, in the same batch.
            await self._persist(rec, then_remove=starting)
        except OSError as e:
            # Unrecorded, it could not be adopted after a restart and would run on unmanaged.
            kill_group(pid, signal.SIGKILL)
            raise RuntimeFailure(
                f"container {config.name} of pod {pod.key}: cannot write its state ({e}); "
                "the process was killed"
            ) from e
        self._notify(pod.uid)
        return started

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        rec = self._find(container)
        if rec is None:
            return
        if rec.running:
            kill_group(rec.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(max(grace_seconds, 0.0)):
                    await rec.exited.wait()
            except TimeoutError:
                if rec.running:
                    log.info(
                        "container %s of pod %s/%s outlived its %g s grace period: SIGKILL",
                        rec.name,
                        rec.pod_namespace,
                        rec.pod_name,
                        grace_seconds,
                    )
                    kill_group(rec.pid, signal.SIGKILL)
        try:
            async with asyncio.timeout(KILL_TIMEOUT):
                await rec.exited.wait()
        except TimeoutError:
            raise RuntimeFailure(
                f"container {rec.name} of pod {rec.pod_namespace}/{rec.pod_name} (pid {rec.pid}) "
                f"still runs {KILL_TIMEOUT:g} s after SIGKILL"
            ) from None

    async def remove_container(self, container: RuntimeContainer) -> None:
        rec = self._find(container)
        if rec is None:
            return
        if rec.running:
            raise RuntimeFailure(
                f"container {rec.name} of pod {rec.pod_namespace}/{rec.pod_name} is running: "
                "stop it before removing it"
            )
        await rec.exited.wait()  # its final state is written: nothing writes the file after us
        async with rec.lock:
            rec.removed = True
            try:
                files = [self._container_file(rec), self.log_path(container), *own_file(rec)]
                await asyncio.to_thread(_remove_files, *files)
                await asyncio.to_thread(logrotation.remove_all, self.log_path(container))
            except OSError as e:
                raise RuntimeFailure(f"cannot delete container {rec.id}: {e}") from e
        self._rotator.forget(rec.id)
        pod = self._pods.get(rec.pod_uid)
        if pod is not None:
            pod.containers.pop(rec.id, None)
            self._changed()

    async def rotate_logs(self, policy: LogRotationPolicy) -> None:
        """The running containers' logs, rotated in place (process/logrotate.py)."""
        running = [
            (rec.id, rec.pod_uid, rec.name, rec.attempt)
            for pod in list(self._pods.values())
            for rec in list(pod.containers.values())
            if rec.running
        ]

        def due_logs() -> list[tuple[str, Path]]:
            # Paths as strings until one is due: building a Path per container, every 10 s,
            # was most of the pass at 1,000 idle pods, and few logs are ever due.
            due = []
            for id, uid, name, attempt in running:
                path = self._log_file(uid, name, attempt)
                if logrotation.needs_rotation(path, policy):
                    due.append((id, Path(path)))
            return due

        # One thread call sizes every log: a thread hop per container was the cost before.
        due = await asyncio.to_thread(due_logs)
        for id, path in due:
            try:
                await self._rotator.rotate(id, path, policy)
            except OSError as e:
                log.warning("failed to rotate the log of container %s: %s", id, e)

    # --- exit handling --------------------------------------------------------------------------

    def _watch(self, rec: ContainerRecord) -> None:
        assert self._loop is not None and rec.pidfd is not None
        # A pidfd polls readable once the process has exited, whoever its parent is.
        self._loop.add_reader(rec.pidfd, self._on_exit, rec)

    def _unwatch(self, rec: ContainerRecord) -> None:
        if rec.pidfd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(rec.pidfd)
        os.close(rec.pidfd)
        rec.pidfd = None

    def _on_exit(self, rec: ContainerRecord) -> None:
        pidfd = rec.pidfd
        if pidfd is None or rec.finishing:
            return
        if rec.cgroup or self._launcher.owns(rec.pid):
            # Unreaped, the zombie keeps its pid (and group id) while the cgroups are read and
            # emptied in a thread, or while the launch server is asked for its status; then
            # the exit is handled as below.
            rec.finishing = True
            assert self._loop is not None
            self._loop.remove_reader(pidfd)
            self._spawn_task(self._finish(rec))
            return
        # Leftovers die with their container's main process, as in a PID namespace. Do it before
        # reaping: until then the zombie keeps its pid, so the group id names only this
        # container. (An adopted process is reaped by someone else at any time; a pid recycled
        # into a new group leader within that instant is a risk we take.)
        kill_group(rec.pid, signal.SIGKILL)
        self._know_start_time(rec)
        code = reap(pidfd)
        self._unwatch(rec)
        self._record_code(rec, code, oom=False)

    async def _finish(self, rec: ContainerRecord) -> None:
        oom = False
        if rec.cgroup:
            try:
                oom = await asyncio.to_thread(self._cgroups.finish, rec.pod_uid, rec.id)
            except OSError as e:
                log.error("container %s: cannot clean up its cgroups: %s", rec.id, e)
        pidfd = rec.pidfd
        if pidfd is None:  # close() came first: the next start() sees the exit
            return
        kill_group(rec.pid, signal.SIGKILL)
        self._know_start_time(rec)
        code = await reap_exited(rec.pid, pidfd, self._launcher)
        if rec.pidfd != pidfd:  # close() came while the launch server was asked
            return
        self._unwatch(rec)
        self._record_code(rec, code, oom)

    def _record_code(self, rec: ContainerRecord, code: int | None, oom: bool) -> None:
        if oom and code != 0:
            # Killed by the kernel for its memory limit, as the kubelet reports it.
            self._record_exit(rec, UNKNOWN_EXIT_CODE if code is None else code, "OOMKilled", None)
        elif code is None:
            self._record_exit(rec, UNKNOWN_EXIT_CODE, UNKNOWN_REASON, UNKNOWN_MESSAGE)
        else:
            self._record_exit(rec, code, "Completed" if code == 0 else "Error", None)

    def _record_exit(
        self, rec: ContainerRecord, code: int, reason: str, message: str | None
    ) -> None:
        for stream in self._execs.pop(rec.id, set()):
            stream.kill()
        rec.finished_at = _now()
        rec.exit_code, rec.reason, rec.message = code, reason, message
        rec.reading_message = True  # shown exited once _after_exit has read its message
        self._changed()
        log.info(
            "container %s of pod %s/%s exited: %d (%s)",
            rec.name,
            rec.pod_namespace,
            rec.pod_name,
            code,
            reason,
        )
        self._spawn_task(self._after_exit(rec))

    async def _after_exit(self, rec: ContainerRecord) -> None:
        stdio = self._stdio.pop(rec.id, None)
        if stdio is not None:
            await stdio.close()  # what its terminal still held reaches the log first
        try:
            rec.message = await exit_message(rec, lambda n: self.read_log(rec.view(), tail_lines=n))
        finally:
            rec.reading_message = False
            self._changed()
        try:
            await self._persist(rec)
        except OSError as e:
            # Memory stays right; after a restart the stale "running" file reads as an unknown exit.
            log.error(
                "container %s of pod %s/%s: cannot record its exit: %s",
                rec.name,
                rec.pod_namespace,
                rec.pod_name,
                os_reason(e),
            )
        rec.exited.set()
        self._notify(rec.pod_uid)

    # --- helpers --------------------------------------------------------------------------------

    async def _persist(self, rec: ContainerRecord, then_remove: Path | None = None) -> None:
        async with rec.lock:
            if rec.removed:
                if then_remove is not None:
                    await asyncio.to_thread(statefile.remove, then_remove)
                return
            data: Any = (
                rec.to_json()
                if rec.proc_start_time
                else functools.partial(self._json_with_start_time, rec)
            )
            await self._state.write(self._container_file(rec), data, then_remove)

    def _json_with_start_time(self, rec: ContainerRecord) -> dict[str, Any]:
        """In the state files' thread: the record, its process's start time read first."""
        self._know_start_time(rec)
        if rec.proc_start_time < 0:
            raise OSError(errno.ESRCH, f"cannot read /proc/{rec.pid}/stat; is /proc mounted?")
        return rec.to_json()

    def _know_start_time(self, rec: ContainerRecord) -> None:
        """Record the start time of the container's process if it is not known yet (-1: it
        could not be read). Called by the state files' thread, and by the exit handling before
        it reaps, under one lock: the thread finds it known once the process may have been
        reaped, so a pid given to another process since is never read for it."""
        with self._start_time_lock:
            if rec.proc_start_time:
                return
            start_time = proc_start_time(rec.pid)
            rec.proc_start_time = -1 if start_time is None else start_time

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _changed(self) -> None:
        """A record changed what its view shows: list_pods makes the listing again (each pod's
        view is still kept by its record while that record is unchanged)."""
        self._listing = None

    def _notify(self, uid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(uid)
            except Exception:
                log.exception("runtime listener failed for pod %s", uid)

    def _find(self, container: RuntimeContainer) -> ContainerRecord | None:
        pod = self._pods.get(container.pod_uid)
        return None if pod is None else pod.containers.get(container.id)

    def _pod_lock(self, uid: str) -> asyncio.Lock:
        return self._pod_locks.setdefault(uid, asyncio.Lock())

    def _view(self, pod: PodRecord) -> RuntimePod:
        return pod.view(self._node_ip)

    def _pod_dir(self, uid: str) -> Path:
        return self._dir / uid

    def _container_file(self, rec: ContainerRecord) -> Path:
        return self._pod_dir(rec.pod_uid) / f"{rec.id}.json"

    def _log_path(self, uid: str, name: str, attempt: int) -> Path:
        return Path(self._log_file(uid, name, attempt))

    def _log_file(self, uid: str, name: str, attempt: int) -> str:
        return os.path.join(self._log_dir(uid, name), f"{attempt}.log")

    def _log_dir(self, uid: str, name: str) -> str:
        # Strings, not Paths: the stats sample asks for every container's (1,000 Path
        # conversions were a tenth of an idle node's CPU).
        return os.path.join(self._dir, uid, "logs", name)


def _remove_files(*paths: Path) -> None:
    for path in paths:
        statefile.remove(path)


def _remove_tree(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)
