"""Reading resource usage from cgroupfs and /proc: a container by one of its processes, and the
node. Blocking file I/O only: the collector runs it in a thread.

A container is found from its process: `/proc/<pid>/cgroup` names its cgroup in each hierarchy,
which works alike for the process, docker and CRI runtimes. Each figure comes from the first
place that is the container's own:

- CPU: cgroup v1 `cpuacct.usage` (ns), else v2 `cpu.stat` `usage_usec` (v2 keeps it in every
  cgroup, with or without the cpu controller);
- memory: v1 `memory.usage_in_bytes` minus `total_inactive_file` of `memory.stat`, else v2
  `memory.current` minus `inactive_file`: the working set, as the kubelet (cAdvisor) computes it.

A cgroup is not the container's own when it also holds the agent (the process runtime leaves a
container without limits in the agent's cgroups) or is the root: its figures would be the agent's
or the machine's. Then the figure is the sum over the container's processes (those of a cgroup
that is its own, else the main process and its descendants) from `/proc/<pid>/stat`: CPU as
utime + stime + the reaped children's cutime + cstime, memory as the resident set. (On this
project's test machine cpuacct is mounted apart from cpu, and the process runtime does not join
cpuacct, so its containers' CPU is measured this way even when they have cgroups.)

A container's cgroups are read from its process once (given the container's ID as its key) and
kept while the container is sampled, as cAdvisor tracks a container by its cgroup rather than
asking its process again: only the figures are read each sample (at 1,000 containers the
`/proc/<pid>/cgroup` reads were a third of a sample). A plan is dropped with its container, when
the pid of the key changes, and all of them when the mounts or the agent's own cgroups change.
Likewise the process tree (for a container without a cgroup of its own): each process's parent
is kept between samples and read again only for new processes and orphans (`CgroupFs._tree`),
so a sample reads the containers' processes, not every process on the machine.

The node is the root cgroup, as the kubelet reports cAdvisor's "/" container: v1 root
`cpuacct.usage` and `memory.usage_in_bytes` minus `total_inactive_file`; on v2, whose root has no
`memory.current`, usage is MemTotal - MemFree and inactive file comes from the root's
`memory.stat` (else /proc/meminfo's Inactive(file)); CPU from the root's `cpu.stat`, else
/proc/stat (user + nice + system + irq + softirq + steal). MemTotal - MemAvailable is not used:
it also subtracts active page cache and reclaimable slab, so it is lower than the working set
the kubelet reports and compares eviction thresholds with.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

# The process tree's parents are all read again once in this many samples (`CgroupFs._tree`).
FULL_TREE_EVERY = 6
# Above this a v1 limit means "no limit" (the kernel reports PAGE_COUNTER_MAX pages as bytes).
_UNLIMITED = 1 << 62
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Reading(NamedTuple):
    """One read of one container or the node, before rates are derived (a tuple: one is made
    per container, every sample)."""

    at: float  # unix time of the read
    cpu_ns: int | None
    working_set: int | None
    usage: int | None = None
    rss: int | None = None
    limit: int | None = None
    page_faults: int | None = None
    major_page_faults: int | None = None


@dataclass(frozen=True)
class Mounts:
    v1: dict[str, Path]  # controller -> the root of its v1 hierarchy
    v2: Path | None  # the unified hierarchy


def read_mounts(text: str) -> Mounts:
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and v2 is None:
            v2 = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1.setdefault(option, Path(fields[1]))
    return Mounts(v1, v2)


def parse_cgroups(text: str) -> dict[str, str]:
    """`/proc/<pid>/cgroup` as controller -> path; "" is the unified (v2) hierarchy."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            out[name] = path
    return out


