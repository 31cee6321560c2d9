"""CrashLoopBackOff: how long a crashed container waits before its next start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

INITIAL_SECONDS = 10.0
MAX_SECONDS = 300.0
# A container that ran this long since its last restart is healthy again: start from 10 s.
RESET_AFTER_SECONDS = 600.0


@dataclass
class _Entry:
    delay: float
    last_start: float


class Backoff:
    """Per-key exponential back-off: the first restart is immediate, then 10 s doubling to 300 s.

    Matches the kubelet: a container that crashed once restarts at once; one that keeps crashing
    waits 10, 20, 40 ... 300 s counted from its last exit.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: dict[str, _Entry] = {}

    def remaining(self, key: str, finished_at: float) -> float:
        """Seconds left before `key` may start again, given when it last exited (0: now)."""
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        if finished_at - entry.last_start >= RESET_AFTER_SECONDS:
            del self._entries[key]
            return 0.0
        return max(0.0, finished_at + entry.delay - self._clock())

    def record_start(self, key: str) -> None:
        """Account a (re)start: the next crash waits twice as long as the last."""
        now = self._clock()
        entry = self._entries.get(key)
        if entry is None:
            # The first restart was free; the next waits the initial delay.
            self._entries[key] = _Entry(INITIAL_SECONDS, now)
        else:
            entry.delay = min(entry.delay * 2, MAX_SECONDS)
            entry.last_start = now

    def delay_of(self, key: str) -> float:
        entry = self._entries.get(key)
        return entry.delay if entry else 0.0

    def forget(self, keys: set[str]) -> None:
        for key in keys:
            self._entries.pop(key, None)
