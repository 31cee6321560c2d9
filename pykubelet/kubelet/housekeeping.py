"""Housekeeping (the kubelet's HandlePodCleanups), every 2 s once all sources are ready:

- kill what the runtime runs that no source wants (pods of an earlier agent, pods removed
  while a worker was busy) and forget workers whose pods are finished and gone;
- in the background, one pass at a time so that config updates, runtime events and probes are
  never held up by a walk of a big emptyDir: remove the volumes of pods no source has, and
  every `--eviction-monitoring-interval` (10 s) the kubelet's local-storage eviction
  (Failed/Evicted with its message): a pod whose emptyDir uses more than its sizeLimit, whose
  ephemeral storage is above the sum of its containers' `limits.ephemeral-storage`, or one of
  whose containers' writable layer and logs are above its own limit (those two from the stats
  collector's latest sample).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from pykubelet.api.model import Pod
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.kubelet.eviction_policy import storage_limit_message
from pykubelet.kubelet.pod_store import PodView
from pykubelet.pod.volumes import Exceeded
from pykubelet.pod.workers import UpdateType
from pykubelet.runtime.base import RuntimePod
from pykubelet.stats.types import NodeStats
from pykubelet.status.generate import TERMINAL_PHASES
from pykubelet.status.manager import StatusManager

log = logging.getLogger(__name__)

# How often emptyDir usage is measured against sizeLimit (a walk of each limited volume), and
# the pods' ephemeral storage against their limits: the eviction manager's interval.
EVICTION_PERIOD = 10.0


class RunningPods(Protocol):
    async def list_pods(self) -> list[RuntimePod]: ...


class Workers(Protocol):
    def is_known(self, uid: str) -> bool: ...

    def forget_finished(self, desired: set[str]) -> None: ...

    def update_pod(
        self,
        update: UpdateType,
        pod: Pod | None,
        uid: str | None = None,
        *,
        grace: float | None = None,
        removed: bool = False,
    ) -> None: ...


class LatestStats(Protocol):
    def latest(self) -> NodeStats | None: ...


class PodVolumes(Protocol):
    async def pod_uids(self) -> list[str]: ...

    async def teardown(self, uid: str) -> None: ...

    async def over_limit(self, pod: Pod) -> list[Exceeded]: ...


class Housekeeping:
    def __init__(
        self,
        runtime: RunningPods,
        pods: PodView,
        workers: Workers,
        volumes: PodVolumes,
        statuses: StatusManager,
        recorder: EventRecorder,
        is_rejected: Callable[[str], bool],
        eviction_period: float = EVICTION_PERIOD,
        stats: LatestStats | None = None,
    ) -> None:
        self._stats = stats
        self._runtime = runtime
        self._pods = pods
        self._workers = workers
        self._volumes = volumes
        self._statuses = statuses
        self._recorder = recorder
        self._is_rejected = is_rejected
        self._eviction_period = eviction_period
        self._next_eviction_check = 0.0
        self._background: asyncio.Task[None] | None = None

    async def run_once(self) -> None:
        """Kill what the runtime runs that no source wants; forget finished workers. Raises
        what the runtime raises (the sync loop backs off)."""
        for runtime_pod in await self._runtime.list_pods():
            uid = runtime_pod.uid
            if uid in self._pods or self._workers.is_known(uid):
                continue
            log.info(
                "removing pod %s/%s (uid %s): no source has it",
                runtime_pod.namespace,
                runtime_pod.name,
                uid,
            )
            self._workers.update_pod(UpdateType.KILL, None, uid, removed=True)
        self._workers.forget_finished({pod.uid for pod in self._pods})
        if self._background is None or self._background.done():
            self._background = asyncio.create_task(self._volume_pass(), name="volume-housekeeping")

    async def close(self) -> None:
        if self._background is not None:
            self._background.cancel()
            await asyncio.gather(self._background, return_exceptions=True)

    async def _volume_pass(self) -> None:
        try:
            # Volumes of pods that ended while no agent ran (or whose removal failed half-way).
            for uid in await self._volumes.pod_uids():
                if uid not in self._pods and not self._workers.is_known(uid):
                    log.info("removing the volumes of pod %s: no source has it", uid)
                    await self._volumes.teardown(uid)
            if time.monotonic() >= self._next_eviction_check:
                self._next_eviction_check = time.monotonic() + self._eviction_period
                await self._evict_over_limit()
        except Exception:
            log.exception("volume housekeeping failed; retrying at the next housekeeping")

    async def _evict_over_limit(self) -> None:
        """An emptyDir past its sizeLimit, or a pod or container past its ephemeral-storage
        limit, fails its pod, as the kubelet's eviction manager."""
        latest = self._stats.latest() if self._stats is not None else None
        sampled = {p.uid: p for p in latest.pods} if latest is not None else {}
        for pod in self._pods:
            uid = pod.uid
            if self._is_rejected(uid):
                continue
            status = self._statuses.get(uid)
            if status is None or status.phase in TERMINAL_PHASES:
                continue
            message = None
            if any(
                v.empty_dir is not None and v.empty_dir.size_limit is not None
                for v in pod.spec.volumes or []
            ):
                exceeded = await self._volumes.over_limit(pod)
                if exceeded:
                    first = exceeded[0]
                    message = (
                        f'Usage of EmptyDir volume "{first.volume}" exceeds the limit '
                        f'"{first.limit}".'
                    )
            found = sampled.get(uid)
            if message is None and found is not None and found.ephemeral_storage is not None:
                message = storage_limit_message(pod, found)
            if message is None:
                continue
            log.warning("evicting pod %s: %s", pod.key, message)
            self._recorder.record(
                "Warning",
                "Evicted",
                message,
                ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, uid),
            )
            self._statuses.set(
                uid,
                status.model_copy(
                    update={"phase": "Failed", "reason": "Evicted", "message": message}
                ),
            )
            self._workers.update_pod(UpdateType.KILL, pod)
