"""State files written in batches: the writes that arrive while one batch is on disk go
together in the next, in one thread hop and with one directory fsync per directory.

A burst of 100 container starts otherwise queues 100 writes (each two fsyncs and a thread hop)
on the default executor, ahead of every other blocking call of the agent. Each write keeps the
guarantee of `statefile.write_json_many`: when `write` returns, the file is durable.

A large batch is split among a few threads of the writer's own: its fsyncs are independent, and
the disk takes them side by side (1,000 sandbox records in new directories: 237 ms from one
thread, 101 ms from eight). Every pod's first step waits for its sandbox record, so in a burst
all of them wait for that one batch.

A write with `durable=False` returns once the file is in place, unsynced; the writer remembers
it, and the next durable write into its directory (one that starts after it returned) fsyncs it
before that directory. The process runtime's sandbox records are written so: a pod's first
container waited for two fsyncs of its sandbox record on the disk (about 0.6 ms a pod, alone;
in a burst of 100 pods, a batch of 80 records held them all 45 ms) for a guarantee no process
needs before it exists. Such a write does not wait for the durable ones of its batch either:
each part writes its unsynced files first and tells their writers at once (in a burst of 1,000
API pods their sandbox records waited 106 ms at the median for other pods' fsyncs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pykubelet.runtime.process import statefile

_Item = tuple[statefile.StateWrite, "asyncio.Future[None]"]

# Batches on disk at once: a few in parallel let the filesystem commit their fsyncs together
# (one thread fsyncing a whole burst in turn was slower than the old thread per write).
FLUSHERS = 4
# A batch larger than this goes to the threads in parts of at least this many files, at most
# SPLIT_THREADS of them. 8, not 32: in a burst of 1,000 API pods the batches are mostly of
# 10-60 files, and one thread syncing each file in turn, waiting for the interpreter lock after
# every fsync, made a container's record wait 0.56 s at the p99 (0.29 s split at 8), which the
# pod's status waits for (bench/HISTORY.md, session 24).
SPLIT_AT = 8
SPLIT_THREADS = 8


class StateWriter:
    """Group commit of state files. Writes to one path must not overlap (callers hold the
    record's lock), so a batch never holds two versions of a file."""

    def __init__(self) -> None:
        self._pending: list[_Item] = []
        self._flushers = 0  # counted down in the flusher itself: none ends unseen
        self._tasks: set[asyncio.Task[None]] = set()
        self._threads: ThreadPoolExecutor | None = None
        # Files written with durable=False, by directory, until a durable write there syncs them.
        self._unsynced: dict[Path, set[Path]] = {}

    async def write(
        self,
        path: Path,
        data: Any,
        then_remove: Path | None = None,
        make_dir: bool = False,
        durable: bool = True,
    ) -> None:
        """Atomically replace `path` with `data` as JSON, durably (or, with `durable=False`,
        unsynced until the next durable write into its directory); then delete `then_remove`.
        `make_dir`: its directory is made if missing. Raises the OSError of this file's write."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Retrieved even when its writer was cancelled meanwhile, so no "never retrieved" noise.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        item = statefile.StateWrite(path, data, then_remove, make_dir, durable)
        self._pending.append((item, future))
        if self._flushers < FLUSHERS:
            self._flushers += 1
            task = asyncio.create_task(self._flush(), name="state-writer")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # Shielded: a caller that is cancelled (a kill cancels a sync) leaves the batch alone.
        await asyncio.shield(future)

    def unsynced(self, path: Path) -> None:
        """`path` is in place and may not be synced (written here with durable=False, or found
        so at a restart): the next durable write into its directory fsyncs it."""
        self._unsynced.setdefault(path.parent, set()).add(path)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    errors = await self._write(batch)
                except BaseException as e:
                    # Cancelled (the agent stops): the writers are, as their own to_thread
                    # would have been; the thread still finishes the batch.
                    for _, future in batch:
                        if not future.done():
                            if isinstance(e, Exception):
                                future.set_exception(e)
                            else:
                                future.cancel()
                    raise
                for (item, future), error in zip(batch, errors, strict=True):
                    if future.done():
                        continue  # an unsynced write, told when it was in place (_placed)
                    if error is None and not item.durable:
                        self.unsynced(item.path)
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
        finally:
            # No await between the last look at _pending and this: a write queued meanwhile
            # found this flusher counted and running, and was taken by the loop above.
            self._flushers -= 1

    async def _write(self, batch: list[_Item]) -> list[OSError | None]:
        """The batch written in up to SPLIT_THREADS parts at once; each file's error. The
        unsynced files of the directories its durable writes go to are synced with them (by
        every part that writes there), and forgotten once one of those writes succeeded."""
        items = [item for item, _ in batch]
        parts = min(SPLIT_THREADS, len(items) // SPLIT_AT) or 1
        if self._threads is None:
            self._threads = ThreadPoolExecutor(SPLIT_THREADS, thread_name_prefix="state-writer")
        loop = asyncio.get_running_loop()
        part_items = [items[i::parts] for i in range(parts)]
        to_sync = [self._to_sync(part) for part in part_items]

        def placed(part: list[_Item]) -> Callable[[list[OSError | None]], None]:
            # From the writer's thread; the loop runs it before the part's own end (both are
            # call_soon_threadsafe from that thread, in this order).
            def tell(errors: list[OSError | None]) -> None:
                # A loop closed meanwhile (the agent stopped) has no writer left to tell, and
                # the part's durable files are still written.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._placed, part, list(errors))

            return tell

        written = await asyncio.gather(
            *(
                loop.run_in_executor(
                    self._threads,
                    statefile.write_json_many,
                    part,
                    sync,
                    placed(batch[i::parts]),
                )
                for i, (part, sync) in enumerate(zip(part_items, to_sync, strict=True))
            )
        )
        errors: list[OSError | None] = [None] * len(items)
        for i, part_errors in enumerate(written):
            errors[i::parts] = part_errors
        synced = {
            item.path.parent
            for item, error in zip(items, errors, strict=True)
            if item.durable and error is None
        }
        for path in (path for sync in to_sync for path in sync if path.parent in synced):
            unsynced = self._unsynced.get(path.parent)
            if unsynced is not None:
                unsynced.discard(path)
                if not unsynced:
                    del self._unsynced[path.parent]
        return errors

    def _placed(self, part: list[_Item], errors: list[OSError | None]) -> None:
        """The unsynced writes of a part are in place (or failed): their writers go on, not
        waiting for the part's fsyncs. Each is remembered for the next durable write into its
        directory before its writer is told."""
        for (item, future), error in zip(part, errors, strict=True):
            if item.durable or future.done():
                continue
            if error is None:
                self.unsynced(item.path)
                future.set_result(None)
            else:
                future.set_exception(error)

    def _to_sync(self, part: list[statefile.StateWrite]) -> list[Path]:
        """The unsynced files where `part` writes durably."""
        dirs = {item.path.parent for item in part if item.durable}
        return [path for d in dirs for path in self._unsynced.get(d, ())]

    def forget(self, directory: Path) -> None:
        """`directory` is gone (its pod was removed): nothing in it is left to sync."""
        self._unsynced.pop(directory, None)

    def close(self) -> None:
        """Its threads let go once what they write is written (blocks: call it in a thread)."""
        threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=True)