def parse_keyed(text: str) -> dict[str, int]:
    """`memory.stat`, `cpu.stat`: one "key value" a line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def _shared(path: str, agents: str | None) -> bool:
    """Whether the cgroup at `path` is the root, the agent's, or one the agent's is inside."""
    if path in ("", "/"):
        return True
    if agents is None:
        return False
    return agents == path or agents.startswith(path.rstrip("/") + "/")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _read_bytes(path: str) -> bytes:
    """A small file (a process's `stat`, `cgroup`) in as few system calls as it can: a sample
    reads one or two per process, and pathlib's and io's layers cost more than the reads."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 8192)
        if len(data) == 8192:
            chunks = [data]
            while len(chunks[-1]) == 8192:
                chunks.append(os.read(fd, 8192))
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data


def _read_small(path: str) -> str:
    return _read_bytes(path).decode(errors="replace")


class _ProcStat(NamedTuple):
    # A tuple, not a dataclass: one is made per process on the machine, every sample.
    ppid: int
    cpu_ticks: int  # utime + stime + cutime + cstime
    rss_pages: int
    minflt: int
    majflt: int


def _proc_stat(data: bytes) -> _ProcStat:
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    # Those past rss (the 22nd after it) are not split apart.
    rest = data[data.rindex(b")") + 2 :].split(None, 22)
    return _ProcStat(
        int(rest[1]),
        int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]),
        int(rest[21]),
        int(rest[7]),
        int(rest[9]),
    )


def _totals(procs: list[_ProcStat]) -> tuple[int, int, int, int]:
    """CPU ticks, resident pages, minor and major faults of `procs` together."""
    if len(procs) == 1:  # most containers
        (only,) = procs
        return only.cpu_ticks, only.rss_pages, only.minflt, only.majflt
    ticks = rss = minflt = majflt = 0
    for proc in procs:
        ticks += proc.cpu_ticks
        rss += proc.rss_pages
        minflt += proc.minflt
        majflt += proc.majflt
    return ticks, rss, minflt, majflt


@dataclass(frozen=True)
class _Plan:
    """Where one container's figures are read: the directories of its process's cgroups that
    are its own, for each use, in the order they are tried (none: its processes instead)."""

    pid: int
    cpu: tuple[Path, ...]  # cpuacct's
    memory: tuple[Path, ...]
    procs: tuple[Path, ...]  # memory's, cpuacct's, cpu's, pids': the first cgroup.procs read


