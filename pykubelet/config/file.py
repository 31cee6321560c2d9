"""The file source: pods from a manifest file or a directory of them.

A full list at start and every `--file-check-frequency`, plus inotify so that an edit is seen at
once. Every change sends the source's whole state as a SET, as the kubelet's file source does.

Where we do better than the kubelet: a manifest that was good and turns bad keeps its last good
pod running (the kubelet drops it, which kills a running pod over a typo), and editor leftovers
(`*~`, `*.swp`, `*.bak`, `#*#`) and files that are not `.yaml`/`.yml`/`.json` are never run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncinotify import Inotify, Mask

from pykubelet.api.decode import decode_pod
from pykubelet.api.errors import FieldError, ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.static import apply_static_defaults
from pykubelet.common import lockedio, metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.config.types import FILE_SOURCE, Op, PodUpdate

log = logging.getLogger(__name__)

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
WATCH_MASK = (
    Mask.CREATE
    | Mask.CLOSE_WRITE
    | Mask.MOVED_TO
    | Mask.MOVED_FROM
    | Mask.DELETE
    | Mask.ATTRIB
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
)
# A burst of events (an editor's save, `cp *`) is folded into one scan after this quiet time.
DEBOUNCE_SECONDS = 0.002
# In a burst (a scan ended less than this per pod ago), scans are spaced by as much: each batch
# costs the merger and the sync loop a pass over every pod (about 1 ms at 1,000), so 1,000
# manifests written one by one must not become 1,000 batches (5 ms apart at 1,000 pods; an edit
# after a quiet time is scanned after the debounce alone). 20 us a pod held each of 20 deletes
# made one after the other 20 ms behind the last one's scan (p99 53 -> 27 ms at 5 us, the
# bursts of 100 and 1,000 unchanged: bench/HISTORY.md, session 28).
BURST_SPACING_PER_POD = 5e-6
WATCH_RETRY_MIN, WATCH_RETRY_MAX = 1.0, 20.0


def is_manifest_name(name: str) -> bool:
    if name.startswith((".", "#")) or name.endswith(("~", ".swp", ".bak", "#")):
        return False
    return name.endswith(MANIFEST_SUFFIXES)


@dataclass
class _Entry:
    signature: tuple[int, int, int, int]  # (dev, ino, size, mtime_ns)
    pod: Pod | None  # the last good pod of this file
    error: ManifestError | None  # why the current content is not used


@dataclass
class ScanResult:
    pods: list[Pod]
    new_errors: list[ManifestError]  # problems not reported before
    kept_stale: set[str]  # files whose last good pod is kept although they are now bad
    listed: bool = True  # False when the directory could not be listed


class ManifestDirectory:
    """The synchronous part: list, stat, read and decode; keeps the last good pod per file.

    Runs in a worker thread: file I/O and YAML parsing would stall the event loop. A file is
    only read again when its (device, inode, size, mtime) changed, so a periodic re-list of an
    unchanged directory costs one stat per file.
    """

    def __init__(self, path: Path, node_name: str) -> None:
        self.path = path
        self.node_name = node_name
        # By path, as a string: a re-list of 1,000 files spent a third of its time making and
        # hashing Path objects.
        self._entries: dict[str, _Entry] = {}
        self._prefix = os.path.join(path, "")  # the directory's, with its "/"
        self._dir_error: str | None = None

    def _candidates(self) -> list[tuple[str, str]]:
        """(name, path) of each manifest file, in the order of their names."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if not stat.S_ISDIR(st.st_mode):
            return [(self.path.name, str(self.path))]
        with os.scandir(self.path) as entries:
            names = sorted(entry.name for entry in entries if is_manifest_name(entry.name))
        return [(name, self._prefix + name) for name in names]

    def scan(self, skip: frozenset[str] = frozenset()) -> ScanResult:
        """Re-list. Files named in `skip` (being written) keep whatever they had."""
        try:
            candidates = self._candidates()
        except OSError as exc:
            # An unreadable directory is a failing source, not an empty one: keep the pods.
            reason = f"cannot list: {exc.strerror or exc}"
            errors = [] if reason == self._dir_error else [_io_error(str(self.path), reason)]
            self._dir_error = reason
            pods = [e.pod for e in self._entries.values() if e.pod is not None]
            return ScanResult(pods, errors, set(), listed=False)
        self._dir_error = None
        seen: dict[str, _Entry] = {}
        new_errors: list[ManifestError] = []
        for name, path in candidates:
            previous = self._entries.get(path)
            if name in skip:
                if previous is not None:
                    seen[path] = previous
                continue
            entry = self._refresh(path, previous, new_errors)
            if entry is not None:
                seen[path] = entry
        self._entries = seen
        return self._result(new_errors)

    def scan_names(self, names: set[str], skip: frozenset[str] = frozenset()) -> ScanResult:
        """Look again at only these names of the directory (what inotify reported): an edit
        among 1,000 manifests costs one stat, not 1,000. A full `scan` when the source is a
        single file or the directory could not be listed last time."""
        if self._dir_error is not None or not self.path.is_dir():
            return self.scan(skip)
        new_errors: list[ManifestError] = []
        # New files are added in the order of their names, after the ones known: re-sorting
        # 1,000 entries for each batch of a burst would cost more than the batch.
        for name in sorted(names):
            if name in skip or not is_manifest_name(name):
                continue
            path = self._prefix + name
            entry = self._refresh(path, self._entries.get(path), new_errors)
            if entry is None:
                self._entries.pop(path, None)
            else:
                self._entries[path] = entry
        return self._result(new_errors)

    def _result(self, new_errors: list[ManifestError]) -> ScanResult:
        entries = self._entries
        stale = {p for p, e in entries.items() if e.error is not None and e.pod is not None}
        return ScanResult([e.pod for e in entries.values() if e.pod is not None], new_errors, stale)

    def _refresh(
        self, path: str, previous: _Entry | None, new_errors: list[ManifestError]
    ) -> _Entry | None:
        """The entry of `path` now (read again only if its signature changed), or None if it
        is not a manifest file any more."""
        try:
            # Through lockedio, as the read below: this runs in a thread beside the busy loop.
            st = lockedio.stat(path)
        except OSError as exc:
            try:
                link = os.lstat(path)
            except OSError:
                return None  # gone (or vanished between the listing and the stat)
            # A dangling link or a link loop: the name is there, its manifest is not.
            signature = (link.st_dev, link.st_ino, link.st_size, link.st_mtime_ns)
            if previous is not None and previous.signature == signature:
                return previous
            error = _io_error(path, f"cannot read: {exc.strerror or exc}")
            new_errors.append(error)
            return _Entry(signature, previous.pod if previous else None, error)
        if not stat.S_ISREG(st.st_mode):
            return None
        signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if previous is not None and previous.signature == signature:
            return previous
        entry = self._load(path, signature, previous)
        if entry.error is not None:
            new_errors.append(entry.error)
        return entry

    def _load(
        self, path: str, signature: tuple[int, int, int, int], previous: _Entry | None
    ) -> _Entry:
        last_good = previous.pod if previous else None
        try:
            pod = decode_pod(lockedio.read_file(path, signature[2]), path)
            pod = apply_static_defaults(pod, self.node_name, FILE_SOURCE, path)
        except ManifestError as exc:
            return _Entry(signature, last_good, exc)
        except OSError as exc:
            return _Entry(signature, last_good, _io_error(path, f"cannot read: {exc.strerror}"))
        return _Entry(signature, pod, None)


