"""Containers as host processes: the embedded default runtime (`--container-runtime=process`).

A pod is a directory, its sandbox a JSON file, and each container instance a process group whose
state lives in a JSON file beside it, so that an agent started again adopts what still runs:

    <root>/runtime/process/<pod uid>/sandbox.json
    <root>/runtime/process/<pod uid>/<container id>.json
    <root>/runtime/process/<pod uid>/logs/<container name>/<attempt>.log

There is no isolation: processes share the host's network, filesystem and users. The image is only
recorded; the command comes from the pod spec.

Exits are watched with pidfds (Linux >= 5.3) registered on the event loop: no thread per child,
and the same mechanism serves our own children and processes adopted after a restart. asyncio's
subprocess support is deliberately not used. Its default watcher is a thread per child; with
PidfdChildWatcher instead, closing the loop drops the subprocess transports, and a transport's
__del__ kills its child if it still runs: an agent that exits would take its containers with it,
leaving nothing to adopt.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import IO, Any

from pykubelet.api.model import Pod
from pykubelet.runtime.base import (
    ChangeListener,
    ContainerConfig,
    ContainerRunState,
    ExecResult,
    Mount,
    RuntimeContainer,
    RuntimeFailure,
    RuntimePod,
    RuntimeSandbox,
    StartError,
)
from pykubelet.runtime.process.cgroups import Cgroups, Settings
from pykubelet.runtime.process.hostexec import run_command
from pykubelet.runtime.process import statefile
from pykubelet.runtime.process.statefile import StateFileError

log = logging.getLogger(__name__)

NAME = "process"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_FILE = "sandbox.json"
STARTING_SUFFIX = ".starting"  # <container id>.starting: a container being started
STATE_VERSION = 1

# The kubelet's ContainerStatusUnknown: the container is gone and nobody can tell how it ended.
UNKNOWN_REASON = "ContainerStatusUnknown"
FOLLOW_POLL_SECONDS = 0.2
# Set in each container's environment: finds its processes when the state file is lost.
ID_VARIABLE = "PYKUBELET_CONTAINER_ID"
_FOLLOW_CHUNK = 1 << 20
UNKNOWN_EXIT_CODE = 137
UNKNOWN_MESSAGE = "the process exited while the agent was not its parent; its exit code is unknown"

# After SIGKILL only a process stuck in the kernel (D state) lingers; past this we give up waiting.
KILL_TIMEOUT = 10.0
_LOG_BLOCK = 64 * 1024

LAUNCHER = Path(__file__).with_name("launcher.py")
# The launcher's own environment. It runs as root: a pod's LD_PRELOAD, LD_LIBRARY_PATH or
# GCONV_PATH would load the pod's code into it before it drops to the pod's user. The container's
# variables travel in its instructions, for the command it execs.
LAUNCHER_ENV = {"PATH": BASE_PATH}
LAUNCH_TIMEOUT = 60.0
# Capability bits (linux/capability.h) the launcher needs for users and mounts.
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SYS_ADMIN = 21


def _now() -> datetime:
    return datetime.now(UTC)


@cache
def _boot_id() -> str:
    """Identifies this boot: pids and /proc start times restart from zero after a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None if there is no such pid."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:  # ENOENT, or ESRCH when the process vanishes while being read
        return None
    # Field 2 (comm) is in parentheses and may itself contain spaces and parentheses.
    rest = data[data.rindex(b")") + 2 :].split()
    return int(rest[19])  # rest[0] is field 3


def _kill_group(pgid: int, sig: int) -> None:
    # A corrupt state file must never make us signal init, everyone (0, -1) or ourselves.
    if pgid <= 1 or pgid == os.getpgrp():
        log.error("refusing to signal process group %d", pgid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _reap(pidfd: int) -> int | None:
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


def _check_component(what: str, value: str) -> None:
    """`value` becomes a path component: keep it from escaping its directory."""
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise RuntimeFailure(f"{what} {value!r} cannot be used as a file name")


# --- state records ------------------------------------------------------------------------------


class _Fields:
    """Typed access to a decoded state file; any mismatch is a StateFileError naming the field."""

    def __init__(self, data: dict[str, Any], path: Path) -> None:
        self.data = data
        self.path = path
        if data.get("version") != STATE_VERSION:
            raise StateFileError(path, f"unsupported version {data.get('version')!r}")

    def _get(self, key: str, kind: type[Any], optional: bool) -> Any:
        value = self.data.get(key)
        if value is None and optional:
            return None
        # bool is an int in Python, never in our files.
        if not isinstance(value, kind) or isinstance(value, bool):
            raise StateFileError(self.path, f"field {key!r} is not a {kind.__name__}: {value!r}")
        return value

    def text(self, key: str) -> str:
        return str(self._get(key, str, False))

    def opt_text(self, key: str) -> str | None:
        value = self._get(key, str, True)
        return None if value is None else str(value)

    def number(self, key: str) -> int:
        return int(self._get(key, int, False))

    def opt_number(self, key: str) -> int | None:
        value = self._get(key, int, True)
        return None if value is None else int(value)

    def opt_flag(self, key: str) -> bool | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, bool):
            raise StateFileError(self.path, f"field {key!r} is not a bool: {value!r}")
        return value

    def opt_time(self, key: str) -> datetime | None:
        value = self.opt_text(key)
        if value is None:
            return None
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as e:
            raise StateFileError(self.path, f"field {key!r} is not a time: {value!r}") from e
        if parsed.tzinfo is None:
            raise StateFileError(self.path, f"field {key!r} has no time zone: {value!r}")
        return parsed

    def time(self, key: str) -> datetime:
        value = self.opt_time(key)
        if value is None:
            raise StateFileError(self.path, f"field {key!r} is missing")
        return value


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


