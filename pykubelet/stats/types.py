"""What one sample of the node's resource usage holds, and the read-only view of the latest.

A sample is immutable: the collector replaces it whole, so a reader (the HTTP handlers,
eviction and the status page) never sees one half updated. Units are the kubelet's Summary API
units: CPU as cumulative core-nanoseconds and a rate in nanocores, memory and file systems in
bytes and inodes.

The values are NamedTuples: immutable, and made in a third of the time of a frozen dataclass (a
sample makes several per container, every 10 s).
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple, Protocol


class CpuUsage(NamedTuple):
    time: datetime  # when it was read
    usage_core_nanoseconds: int  # cumulative, since the container (node: boot) started
    usage_nano_cores: int | None = None  # the rate since the previous sample; None on the first

    @property
    def seconds(self) -> float:
        return self.usage_core_nanoseconds / 1e9


class MemoryUsage(NamedTuple):
    time: datetime
    working_set_bytes: int  # usage minus inactive file: what the kernel cannot just drop
    usage_bytes: int | None = None
    rss_bytes: int | None = None
    available_bytes: int | None = None  # the limit (node: capacity) minus the working set
    page_faults: int | None = None
    major_page_faults: int | None = None


class FsStats(NamedTuple):
    """The Summary API's FsStats: a file system's totals (None: not measured) and what one
    thing (a container's writable layer, its logs, a volume, a pod) uses of it."""

    time: datetime
    available_bytes: int | None = None
    capacity_bytes: int | None = None
    used_bytes: int | None = None
    inodes_free: int | None = None
    inodes: int | None = None
    inodes_used: int | None = None


class VolumeStats(NamedTuple):
    name: str  # the volume's name in the pod spec
    plugin: str  # its directory's plugin (kubernetes.io~empty-dir, ...); not in the Summary API
    fs: FsStats


class ContainerStats(NamedTuple):
    name: str
    id: str  # the runtime's container ID (the rate is computed per ID: a restart starts anew)
    start_time: datetime
    cpu: CpuUsage | None
    memory: MemoryUsage | None
    rootfs: FsStats | None = None  # its writable layer (None: the runtime has none or cannot say)
    logs: FsStats | None = None  # its log files


class PodStats(NamedTuple):
    uid: str
    name: str
    namespace: str
    start_time: datetime
    containers: tuple[ContainerStats, ...]
    # The sums of its containers' usage (the time: the latest of theirs); None when no
    # container could be measured.
    cpu: CpuUsage | None
    memory: MemoryUsage | None
    volumes: tuple[VolumeStats, ...] = ()
    # Its containers' writable layers and logs, its volumes and the files the agent keeps for
    # it (etc-hosts): the kubelet's calcEphemeralStorage. None: storage not sampled.
    ephemeral_storage: FsStats | None = None


class NodeStats(NamedTuple):
    node_name: str
    start_time: datetime  # the machine's boot
    time: datetime  # when this sample was taken
    cpu: CpuUsage | None
    memory: MemoryUsage | None
    pods: tuple[PodStats, ...] = ()
    fs: FsStats | None = None  # the --root-dir file system
    image_fs: FsStats | None = None  # where the runtime keeps its images (None: it has none)
    # What went wrong in this sample (the runtime could not list its pods, ...): the kubelet's
    # `scrape_error` 1. A container that exited while it was read is no error.
    errors: tuple[str, ...] = ()


class UsagePoint(NamedTuple):
    """One sample of a pod's usage in its history: CPU cores (None on the pod's first sample,
    which has no rate yet) and the memory working set in bytes."""

    time: datetime
    cpu_cores: float | None
    memory_bytes: int | None


class UsageHistory(Protocol):
    """A pod's recent usage, oldest first (the status page's charts)."""

    def history(self, uid: str) -> tuple[UsagePoint, ...]:
        """The pod's last samples (at most `HISTORY_SAMPLES`); () for a pod not sampled."""
        ...


class StatsView(Protocol):
    """The read-only side of the collector: what the HTTP handlers, eviction and the status
    page read."""

    def latest(self) -> NodeStats | None:
        """The latest sample; None until the first one is taken."""
        ...

    def history(self, uid: str) -> tuple[UsagePoint, ...]:
        """The pod's last samples, oldest first; () for a pod not sampled."""
        ...
