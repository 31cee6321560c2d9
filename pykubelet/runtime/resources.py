"""Kubernetes resource quantities, and the numbers the kubelet derives from them for cgroups."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

CPU_PERIOD = 100_000  # microseconds, as the kubelet sets it
MIN_CPU_QUOTA = 1_000
MIN_CPU_SHARES = 2
MAX_CPU_SHARES = 262_144

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"m": -1, "": 0, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]))?$"
)


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("128Mi", "0.5", "500m", "1e3") as a number."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"invalid quantity {text!r}")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number)
        if exponent:
            return value * (Decimal(10) ** int(exponent[1:]))
        suffix = suffix or ""
        if suffix in _BINARY:
            return value * Decimal(1024 ** _BINARY[suffix])
        return value * (Decimal(1000) ** _DECIMAL[suffix])
    except InvalidOperation as e:
        raise ValueError(f"invalid quantity {text!r}") from e


def memory_bytes(text: str) -> int:
    """A memory quantity in bytes, rounded up as the kubelet's Quantity.Value()."""
    return math.ceil(parse_quantity(text))


def milli_cpu(text: str) -> int:
    return math.ceil(parse_quantity(text) * 1000)


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
    return 0 if value is None else milli_cpu(value)
