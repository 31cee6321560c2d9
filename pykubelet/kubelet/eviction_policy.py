"""What the eviction manager decides, without doing it (pure, the clock given): as the kubelet's
pkg/kubelet/eviction/helpers.go and the state part of eviction_manager.go's synchronize.

- A threshold is met when its signal's observed available amount is below its quantity (or
  percentage of the signal's capacity); a threshold met before stays met until the available
  amount is back above the quantity plus its minimum reclaim (`--eviction-minimum-reclaim`).
- A node condition (MemoryPressure, DiskPressure, PIDPressure) is True while one of its
  thresholds is met, and for `--eviction-pressure-transition-period` after that was last
  seen, so the condition does not flap.
- Eviction acts on the thresholds met for their grace period: 0 for hard ones, the signal's
  `--eviction-soft-grace-period` for soft ones; memory before the others.
- Pods are ranked as the kubelet ranks them: for memory, the pods using more than they
  request first, then by priority (lowest first), then by usage above the request; for disk,
  the same with ephemeral storage (the kubelet's podDiskUsage: its containers' writable layers
  and logs, and its local volumes: emptyDirs not in memory, configMaps; hostPaths have no
  stats); for pids, by priority then by the number of processes.
- The message of an eviction is the kubelet's: "The node was low on resource: memory.
  Threshold quantity: 100Mi, available: 42Mi. Container x was using 200Mi, request is 0, has
  larger consumption of memory. "
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cmp_to_key

from pykubelet.api.model import Pod
from pykubelet.api.quantity import to_bytes
from pykubelet.common.allocatable import Threshold
from pykubelet.stats.types import FsStats, PodStats

# The kubelet's eviction Reason, and its messages (eviction/helpers.go).
REASON = "Evicted"
NODE_LOW_MESSAGE = "The node was low on resource: {}. "
THRESHOLD_MET_MESSAGE = "Threshold quantity: {}, available: {}. "
CONTAINER_MESSAGE = "Container {} was using {}, request is {}, has larger consumption of {}. "
NODE_CONDITION_MESSAGE = "The node had condition: [{}]. "
POD_STORAGE_MESSAGE = "Pod ephemeral local storage usage exceeds the total limit of containers {}. "
CONTAINER_STORAGE_MESSAGE = 'Container {} exceeded its local ephemeral storage limit "{}". '

MEMORY_PRESSURE = "MemoryPressure"
DISK_PRESSURE = "DiskPressure"
PID_PRESSURE = "PIDPressure"
CONDITIONS = (MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE)

# The resource each signal reclaims (signalToResource) and the condition it sets.
SIGNAL_RESOURCE = {
    "memory.available": "memory",
    "allocatableMemory.available": "memory",
    "nodefs.available": "ephemeral-storage",
    "nodefs.inodesFree": "inodes",
    "imagefs.available": "ephemeral-storage",
    "imagefs.inodesFree": "inodes",
    "containerfs.available": "ephemeral-storage",
    "containerfs.inodesFree": "inodes",
    "pid.available": "pids",
}
RESOURCE_CONDITION = {
    "memory": MEMORY_PRESSURE,
    "ephemeral-storage": DISK_PRESSURE,
    "inodes": DISK_PRESSURE,
    "pids": PID_PRESSURE,
}
# kubelettypes.IsCriticalPodBasedOnPriority: system-cluster-critical and above.
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000


@dataclass(frozen=True)
class Rule:
    """One eviction threshold as the manager applies it."""

    value: Threshold
    hard: bool
    grace_period: float = 0.0  # seconds the threshold must hold before eviction (soft)
    min_reclaim: Threshold | None = None

    @property
    def signal(self) -> str:
        return self.value.signal

    @property
    def resource(self) -> str:
        return SIGNAL_RESOURCE[self.signal]


def rules(
    hard: Iterable[Threshold],
    soft: Iterable[Threshold] = (),
    grace_periods: Mapping[str, float] | None = None,
    minimum_reclaim: Mapping[str, Threshold] | None = None,
) -> tuple[Rule, ...]:
    """The kubelet's ParseThresholdConfig once the flags are parsed: hard, then soft with their
    grace periods, each with its signal's minimum reclaim."""
    graces = grace_periods or {}
    reclaims = minimum_reclaim or {}
    out = [Rule(t, True, 0.0, reclaims.get(t.signal)) for t in hard]
    out += [Rule(t, False, graces.get(t.signal, 0.0), reclaims.get(t.signal)) for t in soft]
    return tuple(out)


@dataclass(frozen=True)
class Observation:
    """A signal's observed value: available and the capacity percentages are taken of."""

    available: int
    capacity: int


