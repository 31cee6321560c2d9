"""The status page's sparklines and usage column: the SVG path, the scale, escaping."""

from __future__ import annotations

from datetime import UTC, datetime

from pykubelet.server import sparkline, status_page
from pykubelet.stats.types import UsagePoint

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_path_spans_the_box_from_zero_to_the_largest_value() -> None:
    assert sparkline.path([]) == "" and sparkline.path([1.0]) == ""  # one sample: no line yet
    # 120 x 24 with a 2 px margin: x from 2 to 118, y from 22 (0) to 2 (the largest).
    assert sparkline.path([0.0, 1.0, 0.5]) == "M2 22 L60 2 L118 12"
    assert sparkline.path([0.0, 0.0]) == "M2 22 L118 22"  # flat at 0: along the bottom


def test_a_missing_value_breaks_the_line() -> None:
    assert sparkline.path([None, 2.0, 4.0]) == "M60 12 L118 2"
    assert sparkline.path([None, 0.5]) == "M118 2 h0"  # the first CPU rate: a dot
    assert sparkline.path([1.0, None, 1.0]) == "M2 2 h0 M118 2 h0"


def test_the_title_is_escaped() -> None:
    out = sparkline.svg([1.0, 2.0], 'a<b>"c"&', "spark")
    assert "<b>" not in out and "&lt;b&gt;" in out and "&quot;c&quot;" in out
    assert out.startswith("<svg") and '<path d="M2 22' not in out and "<path d=" in out


class History:
    def __init__(self, points: dict[str, tuple[UsagePoint, ...]]) -> None:
        self.points = points

    def history(self, uid: str) -> tuple[UsagePoint, ...]:
        return self.points.get(uid, ())


def pod(name: str, uid: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }


def test_the_page_charts_each_pod_and_shows_the_pressure_conditions() -> None:
    points = (
        UsagePoint(T0, None, 40 << 20),
        UsagePoint(T0, 0.25, 50 << 20),
    )
    html = status_page.render(
        "n1",
        [pod("web<script>", "u1"), pod("idle", "u2")],
        [],
        T0,
        history=History({"u1": points}),
        pressure=lambda: frozenset({"MemoryPressure"}),
    )
    assert "web&lt;script&gt;" in html and "web<script>" not in html
    assert html.count('<svg class="spark cpu"') == 1 and html.count('<svg class="spark mem"') == 1
    assert "CPU 250m" in html and "memory 50Mi" in html  # the latest values
    assert "no samples yet" in html  # the pod not sampled
    assert '<td>MemoryPressure</td><td class="bad">True</td>' in html
    assert '<td>DiskPressure</td><td class="ok">False</td>' in html
    assert '<td>PIDPressure</td><td class="ok">False</td>' in html


def test_without_history_or_pressure_the_page_is_as_before() -> None:
    html = status_page.render("n1", [pod("web", "u1")], [], T0)
    assert "<svg" not in html and "Pressure" not in html and "<th>Usage</th>" not in html
