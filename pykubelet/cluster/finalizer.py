"""The kubelet's final delete.

A pod being deleted (deletionTimestamp) is terminated by the kubelet within its grace period;
once its containers are stopped its last status is sent and it is deleted from the API server
with gracePeriodSeconds=0 and its UID as a precondition. Pods being deleted that never ran here
(first seen with a deletionTimestamp) and pods whose termination ended with the agent away are
swept every 2 s. The sweep also forgets the statuses of pods that are gone everywhere.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from pykubelet.api.model import Pod
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.cluster.connection import ApiConnection
from pykubelet.config.apiserver import ApiSource
from pykubelet.kubelet.pod_store import PodView
from pykubelet.pod.workers import WorkerState
from pykubelet.runtime.base import ContainerRunState, RuntimePod
from pykubelet.status.patcher import StatusSync

log = logging.getLogger(__name__)

Obj = dict[str, Any]

SWEEP_PERIOD = 2.0


class Workers(Protocol):
    @property
    def pods(self) -> PodView: ...

    def worker_state(self, uid: str) -> WorkerState | None: ...


class RuntimePods(Protocol):
    async def get_pod(self, uid: str) -> RuntimePod | None: ...


class FinalDeletes:
    def __init__(
        self,
        connection: ApiConnection,
        source: ApiSource,
        statuses: StatusSync,
        kubelet: Workers,
        runtime: RuntimePods,
        period: float = SWEEP_PERIOD,
    ) -> None:
        self._connection = connection
        self._source = source
        self._statuses = statuses
        self._kubelet = kubelet
        self._runtime = runtime
        self._period = period
        self.count = 0
        self._deleted: set[str] = set()  # UIDs whose final delete went through
        self._background: set[asyncio.Task[None]] = set()

    async def on_terminated(self, uid: str, pod: Pod | None) -> None:
        if uid not in self._deleted and self._source.deleting_object(uid) is not None:
            task = asyncio.create_task(self._final_delete(uid), name=f"final-delete-{uid[:8]}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    async def _final_delete(self, uid: str) -> None:
        api = self._connection.api
        obj = self._source.deleting_object(uid)
        if api is None or obj is None or uid in self._deleted:
            return
        # Its last status first (containers terminated), as the kubelet's status manager does.
        await self._statuses.flush(api, [uid])
        meta = obj.get("metadata") or {}
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
        try:
            await api.delete(path, grace=0, uid=uid)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("final delete of pod %s failed: %s (retrying)", path, exc)
                return
        self._deleted.add(uid)
        self.count += 1
        log.info(
            "pod %s/%s terminated: deleted from the API server",
            meta.get("namespace"),
            meta.get("name"),
        )

    async def _can_delete(self, uid: str) -> bool:
        state = self._kubelet.worker_state(uid)
        if state in (WorkerState.SYNCING, WorkerState.TERMINATING):
            return False
        runtime_pod = await self._runtime.get_pod(uid)
        if runtime_pod is None:
            return True
        return not any(
            c.state in (ContainerRunState.RUNNING, ContainerRunState.CREATED)
            for c in runtime_pod.containers
        )

    async def sweep(self) -> None:
        deleting = self._source.deleting()
        self._deleted &= set(deleting)
        for uid in deleting:
            if uid not in self._deleted and await self._can_delete(uid):
                await self._final_delete(uid)
        # Statuses of pods that are gone everywhere are not needed any more.
        for uid in self._statuses.known():
            if (
                uid not in self._kubelet.pods
                and self._source.api_object(uid) is None
                and self._kubelet.worker_state(uid) is None
            ):
                self._statuses.forget(uid)

    async def run(self, api: KubeApi) -> None:
        await self._source.synced.wait()
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("the final-delete sweep failed")
            await asyncio.sleep(self._period)
