"""State files written in batches: the writes that arrive while one batch is on disk go
together in the next, in one thread hop and with one directory fsync per directory.

A burst of 100 container starts otherwise queues 100 writes (each two fsyncs and a thread hop)
on the default executor, ahead of every other blocking call of the agent. Each write keeps the
guarantee of `statefile.write_json_many`: when `write` returns, the file is durable.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pykubelet.runtime.process import statefile

_Item = tuple[Path, Any, Path | None, bool, "asyncio.Future[None]"]

# Batches on disk at once: a few in parallel let the filesystem commit their fsyncs together
# (one thread fsyncing a whole burst in turn was slower than the old thread per write).
FLUSHERS = 4


class StateWriter:
    """Group commit of state files. Writes to one path must not overlap (callers hold the
    record's lock), so a batch never holds two versions of a file."""

    def __init__(self) -> None:
        self._pending: list[_Item] = []
        self._flushers = 0  # counted down in the flusher itself: none ends unseen
        self._tasks: set[asyncio.Task[None]] = set()

    async def write(
        self, path: Path, data: Any, then_remove: Path | None = None, make_dir: bool = False
    ) -> None:
        """Atomically replace `path` with `data` as JSON, durably; then delete `then_remove`.
        `make_dir`: its directory is made if missing. Raises the OSError of this file's write."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Retrieved even when its writer was cancelled meanwhile, so no "never retrieved" noise.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending.append((path, data, then_remove, make_dir, future))
        if self._flushers < FLUSHERS:
            self._flushers += 1
            task = asyncio.create_task(self._flush(), name="state-writer")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # Shielded: a caller that is cancelled (a kill cancels a sync) leaves the batch alone.
        await asyncio.shield(future)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    errors = await asyncio.to_thread(
                        statefile.write_json_many, [(p, d, r, m) for p, d, r, m, _ in batch]
                    )
                except BaseException as e:
                    # Cancelled (the agent stops): the writers are, as their own to_thread
                    # would have been; the thread still finishes the batch.
                    for *_, future in batch:
                        if not future.done():
                            if isinstance(e, Exception):
                                future.set_exception(e)
                            else:
                                future.cancel()
                    raise
                for (*_, future), error in zip(batch, errors, strict=True):
                    if future.done():
                        continue
                    if error is None:
                        future.set_result(None)
                    else:
                        future.set_exception(error)
        finally:
            # No await between the last look at _pending and this: a write queued meanwhile
            # found this flusher counted and running, and was taken by the loop above.
            self._flushers -= 1
