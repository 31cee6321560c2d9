"""The eviction signals read from the machine (blocking: called in a thread), as the kubelet's
makeSignalObservations over its summary:

- `nodefs.available` / `nodefs.inodesFree`: statvfs of the `--root-dir` file system (available
  blocks to unprivileged users, free inodes, and their totals); `imagefs.*` are the same
  observation (pykubelet keeps no image file system of its own: the process runtime has no
  images, and the engines' are not measured), as the kubelet does when the image file system
  is the node's.
- `pid.available`: the kernel's pid limit (the smaller of kernel.pid_max and
  kernel.threads-max) minus the tasks that exist now (/proc/loadavg's total, what sysinfo's
  procs counts).
- `memory.available` is the stats collector's (node memory capacity minus working set); it is
  not read here.
- per pod: its ephemeral storage (the pod's directories under --root-dir: volumes and, for the
  process runtime, its logs; other mounts are not crossed, so a tmpfs or a hostPath is not
  counted) and inodes, and its processes (the containers' main processes and their
  descendants).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pykubelet.kubelet.eviction_policy import Observation
from pykubelet.stats.storage import DiskUsage, disk_usage

__all__ = ["DiskUsage", "disk_usage", "fs_observations", "pid_observation", "pod_paths"]

FS_SIGNALS = ("nodefs", "imagefs")


def fs_observations(root_dir: Path) -> dict[str, Observation]:
    st = os.statvfs(root_dir)
    available = Observation(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)
    inodes = Observation(st.f_favail, st.f_files)
    out: dict[str, Observation] = {}
    for fs in FS_SIGNALS:
        out[f"{fs}.available"] = available
        if st.f_files:  # file systems without inodes (btrfs reports 0) have no inode signal
            out[f"{fs}.inodesFree"] = inodes
    return out


def pid_observation(proc: Path = Path("/proc")) -> Observation:
    limits = []
    for name in ("pid_max", "threads-max"):
        try:
            limits.append(int((proc / "sys" / "kernel" / name).read_text()))
        except (OSError, ValueError):
            continue
    limit = min(limits) if limits else 32768
    running = int((proc / "loadavg").read_text().split()[3].split("/")[1])
    return Observation(max(0, limit - running), limit)


def pod_paths(root_dir: Path, uid: str) -> list[Path]:
    """The directories of a pod under --root-dir: its volumes and its runtime's files (logs)."""
    out = [root_dir / "pods" / uid]
    runtime = root_dir / "runtime"
    try:
        backends = list(runtime.iterdir())
    except OSError:
        backends = []
    out += [backend / uid for backend in backends]
    return [p for p in out if p.exists()]


def process_counts(roots: Mapping[str, list[int]], proc: Path = Path("/proc")) -> dict[str, int]:
    """By key (a pod), the processes that are one of its pids or descend from one."""
    children: dict[int, list[int]] = {}
    with os.scandir(proc) as entries:
        names = [e.name for e in entries if e.name.isdigit()]
    for name in names:
        try:
            text = (proc / name / "stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    alive = {pid for kids in children.values() for pid in kids}
    out: dict[str, int] = {}
    for key, pids in roots.items():
        found: set[int] = set()
        todo = [p for p in pids if p in alive]
        while todo:
            current = todo.pop()
            if current in found:
                continue
            found.add(current)
            todo.extend(children.get(current, []))
        out[key] = len(found)
    return out
