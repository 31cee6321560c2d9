"""Image GC's policy (the kubelet's realImageGCManager) over an in-memory engine: when it runs,
what it removes and in which order, what it never removes, and its events."""

from __future__ import annotations

import asyncio

import pytest

from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.kubelet.image_gc import ImageGC, ImageGCError, ImageGCPolicy, run_periodically
from pykubelet.runtime.base import GcImage, ImageFsUsage, RuntimeFailure

MB = 1 << 20
NODE = ObjectRef.node("node-1")


class Engine:
    """Images and a file system of `capacity` bytes of which images use their sizes plus
    `other` bytes."""

    def __init__(self, capacity: int, other: int, *images: GcImage) -> None:
        self.capacity = capacity
        self.other = other
        self.images = {i.id: i for i in images}
        self.removed: list[str] = []
        self.refuse: set[str] = set()

    async def list_images(self) -> list[GcImage]:
        return list(self.images.values())

    async def remove_image(self, image: GcImage) -> None:
        if image.id in self.refuse:
            raise RuntimeFailure(f"cannot remove image {image.id}: conflict")
        self.removed.append(image.id)
        del self.images[image.id]

    async def image_fs_usage(self) -> ImageFsUsage:
        used = self.other + sum(i.size for i in self.images.values())
        return ImageFsUsage("/var/lib/images", self.capacity, self.capacity - used)

    def use(self, image_id: str, in_use: bool = True) -> None:
        old = self.images[image_id]
        self.images[image_id] = GcImage(old.id, old.tags, old.size, in_use, old.pinned)


def image(id: str, size_mb: int, *, in_use: bool = False, pinned: bool = False) -> GcImage:
    return GcImage(id, (f"localhost/{id}:1",), size_mb * MB, in_use, pinned)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_gc(engine: Engine, recorder: EventRecorder, clock: Clock, **policy: int) -> ImageGC:
    policy.setdefault("min_age", 0)
    return ImageGC(engine, ImageGCPolicy(**policy), recorder, NODE, clock=clock)


async def test_unused_images_go_least_recently_used_first_down_to_the_low_threshold() -> None:
    # 100 MiB disk, 50 used by other files: images of 10 each put it at 90 %.
    engine = Engine(
        100 * MB,
        50 * MB,
        image("old", 10),
        image("recent", 10),
        image("never", 10),
        image("busy", 10, in_use=True),
        image("pause", 0, pinned=True),
    )
    recorder, clock = EventRecorder(), Clock()
    gc = make_gc(engine, recorder, clock)
    engine.use("old")
    engine.use("recent")
    await gc.run_once()  # 90 % >= 85 %: removes 10 MiB to reach 80 %
    assert engine.removed == ["never"]  # never seen in use: before any that was
    clock.now += 10
    engine.use("old", False)
    clock.now += 10
    engine.use("recent", False)
    await gc.run_once()  # 80 %: below the high threshold, nothing
    assert engine.removed == ["never"]
    engine.other += 10 * MB  # 90 % again
    await gc.run_once()
    assert engine.removed == ["never", "old"]
    assert set(engine.images) == {"recent", "busy", "pause"}
    assert recorder.for_object("Node", "node-1") == []


async def test_a_pass_that_cannot_free_enough_says_so_as_the_kubelet() -> None:
    engine = Engine(100 * MB, 80 * MB, image("busy", 10, in_use=True), image("spare", 5))
    recorder, clock = EventRecorder(), Clock()
    gc = make_gc(engine, recorder, clock)
    with pytest.raises(ImageGCError) as caught:
        await gc.run_once()
    amount = 100 * MB * 20 // 100 - 5 * MB
    expected = (
        "Failed to garbage collect required amount of images. Attempted to free "
        f"{amount} bytes, but only found {5 * MB} bytes eligible to free."
    )
    assert str(caught.value) == expected
    assert engine.removed == ["spare"]
    events = recorder.for_object("Node", "node-1")
    assert [(e.type, e.reason, e.message) for e in events] == [
        ("Warning", "FreeDiskSpaceFailed", expected)
    ]


async def test_young_images_and_refusals_are_skipped() -> None:
    engine = Engine(100 * MB, 80 * MB, image("a", 10), image("b", 10))
    recorder, clock = EventRecorder(), Clock()
    gc = make_gc(engine, recorder, clock, min_age=120)
    with pytest.raises(ImageGCError):
        await gc.run_once()  # first seen now: too young
    assert engine.removed == []
    clock.now += 121
    engine.refuse.add("a")  # a container was created from it meanwhile
    with pytest.raises(ImageGCError):
        await gc.run_once()
    assert engine.removed == ["b"]


async def test_repeated_failures_are_image_gc_failed_and_high_100_turns_it_off() -> None:
    engine = Engine(100 * MB, 95 * MB)
    recorder = EventRecorder()
    gc = make_gc(engine, recorder, Clock())
    stop = asyncio.Event()
    task = asyncio.create_task(run_periodically(gc, 0.01, stop))
    for _ in range(500):
        if any(e.reason == "ImageGCFailed" for e in recorder.for_object("Node", "node-1")):
            break
        await asyncio.sleep(0.01)
    stop.set()
    await task
    reasons = [e.reason for e in recorder.for_object("Node", "node-1")]
    assert reasons == ["FreeDiskSpaceFailed", "ImageGCFailed"]  # each counted once, repeated

    off = make_gc(engine, EventRecorder(), Clock(), high_threshold_percent=100)
    assert await off.run_once() == 0


async def test_no_images_on_the_process_runtime() -> None:
    gc = ImageGC(None, ImageGCPolicy(), EventRecorder(), NODE)
    assert await gc.run_once() == 0