def format_amount(resource: str, value: int) -> str:
    """A quantity as the kubelet prints it: bytes as BinarySI (42Mi when exact, else the
    number), counts as DecimalSI (2k when exact)."""
    if value == 0:
        return "0"
    binary = resource in ("memory", "ephemeral-storage")
    base, suffixes = (1024, ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")) if binary else (
        1000, ("k", "M", "G", "T", "P", "E")
    )  # fmt: skip
    suffix, amount = "", value
    for candidate in suffixes:
        if amount % base:
            break
        amount //= base
        suffix = candidate
    return f"{amount}{suffix}"


def _quantity(rule: Rule, observation: Observation, enforce_min_reclaim: bool) -> int:
    amount = rule.value.amount(observation.capacity)
    if enforce_min_reclaim and rule.min_reclaim is not None:
        amount += rule.min_reclaim.amount(observation.capacity)
    return amount


def thresholds_met(
    candidates: Iterable[Rule],
    observations: Mapping[str, Observation],
    enforce_min_reclaim: bool,
) -> list[Rule]:
    """The rules whose signal is observed below their quantity (plus their minimum reclaim
    when `enforce_min_reclaim`); an unobserved signal meets nothing."""
    out = []
    for rule in candidates:
        observed = observations.get(rule.signal)
        if observed is not None and _quantity(rule, observed, enforce_min_reclaim) > (
            observed.available
        ):
            out.append(rule)
    return out


@dataclass
class PressureState:
    """The manager's memory between observations (synchronize's state): when each met
    threshold was first seen, when each condition was last seen, what was met last time."""

    transition_period: float
    first_observed: dict[Rule, float] = field(default_factory=dict)
    condition_last_observed: dict[str, float] = field(default_factory=dict)
    met: list[Rule] = field(default_factory=list)
    conditions: frozenset[str] = frozenset()

    def update(
        self, all_rules: Sequence[Rule], observations: Mapping[str, Observation], now: float
    ) -> list[Rule]:
        """Take an observation; returns the thresholds to act on now (grace periods met),
        memory first."""
        met = thresholds_met(all_rules, observations, False)
        # Those met last time stay met until their minimum reclaim is satisfied.
        for rule in thresholds_met(self.met, observations, True):
            if rule not in met:
                met.append(rule)
        self.first_observed = {r: self.first_observed.get(r, now) for r in met}
        for rule in met:
            self.condition_last_observed[RESOURCE_CONDITION[rule.resource]] = now
        self.condition_last_observed = {
            c: at
            for c, at in self.condition_last_observed.items()
            if now - at < self.transition_period or at == now
        }
        self.conditions = frozenset(self.condition_last_observed)
        due = [r for r in met if now - self.first_observed[r] >= r.grace_period]
        self.met = due
        return sorted(due, key=_eviction_priority)


def _eviction_priority(rule: Rule) -> int:
    # byEvictionPriority: memory first, then the rest as they came.
    return 0 if rule.resource == "memory" else 1


# --- the pods -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodUsage:
    """What one pod uses, as far as it was measured (None: not measured)."""

    memory: int | None = None  # working set, bytes
    containers_memory: Mapping[str, int] = field(default_factory=dict)  # by container name
    disk: int | None = None  # writable layers + logs + local volumes, bytes
    inodes: int | None = None
    processes: int | None = None


def local_volume_names(pod: Pod) -> set[str]:
    """The kubelet's localVolumeNames: the pod's volumes on the node's disk (hostPath, emptyDir
    not in memory, configMap; its gitRepo has no pykubelet counterpart)."""
    return {
        v.name
        for v in pod.spec.volumes or []
        if v.host_path is not None
        or (v.empty_dir is not None and v.empty_dir.medium != "Memory")
        or v.config_map is not None
    }


def pod_disk_usage(pod: Pod, stats: PodStats) -> PodUsage:
    """The kubelet's podDiskUsage over a sample: the containers' writable layers and logs, and
    the pod's local volumes (bytes and inodes; what was not measured counts 0)."""
    parts = [fs for c in stats.containers for fs in (c.rootfs, c.logs) if fs is not None]
    local = local_volume_names(pod)
    parts += [v.fs for v in stats.volumes if v.name in local]
    return PodUsage(
        disk=sum(p.used_bytes or 0 for p in parts),
        inodes=sum(p.inodes_used or 0 for p in parts),
    )


def _used(fs: FsStats | None) -> int:
    return fs.used_bytes or 0 if fs is not None else 0


