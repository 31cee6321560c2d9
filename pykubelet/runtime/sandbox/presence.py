"""Whether an image is on the node, asked of the engine once for everyone asking at once.

What it promises:
- Callers asking about the same image while a lookup is in flight share its answer: a hundred
  pods of one image started together make one engine round trip, not a hundred (Podman
  serialises them).
- A "present" answer is reused for FRESH seconds; "absent" never is (the pull that follows
  makes it present). An image removed within those seconds fails the create that uses it,
  which the next sync tries again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

FRESH = 2.0  # seconds a "present" answer is reused


class ImagePresence:
    def __init__(self, lookup: Callable[[str], Awaitable[bool]], fresh: float = FRESH) -> None:
        self._lookup = lookup
        self._fresh = fresh
        self._present_at: dict[str, float] = {}
        self._inflight: dict[str, asyncio.Future[bool]] = {}

    async def present(self, image: str) -> bool:
        seen = self._present_at.get(image)
        if seen is not None and time.monotonic() - seen < self._fresh:
            return True
        future = self._inflight.get(image)
        if future is None:
            future = asyncio.ensure_future(self._ask(image))
            self._inflight[image] = future
            future.add_done_callback(lambda f: self._done(image, f))
        # Shielded: one caller cancelled does not cancel the lookup the others wait for.
        return await asyncio.shield(future)

    async def _ask(self, image: str) -> bool:
        asked = time.monotonic()
        present = await self._lookup(image)
        if present:
            self._present_at[image] = asked
        else:
            self._present_at.pop(image, None)
        return present

    def _done(self, image: str, future: asyncio.Future[bool]) -> None:
        self._inflight.pop(image, None)
        if not future.cancelled():
            future.exception()  # retrieved: every caller may have gone

    def forget(self, image: str) -> None:
        """It may have changed (pulled, removed): ask the engine next time."""
        self._present_at.pop(image, None)
