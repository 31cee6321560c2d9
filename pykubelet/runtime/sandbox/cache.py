"""The status cache of a sandbox backend: every sandbox and container of ours, as last inspected.

What it promises:
- Reads are served from memory. `refresh_*` inspects one id into the cache, or out of it if it
  is gone or not ours; an inspect and a removal of the same id never interleave (a removal is
  never undone by an inspect that started before it).
- `resync` lists the engine (one or two cheap calls), inspects only what is new or whose state
  differs, and forgets what the listing no longer has, unless it was stored after the listing
  began (it was created meanwhile: the listing could not see it). It returns the UIDs of the pods
  that changed. Callers arriving while one runs share it, and it is shielded: a caller that is
  cancelled (a PLEG tick, a request) does not cancel the relist the others wait for.
- Whatever the cache stops tracking is released in the engine too (`Inspector.forget`).
- An id `expect`ed (the core has just created it and will refresh it itself when its start is
  done) is left to that refresh: a relist does not inspect it meanwhile, and `pending` tells
  the change stream so. Each entry records when its inspect was sent (`inspected_ns`).
- An exited container's entry is completed by `finish` (its termination message, read once per
  exit: messages.py) before it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from pykubelet.runtime.sandbox.engine import (
    ContainerEntry,
    Entry,
    Inspector,
    Kind,
    SandboxEntry,
)

REFRESH_CONCURRENCY = 8  # inspects at once during a relist: Podman serialises them anyway

T = TypeVar("T")
E = TypeVar("E", SandboxEntry, ContainerEntry)


# Completes an exited container's entry before it is stored: (the new entry, the one it replaces).
Finisher = Callable[[ContainerEntry, ContainerEntry | None], Awaitable[None]]


class StatusCache:
    def __init__(self, source: Inspector, name: str, finish: Finisher | None = None) -> None:
        self._source = source
        self._name = name
        self._finish = finish
        self._sandboxes: dict[str, SandboxEntry] = {}
        self._containers: dict[str, ContainerEntry] = {}
        self._seq = 0
        self._locks: dict[str, asyncio.Lock] = {}
        self._resync_task: asyncio.Task[set[str]] | None = None
        self._pending: set[str] = set()

    # --- reads ----------------------------------------------------------------------------------

    def sandbox(self, id: str) -> SandboxEntry | None:
        return self._sandboxes.get(id)

    def container(self, id: str) -> ContainerEntry | None:
        return self._containers.get(id)

    def get(self, id: str) -> Entry | None:
        sandbox = self._sandboxes.get(id)
        return sandbox if sandbox is not None else self._containers.get(id)

    def sandboxes(self, uid: str | None = None) -> list[SandboxEntry]:
        return [s for s in self._sandboxes.values() if uid is None or s.pod_uid == uid]

    def containers(self, uid: str | None = None) -> list[ContainerEntry]:
        return [c for c in self._containers.values() if uid is None or c.pod_uid == uid]

    def pending(self, id: str) -> bool:
        """An id the core made and will refresh itself (`expect`)."""
        return id in self._pending

    @contextlib.contextmanager
    def expect(self, id: str) -> Iterator[None]:
        """While the core starts what it created: its own refresh (inside the block, or its
        removal) tells its state, so nobody else inspects it meanwhile. A refresh ends it."""
        self._pending.add(id)
        try:
            yield
        finally:
            self._pending.discard(id)

    # --- one id ---------------------------------------------------------------------------------

    async def refresh(self, kind: Kind, id: str) -> Entry | None:
        if kind is Kind.SANDBOX:
            return await self.refresh_sandbox(id)
        return await self.refresh_container(id)

    async def refresh_sandbox(self, id: str) -> SandboxEntry | None:
        async with self._lock(id):
            # No longer pending: what happens from here on is the change stream's to tell.
            self._pending.discard(id)
            sent = time.time_ns()
            entry = await self._source.inspect_sandbox(id)
            if entry is not None:
                entry.inspected_ns = sent
                self._sandboxes[entry.id] = self._stamped(entry)
            else:
                self.drop(id)
        self._forget_lock(id)
        return entry

    async def refresh_container(self, id: str) -> ContainerEntry | None:
        async with self._lock(id):
            # No longer pending: what happens from here on is the change stream's to tell.
            self._pending.discard(id)
            sent = time.time_ns()
            entry = await self._source.inspect_container(id)
            if entry is not None and self._finish is not None:
                await self._finish(entry, self._containers.get(id))
            if entry is not None:
                entry.inspected_ns = sent
                self._containers[entry.id] = self._stamped(entry)
            else:
                self.drop(id)
        self._forget_lock(id)
        return entry

    async def remove(self, id: str, call: Callable[[], Awaitable[None]]) -> Entry | None:
        """Run the engine's removal of `id` and, if it succeeds, stop tracking it; the entry
        that was dropped."""
        async with self._lock(id):
            await call()
            gone = self.drop(id)
        self._forget_lock(id)
        return gone

    def drop(self, id: str) -> Entry | None:
        gone: Entry | None = self._sandboxes.pop(id, None)
        if gone is None:
            gone = self._containers.pop(id, None)
        self._source.forget(id)
        return gone

    # --- everything -----------------------------------------------------------------------------

    async def resync(self) -> set[str]:
        task = self._resync_task
        if task is None or task.done():
            task = asyncio.create_task(self._do_resync(), name=f"{self._name}-resync")
            self._resync_task = task
        return await asyncio.shield(task)

    async def _do_resync(self) -> set[str]:
        seen_before = self._seq
        listing = await self._source.listing()
        stale_sandboxes = [
            id
            for id, state in listing.sandboxes.items()
            if (id not in self._sandboxes or self._sandboxes[id].state is not state)
            and id not in self._pending
        ]
        stale_containers = [
            id
            for id, state in listing.containers.items()
            if (id not in self._containers or self._containers[id].state is not state)
            and id not in self._pending
        ]
        refreshed = await _bounded(
            [
                *(self.refresh_sandbox(id) for id in stale_sandboxes),
                *(self.refresh_container(id) for id in stale_containers),
            ]
        )
        uids = {e.pod_uid for e in refreshed if e is not None}
        vanished = [
            *(
                i
                for i, s in self._sandboxes.items()
                if i not in listing.sandboxes and s.seq <= seen_before
            ),
            *(
                i
                for i, c in self._containers.items()
                if i not in listing.containers and c.seq <= seen_before
            ),
        ]
        for id in vanished:
            gone = self.drop(id)
            if gone is not None:
                uids.add(gone.pod_uid)
        return uids

    async def close(self) -> None:
        """Stop a relist in progress and forget everything (the engine is closing)."""
        task, self._resync_task = self._resync_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._sandboxes.clear()
        self._containers.clear()

    # --- helpers --------------------------------------------------------------------------------

    def _stamped(self, entry: E) -> E:
        self._seq += 1
        entry.seq = self._seq
        return entry

    def _lock(self, id: str) -> asyncio.Lock:
        return self._locks.setdefault(id, asyncio.Lock())

    def _forget_lock(self, id: str) -> None:
        lock = self._locks.get(id)
        if lock is not None and not lock.locked() and self.get(id) is None:
            del self._locks[id]


async def _bounded(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    limit = asyncio.Semaphore(REFRESH_CONCURRENCY)

    async def one(coro: Coroutine[Any, Any, T]) -> T:
        async with limit:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))
