"""Cluster mode (`--kubeconfig`): the agent as a node of a Kubernetes cluster.

`Cluster` ties the parts together and gives the kubelet its tasks:
- connect: load the kubeconfig (an empty path: the in-cluster service account) and build the
  client; retried while it fails (a kubeconfig written later by a bootstrap, a typo fixed);
- pods: the API server source (config/apiserver.py), the third producer of the merger;
- node: registration, the Lease heartbeat, the node status (node.py);
- status: pod status patches (status_sync.py), for API pods and, through their mirror pods,
  for static pods;
- mirrors: mirror pods of the static pods (mirror.py);
- events: the recorder's events posted to the API server, rate limited, best effort;
- finalizer: the kubelet's final delete. A pod being deleted (deletionTimestamp) is terminated by
  the kubelet within its grace period; once its containers are stopped its last status is sent
  and it is deleted from the API server with gracePeriodSeconds=0 and its UID as a
  precondition. Pods being deleted that never ran here (first seen with a deletionTimestamp) and
  pods whose termination ended with the agent away are swept every 2 s.

At shutdown the kubelet stops the pods first, then calls `close()`, which sends the statuses
still pending (at most 2 s) and closes the client.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pykubelet.api.model import Pod, PodStatus
from pykubelet.client.kubeapi import ApiError, ConfigError, KubeApi
from pykubelet.client.throttle import Failures, RateLimiter, Retry
from pykubelet.cluster.mirror import MirrorPods
from pykubelet.cluster.node import NodeAgent
from pykubelet.common.events import Event
from pykubelet.common.options import Options
from pykubelet.config.apiserver import ApiSource
from pykubelet.config.types import PodUpdate
from pykubelet.pod.envvars import EnvError
from pykubelet.pod.workers import WorkerState
from pykubelet.runtime.base import ContainerRunState
from pykubelet.status.patcher import StatusSync, Target

if TYPE_CHECKING:
    from pykubelet.kubelet.kubelet import Kubelet

log = logging.getLogger(__name__)

Obj = dict[str, Any]

SWEEP_PERIOD = 2.0
EVENT_QPS, EVENT_BURST = 5.0, 25
EVENT_QUEUE = 1000
SHUTDOWN_FLUSH_SECONDS = 2.0


class EventSink:
    """Posts the recorder's events to `/api/v1/namespaces/{ns}/events`; a repeated event (its
    count went up) patches the one posted. Best effort: a full queue drops the oldest, a failure
    drops the event (and logs at debug only: reporting it as an event would feed a loop)."""

    def __init__(self, node_name: str, qps: float = EVENT_QPS, burst: int = EVENT_BURST) -> None:
        self.node_name = node_name
        self._pending: OrderedDict[str, Event] = OrderedDict()
        self._posted: OrderedDict[str, None] = OrderedDict()
        self._wake = asyncio.Event()
        self._limiter = RateLimiter(qps, burst)
        self.sent = 0
        self.dropped = 0

    def on_event(self, event: Event) -> None:
        self._pending.pop(event.name, None)
        self._pending[event.name] = event
        while len(self._pending) > EVENT_QUEUE:
            self._pending.popitem(last=False)
            self.dropped += 1
        self._wake.set()

    async def run(self, api: KubeApi) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                _, event = self._pending.popitem(last=False)
                await self._limiter.acquire()
                try:
                    await self._send(api, event)
                    self.sent += 1
                except ApiError as exc:
                    self.dropped += 1
                    log.debug("event %s not sent: %s", event.reason, exc)

    async def _send(self, api: KubeApi, event: Event) -> None:
        body = event.to_api(self.node_name)
        meta = body["metadata"]
        base = f"/api/v1/namespaces/{meta['namespace']}/events"
        if event.name in self._posted:
            patch = {
                "count": body["count"],
                "lastTimestamp": body["lastTimestamp"],
                "message": body["message"],
            }
            try:
                await api.patch(f"{base}/{meta['name']}", patch, kind="merge")
                return
            except ApiError as exc:
                if exc.status != 404:
                    raise
        try:
            await api.create(base, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._posted[event.name] = None
        while len(self._posted) > EVENT_QUEUE:
            self._posted.popitem(last=False)


class ApiObjectLookup:
    """ConfigMaps and Secrets for the pods' env and volumes, read from the API server.

    Read at each sync of a pod that uses them (the kubelet's "Get" strategy): a change reaches
    the pod's volumes at its next sync, at most --sync-frequency later.
    """

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    async def _get(self, kind: str, namespace: str, name: str) -> Obj | None:
        api = self._cluster.api
        if api is None:
            raise EnvError(f'{kind[:-1]} "{name}": not connected to the API server yet')
        try:
            return await api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise EnvError(f'cannot read {kind[:-1]} "{namespace}/{name}": {exc}') from None

    async def config_map(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        obj = await self._get("configmaps", namespace, name)
        if obj is None:
            return None
        data: dict[str, str | bytes] = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        try:
            for key, value in (obj.get("binaryData") or {}).items():
                data[str(key)] = base64.b64decode(value)  # bytes as they are: a keystore, a gzip
        except (ValueError, TypeError) as exc:
            raise EnvError(
                f'configmap "{namespace}/{name}": binaryData is not base64: {exc}'
            ) from None
        return data

    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = await self._get("secrets", namespace, name)
        if obj is None:
            return None
        try:
            data = {str(k): base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        except (ValueError, TypeError) as exc:
            raise EnvError(f'secret "{namespace}/{name}": data is not base64: {exc}') from None
        for key, value in (obj.get("stringData") or {}).items():
            data[str(key)] = str(value).encode()
        return data


class Cluster:
    def __init__(self, opts: Options, kubelet: Kubelet, push: Callable[[PodUpdate], None]) -> None:
        self.opts = opts
        self.kubelet = kubelet
        self.kubeconfig: Path = opts.kubeconfig if opts.kubeconfig is not None else Path("")
        self.api: KubeApi | None = None
        self.connected = asyncio.Event()
        self.status = StatusSync(self._target)
        self.source = ApiSource(opts.node_name, push, kubelet.recorder, rejected=self._rejected)
        self.node = NodeAgent(kubelet)
        self.mirrors = MirrorPods(kubelet, self.source, self.node)
        self.events = EventSink(opts.node_name)
        self.final_deletes = 0
        self._deleted: set[str] = set()  # UIDs whose final delete went through
        self._background: set[asyncio.Task[None]] = set()
        self.source.add_listener(self.status.retarget)
        kubelet.statuses.add_listener(self._on_status)
        kubelet.recorder.add_listener(self.events.on_event)
        kubelet.syncer.terminated_listeners.append(self._on_terminated)
        kubelet.syncer.objects = ApiObjectLookup(self)

    def tasks(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        return [
            ("cluster-connect", self._connect()),
            ("cluster-pods", self._with_api(self.source.run)),
            ("cluster-node", self._with_api(self.node.run)),
            ("cluster-status", self._with_api(self.status.run)),
            ("cluster-mirrors", self._with_api(self.mirrors.run)),
            ("cluster-events", self._with_api(self.events.run)),
            ("cluster-finalizer", self._with_api(self._sweep_forever)),
        ]

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.api is not None:
            if not await self.status.flush(self.api, within=SHUTDOWN_FLUSH_SECONDS):
                log.info("some pod statuses were not sent before the agent stopped")
            await self.api.close()
            self.api = None

    # --- connecting ---

    async def _connect(self) -> None:
        retry = Retry(1.0, 30.0)
        failures = Failures(f"loading --kubeconfig {self.kubeconfig}")
        while True:
            try:
                self.api = await KubeApi.connect(self.kubeconfig, self.opts.node_name)
            except ConfigError as exc:
                failures.failed(exc, " (retrying; the API server source stays not ready)")
                await asyncio.sleep(retry.delay())
                continue
            break
        failures.ok()
        log.info("API server %s", self.api.host)
        self.connected.set()

    async def _with_api(self, run: Callable[[KubeApi], Awaitable[None]]) -> None:
        await self.connected.wait()
        assert self.api is not None
        await run(self.api)

    # --- status ---

    def _on_status(self, uid: str, status: PodStatus) -> None:
        self.status.on_status(uid, status)

    def _target(self, uid: str) -> Target | None:
        obj = self.source.api_object(uid)
        if obj is None:
            obj = self.mirrors.mirror_of(uid)
        if obj is None:
            return None
        meta = obj.get("metadata") or {}
        return Target(
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            obj.get("status") or {},
        )

    def _rejected(self, obj: Obj, message: str) -> None:
        """A pod we cannot run: Failed in the API server, as the kubelet's admission does."""
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        if uid and uid not in self.kubelet.pods:
            self.status.set(
                uid,
                {
                    "phase": "Failed",
                    "reason": "FailedValidation",
                    "message": f"pykubelet: {message}",
                },
            )

    # --- the final delete ---

    async def _on_terminated(self, uid: str, pod: Pod | None) -> None:
        if uid in self.source.deleting() and uid not in self._deleted:
            task = asyncio.create_task(self._final_delete(uid), name=f"final-delete-{uid[:8]}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _final_delete(self, uid: str) -> None:
        api = self.api
        obj = self.source.deleting().get(uid)
        if api is None or obj is None or uid in self._deleted:
            return
        # Its last status first (containers terminated), as the kubelet's status manager does.
        await self.status.flush(api, [uid])
        meta = obj.get("metadata") or {}
        path = f"/api/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}"
        try:
            await api.delete(path, grace=0, uid=uid)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("final delete of pod %s failed: %s (retrying)", path, exc)
                return
        self._deleted.add(uid)
        self.final_deletes += 1
        log.info(
            "pod %s/%s terminated: deleted from the API server",
            meta.get("namespace"),
            meta.get("name"),
        )

    async def _can_delete(self, uid: str) -> bool:
        state = self.kubelet.workers.state_of(uid)
        if state in (WorkerState.SYNCING, WorkerState.TERMINATING):
            return False
        runtime_pod = await self.kubelet.runtime.get_pod(uid)
        if runtime_pod is None:
            return True
        return not any(
            c.state in (ContainerRunState.RUNNING, ContainerRunState.CREATED)
            for c in runtime_pod.containers
        )

    async def sweep(self) -> None:
        deleting = self.source.deleting()
        self._deleted &= set(deleting)
        for uid in deleting:
            if uid not in self._deleted and await self._can_delete(uid):
                await self._final_delete(uid)
        # Statuses of pods that are gone everywhere are not needed any more.
        for uid in self.status.known():
            if (
                uid not in self.kubelet.pods
                and self.source.api_object(uid) is None
                and not self.kubelet.workers.is_known(uid)
            ):
                self.status.forget(uid)

    async def _sweep_forever(self, api: KubeApi) -> None:
        await self.source.synced.wait()
        while True:
            try:
                await self.sweep()
            except Exception:
                log.exception("the final-delete sweep failed")
            await asyncio.sleep(SWEEP_PERIOD)
