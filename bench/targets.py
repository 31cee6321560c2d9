"""The targets of issue 19 a bench run measured, each PASS or MISS, printed as one table.

Each bench section turns its own results into `Target` rows (its `targets(...)` function);
`python -m bench` collects the rows of the sections it ran, prints `table(rows)` last and keeps
them in results.json. A section adds a target with `Target(...)` or `at_most(...)`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    what: str  # "process runtime, 100 manifests: p99 start / floor"
    goal: str  # "≤ 1.3x"
    measured: str  # "1.12x (0.210 s / 0.188 s)"
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def at_most(what: str, value: float, limit: float, unit: str, detail: str = "") -> Target:
    """value ≤ limit; unit "x" is a ratio, "s", "ms", "%" or "MiB" a quantity."""
    shown = f"{value:.2f}x" if unit == "x" else f"{value:.3g} {unit}"
    goal = f"≤ {limit:g}x" if unit == "x" else f"< {limit:g} {unit}"
    measured = f"{shown} ({detail})" if detail else shown
    return Target(what, goal, measured, not math.isnan(value) and value <= limit)


def table(rows: list[Target]) -> list[str]:
    if not rows:
        return []
    width = max(len(r.what) for r in rows)
    goal = max(len(r.goal) for r in rows)
    measured = max(len(r.measured) for r in rows)
    lines = [f"{'target':<{width}}  {'goal':<{goal}}  {'measured':<{measured}}  result"]
    for r in rows:
        verdict = "PASS" if r.passed else "MISS"
        lines.append(f"{r.what:<{width}}  {r.goal:<{goal}}  {r.measured:<{measured}}  {verdict}")
    passed = sum(r.passed for r in rows)
    lines.append(f"{passed} of {len(rows)} targets met")
    return lines
