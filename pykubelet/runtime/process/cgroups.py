"""cgroups of the process runtime: resource limits, the pod's pids limit, OOM kills, leftovers.

Each container that needs limits gets a cgroup in each controller used (memory, cpu, pids), at a
path derived only from its pod's QoS class, UID and container ID, laid out as the kubelet's
(cgroupsPerQOS): Guaranteed pods directly in `kubepods`, the others in its `burstable` and
`besteffort` children:

    <hierarchy>/pykubelet/kubepods/[burstable/|besteffort/]pod<pod uid>/<container id>

A pod's class never changes, and the lookups that do not know it (adoption after a restart, the
cleanup of what is left) try the three places, and the layout before `kubepods` existed
(`pykubelet/pod<uid>`), so a restarted agent finds its cgroups again.

`kubepods` holds the node allocatable's limits (the kubelet's createNodeAllocatableCgroups and
enforceNodeAllocatableCgroups): memory and cpu shares of capacity less the reservations with
--enforce-node-allocatable=pods, else of capacity, and `pids.max` when a pid reservation is
set; `besteffort` gets the minimum 2 cpu shares. They are written at every start (a restart
with other reservations changes them); a limit the kernel refuses (memory below what the pods
use now) is logged and left as it was. With `system-reserved` / `kube-reserved` enforced, the
named existing cgroup gets its reservation as limits, or the start is refused.

The pod level carries `pids.max` (`--pod-max-pids`, per pod as the kubelet applies it). On cgroup
v1 the `pykubelet` parent sits under the agent's own cgroup of that hierarchy (v1 allows processes
beside child cgroups, and so containers stay within whatever limits the agent runs under); on v2,
where a cgroup with processes cannot delegate controllers, it sits at the root, as the kubelet's
`kubepods`. A controller the unified hierarchy offers is used there, else on its v1 mount.

Everything here is blocking file I/O on cgroupfs: callers run it in a thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from pykubelet.api.qos import BEST_EFFORT, BURSTABLE, GUARANTEED, QOSClass
from pykubelet.api.quantity import to_bytes, to_millicpu
from pykubelet.runtime.resources import (
    CPU_PERIOD,
    MIN_CPU_SHARES,
    cpu_quota,
    cpu_shares,
    cpu_weight,
    request_milli_cpu,
)

log = logging.getLogger(__name__)

CONTROLLERS = ("memory", "cpu", "pids")
PARENT = "pykubelet"
KUBEPODS = "kubepods"  # the kubelet's defaultNodeAllocatableCgroupName
QOS_DIRS = {GUARANTEED: "", BURSTABLE: "burstable", BEST_EFFORT: "besteffort"}
# A killed process leaves its cgroup within milliseconds; one stuck in the kernel may not.
EMPTY_TIMEOUT = 5.0


@dataclass(frozen=True)
class Hierarchy:
    controller: str
    version: int  # 1 or 2
    parent: Path  # the `pykubelet` directory in it
    mount: Path | None = None  # the hierarchy's root (where named cgroups are found)


@dataclass(frozen=True)
class PodsLimits:
    """What `kubepods` gets: memory in bytes, cpu in millicores, pids (None: unlimited)."""

    memory: int | None = None
    cpu_milli: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class ReservedCgroup:
    """--system-reserved-cgroup or --kube-reserved-cgroup, enforced: its reservation written as
    its limits (the kubelet's enforceExistingCgroup)."""

    what: str  # "System Reserved", "Kube Reserved": the kubelet's words in its errors
    name: str  # from the hierarchy's root, e.g. /system.slice
    limits: PodsLimits


@dataclass(frozen=True)
class Settings:
    """What one container's cgroups get, computed (and validated) before anything is created."""

    memory: int | None  # bytes
    cpu_shares: int
    cpu_quota: int | None  # microseconds per CPU_PERIOD

    @classmethod
    def of(cls, limits: dict[str, str], requests: dict[str, str]) -> Settings:
        memory = limits.get("memory")
        cpu = limits.get("cpu")
        return cls(
            memory=None if memory is None else to_bytes(memory),
            cpu_shares=cpu_shares(request_milli_cpu(limits, requests)),
            cpu_quota=None if cpu is None else cpu_quota(to_millicpu(cpu)),
        )


def _write(path: Path, value: str | int) -> None:
    try:
        path.write_text(str(value))
    except OSError as e:
        raise OSError(e.errno, f"cannot write {value} to {path}: {e.strerror}") from e


def _own_cgroups(proc: Path) -> dict[str, str]:
    """Controller -> the agent's cgroup in it; "" is the unified (v2) hierarchy."""
    out: dict[str, str] = {}
    for line in (proc / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def _mounts(proc: Path) -> tuple[dict[str, Path], Path | None]:
    """The v1 mount of each controller, and the cgroup2 mount."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in (proc / "mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and v2 is None:
            v2 = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1.setdefault(option, Path(fields[1]))
    return v1, v2


class Cgroups:
    def __init__(
        self,
        pod_pids_limit: int = -1,
        parent: str = PARENT,
        proc: Path = Path("/proc/self"),
        pods_limits: PodsLimits | None = None,
        cgroup_root: str = "",
    ) -> None:
        self.pod_pids_limit = pod_pids_limit
        self._pods_limits = pods_limits or PodsLimits()
        self._parent = parent
        # --cgroup-root: the parent at that absolute path of each hierarchy, not under our own.
        self._root = cgroup_root.strip("/")
        self._proc = proc  # where the mounts and our own cgroups are read (tests: a fake tree)
        self._hierarchies: list[Hierarchy] = []
        self._problem: str | None = "cgroups were not detected yet"
        self._warned = False

    @property
    def hierarchies(self) -> list[Hierarchy]:
        return list(self._hierarchies)

    def detect(self) -> None:
        """Find the controllers we can use and create the parents. Never raises: what cannot
        be used is remembered and logged once, when a container first asks for limits."""
        self._hierarchies = []
        if os.geteuid() != 0:
            self._problem = "the agent does not run as root"
            return
        try:
            own = _own_cgroups(self._proc)
            v1, v2 = _mounts(self._proc)
            v2_controllers: set[str] = set()
            if v2 is not None:
                v2_controllers = set((v2 / "cgroup.controllers").read_text().split())
        except (OSError, ValueError) as e:
            self._problem = f"cannot read the cgroup mounts: {e}"
            return
        problems: list[str] = []
        for name in CONTROLLERS:
            if v2 is not None and name in v2_controllers:
                parent = v2 / (self._root or self._parent)
                hierarchy = Hierarchy(name, 2, parent, v2)
            elif name in v1 and name in own:
                if self._root:
                    parent = v1[name] / self._root
                else:
                    parent = v1[name] / own[name].lstrip("/") / self._parent
                hierarchy = Hierarchy(name, 1, parent, v1[name])
            else:
                problems.append(f"no {name} controller is mounted")
                continue
            try:
                hierarchy.parent.mkdir(parents=True, exist_ok=True)
                kubepods = hierarchy.parent / KUBEPODS
                for directory in (kubepods, *(kubepods / d for d in QOS_DIRS.values() if d)):
                    directory.mkdir(exist_ok=True)
                if hierarchy.version == 2:
                    # The controller enabled on the way down from the root to kubepods.
                    assert hierarchy.mount is not None
                    ancestors = [hierarchy.mount, *reversed(hierarchy.parent.parents)]
                    below_root = [a for a in ancestors if a.is_relative_to(hierarchy.mount)]
                    for directory in (*dict.fromkeys(below_root), hierarchy.parent, kubepods):
                        _write(directory / "cgroup.subtree_control", f"+{name}")
                    for qos_dir in QOS_DIRS.values():
                        if qos_dir:
                            _write(kubepods / qos_dir / "cgroup.subtree_control", f"+{name}")
            except OSError as e:
                problems.append(f"cannot use the {name} controller: {e}")
                continue
            self._hierarchies.append(hierarchy)
            self._limit_pods(hierarchy)
        self._problem = "; ".join(problems) or None

    def _limit_pods(self, h: Hierarchy) -> None:
        """kubepods' limits, and besteffort's minimum shares. A refusal is logged, not fatal:
        the kubelet retries it too (pods above a lowered limit are evicted meanwhile)."""
        kubepods = h.parent / KUBEPODS
        limits = self._pods_limits
        writes: list[tuple[Path, int | str]] = []
        if h.controller == "memory" and limits.memory is not None:
            name = "memory.limit_in_bytes" if h.version == 1 else "memory.max"
            writes.append((kubepods / name, limits.memory))
        elif h.controller == "cpu":
            if limits.cpu_milli is not None:
                shares = cpu_shares(limits.cpu_milli)
                writes.append(_shares_file(h, kubepods, shares))
            writes.append(_shares_file(h, kubepods / QOS_DIRS[BEST_EFFORT], MIN_CPU_SHARES))
        elif h.controller == "pids" and limits.pids is not None:
            writes.append((kubepods / "pids.max", limits.pids))
        for path, value in writes:
            try:
                _write(path, value)
            except OSError as e:
                log.warning("Failed to update Node Allocatable Limits %s: %s", kubepods, e)

    def enforce_reserved(self, reserved: tuple[ReservedCgroup, ...]) -> None:
        """Write each reservation to its existing cgroup; raises ValueError with the kubelet's
        message (the start is refused, as the kubelet's is)."""
        for cgroup in reserved:
            try:
                self._enforce_one(cgroup)
            except (OSError, ValueError) as e:
                raise ValueError(
                    f'Failed to enforce {cgroup.what} Cgroup Limits on "{cgroup.name}": {e}'
                ) from None

    def _enforce_one(self, cgroup: ReservedCgroup) -> None:
        if not self._hierarchies:
            raise ValueError(f"cgroups are not usable: {self._problem}")
        limits = cgroup.limits
        for h in self._hierarchies:
            if h.mount is None:
                continue
            path = h.mount / cgroup.name.lstrip("/")
            if not path.is_dir():
                raise ValueError(f'"{cgroup.name}" cgroup does not exist')
            if h.controller == "memory" and limits.memory is not None:
                name = "memory.limit_in_bytes" if h.version == 1 else "memory.max"
                _write(path / name, limits.memory)
            elif h.controller == "cpu" and limits.cpu_milli is not None:
                _write(*_shares_file(h, path, cpu_shares(limits.cpu_milli)))
            elif h.controller == "pids" and limits.pids is not None:
                _write(path / "pids.max", limits.pids)

    def pods_cgroup(self, controller: str) -> Path | None:
        """The `kubepods` directory of a controller in use (what its limits are read from)."""
        for h in self._hierarchies:
            if h.controller == controller:
                return h.parent / KUBEPODS
        return None

    def wanted(self, limits: dict[str, str], requests: dict[str, str]) -> bool:
        """Whether a container with these resources needs cgroups at all."""
        return "memory" in limits or "cpu" in limits or "cpu" in requests or self.pod_pids_limit > 0

    def warn_once(self) -> bool:
        """Log, once, why limits are not (all) enforced; True if cgroups can be used at all."""
        if self._problem is not None and not self._warned:
            self._warned = True
            what = "some resource limits" if self._hierarchies else "resource limits"
            log.warning(
                "%s of the process runtime are not enforced: %s (containers run anyway)",
                what,
                self._problem,
            )
        return bool(self._hierarchies)

    def _dirs(
        self, pod_uid: str, container_id: str | None = None, qos: QOSClass | None = None
    ) -> list[tuple[Hierarchy, Path]]:
        out = []
        for h in self._hierarchies:
            path = _pod_dir(h, pod_uid, qos)
            out.append((h, path if container_id is None else path / container_id))
        return out

    def create(
        self, pod_uid: str, container_id: str, settings: Settings, qos: QOSClass = BURSTABLE
    ) -> list[str]:
        """Create the container's cgroups with their limits, below its pod's QoS class: the
        cgroup.procs files to join. On failure nothing of the container is left."""
        procs: list[str] = []
        try:
            for h, cdir in self._dirs(pod_uid, container_id, qos):
                pod_dir = cdir.parent
                pod_dir.mkdir(exist_ok=True)
                if h.controller == "pids":
                    limit = self.pod_pids_limit
                    _write(pod_dir / "pids.max", limit if limit > 0 else "max")
                if h.version == 2:
                    _write(pod_dir / "cgroup.subtree_control", f"+{h.controller}")
                cdir.mkdir(exist_ok=h.version == 2)  # v2 controllers share one directory
                self._configure(h, cdir, settings)
                if str(cdir / "cgroup.procs") not in procs:
                    procs.append(str(cdir / "cgroup.procs"))
        except OSError:
            self.remove(pod_uid, container_id)
            raise
        return procs

    def _configure(self, h: Hierarchy, cdir: Path, s: Settings) -> None:
        if h.controller == "memory" and s.memory is not None:
            if h.version == 1:
                _write(cdir / "memory.limit_in_bytes", s.memory)
                # No swap beyond the limit, where the kernel accounts swap (swapaccount=1).
                if (cdir / "memory.memsw.limit_in_bytes").exists():
                    _write(cdir / "memory.memsw.limit_in_bytes", s.memory)
            else:
                _write(cdir / "memory.max", s.memory)
                if (cdir / "memory.swap.max").exists():
                    _write(cdir / "memory.swap.max", 0)
        elif h.controller == "cpu":
            if h.version == 1:
                _write(cdir / "cpu.shares", s.cpu_shares)
                if s.cpu_quota is not None:
                    _write(cdir / "cpu.cfs_period_us", CPU_PERIOD)
                    _write(cdir / "cpu.cfs_quota_us", s.cpu_quota)
            else:
                _write(cdir / "cpu.weight", cpu_weight(s.cpu_shares))
                if s.cpu_quota is not None:
                    _write(cdir / "cpu.max", f"{s.cpu_quota} {CPU_PERIOD}")

    def procs_files(self, pod_uid: str, container_id: str) -> list[str]:
        """The cgroup.procs files of the container's existing cgroups (to join them)."""
        files = {str(cdir / "cgroup.procs") for _, cdir in self._dirs(pod_uid, container_id)}
        return sorted(f for f in files if os.path.exists(f))

    def exists(self, pod_uid: str, container_id: str) -> bool:
        return any(cdir.is_dir() for _, cdir in self._dirs(pod_uid, container_id))

    def oom_killed(self, pod_uid: str, container_id: str) -> bool:
        """Whether the kernel OOM-killed a process of the container for its memory limit."""
        for h, cdir in self._dirs(pod_uid, container_id):
            if h.controller != "memory":
                continue
            name = "memory.oom_control" if h.version == 1 else "memory.events"
            try:
                text = (cdir / name).read_text()
            except OSError:
                return False
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value) > 0
        return False

    def finish(self, pod_uid: str, container_id: str) -> bool:
        """After the container's main process exited: whether it was OOM-killed; then kill
        what is left in its cgroups and remove them."""
        oom = self.oom_killed(pod_uid, container_id)
        self.remove(pod_uid, container_id)
        return oom

    def remove(self, pod_uid: str, container_id: str) -> None:
        _empty_and_remove([cdir for _, cdir in self._dirs(pod_uid, container_id)])

    def remove_pod(self, pod_uid: str) -> None:
        """Kill whatever is left of the pod and remove its cgroups."""
        for _, pod_dir in self._dirs(pod_uid):
            with contextlib.suppress(FileNotFoundError):
                children = [Path(e.path) for e in os.scandir(pod_dir) if e.is_dir()]
                _empty_and_remove(children)
            _empty_and_remove([pod_dir])


def _shares_file(h: Hierarchy, directory: Path, shares: int) -> tuple[Path, int | str]:
    if h.version == 1:
        return directory / "cpu.shares", shares
    return directory / "cpu.weight", cpu_weight(shares)


def _pod_dir(h: Hierarchy, pod_uid: str, qos: QOSClass | None) -> Path:
    """Where the pod's cgroup is in this hierarchy: below its class when known, else wherever it
    exists (kubepods, burstable, besteffort, or the layout before kubepods)."""
    name = f"pod{pod_uid}"
    kubepods = h.parent / KUBEPODS
    if qos is not None:
        qos_dir = QOS_DIRS[qos]
        return (kubepods / qos_dir if qos_dir else kubepods) / name
    candidates = [kubepods / name, kubepods / "burstable" / name, kubepods / "besteffort" / name]
    for candidate in [*candidates, h.parent / name]:
        if candidate.is_dir():
            return candidate
    return candidates[0]


def _empty_and_remove(dirs: list[Path]) -> None:
    left = list(dirs)
    deadline = time.monotonic() + EMPTY_TIMEOUT
    while left:
        for path in list(left):
            try:
                pids = (path / "cgroup.procs").read_text().split()
            except FileNotFoundError:
                left.remove(path)
                continue
            for pid in pids:
                # Only pids read from this cgroup just now: never our own, never init.
                if int(pid) > 1 and int(pid) != os.getpid():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                path.rmdir()
                left.remove(path)
            except FileNotFoundError:
                left.remove(path)
            except OSError as e:
                if e.errno != errno.EBUSY:
                    raise OSError(e.errno, f"cannot remove cgroup {path}: {e.strerror}") from e
        if left:
            if time.monotonic() > deadline:
                raise OSError(
                    errno.EBUSY,
                    f"cgroups {', '.join(map(str, left))} still hold processes "
                    f"{EMPTY_TIMEOUT:g} s after SIGKILL",
                )
            time.sleep(0.01)
