"""The numbers the kubelet derives from resource quantities for cgroups and engines."""

from __future__ import annotations

from pykubelet.api.quantity import to_millicpu

CPU_PERIOD = 100_000  # microseconds, as the kubelet sets it
MIN_CPU_QUOTA = 1_000
MIN_CPU_SHARES = 2
MAX_CPU_SHARES = 262_144


def cpu_shares(milli: int) -> int:
    """The kubelet's MilliCPUToShares: no request still gets the minimum weight, 2."""
    return min(max(milli * 1024 // 1000, MIN_CPU_SHARES), MAX_CPU_SHARES)


def cpu_quota(milli: int) -> int:
    """The kubelet's MilliCPUToQuota for a 100 ms period, at least 1 ms."""
    return max(milli * CPU_PERIOD // 1000, MIN_CPU_QUOTA)


def cpu_weight(shares: int) -> int:
    """cgroup v2's cpu.weight for v1 shares, the conversion runc and the kubelet use."""
    return 1 + ((shares - MIN_CPU_SHARES) * 9999) // (MAX_CPU_SHARES - MIN_CPU_SHARES)


def request_milli_cpu(limits: dict[str, str], requests: dict[str, str]) -> int:
    """The cpu request; as the API server defaults it, a limit alone is also the request."""
    value = requests.get("cpu", limits.get("cpu"))
    return 0 if value is None else to_millicpu(value)