def storage_limit_message(pod: Pod, stats: PodStats) -> str | None:
    """Why the kubelet's local-storage eviction evicts the pod for its ephemeral-storage
    limits, or None: the pod's ephemeral storage (all of it, as the Summary API sums it) above
    the sum of its containers' limits (an init container's alone where larger, as PodLimits),
    else a container's writable layer and logs above its own limit (the image file system is
    the node's here, so the layer counts)."""
    limits = [
        (c.name, raw)
        for c in pod.spec.containers
        if (raw := c.resources.limits.get("ephemeral-storage")) is not None
    ]
    init = [
        raw
        for c in pod.spec.init_containers
        if (raw := c.resources.limits.get("ephemeral-storage")) is not None
    ]
    if limits or init:
        total = sum(to_bytes(raw) for _, raw in limits)
        text = str(limits[0][1]) if len(limits) == 1 else format_amount("ephemeral-storage", total)
        for raw in init:
            if to_bytes(raw) > total:
                total, text = to_bytes(raw), str(raw)
        if _used(stats.ephemeral_storage) > total:
            return POD_STORAGE_MESSAGE.format(text)
    by_name = {name: raw for name, raw in limits if to_bytes(raw) != 0}
    for container in stats.containers:
        raw = by_name.get(container.name)
        if raw is not None and _used(container.logs) + _used(container.rootfs) > to_bytes(raw):
            return CONTAINER_STORAGE_MESSAGE.format(container.name, raw)
    return None


def priority(pod: Pod) -> int:
    return pod.spec.priority or 0


def is_critical(pod: Pod, static: bool) -> bool:
    """kubelettypes.IsCriticalPod: static (and mirror) pods, and priority >= 2000000000."""
    return static or priority(pod) >= SYSTEM_CRITICAL_PRIORITY


def _request(pod: Pod, resource: str) -> int:
    total = 0
    for container in pod.spec.containers:
        raw = container.resources.requests.get(resource)
        if raw is None:
            raw = container.resources.limits.get(resource)
        if raw is not None:
            total += to_bytes(raw)
    return total


def _usage(resource: str, usage: PodUsage | None) -> int | None:
    if usage is None:
        return None
    return {
        "memory": usage.memory,
        "ephemeral-storage": usage.disk,
        "inodes": usage.inodes,
        "pids": usage.processes,
    }[resource]


def rank(resource: str, pods: Sequence[Pod], usage: Mapping[str, PodUsage]) -> list[Pod]:
    """The pods in the order the kubelet evicts them to reclaim `resource`."""

    def used(pod: Pod) -> int | None:
        return _usage(resource, usage.get(pod.uid))

    def exceeds(a: Pod, b: Pod) -> int:
        # exceedMemoryRequests / exceedDiskRequests: a pod without stats first, then those
        # using more than they ask.
        ua, ub = used(a), used(b)
        if ua is None or ub is None:
            return _cmp_bool(ua is None, ub is None)
        return _cmp_bool(ua > _request(a, resource), ub > _request(b, resource))

    def by_priority(a: Pod, b: Pod) -> int:
        return (priority(a) > priority(b)) - (priority(a) < priority(b))

    def by_usage(a: Pod, b: Pod) -> int:
        # memory / disk: the larger usage above the request first (pids: more processes).
        ua, ub = used(a), used(b)
        if ua is None or ub is None:
            return _cmp_bool(ua is None, ub is None)
        if resource != "pids":
            ua, ub = ua - _request(a, resource), ub - _request(b, resource)
        return (ub > ua) - (ub < ua)

    order = [by_priority, by_usage] if resource == "pids" else [exceeds, by_priority, by_usage]

    def compare(a: Pod, b: Pod) -> int:
        for one in order:
            result = one(a, b)
            if result:
                return result
        return 0

    return sorted(pods, key=cmp_to_key(compare))


def _cmp_bool(a: bool, b: bool) -> int:
    # The kubelet's cmpBool: true sorts first.
    if a == b:
        return 0
    return -1 if a else 1


def eviction_message(
    rule: Rule, observation: Observation | None, pod: Pod, usage: PodUsage | None
) -> str:
    """The kubelet's evictionMessage for a pod evicted to reclaim `rule`'s resource."""
    resource = rule.resource
    message = NODE_LOW_MESSAGE.format(resource)
    if observation is not None:
        message += THRESHOLD_MET_MESSAGE.format(
            _threshold_text(rule, observation), format_amount(resource, observation.available)
        )
    if resource == "memory" and usage is not None:
        for container in pod.spec.containers:
            used = usage.containers_memory.get(container.name)
            raw = container.resources.requests.get("memory")
            request = to_bytes(raw) if raw is not None else 0
            if used is not None and used > request:
                message += CONTAINER_MESSAGE.format(
                    container.name,
                    format_amount(resource, used),
                    raw if raw is not None else "0",
                    resource,
                )
    return message


def _threshold_text(rule: Rule, observation: Observation) -> str:
    if rule.value.quantity is not None:
        return rule.value.given
    return format_amount(rule.resource, rule.value.amount(observation.capacity))


def admit_message(conditions: Iterable[str]) -> str:
    """The eviction admit handler's refusal (the conditions in the kubelet's order)."""
    present = [c for c in CONDITIONS if c in set(conditions)]
    return NODE_CONDITION_MESSAGE.format(" ".join(present))
