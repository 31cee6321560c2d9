"""The pods' usage histories: what is appended is what is read back, oldest first, bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pykubelet.stats.history import UsageHistories
from pykubelet.stats.types import UsagePoint

T0 = datetime(2026, 12, 6, 4, 30, 15, 123456, tzinfo=UTC)


def test_points_read_back_as_appended_unknown_values_included() -> None:
    histories = UsageHistories(samples=5)
    histories.append("a", T0, None, 50 * 2**20)
    histories.append("a", T0 + timedelta(seconds=10), 0.25, None)
    histories.append("a", T0 + timedelta(seconds=20), 1.5, 2**52 + 1)
    assert histories.of("a") == (
        UsagePoint(T0, None, 50 * 2**20),
        UsagePoint(T0 + timedelta(seconds=10), 0.25, None),
        UsagePoint(T0 + timedelta(seconds=20), 1.5, 2**52 + 1),
    )
    assert histories.of("b") == ()


def test_the_oldest_goes_first_and_gone_pods_are_forgotten() -> None:
    histories = UsageHistories(samples=3)
    for i in range(7):
        histories.append("a", T0 + timedelta(seconds=i), float(i), i)
        histories.append("b", T0, None, None)
    assert [p.memory_bytes for p in histories.of("a")] == [4, 5, 6]
    assert len(histories.of("b")) == 3
    histories.keep_only(["b"])
    assert histories.of("a") == ()
    assert len(histories.of("b")) == 3
