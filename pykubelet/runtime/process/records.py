"""The process runtime's state: what it records of sandboxes and containers, and loading it back.

Each pod is a directory under the runtime's root; its sandbox and each container instance are
JSON state files in it (written atomically by `statefile`):

    <root>/runtime/process/<pod uid>/sandbox.json
    <root>/runtime/process/<pod uid>/<container id>.json
    <root>/runtime/process/<pod uid>/<container id>.starting   (a container being started)

What this module promises:

- a record read back is the record written (`to_json` / `from_json`), or a StateFileError
  naming the file and the field: a file of another version, of another pod or container, or
  with a pid we could not have started is never taken for a container;
- `load` gives every pod directory as it was left (adoption after a restart), with a pidfd on
  each container process still running, and cleans up on the way: interrupted writes removed,
  processes whose start was never recorded killed, corrupt files renamed aside (`.corrupt`) and
  their processes killed, cgroups of containers gone while the agent was away read for OOM
  kills and removed.

Loading blocks (directory scans, /proc, cgroupfs): it runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pykubelet.common.lightevent import LightEvent
from pykubelet.runtime.base import (
    ContainerRunState,
    RuntimeContainer,
    RuntimeFailure,
    RuntimePod,
    RuntimeSandbox,
)
from pykubelet.runtime.process import statefile
from pykubelet.runtime.process.cgroups import Cgroups
from pykubelet.runtime.process.processes import kill_tagged, reopen
from pykubelet.runtime.process.statefile import StateFileError

log = logging.getLogger(__name__)

NAME = "process"  # the runtime's name, in every container it reports
STATE_VERSION = 1
SANDBOX_FILE = "sandbox.json"
STARTING_SUFFIX = ".starting"  # <container id>.starting: a container being started


def check_component(what: str, value: str) -> None:
    """`value` becomes a path component: keep it from escaping its directory."""
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise RuntimeFailure(f"{what} {value!r} cannot be used as a file name")


class Fields:
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
class SandboxRecord:
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
    def from_json(cls, data: dict[str, Any], path: Path) -> SandboxRecord:
        f = Fields(data, path)
        return cls(
            id=f.text("id"),
            pod_uid=f.text("pod_uid"),
            pod_name=f.text("pod_name"),
            pod_namespace=f.text("pod_namespace"),
            created_at=f.time("created_at"),
        )

    # The last view: a record never changes once made, and the relists ask for it every second.
    _view: RuntimeSandbox | None = field(default=None, init=False, repr=False, compare=False)

    def view(self, ip: str) -> RuntimeSandbox:
        if self._view is None or self._view.ip != ip:
            self._view = RuntimeSandbox(
                id=self.id,
                pod_uid=self.pod_uid,
                pod_name=self.pod_name,
                pod_namespace=self.pod_namespace,
                ready=True,
                ip=ip,
                created_at=self.created_at,
            )
        return self._view


@dataclass(eq=False)
class ContainerRecord:
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
    # The host file bound at its terminationMessagePath (None: none) and the policy, read at
    # its exit (runtime/termination.py); absent in files older than the fields.
    termination_file: str | None = None
    termination_policy: str = ""
    # Not persisted.
    pidfd: int | None = None  # set while the exit is being watched
    # Set once the exit is recorded, in memory and (if the disk allows) in the state file.
    exited: LightEvent = field(default_factory=LightEvent)
    # Orders the writes of the state file and its deletion.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    removed: bool = False  # the state file is deleted: never write it again
    cgroup: bool = False  # it has cgroups to read (OOM) and remove at its exit
    finishing: bool = False  # its exit was seen and its cgroups are being emptied
    # Its exit is recorded, its termination message not read yet: the view still shows it
    # running, so that the exit and its message reach the status together (as the kubelet
    # reads the message with the status of the exited container).
    reading_message: bool = False
    _view: RuntimeContainer | None = field(default=None, init=False, repr=False)

    @property
    def running(self) -> bool:
        return self.finished_at is None

    def view(self) -> RuntimeContainer:
        # The relists (PLEG every second, housekeeping, stats) ask for every container: the view
        # is made again only when the exit is recorded, the one change a record sees.
        view = self._view
        shown = not self.reading_message
        finished_at = self.finished_at if shown else None
        exit_code, reason, message = (
            (self.exit_code, self.reason, self.message) if shown else (None, None, None)
        )
        if view is not None and (view.finished_at, view.exit_code, view.reason, view.message) == (
            finished_at,
            exit_code,
            reason,
            message,
        ):
            return view
        self._view = view = RuntimeContainer(
            id=self.id,
            runtime=NAME,
            pod_uid=self.pod_uid,
            pod_name=self.pod_name,
            pod_namespace=self.pod_namespace,
            name=self.name,
            attempt=self.attempt,
            spec_hash=self.spec_hash,
            image=self.image,
            state=ContainerRunState.RUNNING if finished_at is None else ContainerRunState.EXITED,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=finished_at,
            exit_code=exit_code,
            reason=reason,
            message=message,
            pid=self.pid,
        )
        return view

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
            "termination_file": self.termination_file,
            "termination_policy": self.termination_policy,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> ContainerRecord:
        f = Fields(data, path)
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
            termination_file=f.opt_text("termination_file"),
            termination_policy=f.opt_text("termination_policy") or "",
        )
        if rec.pid <= 1:
            raise StateFileError(path, f"field 'pid' is not a pid we could have started: {rec.pid}")
        if path.stem != rec.id:
            raise StateFileError(path, f"holds container {rec.id!r}, not {path.stem!r}")
        return rec


@dataclass
class PodRecord:
    uid: str
    name: str
    namespace: str
    sandbox: SandboxRecord | None = None
    containers: dict[str, ContainerRecord] = field(default_factory=dict)
    # The last view and what it was made of (`view`).
    view_cache: tuple[tuple[object, ...], RuntimePod] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def view(self, node_ip: str) -> RuntimePod:
        """What the runtime reports of the pod. Made again only when a part changed (the parts'
        views are cached by their records): the PLEG asks for every pod each second, and an
        idle pod never changes."""
        sandbox = None if self.sandbox is None else self.sandbox.view(node_ip)
        key = (self.name, self.namespace, sandbox, *(c.view() for c in self.containers.values()))
        cached = self.view_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        containers = sorted(
            self.containers.values(), key=lambda c: (c.name, c.attempt, c.created_at)
        )
        view = RuntimePod(
            uid=self.uid,
            name=self.name,
            namespace=self.namespace,
            sandbox=sandbox,
            containers=[c.view() for c in containers],
        )
        self.view_cache = (key, view)
        return view


@dataclass
class LoadedPod:
    """One pod directory as read at start, with a pidfd for each container still running."""

    pod: PodRecord
    alive: dict[str, int] = field(default_factory=dict)  # container id -> pidfd
    oom: set[str] = field(default_factory=set)  # gone while the agent was away, OOM-killed


# --- loading (runs in a thread) -----------------------------------------------------------------


def load(root: Path, cgroups: Cgroups) -> list[LoadedPod]:
    """Every pod directory under `root`, sorted by pod UID (see the module's docstring)."""
    statefile.ensure_dir(root)
    loaded: list[LoadedPod] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            check_component("pod UID", entry.name)
            item = _load_pod(Path(entry.path))
        except (OSError, RuntimeFailure) as e:
            log.warning("skipping pod directory %s: %s", entry.path, e)
            continue
        loaded.append(item)
        # Outside the try: failing to watch a live process (EMFILE...) must fail start(), not
        # hide the pod, or it would be started a second time beside the one still running.
        for rec in item.pod.containers.values():
            if rec.running:
                pidfd = reopen(rec.pid, rec.proc_start_time, rec.boot_id)
                if pidfd is not None:
                    item.alive[rec.id] = pidfd
                    rec.cgroup = cgroups.exists(rec.pod_uid, rec.id)
                    continue
            # Gone: what is left of its cgroups goes, after the OOM counter was read.
            try:
                if cgroups.finish(rec.pod_uid, rec.id) and rec.running:
                    item.oom.add(rec.id)
            except OSError as e:
                log.warning("container %s: cannot clean up its cgroups: %s", rec.id, e)
    return loaded


def _load_pod(pod_dir: Path) -> LoadedPod:
    uid = pod_dir.name
    sandbox: SandboxRecord | None = None
    containers: list[ContainerRecord] = []
    for entry in sorted(os.scandir(pod_dir), key=lambda e: e.name):
        path = Path(entry.path)
        if statefile.is_temporary(entry.name):
            statefile.remove(path)  # an interrupted write; the previous version is intact
            continue
        if entry.name.endswith(STARTING_SUFFIX):
            container_id = entry.name.removesuffix(STARTING_SUFFIX)
            if not (pod_dir / f"{container_id}.json").exists():
                # Forked, never recorded: the agent died in between. Never run it twice.
                kill_tagged(container_id)
            statefile.remove(path)
            continue
        if not entry.name.endswith(".json") or not entry.is_file(follow_symlinks=False):
            continue
        try:
            data = statefile.read_json(path)
            if entry.name == SANDBOX_FILE:
                sandbox = SandboxRecord.from_json(data, path)
                if sandbox.pod_uid != uid:
                    raise StateFileError(path, f"belongs to pod {sandbox.pod_uid}, not {uid}")
            else:
                rec = ContainerRecord.from_json(data, path)
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
                kill_tagged(entry.name.removesuffix(".json"))
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
    return LoadedPod(PodRecord(uid, name, namespace, sandbox, {c.id: c for c in containers}))
