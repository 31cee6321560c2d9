"""Retry timing, failure logging and rate limits for the API server clients.

`Retry` is the reflector's exponential back-off with jitter; `Failures` logs the first failure
of a kind at WARNING and its recovery at INFO, so a server that is away for an hour logs two
lines; `RateLimiter` is the client's token bucket (client-go's flowcontrol).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

log = logging.getLogger(__name__)

# Reflector-like retry timing (client-go: 800 ms doubling to 30 s). Capped lower: one node, and a
# restarted API server should see its nodes back within seconds.
RETRY_MIN, RETRY_MAX = 0.8, 8.0


class Retry:
    """Exponential back-off with jitter, so that many nodes do not retry in step."""

    def __init__(self, initial: float = RETRY_MIN, maximum: float = RETRY_MAX) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def delay(self) -> float:
        base = self._next
        self._next = min(self._next * 2, self.maximum)
        return base * (1 + random.random() * 0.25)

    def reset(self) -> None:
        self._next = self.initial


class Failures:
    """Logs the first failure of a kind at WARNING, repeats at DEBUG, and the recovery."""

    def __init__(self, what: str, logger: logging.Logger = log) -> None:
        self.what = what
        self._log = logger
        self._last: str | None = None
        self.count = 0

    def failed(self, error: Exception, consequence: str = "") -> None:
        self.count += 1
        text = str(error)
        if text != self._last:
            self._log.warning("%s failed: %s%s", self.what, text, consequence)
            self._last = text
        else:
            self._log.debug("%s failed again: %s", self.what, text)

    def ok(self) -> None:
        if self._last is not None:
            self._log.info("%s works again", self.what)
            self._last = None


class RateLimiter:
    """A token bucket: `qps` tokens a second, at most `burst` saved up; `qps` 0: no limit."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.qps)
                self._tokens = 1.0
                self._at = time.monotonic()
            self._tokens -= 1