def _io_error(location: str, reason: str) -> ManifestError:
    return ManifestError(location, [FieldError("", reason)])


class FileSource:
    """The async shell: scans on start, on inotify events and every `period` seconds."""

    def __init__(
        self,
        path: Path,
        node_name: str,
        period: float,
        push: Callable[[PodUpdate], None],
        recorder: EventRecorder,
    ) -> None:
        self.path = path
        self.period = period
        self._push = push
        self._recorder = recorder
        self._node = ObjectRef.node(node_name)
        self._dir = ManifestDirectory(path, node_name)
        self._dirty = asyncio.Event()
        # The names inotify reported since the last scan; None: look at everything (at start,
        # after the watch was re-armed, on a queue overflow).
        self._changed: set[str] | None = None
        self._writing: set[str] = set()
        self._last_sent: dict[str, Pod] | None = None
        self._last_scan_end = 0.0  # loop time
        self.scans = 0

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch_forever(), name="file-source-inotify")
        try:
            await self._scan_once(full=True)
            while True:
                # asyncio.timeout, not wait_for, which can swallow a cancellation in 3.11.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.period):
                        await self._dirty.wait()
                full = not self._dirty.is_set()
                if not full:
                    await asyncio.sleep(DEBOUNCE_SECONDS)
                    loop = asyncio.get_running_loop()
                    spacing = len(self._last_sent or ()) * BURST_SPACING_PER_POD
                    since = loop.time() - self._last_scan_end
                    if since < spacing:
                        await asyncio.sleep(spacing - since)
                self._dirty.clear()
                await self._scan_once(full=full)
                self._last_scan_end = asyncio.get_running_loop().time()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _scan_once(self, *, full: bool) -> None:
        skip: frozenset[str] = frozenset() if full else frozenset(self._writing)
        if full:
            self._writing.clear()
        changed, self._changed = self._changed, set()
        if full or changed is None:
            result = await asyncio.to_thread(self._dir.scan, skip)
        else:
            result = await asyncio.to_thread(self._dir.scan_names, changed, skip)
        self.scans += 1
        if result.listed:
            metrics.source_last_success.labels(FILE_SOURCE).set(time.time())
        else:
            metrics.source_errors.labels(FILE_SOURCE, "list").inc()
        if result.new_errors:
            metrics.source_errors.labels(FILE_SOURCE, "manifest").inc(len(result.new_errors))
        for error in result.new_errors:
            kept = (
                " (its last good pod keeps running)" if error.location in result.kept_stale else ""
            )
            for line in error.lines():
                self._recorder.record("Warning", "FailedValidation", line + kept, self._node)
        current = {pod.uid: pod for pod in result.pods}
        if self._last_sent is not None and _same(self._last_sent, current):
            return
        self._last_sent = current
        metrics.source_updates.labels(FILE_SOURCE).inc()
        self._push(PodUpdate(list(result.pods), Op.SET, FILE_SOURCE))

    async def _watch_forever(self) -> None:
        delay = WATCH_RETRY_MIN
        while True:
            try:
                await self._watch()
                delay = WATCH_RETRY_MIN  # the watched directory went away: re-arm at once
            except OSError as exc:
                log.debug("cannot watch %s (%s); retrying in %.0fs", self.path, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, WATCH_RETRY_MAX)
            self._changed = None
            self._dirty.set()

    async def _watch(self) -> None:
        target = self.path
        only: str | None = None
        if not target.is_dir():
            # A single file: watch its directory, so an editor's rename-over is seen too.
            only = target.name
            target = target.parent
        with Inotify() as inotify:
            inotify.add_watch(target, WATCH_MASK)
            # The directory may have changed between the last scan and the watch.
            self._changed = None
            self._dirty.set()
            async for event in inotify:
                if event.mask & (Mask.IGNORED | Mask.DELETE_SELF | Mask.MOVE_SELF):
                    return
                if event.mask & Mask.Q_OVERFLOW:
                    self._changed = None  # events were lost: list everything
                    self._dirty.set()
                    continue
                name = str(event.name) if event.name is not None else ""
                if only is not None and name != only:
                    continue
                if only is not None and (target / only).is_dir():
                    # The manifest directory appeared: watch it, not its parent.
                    self._dirty.set()
                    return
                if only is None and not is_manifest_name(name):
                    continue
                if event.mask & Mask.CREATE and _is_empty_regular_file(target / name):
                    # Created but not written yet: wait for its close instead of reporting an
                    # empty manifest.
                    self._writing.add(name)
                    continue
                self._writing.discard(name)
                if self._changed is not None:
                    self._changed.add(name)
                self._dirty.set()


def _is_empty_regular_file(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def _same(before: dict[str, Pod], after: dict[str, Pod]) -> bool:
    return before.keys() == after.keys() and all(before[k] is after[k] for k in after)
