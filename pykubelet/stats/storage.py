"""The file-system part of a stats sample, as the kubelet's summary provider measures it:

- the node's `fs`: statvfs of the `--root-dir` file system (its totals; `usedBytes` is capacity
  less free blocks), and the runtime's `imageFs` where the runtime has images (the engine names
  the file system and what its images use; its totals are statvfs of that path);
- per container, `rootfs` (the writable layer, as the engine measured it; its totals the image
  file system's) and `logs` (the container's log files, measured here: the files the runtime
  names, or those directly in the directories it names; totals the node's);
- per pod, its volumes (each directory under <root-dir>/pods/<uid>/volumes/<plugin>/<name>, with
  the volume's name) and the files the agent keeps for it there (etc-hosts, resolv.conf).

Walking trees is blocking and the engines' writable layers are expensive to measure (an engine
walks each layer), so this runs at most once per period (`StorageSampler.due`): the runtime is
asked on the event loop, every file is measured in one thread call. A tree is walked without
crossing into another file system (a tmpfs volume is measured on its own), counting a
hard-linked file once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from stat import S_ISDIR
from typing import Protocol

from pykubelet.runtime.base import (
    ContainerStorage,
    ImageFsStats,
    ImageService,
    RuntimeContainer,
    RuntimeFailure,
)
from pykubelet.stats.types import FsStats, VolumeStats

log = logging.getLogger(__name__)


class StorageSource(Protocol):
    """What the storage sample needs of the runtime."""

    async def container_storage(
        self, containers: list[RuntimeContainer]
    ) -> dict[str, ContainerStorage]: ...

    def image_service(self) -> ImageService | None: ...


@dataclass(frozen=True)
class DiskUsage:
    bytes: int
    inodes: int


def disk_usage(paths: Iterable[str | os.PathLike[str]]) -> DiskUsage:
    """The blocks and inodes under `paths`, not crossing into other file systems and counting
    a hard-linked file once. One `lstat` per entry (and a `scandir` per directory): at 1,000
    pods, a storage sample walks a few thousand."""
    used = inodes = 0
    seen: set[tuple[int, int]] = set()
    for top in paths:
        device: int | None = None
        todo = [os.fspath(top)]
        while todo:
            current = todo.pop()
            try:
                st = os.lstat(current)
            except OSError:
                continue  # removed while walked
            if device is None:
                device = st.st_dev
            if st.st_dev != device or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            used += st.st_blocks * 512
            inodes += 1
            if S_ISDIR(st.st_mode):
                try:
                    with os.scandir(current) as entries:
                        todo.extend(entry.path for entry in entries)
                except OSError:
                    continue
    return DiskUsage(used, inodes)


def fs_totals(path: str | Path, at: datetime | None = None) -> FsStats:
    """A file system's totals (statvfs of `path`), with `usedBytes` what is not free on it."""
    st = os.statvfs(path)
    return FsStats(
        time=at or datetime.now(UTC),
        available_bytes=st.f_bavail * st.f_frsize,
        capacity_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        # File systems without inodes (btrfs reports 0) have no inode figures.
        inodes_free=st.f_ffree if st.f_files else None,
        inodes=st.f_files or None,
        inodes_used=(st.f_files - st.f_ffree) if st.f_files else None,
    )


def usage_on(totals: FsStats | None, used: int | None, inodes: int | None, at: datetime) -> FsStats:
    """What one thing uses (`used`, `inodes`) of the file system `totals` describes."""
    return FsStats(
        time=at,
        available_bytes=totals.available_bytes if totals else None,
        capacity_bytes=totals.capacity_bytes if totals else None,
        used_bytes=used,
        inodes_free=totals.inodes_free if totals else None,
        inodes=totals.inodes if totals else None,
        inodes_used=inodes,
    )


@dataclass(frozen=True)
class StorageReading:
    """One storage sample: the node's, and by container ID and pod UID what they use."""

    at: float
    node_fs: FsStats | None = None
    image_fs: FsStats | None = None
    rootfs: dict[str, FsStats] = field(default_factory=dict)  # container ID -> writable layer
    logs: dict[str, FsStats] = field(default_factory=dict)  # container ID -> its log files
    volumes: dict[str, tuple[VolumeStats, ...]] = field(default_factory=dict)  # pod UID
    pod_files: dict[str, FsStats] = field(default_factory=dict)  # pod UID -> etc-hosts, ...


def _time(at: float | None, default: datetime) -> datetime:
    return datetime.fromtimestamp(at, UTC) if at is not None else default


