"""Giving the C heap's free memory back to the system.

glibc's malloc keeps the pages it freed inside its heap, for the next allocations. A burst of
pod starts allocates much that is freed once the pods run (decoded manifests, status drafts, JSON
texts), and an idle agent never allocates that much again: measured after 1,000 pods started,
the resident set went from 97.8 to 92.9 MiB on the first malloc_trim(0), which (glibc 2.8 and
later) returns every free page, not only the heap's top.

`trim_heap_periodically` trims every `period` seconds in a thread, so the loop does not make the
call; malloc_trim holds each arena's lock while it walks it, so an allocation of the loop's from
the main arena may still wait that long (0.3 ms measured at 1,000 pods) every `period`.
Elsewhere than glibc (musl, another libc) there is nothing to call and it returns at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_PERIOD = 30.0


def heap_trimmer() -> Callable[[], bool] | None:
    """glibc's malloc_trim(0), or None where the C library has none."""
    try:
        # The interpreter's own symbols, the C library's among them (ctypes.util's search
        # for the library by name would import a tenth of a MiB for nothing).
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def call() -> bool:
        return bool(trim(0))  # 1: memory was returned

    return call


async def trim_heap_periodically(period: float = TRIM_PERIOD) -> None:
    """malloc_trim every `period` seconds until cancelled (nothing where there is none)."""
    trim = heap_trimmer()
    if trim is None:
        log.debug("no malloc_trim in this C library: the heap is not trimmed")
        return
    while True:
        await asyncio.sleep(period)
        started = time.monotonic()
        returned = await asyncio.to_thread(trim)
        log.debug(
            "heap trimmed in %.1f ms (%s)",
            1000 * (time.monotonic() - started),
            "memory returned" if returned else "nothing to return",
        )
