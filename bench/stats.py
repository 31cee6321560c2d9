"""Percentiles without numpy, and the medians of repeated runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    # Nearest-rank, as latency SLOs are stated.
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def percentiles(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 4),
        "p90": round(percentile(values, 90), 4),
        "p99": round(percentile(values, 99), 4),
        "max": round(max(values), 4) if values else math.nan,
        "count": len(values),
    }


def median_item(items: Sequence[T], key: Callable[[T], float]) -> T:
    """The item whose key is the median (the lower middle one of an even count)."""
    ordered = sorted(items, key=key)
    return ordered[(len(ordered) - 1) // 2]


def runs_range(values: list[float], unit: str, digits: int = 2) -> str:
    """ "median of N pairs, LOW-HIGH<unit>" for repeated runs' figures; "" for fewer than two."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    return f"median of {len(values)} pairs, {low:.{digits}f}-{high:.{digits}f}{unit}"
