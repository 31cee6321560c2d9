"""Percentiles without numpy."""

from __future__ import annotations

import math


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