class StorageSampler:
    def __init__(
        self, root_dir: Path, source: StorageSource, period: float, sample_period: float
    ) -> None:
        """`period`: how often to measure (--volume-stats-agg-period); `sample_period`: how often
        the collector samples (--housekeeping-interval), the granularity of `due`."""
        self._root_dir = root_dir
        self._source = source
        self.period = period
        self._slack = sample_period / 2
        self._latest: StorageReading | None = None
        self._failing = ""  # what failed in the last sample, logged once

    def due(self, now: float) -> bool:
        """Whether the last reading is old enough to take another: a period old, less half the
        collector's (its samples come once a sample period; others in between reuse it)."""
        return self._latest is None or now - self._latest.at >= self.period - self._slack

    @property
    def latest(self) -> StorageReading | None:
        return self._latest

    async def sample(self, containers: Sequence[RuntimeContainer]) -> StorageReading:
        """Ask the runtime what `containers` keep on disk and measure it all; keep it."""
        problems: list[str] = []
        storage: dict[str, ContainerStorage] = {}
        try:
            storage = await self._source.container_storage(list(containers))
        except (RuntimeFailure, TimeoutError) as exc:
            problems.append(f"cannot measure the containers' writable layers: {exc}")
        image: ImageFsStats | None = None
        images = self._source.image_service()
        if images is not None:
            try:
                image = await images.image_fs_stats()
            except (RuntimeFailure, TimeoutError) as exc:
                problems.append(f"cannot read the image file system: {exc}")
        uids = sorted({c.pod_uid for c in containers})
        reading = await asyncio.to_thread(self._measure, storage, image, uids, problems)
        problem = "; ".join(problems)
        if problem and problem != self._failing:
            log.warning("storage usage sample incomplete: %s", problem)
        elif not problem and self._failing:
            log.info("storage usage samples complete again")
        self._failing = problem
        self._latest = reading
        return reading

    def _measure(
        self,
        storage: dict[str, ContainerStorage],
        image: ImageFsStats | None,
        uids: list[str],
        problems: list[str],
    ) -> StorageReading:
        """In a thread: every file this sample reads."""
        started = time.time()
        now = datetime.fromtimestamp(started, UTC)
        node_fs: FsStats | None = None
        try:
            node_fs = fs_totals(self._root_dir, now)
        except OSError as exc:
            problems.append(f"cannot read the --root-dir file system: {exc.strerror or exc}")
        image_fs: FsStats | None = None
        image_totals: FsStats | None = None
        if image is not None:
            try:
                image_totals = fs_totals(image.path, now)
            except OSError as exc:
                problems.append(f"cannot measure the image file system {image.path}: {exc}")
            image_fs = usage_on(
                image_totals, image.used_bytes, image.inodes_used, _time(image.at, now)
            )
        rootfs: dict[str, FsStats] = {}
        logs: dict[str, FsStats] = {}
        for id, found in storage.items():
            if found.rootfs_bytes is not None:
                at = _time(found.rootfs_at, now)
                rootfs[id] = usage_on(image_totals, found.rootfs_bytes, found.rootfs_inodes, at)
            if found.log_paths:
                used = disk_usage(_log_files(found.log_paths))
                logs[id] = usage_on(node_fs, used.bytes, used.inodes, now)
        volumes: dict[str, tuple[VolumeStats, ...]] = {}
        pod_files: dict[str, FsStats] = {}
        pods_dir = os.path.join(self._root_dir, "pods")
        for uid in uids:
            pod_dir = f"{pods_dir}/{uid}"
            volumes[uid] = tuple(self._volumes(f"{pod_dir}/volumes", now))
            files = _top_files(pod_dir)
            if files:
                used = disk_usage(files)
                pod_files[uid] = usage_on(node_fs, used.bytes, used.inodes, now)
        return StorageReading(started, node_fs, image_fs, rootfs, logs, volumes, pod_files)

    @staticmethod
    def _volumes(directory: str, now: datetime) -> Iterable[VolumeStats]:
        try:
            plugins = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            return
        for plugin in plugins:
            try:
                entries = sorted(os.scandir(plugin.path), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                path = entry.path
                try:
                    totals = fs_totals(path, now)  # its own file system when it is a tmpfs
                except OSError:
                    continue
                used = disk_usage([path])
                fs = usage_on(totals, used.bytes, used.inodes, now)
                yield VolumeStats(name=entry.name, plugin=plugin.name, fs=fs)


def _log_files(paths: Iterable[str]) -> list[str]:
    """The log files named, and those directly in the directories named (the kubelet's
    fileMetricsByDir: the files, not the directory itself nor what is below it)."""
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            out += _top_files(path)
        else:
            out.append(path)
    return out


def _top_files(directory: str) -> list[str]:
    """The files directly in a directory (a pod's: etc-hosts, resolv.conf, not its volumes)."""
    try:
        with os.scandir(directory) as entries:
            return [e.path for e in entries if e.is_file(follow_symlinks=False)]
    except OSError:
        return []
