"""Each pod's recent usage (the status page's charts), kept compact: one array of floats a pod,
three numbers a sample (time, CPU cores, memory bytes; NaN for an unknown value), and the
`UsagePoint`s made only when read. A point kept as objects (the point, its datetime, a float
and an int) took about 170 bytes and a deque a pod 600 more: at 1,000 pods and 30 samples,
5 MiB of an idle agent's memory for what is read only when someone opens the status page.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from datetime import UTC, datetime

from pykubelet.stats.types import UsagePoint

_FIELDS = 3  # time (a POSIX timestamp), cores, memory bytes (exact as a float below 2**53)


def _known(value: float) -> float | None:
    return None if math.isnan(value) else value


class UsageHistories:
    """The last `samples` points of each pod, oldest first."""

    def __init__(self, samples: int) -> None:
        self._samples = samples
        self._by_pod: dict[str, array[float]] = {}

    def append(
        self, uid: str, at: datetime, cpu_cores: float | None, memory_bytes: int | None
    ) -> None:
        points = self._by_pod.get(uid)
        if points is None:
            points = self._by_pod[uid] = array("d")
        if len(points) >= self._samples * _FIELDS:
            del points[:_FIELDS]
        points.extend(
            (
                at.timestamp(),
                math.nan if cpu_cores is None else cpu_cores,
                math.nan if memory_bytes is None else float(memory_bytes),
            )
        )

    def keep_only(self, uids: Iterable[str]) -> None:
        """Forget every pod but these."""
        wanted = set(uids)
        for gone in [uid for uid in self._by_pod if uid not in wanted]:
            del self._by_pod[gone]

    def of(self, uid: str) -> tuple[UsagePoint, ...]:
        points = self._by_pod.get(uid)
        if points is None:
            return ()
        out = []
        for i in range(0, len(points), _FIELDS):
            memory = _known(points[i + 2])
            out.append(
                UsagePoint(
                    datetime.fromtimestamp(points[i], UTC),
                    _known(points[i + 1]),
                    None if memory is None else int(memory),
                )
            )
        return tuple(out)