@dataclass
class _Sandbox:
    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "id": self.id,
            "pod_uid": self.pod_uid,
            "pod_name": self.pod_name,
            "pod_namespace": self.pod_namespace,
            "created_at": _iso(self.created_at),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> _Sandbox:
        f = _Fields(data, path)
        return cls(
            id=f.text("id"),
            pod_uid=f.text("pod_uid"),
            pod_name=f.text("pod_name"),
            pod_namespace=f.text("pod_namespace"),
            created_at=f.time("created_at"),
        )

    def view(self, ip: str) -> RuntimeSandbox:
        return RuntimeSandbox(
            id=self.id,
            pod_uid=self.pod_uid,
            pod_name=self.pod_name,
            pod_namespace=self.pod_namespace,
            ready=True,
            ip=ip,
            created_at=self.created_at,
        )


@dataclass(eq=False)
class _Container:
    id: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    name: str
    attempt: int
    spec_hash: str
    image: str
    pid: int
    proc_start_time: int  # tells our process from a later one that got the same pid
    boot_id: str
    created_at: datetime
    started_at: datetime
    finished_at: datetime | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    # Started through the launcher (mounts, user, cgroups); None in files older than the field.
    launched: bool | None = None
    # Not persisted.
    pidfd: int | None = None  # set while the exit is being watched
    # Set once the exit is recorded, in memory and (if the disk allows) in the state file.
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    # Orders the writes of the state file and its deletion.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    removed: bool = False  # the state file is deleted: never write it again
    cgroup: bool = False  # it has cgroups to read (OOM) and remove at its exit
    finishing: bool = False  # its exit was seen and its cgroups are being emptied

    @property
    def running(self) -> bool:
        return self.finished_at is None

    def view(self) -> RuntimeContainer:
        return RuntimeContainer(
            id=self.id,
            runtime=NAME,
            pod_uid=self.pod_uid,
            pod_name=self.pod_name,
            pod_namespace=self.pod_namespace,
            name=self.name,
            attempt=self.attempt,
            spec_hash=self.spec_hash,
            image=self.image,
            state=ContainerRunState.RUNNING if self.running else ContainerRunState.EXITED,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            exit_code=self.exit_code,
            reason=self.reason,
            message=self.message,
            pid=self.pid,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "id": self.id,
            "pod_uid": self.pod_uid,
            "pod_name": self.pod_name,
            "pod_namespace": self.pod_namespace,
            "name": self.name,
            "attempt": self.attempt,
            "spec_hash": self.spec_hash,
            "image": self.image,
            "pid": self.pid,
            "proc_start_time": self.proc_start_time,
            "boot_id": self.boot_id,
            "state": "running" if self.running else "exited",  # for people reading the file
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "exit_code": self.exit_code,
            "reason": self.reason,
            "message": self.message,
            "launched": self.launched,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> _Container:
        f = _Fields(data, path)
        rec = cls(
            id=f.text("id"),
            pod_uid=f.text("pod_uid"),
            pod_name=f.text("pod_name"),
            pod_namespace=f.text("pod_namespace"),
            name=f.text("name"),
            attempt=f.number("attempt"),
            spec_hash=f.text("spec_hash"),
            image=f.text("image"),
            pid=f.number("pid"),
            proc_start_time=f.number("proc_start_time"),
            boot_id=f.text("boot_id"),
            created_at=f.time("created_at"),
            started_at=f.time("started_at"),
            finished_at=f.opt_time("finished_at"),
            exit_code=f.opt_number("exit_code"),
            reason=f.opt_text("reason"),
            message=f.opt_text("message"),
            launched=f.opt_flag("launched"),
        )
        if rec.pid <= 1:
            raise StateFileError(path, f"field 'pid' is not a pid we could have started: {rec.pid}")
        if path.stem != rec.id:
            raise StateFileError(path, f"holds container {rec.id!r}, not {path.stem!r}")
        return rec


@dataclass
class _Pod:
    uid: str
    name: str
    namespace: str
    sandbox: _Sandbox | None = None
    containers: dict[str, _Container] = field(default_factory=dict)


@dataclass
class _Loaded:
    """One pod directory as read at start(), with a pidfd for each container still running."""

    pod: _Pod
    alive: dict[str, int] = field(default_factory=dict)  # container id -> pidfd
    oom: set[str] = field(default_factory=set)  # gone while the agent was away, OOM-killed


# --- the runtime --------------------------------------------------------------------------------


class ProcessRuntime:
    """The Runtime protocol over host processes.

    Blocking work that can take long (fsync of state files, reading logs, deleting a pod's files,
    loading the state at start) runs in asyncio's default thread pool: a bounded pool, never a
    thread per container. fork+exec itself runs on the loop, as asyncio's own subprocess support
    does: it returns as soon as the child has exec'd.
    """

    name = NAME

    def __init__(
        self, root_dir: Path, node_ip: str = "127.0.0.1", pod_pids_limit: int = -1
    ) -> None:
        self._cgroups = Cgroups(pod_pids_limit)
        self._dir = root_dir / "runtime" / "process"
        # Where the volumes of pods are mounted (pykubelet.pod.volumes): no container's namespace
        # keeps a copy of those mounts.
        self._volumes_dir = root_dir / "pods"
        self._node_ip = node_ip
        self._pods: dict[str, _Pod] = {}
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._listeners: list[ChangeListener] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._loop is not None:
            return
        if not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD"):
            raise RuntimeFailure("the process runtime needs Linux >= 5.3 (pidfd_open, P_PIDFD)")
        try:
            await asyncio.to_thread(self._cgroups.detect)
            loaded = await asyncio.to_thread(self._load)
        except OSError as e:
            raise RuntimeFailure(f"cannot load the process runtime's state: {e}") from e
        self._loop = asyncio.get_running_loop()
        for item in loaded:
            self._pods[item.pod.uid] = item.pod
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
        while self._tasks:
            # Exits already seen still reach their state files.
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._pods.clear()
        self._pod_locks.clear()
        self._loop = None

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # --- queries --------------------------------------------------------------------------------

    async def list_pods(self) -> list[RuntimePod]:
        return [self._view(pod) for _, pod in sorted(self._pods.items())]

    async def get_pod(self, uid: str) -> RuntimePod | None:
        pod = self._pods.get(uid)
        return None if pod is None else self._view(pod)

    def log_path(self, container: RuntimeContainer) -> Path:
        """Where that attempt's stdout and stderr go (appended, also across agent restarts)."""
        return self._log_path(container.pod_uid, container.name, container.attempt)

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> bytes:
        """Like the kubelet: the last `tail_lines` lines, of which at most the first
        `limit_bytes` bytes."""
        path = self.log_path(container)
        return await asyncio.to_thread(_read_log, path, tail_lines, limit_bytes)

    async def follow_log(
        self, container: RuntimeContainer, tail_lines: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The process writes straight to its file, so following is polling the file's end."""
        path = self.log_path(container)
        rec = self._find(container)
        head = await asyncio.to_thread(_read_log, path, tail_lines, None)
        offset = await asyncio.to_thread(_size_of, path)
        if head:
            yield head
        while True:
            done = rec is None or rec.exited.is_set()
            chunk = await asyncio.to_thread(_read_from, path, offset)
            if chunk:
                offset += len(chunk)
                yield chunk
            elif done:
                return
            else:
                await asyncio.sleep(FOLLOW_POLL_SECONDS)

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        """As the container's main process sees the machine: its working directory, its
        environment, and, if it has them, its mount namespace (its volumes) and its user."""
        rec = self._find(container)
        # A finishing container has exited: its zombie has no mount namespace left to enter.
        if rec is None or not rec.running or rec.finishing:
            raise RuntimeFailure(f"container {container.name} is not running")
        try:
            cwd = os.readlink(f"/proc/{rec.pid}/cwd")
        except OSError:
            cwd = str(self._pod_dir(rec.pod_uid))
        full_env = _container_env(rec.pod_name, env)
        enter = await asyncio.to_thread(_exec_context, rec.pid)
        if not rec.running or rec.finishing:
            raise RuntimeFailure(f"container {container.name} is not running")
        if enter is None:
            # Run without its context, the command would be the agent's: root, in the host's
            # mounts. Only a container started as the agent's own processes are may do without.
            if rec.launched is not False or rec.cgroup:
                raise RuntimeFailure(
                    f"container {container.name} is not running: cannot read the mounts and "
                    f"user of its process {rec.pid}"
                )
            enter = {}
        if not (enter or rec.cgroup):
            try:
                return await run_command(command, cwd, full_env, timeout_seconds)
            except (OSError, ValueError) as e:
                raise RuntimeFailure(f"cannot run {command[0]!r}: {e}") from e
        # As in a container: its mounts, user and cgroups (read from the live process, so this
        # holds for adopted containers too).
        if "mount_ns_pid" in enter:
            enter["mount_ns_start_time"] = rec.proc_start_time
        enter["cgroups"] = await asyncio.to_thread(self._cgroups.procs_files, rec.pod_uid, rec.id)
        home_of_user = not any(name == "HOME" for name, _ in env)
        enter.update(cwd=cwd, argv=command, env=full_env, home_of_user=home_of_user)
        try:
            config_fd = _memfd("pykubelet-exec", enter)
        except OSError as e:
            raise RuntimeFailure(f"cannot run {command[0]!r}: {e}") from e
        # The instructions in a memfd, not in argv: any user of the host may read an argv in
        # /proc, and the environment in them may hold secrets.
        argv = [sys.executable, "-I", "-S", str(LAUNCHER), "--exec", str(config_fd)]
        try:
            return await run_command(
                argv, "/", LAUNCHER_ENV, timeout_seconds, pass_fds=(config_fd,)
            )
        except (OSError, ValueError) as e:
            raise RuntimeFailure(f"cannot run {command[0]!r}: {e}") from e
        finally:
            os.close(config_fd)

    # --- sandboxes ------------------------------------------------------------------------------

    async def run_sandbox(self, pod: Pod) -> RuntimeSandbox:
        _check_component("pod UID", pod.uid)
        async with self._pod_lock(pod.uid):
            state = self._pods.get(pod.uid)
            if state is not None and state.sandbox is not None:
                return state.sandbox.view(self._node_ip)
            sandbox = _Sandbox(
                id=uuid.uuid4().hex,
                pod_uid=pod.uid,
                pod_name=pod.metadata.name,
                pod_namespace=pod.metadata.namespace,
                created_at=_now(),
            )
            pod_dir = self._pod_dir(pod.uid)
            try:
                await asyncio.to_thread(_create_sandbox, pod_dir, sandbox.to_json())
            except OSError as e:
                raise RuntimeFailure(f"cannot create the sandbox of pod {pod.key}: {e}") from e
            if state is None:
                state = self._pods.setdefault(
                    pod.uid, _Pod(pod.uid, pod.metadata.name, pod.metadata.namespace)
                )
            state.name, state.namespace = pod.metadata.name, pod.metadata.namespace
            state.sandbox = sandbox
            return sandbox.view(self._node_ip)

    async def remove_pod(self, uid: str) -> None:
        _check_component("pod UID", uid)
        async with self._pod_lock(uid):
            pod = self._pods.get(uid)
            if pod is not None:
                running = [rec for rec in pod.containers.values() if not rec.exited.is_set()]
                for rec in running:
                    if rec.running:
                        _kill_group(rec.pid, signal.SIGKILL)
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
            self._pods.pop(uid, None)
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
        # Under the pod's lock, so that a remove_pod running meanwhile cannot miss the process.
        async with self._pod_lock(pod.uid):
            return await self._start_locked(pod, sandbox, config, argv)

    async def _start_locked(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig, argv: list[str]
    ) -> RuntimeContainer:
        state = self._pods.get(pod.uid)
        if state is None or state.sandbox is None or state.sandbox.id != sandbox.id:
            raise RuntimeFailure(f"pod {pod.key} has no sandbox {sandbox.id} in this runtime")
        _check_component("container name", config.name)
        if self._loop is None:
            raise RuntimeFailure("the process runtime is not started")

        pod_dir = self._pod_dir(pod.uid)
        cwd = config.working_dir or str(pod_dir)
        if not os.path.isabs(cwd):
            raise StartError(
                "RunContainerError",
                f'the working directory "{cwd}" is invalid: it needs to be an absolute path',
            )
        env = _container_env(pod.metadata.name, config.env)

        log_path = self._log_path(pod.uid, config.name, config.attempt)
        created_at = _now()
        container_id = uuid.uuid4().hex
        env[ID_VARIABLE] = container_id
        settings = self._cgroup_settings(config)
        launch = _launch_config(config, argv, cwd, env, settings is not None)
        # Written before the fork, removed once the state file is: an agent killed in between
        # finds the marker at its next start and kills the process by its ID, which would
        # otherwise run on, unknown (found by the SIGKILL churn soak).
        starting = pod_dir / f"{container_id}{STARTING_SUFFIX}"
        try:
            await asyncio.to_thread(_write_marker, starting)
        except OSError as e:
            raise RuntimeFailure(f"cannot write {starting}: {e}") from e
        if launch is not None:
            launch["pods_dir"] = str(self._volumes_dir)
        procs: list[str] = []
        if settings is not None:
            try:
                procs = await asyncio.to_thread(
                    self._cgroups.create, pod.uid, container_id, settings
                )
            except OSError as e:
                raise StartError(
                    "RunContainerError",
                    f"cannot create the cgroups of container {config.name}: {e}",
                ) from e
        try:
            if launch is None:
                pid, pidfd, start_time = _spawn(argv, cwd, env, log_path)
            else:
                launch["cgroups"] = procs
                pid, pidfd, start_time = await _spawn_launched(launch, log_path)
        except BaseException:
            if procs:
                await self._remove_cgroups(pod.uid, container_id)
            await asyncio.to_thread(statefile.remove, starting)
            raise
        rec = _Container(
            id=container_id,
            pod_uid=pod.uid,
            pod_name=pod.metadata.name,
            pod_namespace=pod.metadata.namespace,
            name=config.name,
            attempt=config.attempt,
            spec_hash=config.spec_hash,
            image=config.image,
            pid=pid,
            proc_start_time=start_time,
            boot_id=_boot_id(),
            created_at=created_at,
            started_at=_now(),
            pidfd=pidfd,
            cgroup=bool(procs),
            launched=launch is not None,
        )
        state.containers[rec.id] = rec
        self._watch(rec)
        started = rec.view()
        try:
            await self._persist(rec)
        except OSError as e:
            # Unrecorded, it could not be adopted after a restart and would run on unmanaged.
            _kill_group(pid, signal.SIGKILL)
            raise RuntimeFailure(
                f"container {config.name} of pod {pod.key}: cannot write its state ({e}); "
                "the process was killed"
            ) from e
        await asyncio.to_thread(statefile.remove, starting)
        self._notify(pod.uid)
        return started

    def _cgroup_settings(self, config: ContainerConfig) -> Settings | None:
        """The container's cgroup limits, or None if it needs none or cgroups are unusable."""
        if not self._cgroups.wanted(config.limits, config.requests):
            return None
        try:
            settings = Settings.of(config.limits, config.requests)
        except ValueError as e:
            raise StartError("CreateContainerConfigError", f"resources: {e}") from e
        return settings if self._cgroups.warn_once() else None

    async def _remove_cgroups(self, uid: str, container_id: str) -> None:
        try:
            await asyncio.to_thread(self._cgroups.remove, uid, container_id)
        except OSError as e:
            log.error("cannot remove the cgroups of container %s: %s", container_id, e)

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        rec = self._find(container)
        if rec is None:
            return
        if rec.running:
            _kill_group(rec.pid, signal.SIGTERM)
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
                    _kill_group(rec.pid, signal.SIGKILL)
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
                await asyncio.to_thread(
                    _remove_files, self._container_file(rec), self.log_path(container)
                )
            except OSError as e:
                raise RuntimeFailure(f"cannot delete container {rec.id}: {e}") from e
        pod = self._pods.get(rec.pod_uid)
        if pod is not None:
            pod.containers.pop(rec.id, None)

    # --- exit handling --------------------------------------------------------------------------

    def _watch(self, rec: _Container) -> None:
        assert self._loop is not None and rec.pidfd is not None
        # A pidfd polls readable once the process has exited, whoever its parent is.
        self._loop.add_reader(rec.pidfd, self._on_exit, rec)

    def _unwatch(self, rec: _Container) -> None:
        if rec.pidfd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(rec.pidfd)
        os.close(rec.pidfd)
        rec.pidfd = None

    def _on_exit(self, rec: _Container) -> None:
        pidfd = rec.pidfd
        if pidfd is None or rec.finishing:
            return
        if rec.cgroup:
            # Unreaped, the zombie keeps its pid (and group id) while the cgroups are read and
            # emptied in a thread; then the exit is handled as below.
            rec.finishing = True
            assert self._loop is not None
            self._loop.remove_reader(pidfd)
            self._spawn_task(self._finish_cgroups(rec))
            return
        # Leftovers die with their container's main process, as in a PID namespace. Do it before
        # reaping: until then the zombie keeps its pid, so the group id names only this
        # container. (An adopted process is reaped by someone else at any time; a pid recycled
        # into a new group leader within that instant is a risk we take.)
        _kill_group(rec.pid, signal.SIGKILL)
        code = _reap(pidfd)
        self._unwatch(rec)
        self._record_code(rec, code, oom=False)

    async def _finish_cgroups(self, rec: _Container) -> None:
        try:
            oom = await asyncio.to_thread(self._cgroups.finish, rec.pod_uid, rec.id)
        except OSError as e:
            log.error("container %s: cannot clean up its cgroups: %s", rec.id, e)
            oom = False
        pidfd = rec.pidfd
        if pidfd is None:  # close() came first: the next start() sees the exit
            return
        _kill_group(rec.pid, signal.SIGKILL)
        code = _reap(pidfd)
        self._unwatch(rec)
        self._record_code(rec, code, oom)

    def _record_code(self, rec: _Container, code: int | None, oom: bool) -> None:
        if oom and code != 0:
            # Killed by the kernel for its memory limit, as the kubelet reports it.
            self._record_exit(rec, UNKNOWN_EXIT_CODE if code is None else code, "OOMKilled", None)
        elif code is None:
            self._record_exit(rec, UNKNOWN_EXIT_CODE, UNKNOWN_REASON, UNKNOWN_MESSAGE)
        else:
            self._record_exit(rec, code, "Completed" if code == 0 else "Error", None)

    def _record_exit(self, rec: _Container, code: int, reason: str, message: str | None) -> None:
        rec.finished_at = _now()
        rec.exit_code, rec.reason, rec.message = code, reason, message
        log.info(
            "container %s of pod %s/%s exited: %d (%s)",
            rec.name,
            rec.pod_namespace,
            rec.pod_name,
            code,
            reason,
        )
        self._spawn_task(self._after_exit(rec))

    async def _after_exit(self, rec: _Container) -> None:
        try:
            await self._persist(rec)
        except OSError as e:
            # Memory stays right; after a restart the stale "running" file reads as an unknown exit.
            log.error("cannot record the exit of container %s: %s", rec.id, e)
        rec.exited.set()
        self._notify(rec.pod_uid)

    # --- helpers --------------------------------------------------------------------------------

    async def _persist(self, rec: _Container) -> None:
        async with rec.lock:
            if rec.removed:
                return
            await asyncio.to_thread(statefile.write_json, self._container_file(rec), rec.to_json())

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notify(self, uid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(uid)
            except Exception:
                log.exception("runtime listener failed for pod %s", uid)

    def _find(self, container: RuntimeContainer) -> _Container | None:
        pod = self._pods.get(container.pod_uid)
        return None if pod is None else pod.containers.get(container.id)

    def _pod_lock(self, uid: str) -> asyncio.Lock:
        return self._pod_locks.setdefault(uid, asyncio.Lock())

    def _view(self, pod: _Pod) -> RuntimePod:
        containers = sorted(
            pod.containers.values(), key=lambda c: (c.name, c.attempt, c.created_at)
        )
        return RuntimePod(
            uid=pod.uid,
            name=pod.name,
            namespace=pod.namespace,
            sandbox=None if pod.sandbox is None else pod.sandbox.view(self._node_ip),
            containers=[c.view() for c in containers],
        )

    def _pod_dir(self, uid: str) -> Path:
        return self._dir / uid

    def _container_file(self, rec: _Container) -> Path:
        return self._pod_dir(rec.pod_uid) / f"{rec.id}.json"

    def _log_path(self, uid: str, name: str, attempt: int) -> Path:
        return self._pod_dir(uid) / "logs" / name / f"{attempt}.log"

    # --- loading (runs in a thread) -------------------------------------------------------------

    def _load(self) -> list[_Loaded]:
        statefile.ensure_dir(self._dir)
        loaded: list[_Loaded] = []
        for entry in sorted(os.scandir(self._dir), key=lambda e: e.name):
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                _check_component("pod UID", entry.name)
                item = self._load_pod(Path(entry.path))
            except (OSError, RuntimeFailure) as e:
                log.warning("skipping pod directory %s: %s", entry.path, e)
                continue
            loaded.append(item)
            # Outside the try: failing to watch a live process (EMFILE...) must fail start(), not
            # hide the pod, or it would be started a second time beside the one still running.
            for rec in item.pod.containers.values():
                if rec.running:
                    pidfd = _reopen(rec)
                    if pidfd is not None:
                        item.alive[rec.id] = pidfd
                        rec.cgroup = self._cgroups.exists(rec.pod_uid, rec.id)
                        continue
                # Gone: what is left of its cgroups goes, after the OOM counter was read.
                try:
                    if self._cgroups.finish(rec.pod_uid, rec.id) and rec.running:
                        item.oom.add(rec.id)
                except OSError as e:
                    log.warning("container %s: cannot clean up its cgroups: %s", rec.id, e)
        return loaded

    def _load_pod(self, pod_dir: Path) -> _Loaded:
        uid = pod_dir.name
        sandbox: _Sandbox | None = None
        containers: list[_Container] = []
        for entry in sorted(os.scandir(pod_dir), key=lambda e: e.name):
            path = Path(entry.path)
            if statefile.is_temporary(entry.name):
                statefile.remove(path)  # an interrupted write; the previous version is intact
                continue
            if entry.name.endswith(STARTING_SUFFIX):
                container_id = entry.name.removesuffix(STARTING_SUFFIX)
                if not (pod_dir / f"{container_id}.json").exists():
                    # Forked, never recorded: the agent died in between. Never run it twice.
                    _kill_tagged(container_id)
                statefile.remove(path)
                continue
            if not entry.name.endswith(".json") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                data = statefile.read_json(path)
                if entry.name == SANDBOX_FILE:
                    sandbox = _Sandbox.from_json(data, path)
                    if sandbox.pod_uid != uid:
                        raise StateFileError(path, f"belongs to pod {sandbox.pod_uid}, not {uid}")
                else:
                    rec = _Container.from_json(data, path)
                    if rec.pod_uid != uid:
                        raise StateFileError(path, f"belongs to pod {rec.pod_uid}, not {uid}")
                    containers.append(rec)
            except FileNotFoundError:
                continue
            except StateFileError as e:
                log.warning("skipping a corrupt state file: %s", e)
                if entry.name == SANDBOX_FILE:
                    sandbox = None
                else:
                    _kill_tagged(entry.name.removesuffix(".json"))
                # Kept aside for a person to look at; never read again.
                with contextlib.suppress(OSError):
                    path.rename(path.with_name(entry.name + ".corrupt"))
        if sandbox is not None:
            name, namespace = sandbox.pod_name, sandbox.pod_namespace
        elif containers:
            name, namespace = containers[-1].pod_name, containers[-1].pod_namespace
        else:
            # Still listed, so that housekeeping can remove a directory nothing else describes.
            name, namespace = "", ""
        return _Loaded(_Pod(uid, name, namespace, sandbox, {c.id: c for c in containers}))


def _kill_tagged(container_id: str) -> None:
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
            _kill_group(pid, signal.SIGKILL)


def _reopen(rec: _Container) -> int | None:
    """A pidfd on the recorded process if it still exists (a zombie counts: its exit is then
    seen at once), None if it is gone or its pid now belongs to another process."""
    if rec.boot_id != _boot_id():
        return None
    try:
        pidfd = os.pidfd_open(rec.pid)
    except ProcessLookupError:
        # Processes left in its group might still run; they are not killed, since nothing proves
        # the group id was not recycled while the agent was away.
        return None
    # Opened first, checked second: if the start time matches, the pidfd is on our process.
    if _proc_start_time(rec.pid) != rec.proc_start_time:
        os.close(pidfd)
        return None
    return pidfd


def _spawn(
    argv: list[str], cwd: str, env: dict[str, str], log_path: Path, pass_fds: tuple[int, ...] = ()
) -> tuple[int, int, int]:
    """fork+exec `argv` in a new session writing to `log_path`: (pid, pidfd, /proc start time)."""
    if not os.path.isdir(cwd):  # Popen would say so too, but naming the file, not the problem
        raise StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    try:
        statefile.ensure_dir(log_path.parent)
        # The child writes to the file itself: its output does not go through the agent, and
        # nothing is lost while the agent restarts.
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise RuntimeFailure(f"cannot open the log file {log_path}: {e}") from e
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group, signalled and killed as a whole
            close_fds=True,
            pass_fds=pass_fds,
        )
    except OSError as e:
        raise _exec_error(argv[0], cwd, e) from e
    except ValueError as e:  # a NUL byte, or "=" in a variable name
        raise StartError("CreateContainerConfigError", f"cannot start {argv[0]!r}: {e}") from e
    finally:
        os.close(log_fd)
    # Popen is only our fork+exec; the pid is reaped through its pidfd. A returncode makes the
    # Popen look finished, so its __del__ does not queue the pid for subprocess._cleanup(), which
    # would reap the child behind our back and lose its exit status.
    proc.returncode = 0
    pid = proc.pid
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        _kill_group(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # SIGKILLed just now: this does not wait for long
        raise RuntimeFailure(f"cannot watch process {pid} ({e}); it was killed") from e
    # Not reaped yet, so /proc/<pid> exists even if the process has already exited.
    start_time = _proc_start_time(pid)
    if start_time is None:
        _kill_group(pid, signal.SIGKILL)
        os.close(pidfd)
        raise RuntimeFailure(f"cannot read /proc/{pid}/stat; is /proc mounted?")
    return pid, pidfd, start_time


def _exec_error(program: str, cwd: str, e: OSError) -> StartError:
    if e.filename == cwd and not os.path.isdir(cwd):
        return StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    if isinstance(e, FileNotFoundError) and "/" not in program:
        problem = "executable file not found in $PATH"
    else:
        problem = (e.strerror or str(e)).lower()
    return StartError("RunContainerError", f'exec: "{program}": {problem}')


def _exec_context(pid: int) -> dict[str, Any] | None:
    """How to run a command as in the container of `pid`: its mount namespace if not ours, its
    uid, gid and groups if not the agent's; empty if it runs as the agent's processes do, None
    if it cannot be read."""
    out: dict[str, Any] = {}
    try:
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
            out["mount_ns_pid"] = pid
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
        uid, gid = int(fields["Uid"].split()[1]), int(fields["Gid"].split()[1])
        groups = [int(g) for g in fields["Groups"].split()]
    except (OSError, KeyError, ValueError, IndexError):
        return None  # gone meanwhile, or a zombie (no namespaces left): the caller decides
    if (uid, gid, sorted(groups)) != (os.geteuid(), os.getegid(), sorted(os.getgroups())):
        out.update(uid=uid, gid=gid, groups=groups)
    return out


def _capabilities() -> int:
    """The agent's effective capabilities (CapEff of /proc/self/status), 0 if unreadable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


@cache
def _effective_capabilities() -> int:
    return _capabilities()


def _launch_config(
    config: ContainerConfig, argv: list[str], cwd: str, env: dict[str, str], cgroups: bool
) -> dict[str, Any] | None:
    """The launcher's instructions, or None when a plain fork+exec does (the fast path)."""
    identity = (
        (config.run_as_user is not None and config.run_as_user != os.geteuid())
        or (config.run_as_group is not None and config.run_as_group != os.getegid())
        or bool(config.supplemental_groups)
    )
    mounts = bool(config.mounts) or config.read_only_root_filesystem
    if not (identity or mounts or cgroups):
        return None
    caps = _effective_capabilities()
    if mounts and not caps >> CAP_SYS_ADMIN & 1:
        raise StartError(
            "CreateContainerConfigError",
            "volume mounts and readOnlyRootFilesystem need an agent running as root with "
            "CAP_SYS_ADMIN (a mount namespace per container); this agent has no CAP_SYS_ADMIN",
        )
    if identity and not (caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1):
        raise StartError(
            "CreateContainerConfigError",
            f"runAsUser/runAsGroup/supplementalGroups need an agent running as root "
            f"(CAP_SETUID, CAP_SETGID); this agent runs as uid {os.geteuid()} without them",
        )
    for m in config.mounts:
        _check_mount(m)
    return {
        "cgroups": [],
        "mounts": [
            {"source": m.host_path, "target": m.container_path, "read_only": m.read_only}
            for m in config.mounts
        ],
        "read_only_root": config.read_only_root_filesystem,
        "uid": config.run_as_user,
        "gid": config.run_as_group,
        "groups": list(config.supplemental_groups) if identity else None,
        "cwd": cwd,
        "argv": argv,
        "env": env,
        "home_of_user": not any(name == "HOME" for name, _ in config.env),
    }


def _check_mount(m: Mount) -> None:
    for what, path in (("host path", m.host_path), ("container path", m.container_path)):
        if not os.path.isabs(path) or "\0" in path:
            raise StartError(
                "CreateContainerConfigError",
                f"mount {m.host_path} -> {m.container_path}: the {what} must be absolute",
            )


def _memfd(name: str, data: dict[str, Any]) -> int:
    """A close-on-exec memfd holding `data` as JSON, at offset 0."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        raw = json.dumps(data).encode()
        while raw:
            raw = raw[os.write(fd, raw) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _start_launcher(launch: dict[str, Any], log_path: Path) -> tuple[int, int, int, int]:
    """fork+exec the launcher: (pid, pidfd, /proc start time, read end of its error pipe).

    The instructions go through a memfd (no size limit, nothing on disk, no shell); the error
    pipe's write end is close-on-exec in the launcher, so EOF without data means it exec'd."""
    try:
        config_fd = _memfd("pykubelet-launch", launch)
    except OSError as e:
        raise RuntimeFailure(f"cannot pass the launcher its instructions: {e}") from e
    err_r, err_w = os.pipe()
    try:
        argv = [sys.executable, "-I", "-S", str(LAUNCHER), str(config_fd), str(err_w)]
        # "/" as the launcher's cwd: it enters the container's own after the mounts, and reports
        # a missing one as the container's error.
        pid, pidfd, start_time = _spawn(
            argv, "/", dict(LAUNCHER_ENV), log_path, pass_fds=(config_fd, err_w)
        )
    except BaseException:
        os.close(err_r)
        raise
    finally:
        os.close(config_fd)
        os.close(err_w)
    return pid, pidfd, start_time, err_r


async def _spawn_launched(launch: dict[str, Any], log_path: Path) -> tuple[int, int, int]:
    pid, pidfd, start_time, err_r = _start_launcher(launch, log_path)
    try:
        async with asyncio.timeout(LAUNCH_TIMEOUT):
            report = await _read_until_eof(err_r)
    except BaseException as e:
        # Cancelled, or stuck (a mount on a dead NFS server): never leave it running unrecorded.
        _kill_group(pid, signal.SIGKILL)
        await _readable(pidfd)
        _reap(pidfd)
        os.close(pidfd)
        if isinstance(e, TimeoutError):
            raise StartError(
                "RunContainerError",
                f"the launcher of {launch['argv'][0]!r} did not exec it within "
                f"{LAUNCH_TIMEOUT:g} s (a mount or a cgroup hanging?); it was killed",
            ) from None
        raise
    finally:
        os.close(err_r)
    if not report:
        # exec'd (or killed before it could report: its exit is then the container's).
        return pid, pidfd, start_time
    await _readable(pidfd)  # it exits right after writing the report
    _reap(pidfd)
    os.close(pidfd)
    raise _launch_error(report, launch)


def _launch_error(report: bytes, launch: dict[str, Any]) -> StartError:
    program, cwd = str(launch["argv"][0]), str(launch["cwd"])
    try:
        data = json.loads(report)
        stage, code, message = str(data["stage"]), data.get("errno"), str(data["message"])
    except (ValueError, KeyError, TypeError):
        return StartError("RunContainerError", f"the launcher failed: {report[:200]!r}")
    if stage == "exec":
        if not isinstance(code, int):
            return StartError("CreateContainerConfigError", f"cannot start {program!r}: {message}")
        return _exec_error(program, cwd, OSError(code, os.strerror(code)))
    if stage == "chdir" and code == errno.ENOENT:
        return StartError("RunContainerError", f'the working directory "{cwd}" does not exist')
    return StartError("RunContainerError", message)


async def _readable(fd: int) -> None:
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


async def _read_until_eof(fd: int) -> bytes:
    """All of a pipe, without blocking the loop (the launcher takes ~30 ms to exec)."""
    os.set_blocking(fd, False)
    out = b""
    while True:
        await _readable(fd)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if not chunk:
            return out
        out += chunk


def _write_marker(path: Path) -> None:
    # No fsync: it guards against the agent dying, not the machine (whose processes die too).
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))


def _create_sandbox(pod_dir: Path, data: dict[str, Any]) -> None:
    statefile.ensure_dir(pod_dir)
    statefile.write_json(pod_dir / SANDBOX_FILE, data)


def _remove_files(*paths: Path) -> None:
    for path in paths:
        statefile.remove(path)


def _remove_tree(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(path)


def _container_env(pod_name: str, env: list[tuple[str, str]]) -> dict[str, str]:
    """A small fixed base instead of the agent's own environment, then the pod's variables."""
    out = {"PATH": BASE_PATH, "HOSTNAME": pod_name, "HOME": "/root"}
    out.update(env)  # later entries win, and a name keeps its first position
    return out


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(_FOLLOW_CHUNK)
    except FileNotFoundError:
        return b""


def _read_log(path: Path, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return b""
    with f:
        start = 0 if tail_lines is None else _tail_offset(f, tail_lines)
        f.seek(start)
        # As the kubelet's limitBytes: the beginning is kept, the rest cut off.
        return f.read() if limit_bytes is None else f.read(max(limit_bytes, 0))


def _tail_offset(f: IO[bytes], lines: int) -> int:
    """Where the last `lines` lines of `f` begin, reading backwards from the end in blocks."""
    end = f.seek(0, os.SEEK_END)
    if lines <= 0:
        return end
    if end == 0:
        return 0
    f.seek(end - 1)
    # A final newline ends the last line; it does not start another one.
    pos = end - 1 if f.read(1) == b"\n" else end
    found = 0
    while pos > 0:
        size = min(_LOG_BLOCK, pos)
        pos -= size
        f.seek(pos)
        block = f.read(size)
        i = len(block)
        while (i := block.rfind(b"\n", 0, i)) >= 0:
            found += 1
            if found == lines:
                return pos + i + 1
    return 0
