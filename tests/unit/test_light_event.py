"""LightEvent behaves as asyncio.Event for what pykubelet asks of it."""

from __future__ import annotations

import asyncio

import pytest

from pykubelet.common.lightevent import LightEvent


async def test_set_wakes_every_waiter_and_later_waits_return_at_once() -> None:
    event = LightEvent()
    waiters = [asyncio.create_task(event.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    event.set()
    event.clear()  # too late to take the wake-up back, as with asyncio.Event
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert not event.is_set()
    event.set()
    assert event.is_set()
    assert await asyncio.wait_for(event.wait(), 1) is True


async def test_a_cancelled_waiter_is_dropped_and_the_others_still_wake() -> None:
    event = LightEvent()
    cancelled = asyncio.create_task(event.wait())
    kept = asyncio.create_task(event.wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert "1 waiting" in repr(event)
    event.set()
    assert await kept is True


async def test_clear_then_wait_waits_for_the_next_set() -> None:
    event = LightEvent()
    event.set()
    event.clear()
    waiter = asyncio.create_task(event.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    event.set()
    assert await waiter is True
