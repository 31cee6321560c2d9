"""Image garbage collection (the kubelet's realImageGCManager), every 5 minutes:

when the image file system's usage is at or above `--image-gc-high-threshold` (85 %), unused
images are removed, the least recently used first (then the first detected first), until the
usage is down to `--image-gc-low-threshold` (80 %). Unused: no container of the engine uses
it (running or not, the agent's or another's), it is not the pod infra image nor pinned by
the runtime; and it was first seen more than `--image-minimum-gc-age` (2 min) ago. A pass that
cannot free enough records the kubelet's FreeDiskSpaceFailed event ("Failed to garbage
collect required amount of images. ..."), and a second failure in a row ImageGCFailed.
`--image-gc-high-threshold=100` turns image GC off.

When an image was last used and first detected is known from this agent's passes (as the
kubelet's records, kept in memory): after a restart every image starts as first seen then.
The process runtime has no images: image GC says so once and does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.runtime.base import GcImage, ImageService

log = logging.getLogger(__name__)

# The kubelet's ImageGCPeriod.
IMAGE_GC_PERIOD = 300.0


@dataclass(frozen=True)
class ImageGCPolicy:
    high_threshold_percent: int = 85
    low_threshold_percent: int = 80
    min_age: float = 120.0


class ImageGCError(Exception):
    """A pass failed: the message is the kubelet's."""


@dataclass
class _Record:
    first_detected: float
    last_used: float  # 0: not seen in use by this agent


class ImageGC:
    def __init__(
        self,
        images: ImageService | None,
        policy: ImageGCPolicy,
        recorder: EventRecorder,
        node: ObjectRef,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._images = images
        self._policy = policy
        self._recorder = recorder
        self._node = node
        self._clock = clock
        self._records: dict[str, _Record] = {}
        self._said_no_images = False

    async def run_once(self) -> int:
        """One pass; returns the bytes freed. ImageGCError (or RuntimeFailure) if it failed."""
        if self._images is None:
            if not self._said_no_images:
                self._said_no_images = True
                log.info("image garbage collection: this runtime has no images, nothing to do")
            return 0
        if self._policy.high_threshold_percent >= 100:
            return 0
        usage = await self._images.image_fs_usage()
        capacity, available = usage.capacity_bytes, usage.available_bytes
        if capacity <= 0:
            raise ImageGCError(f"invalid capacity {capacity} on image filesystem")
        if available > capacity:
            available = capacity
        usage_percent = 100 - available * 100 // capacity
        if usage_percent < self._policy.high_threshold_percent:
            await self._detect()  # keeps last-used times current between passes that free
            return 0
        amount = capacity * (100 - self._policy.low_threshold_percent) // 100 - available
        log.info(
            "disk usage on image filesystem %s is over the high threshold, trying to free "
            "bytes down to the low threshold: usage %d%%, highThreshold %d%%, amountToFree %d, "
            "lowThreshold %d%%",
            usage.path,
            usage_percent,
            self._policy.high_threshold_percent,
            amount,
            self._policy.low_threshold_percent,
        )
        freed = await self._free_space(amount)
        if freed < amount:
            message = (
                "Failed to garbage collect required amount of images. Attempted to free "
                f"{amount} bytes, but only found {freed} bytes eligible to free."
            )
            self._recorder.record("Warning", "FreeDiskSpaceFailed", message, self._node)
            raise ImageGCError(message)
        return freed

    def record_failure(self, message: str) -> None:
        """The kubelet's ImageGCFailed event on the node, for a pass that failed again."""
        self._recorder.record("Warning", "ImageGCFailed", message, self._node)

    async def _detect(self) -> list[GcImage]:
        assert self._images is not None
        now = self._clock()
        images = await self._images.list_images()
        seen = set()
        for image in images:
            seen.add(image.id)
            record = self._records.setdefault(image.id, _Record(first_detected=now, last_used=0))
            if image.in_use or image.pinned:
                record.last_used = now
        for gone in set(self._records) - seen:
            del self._records[gone]
        return images

    async def _free_space(self, amount: int) -> int:
        assert self._images is not None
        now = self._clock()
        images = await self._detect()
        candidates = []
        for image in images:
            record = self._records[image.id]
            if image.in_use or image.pinned:
                continue
            if now - record.first_detected < self._policy.min_age:
                continue
            candidates.append((record.last_used, record.first_detected, image))
        candidates.sort(key=lambda c: (c[0], c[1]))
        freed = 0
        failures = []
        for _, _, image in candidates:
            if freed >= amount:
                break
            name = image.tags[0] if image.tags else image.id
            try:
                await self._images.remove_image(image)
            except Exception as exc:
                failures.append(str(exc))
                continue
            log.info("removed unused image %s (%s, %d bytes)", name, image.id[:19], image.size)
            self._records.pop(image.id, None)
            freed += image.size
        if failures:
            log.warning("image garbage collection: %s", "; ".join(failures))
        return freed


async def run_periodically(gc: ImageGC, period: float, stop: asyncio.Event) -> None:
    """`gc` at once and then every `period` seconds until `stop`; a second failure in a row is
    the kubelet's ImageGCFailed event on the node."""
    failed_before = False
    while not stop.is_set():
        try:
            await gc.run_once()
            failed_before = False
        except Exception as exc:
            if failed_before:
                log.error("image garbage collection failed multiple times in a row: %s", exc)
                gc.record_failure(str(exc))
            else:
                log.warning("image garbage collection failed once: %s", exc)
            failed_before = True
        try:
            async with asyncio.timeout(period):
                await stop.wait()
            return
        except TimeoutError:
            pass
