"""The machine this agent runs on, read in one place: CPUs, memory, the storage of --root-dir,
and the identity the Node reports (machine ID, boot ID, kernel, OS image, architecture).

What does not change while the agent runs; read once, in a thread (it reads files).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


@dataclass(frozen=True)
class MachineFacts:
    """What does not change while the agent runs; read once, in a thread."""

    cpus: int
    memory_kib: int
    storage_bytes: int
    hostname: str
    machine_id: str
    boot_id: str
    system_uuid: str
    kernel: str
    os_image: str
    arch: str
    pid_max: int = 0  # /proc/sys/kernel/pid_max: the pids the node has (the kubelet's pid capacity)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def read_machine_facts(root_dir: Path) -> MachineFacts:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    memory = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            memory = int(line.split()[1])
    try:
        storage = shutil.disk_usage(root_dir if root_dir.exists() else "/").total
    except OSError:
        storage = 0
    os_image = "Linux"
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            os_image = line.split("=", 1)[1].strip().strip('"')
    machine_id = _read("/etc/machine-id")
    return MachineFacts(
        cpus=cpus,
        memory_kib=memory,
        storage_bytes=storage,
        hostname=socket.gethostname(),
        machine_id=machine_id,
        boot_id=_read("/proc/sys/kernel/random/boot_id"),
        system_uuid=_read("/sys/class/dmi/id/product_uuid") or machine_id,
        kernel=platform.release(),
        os_image=os_image,
        arch=_ARCH.get(platform.machine(), platform.machine()),
        pid_max=int(_read("/proc/sys/kernel/pid_max") or 0),
    )
