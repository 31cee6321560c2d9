"""`LightEvent`: asyncio.Event's set, clear, is_set and wait, for the events every pod keeps.

An asyncio.Event makes its deque of waiters when it is made: about 700 bytes with the instance's
dictionary, and every pod held three (its worker's wake-up and termination, its container's
exit), 2 MiB of an idle agent at 1,000 pods where almost none is ever waited on at a given time.
This one has slots and makes its list of waiters on the first wait.

The semantics are asyncio.Event's: `wait` returns True once the event is set, at once if it is;
`set` wakes every waiter of the moment (a `clear` right after does not take that back); a
cancelled waiter is dropped.
"""

from __future__ import annotations

import asyncio


class LightEvent:
    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[bool]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        if self._value:
            return
        self._value = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(True)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> bool:
        if self._value:
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            return await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)

    def __repr__(self) -> str:
        waiting = len(self._waiters or ())
        return f"<LightEvent {'set' if self._value else 'unset'}, {waiting} waiting>"
