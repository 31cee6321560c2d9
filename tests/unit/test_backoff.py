from __future__ import annotations

from pykubelet.pod.backoff import Backoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_first_restart_immediate_then_doubling_to_300() -> None:
    clock = Clock()
    b = Backoff(clock)
    assert b.remaining("k", clock.now) == 0  # first crash: restart at once
    delays = []
    for _ in range(8):
        b.record_start("k")
        clock.now += 1  # it crashes a second later
        delays.append(b.remaining("k", clock.now))
        clock.now += delays[-1]
    assert delays == [10, 20, 40, 80, 160, 300, 300, 300]


def test_reset_after_ten_minutes_of_running() -> None:
    clock = Clock()
    b = Backoff(clock)
    b.record_start("k")
    b.record_start("k")
    clock.now += 601
    assert b.remaining("k", clock.now) == 0
    b.record_start("k")
    assert b.delay_of("k") == 10


def test_forget() -> None:
    b = Backoff(Clock())
    b.record_start("uid1/a")
    b.record_start("uid2/a")
    b.forget({"uid1/a"})
    assert b.delay_of("uid1/a") == 0 and b.delay_of("uid2/a") == 10
