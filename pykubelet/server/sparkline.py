"""Sparklines for the status page: a series of values as a small inline SVG, drawn on the
server (no script, no library).

- The vertical scale runs from 0 to the series' largest value (a flat series at 0 draws along
  the bottom), so two charts of the same pod compare by shape, and the latest value is text.
- A missing value (None: no CPU rate on a pod's first sample) breaks the line: the path starts
  a new segment after it; a lone point shows as a dot.
- Everything that is not a number is escaped (the title is the only text).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 120
HEIGHT = 24
PAD = 2.0  # keeps the stroke inside the box


def _fmt(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def path(values: Sequence[float | None], width: int = WIDTH, height: int = HEIGHT) -> str:
    """The SVG path data of `values` across `width` x `height`; "" with fewer than two
    values (one sample is no line yet)."""
    if len(values) < 2:
        return ""
    top = max((v for v in values if v is not None), default=0.0)
    scale = (height - 2 * PAD) / top if top > 0 else 0.0
    step = (width - 2 * PAD) / (len(values) - 1)
    segments: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            segments.append([])
            continue
        x = PAD + i * step
        y = height - PAD - max(0.0, value) * scale
        segments[-1].append(f"{_fmt(x)} {_fmt(y)}")
    # A lone point is a zero-length line: with round caps it shows as a dot.
    return " ".join(
        "M" + " L".join(points) + (" h0" if len(points) == 1 else "")
        for points in segments
        if points
    )


def svg(values: Sequence[float | None], title: str, css_class: str = "spark") -> str:
    """An inline <svg> of `values` with `title` as its tooltip and accessible name."""
    d = path(values)
    line = (
        f'<path d="{d}" fill="none" stroke="currentColor" stroke-width="1.5" '
        'stroke-linecap="round"/>'
        if d
        else ""
    )
    return (
        f'<svg class="{escape(css_class)}" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{line}</svg>"
    )
