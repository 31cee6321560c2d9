"""Node allocatable: what the node offers its pods once the system's share is set aside.

As the kubelet (pkg/kubelet/cm/node_container_manager_linux.go, eviction/helpers.go):

    allocatable = capacity - kube-reserved - system-reserved - hard eviction threshold

per resource, never below 0. Only two hard thresholds reserve anything: `memory.available`
(from memory) and `nodefs.available` (from ephemeral-storage), each a quantity or a percentage
of that resource's capacity (the kubelet's float32 percentage, truncated to whole bytes). The
other signals (`nodefs.inodesFree`, `imagefs.available`, `pid.available`, ...) are parsed and
kept for eviction but reserve nothing. Reservations may also name `pid`, which reduces no
reported resource: it sizes the pods' cgroup only.

The pods' cgroup (`kubepods`, with `--enforce-node-allocatable=pods`) gets capacity minus the
reservations but not the eviction threshold (the kubelet's getNodeAllocatableInternalAbsolute):
the eviction manager acts on the threshold before the kernel's OOM killer does.

The values here are already parsed (cmd/ parses the flags and the KubeletConfiguration with the
one quantity parser); this module is the arithmetic and the Node's quantities.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from pykubelet.common.machine import MachineFacts

# What --kube-reserved and --system-reserved may name (the kubelet's parseResourceList).
RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")
# Every eviction signal the kubelet knows (eviction/api/types.go); all compare with "<".
SIGNALS = (
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
)


_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def percentage(text: str) -> float:
    """The fraction of a "10%" (the kubelet's parsePercentage: a float32 divided by 100 in
    float32). Raises ValueError for what is not a decimal number."""
    number = text.rstrip("%")
    if not _DECIMAL.fullmatch(number):
        raise ValueError(f"invalid percentage {text!r}")
    return float32(float32(float(number)) / 100)


# --enforce-node-allocatable's keys (pkg/kubelet/types/constants.go).
ENFORCE_PODS = "pods"
ENFORCE_SYSTEM_RESERVED = "system-reserved"
ENFORCE_KUBE_RESERVED = "kube-reserved"
ENFORCE_NONE = "none"
ENFORCEMENT_KEYS = (ENFORCE_PODS, ENFORCE_SYSTEM_RESERVED, ENFORCE_KUBE_RESERVED, ENFORCE_NONE)
# The signal that reserves from each resource.
_RESERVING = {"memory": "memory.available", "ephemeral-storage": "nodefs.available"}


def float32(value: float) -> float:
    """`value` rounded to a float32, as Go's `float32(...)`."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


@dataclass(frozen=True)
class Reserved:
    """`--kube-reserved` or `--system-reserved`: resource -> amount (cpu in millicores, memory
    and ephemeral-storage in bytes, pid a count), and the text as given (for /configz)."""

    amounts: Mapping[str, int] = field(default_factory=dict)
    given: Mapping[str, str] = field(default_factory=dict)

    def get(self, resource: str) -> int:
        return self.amounts.get(resource, 0)


@dataclass(frozen=True)
class Threshold:
    """One hard eviction threshold: `signal < quantity` or `signal < percentage` of capacity."""

    signal: str
    given: str  # as written: "100Mi", "10%"
    quantity: int | None = None  # bytes, inodes or pids
    percentage: float | None = None  # a fraction (0.1 for 10%), float32 as the kubelet's

    def amount(self, capacity: int) -> int:
        """The threshold in the units of `capacity` (evictionapi.GetThresholdQuantity)."""
        if self.quantity is not None:
            return self.quantity
        return int(float(capacity) * (self.percentage or 0.0))


# The kubelet's DefaultEvictionHard on Linux; a given --eviction-hard replaces it wholesale.
DEFAULT_THRESHOLDS = (
    Threshold("memory.available", "100Mi", quantity=100 << 20),
    Threshold("nodefs.available", "10%", percentage=percentage("10%")),
    Threshold("nodefs.inodesFree", "5%", percentage=percentage("5%")),
    Threshold("imagefs.available", "15%", percentage=percentage("15%")),
)


@dataclass(frozen=True)
class NodeResources:
    """Capacity, what is reserved from it and allocatable, per resource: cpu in millicores,
    memory and ephemeral-storage in bytes, pods a count."""

    capacity: Mapping[str, int]
    reserved: Mapping[str, int]  # kube-reserved + system-reserved + hard eviction threshold
    allocatable: Mapping[str, int]
    pods_cgroup: Mapping[str, int]  # capacity - reservations (no threshold): kubepods' limits

    def node_quantities(self, which: str) -> dict[str, str]:
        """`capacity` or `allocatable` as the Node's ResourceList reports them."""
        values = self.capacity if which == "capacity" else self.allocatable
        return {name: format_quantity(name, value) for name, value in values.items()}

    def problems(self) -> list[str]:
        """The kubelet's validateNodeAllocatable: reserving more than there is refuses the
        start (its message names the reservation first, then what would be left)."""
        out = []
        for name, reserved in self.reserved.items():
            left = self.capacity[name] - reserved
            if left < 0:
                out.append(
                    f'Resource "{name}" has an allocatable of '
                    f"{format_quantity(name, reserved)}, capacity of {format_quantity(name, left)}"
                )
        return out


def format_quantity(resource: str, value: int) -> str:
    """A canonical quantity: cpu in cores or millicores, memory with a binary suffix when whole,
    storage and counts as plain numbers."""
    if resource == "cpu":
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    if resource == "memory" and value:
        # The largest binary suffix that divides it, as a BinarySI quantity prints.
        for power, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
            if value % (1 << (10 * power)) == 0:
                return f"{value >> (10 * power)}{suffix}"
    return str(value)


def node_resources(
    facts: MachineFacts,
    max_pods: int,
    kube_reserved: Reserved,
    system_reserved: Reserved,
    eviction_hard: tuple[Threshold, ...],
) -> NodeResources:
    capacity = {
        "cpu": facts.cpus * 1000,
        "memory": facts.memory_kib * 1024,
        "ephemeral-storage": facts.storage_bytes,
        "pods": max_pods,
    }
    thresholds = {t.signal: t for t in eviction_hard}
    reserved: dict[str, int] = {}
    allocatable: dict[str, int] = {}
    pods_cgroup: dict[str, int] = {}
    for name, value in capacity.items():
        kept = kube_reserved.get(name) + system_reserved.get(name)
        pods_cgroup[name] = max(value - kept, 0)
        threshold = thresholds.get(_RESERVING.get(name, ""))
        if threshold is not None:
            kept += threshold.amount(value)
        reserved[name] = kept
        allocatable[name] = max(value - kept, 0)
    reserved_pids = kube_reserved.get("pid") + system_reserved.get("pid")
    if reserved_pids:
        pods_cgroup["pid"] = max(facts.pid_max - reserved_pids, 0)
    return NodeResources(capacity, reserved, allocatable, pods_cgroup)