class CgroupFs:
    """Reads under `proc` (a fake tree in tests): its `self/mounts`, `self/cgroup` (the agent's
    own cgroups) and `<pid>/...`. `refresh()` re-reads the mounts and the agent's cgroups (once
    a sample); the other methods read what they are asked, now, but for the containers' cgroups
    (kept by key, see the module's docstring; `keep_only` forgets the others), and the process
    tree's parents (`_tree`)."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._proc_dir = str(proc)
        self._mounts = Mounts({}, None)
        self._own: dict[str, str] = {}
        # The process tree (`_tree`): each process's parent, kept between samples, and this
        # sample's children of each process (None: not made yet).
        self._parents: dict[int, int] = {}
        self._children: dict[int, list[int]] | None = None
        self._samples_since_full = FULL_TREE_EVERY  # the first tree reads every process
        self._sampled: dict[int, _ProcStat] = {}  # pid -> its stat read in this sample
        self._plans: dict[str, _Plan] = {}

    def refresh(self) -> None:
        mounts = read_mounts((self._proc / "self" / "mounts").read_text())
        try:
            own = parse_cgroups((self._proc / "self" / "cgroup").read_text())
        except OSError:
            own = {}
        if mounts != self._mounts or own != self._own:
            self._plans.clear()  # which cgroups are a container's own may have changed
        self._mounts, self._own = mounts, own
        self._children = None  # the process tree, made again when a sample first needs it
        self._samples_since_full += 1

    def keep_only(self, keys: set[str]) -> None:
        """At the end of a sample: forget the cgroups of every container but these (those no
        longer sampled), and the processes read in the sample."""
        for key in self._plans.keys() - keys:
            del self._plans[key]
        self._sampled = {}

    # --- containers ---------------------------------------------------------------------

    def _own_dirs(self, groups: dict[str, str], controller: str) -> list[Path]:
        """Where the process's cgroup that is its own holds `controller`'s files: its v1
        hierarchy first (a controller bound there is accounted there only), then v2."""
        out: list[Path] = []
        mount = self._mounts.v1.get(controller)
        if mount is not None and controller in groups:
            path = groups[controller]
            if not _shared(path, self._own.get(controller)):
                out.append(mount / path.lstrip("/"))
        if self._mounts.v2 is not None and "" in groups:
            path = groups[""]
            if not _shared(path, self._own.get("")):
                out.append(self._mounts.v2 / path.lstrip("/"))
        return out

    def _plan(self, pid: int, key: str | None) -> _Plan | None:
        """Where the container of process `pid` is read, kept under `key`; None if the
        process is gone."""
        plan = self._plans.get(key) if key is not None else None
        if plan is not None and plan.pid == pid:
            return plan
        try:
            groups = parse_cgroups(_read_small(f"{self._proc_dir}/{pid}/cgroup"))
        except (FileNotFoundError, ProcessLookupError):
            return None
        # In the order cgroup.procs is looked for (a dict keeps it).
        own = {c: self._own_dirs(groups, c) for c in ("memory", "cpuacct", "cpu", "pids")}
        plan = _Plan(
            pid,
            tuple(own["cpuacct"]),
            tuple(own["memory"]),
            tuple(where for dirs in own.values() for where in dirs),
        )
        if key is not None:
            self._plans[key] = plan
        return plan

    def container(self, pid: int, key: str | None = None) -> Reading | None:
        """The usage of the container whose process `pid` is; None if the process is gone
        (or, once its cgroups are known under `key`, if it was read from its processes)."""
        plan = self._plan(pid, key)
        if plan is None:
            return None
        cpu = self._cgroup_cpu(plan.cpu) if plan.cpu else None
        memory = self._cgroup_memory(plan.memory) if plan.memory else None
        if cpu is not None and memory is not None:
            return memory._replace(at=time.time(), cpu_ns=cpu)
        procs = self._processes(plan.procs, pid)
        if not procs:
            return None
        ticks, rss_pages, minflt, majflt = _totals(procs)
        if cpu is None:
            cpu = ticks * 1_000_000_000 // _CLK_TCK
        if memory is not None:
            return memory._replace(at=time.time(), cpu_ns=cpu)
        rss = rss_pages * _PAGE_SIZE
        return Reading(
            time.time(),
            cpu,
            rss,
            usage=rss,
            rss=rss,
            page_faults=minflt,
            major_page_faults=majflt,
        )

    @staticmethod
    def _cgroup_cpu(dirs: tuple[Path, ...]) -> int | None:
        for where in dirs:
            try:
                if (where / "cpuacct.usage").exists():
                    return _read_int(where / "cpuacct.usage")
                return parse_keyed((where / "cpu.stat").read_text())["usage_usec"] * 1000
            except (OSError, ValueError, KeyError):
                continue
        return None

    @staticmethod
    def _cgroup_memory(dirs: tuple[Path, ...]) -> Reading | None:
        for where in dirs:
            try:
                if (where / "memory.usage_in_bytes").exists():
                    return _v1_memory(where)
                return _v2_memory(where)
            except (OSError, ValueError, KeyError):
                continue
        return None

    def _processes(self, dirs: tuple[Path, ...], pid: int) -> list[_ProcStat]:
        """The container's processes: those of the first of its own cgroups (`dirs`) that can
        be read, else `pid` and its descendants."""
        pids: list[int] | None = None
        for where in dirs:
            try:
                pids = [int(p) for p in (where / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
            break
        if pids is not None:
            return [stat for p in pids if (stat := self._stat_of(p)) is not None]
        children = self._tree()
        found: list[_ProcStat] = []
        todo = [(pid, 0)]  # (pid, the parent it was found under; 0: the main process)
        while todo:
            current, parent = todo.pop()
            stat = self._stat_of(current)
            if stat is None:
                continue  # gone since the tree was made
            if parent and stat.ppid != parent:
                # The pid was used again by another process since its parent was read: not
                # this container's; the next sample reads every process's parent again.
                self._samples_since_full = FULL_TREE_EVERY
                continue
            found.append(stat)
            todo.extend((child, current) for child in children.get(current, ()))
        return found

    def _stat_of(self, pid: int) -> _ProcStat | None:
        """The process's `stat`, read once a sample; None if it is gone."""
        known = self._sampled.get(pid)
        if known is not None:
            return known
        try:
            stat = _proc_stat(_read_bytes(f"{self._proc_dir}/{pid}/stat"))
        except (OSError, ValueError, IndexError):
            return None  # gone since it was listed
        self._sampled[pid] = stat
        return stat

    def _tree(self) -> dict[int, list[int]]:
        """Each process's children: made once a sample, and only if a container needs its
        descendants. A process's parent is read once and kept: it changes only when the parent
        is gone (the orphan goes to init or a subreaper), which the listing of /proc shows, so
        only new processes and orphans are read. Every FULL_TREE_EVERY samples, and after a
        pid was found used again, every process is read (a pid used again between two samples,
        the listing otherwise unchanged, would keep the parent of the process before)."""
        if self._children is not None:
            return self._children
        with os.scandir(self._proc) as entries:
            listed = [int(e.name) for e in entries if e.name.isdigit()]
        full = self._samples_since_full >= FULL_TREE_EVERY
        if full:
            self._samples_since_full = 0
        known = {} if full else self._parents
        alive = set(listed) if not full else set()
        parents: dict[int, int] = {}
        children: dict[int, list[int]] = {}
        for pid in listed:
            ppid = known.get(pid)
            if ppid is None or (ppid and ppid not in alive):
                stat = self._stat_of(pid)
                if stat is None:
                    continue  # gone since it was listed
                ppid = stat.ppid
            parents[pid] = ppid
            children.setdefault(ppid, []).append(pid)
        self._parents = parents
        self._children = children
        return children

    # --- the node -----------------------------------------------------------------------

    def node(self) -> Reading:
        """The root cgroup's usage (see the module's docstring); raises OSError or ValueError
        when neither cgroupfs nor /proc can tell."""
        meminfo = self._meminfo()
        total = meminfo["MemTotal"]
        cpu = self._node_cpu()
        v1 = self._mounts.v1.get("memory")
        if v1 is not None and (v1 / "memory.usage_in_bytes").exists():
            memory = _v1_memory(v1)
        else:
            inactive = meminfo.get("Inactive(file)", 0)
            stat: dict[str, int] = {}
            if self._mounts.v2 is not None:
                try:
                    stat = parse_keyed((self._mounts.v2 / "memory.stat").read_text())
                    inactive = stat.get("inactive_file", inactive)
                except OSError:
                    pass
            usage = total - meminfo["MemFree"]
            memory = Reading(
                0,
                None,
                max(0, usage - inactive),
                usage=usage,
                rss=stat.get("anon"),
                page_faults=stat.get("pgfault"),
                major_page_faults=stat.get("pgmajfault"),
            )
        working_set = memory.working_set or 0
        return Reading(
            time.time(),
            cpu,
            working_set,
            usage=memory.usage,
            rss=memory.rss,
            limit=total,
            page_faults=memory.page_faults,
            major_page_faults=memory.major_page_faults,
        )

    def _node_cpu(self) -> int:
        v1 = self._mounts.v1.get("cpuacct")
        if v1 is not None and (v1 / "cpuacct.usage").exists():
            return _read_int(v1 / "cpuacct.usage")
        if self._mounts.v2 is not None:
            try:
                return parse_keyed((self._mounts.v2 / "cpu.stat").read_text())["usage_usec"] * 1000
            except (OSError, KeyError):
                pass
        first = (self._proc / "stat").read_text().splitlines()[0].split()
        assert first[0] == "cpu", first
        # user nice system idle iowait irq softirq steal (guest is within user already)
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
        ticks = user + nice + system + irq + softirq + steal
        return ticks * 1_000_000_000 // _CLK_TCK

    def _meminfo(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in (self._proc / "meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            parts = value.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if parts[-1] == "kB" else 1)
        return out

    def boot_time(self) -> float:
        for line in (self._proc / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
        return 0.0


def _v1_memory(where: Path) -> Reading:
    usage = _read_int(where / "memory.usage_in_bytes")
    stat = parse_keyed((where / "memory.stat").read_text())
    limit = _read_int(where / "memory.limit_in_bytes")
    return Reading(
        0,
        None,
        max(0, usage - stat.get("total_inactive_file", 0)),
        usage=usage,
        rss=stat.get("total_rss"),
        limit=limit if limit < _UNLIMITED else None,
        page_faults=stat.get("total_pgfault"),
        major_page_faults=stat.get("total_pgmajfault"),
    )


def _v2_memory(where: Path) -> Reading:
    usage = _read_int(where / "memory.current")
    stat = parse_keyed((where / "memory.stat").read_text())
    limit: int | None = None
    try:
        raw = (where / "memory.max").read_text().strip()
        limit = None if raw == "max" else int(raw)
    except OSError:
        pass
    return Reading(
        0,
        None,
        max(0, usage - stat.get("inactive_file", 0)),
        usage=usage,
        rss=stat.get("anon"),
        limit=limit,
        page_faults=stat.get("pgfault"),
        major_page_faults=stat.get("pgmajfault"),
    )
