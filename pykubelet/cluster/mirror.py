"""Mirror pods: each static pod (from a file or a URL) is shown in the API server as a pod of the
same name, so `kubectl get pods` sees what the node runs (the kubelet's mirror client).

- A mirror pod carries `kubernetes.io/config.mirror` = the static pod's config hash, its spec,
  labels and annotations, and an owner reference to our Node (so it goes with the node).
- Reconciled on every change of the API's view and every second against the kubelet's pods: a
  missing mirror is created (again, if someone deleted it); one whose hash is not the static pod's
  (the manifest changed) or that is being deleted is deleted and then recreated; one with no
  static pod any more is deleted. Deletes are immediate (grace 0) with the mirror's UID as a
  precondition, so a recreated one is never hit by mistake.
- A non-mirror pod that already has the name is left alone (reported once): it is someone's pod.
- The static pod's status goes to its mirror (see status_sync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pykubelet.api.model import Pod
from pykubelet.api.static import CONFIG_HASH, CONFIG_MIRROR
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.client.throttle import Failures
from pykubelet.cluster.node import NodeAgent
from pykubelet.config.apiserver import ApiSource
from pykubelet.kubelet.pod_store import PodView, is_static

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)

PERIOD = 1.0
# A created mirror that the watch has not shown after this long is created again.
PENDING_SECONDS = 10.0


def mirror_hash(obj: Obj) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(CONFIG_MIRROR)
    return str(value) if value is not None else None


def mirror_body(pod: Pod, node_name: str, node_uid: str) -> Obj:
    annotations = dict(pod.metadata.annotations)
    annotations[CONFIG_MIRROR] = annotations.get(CONFIG_HASH, pod.uid)
    meta: Obj = {
        "name": pod.metadata.name,
        "namespace": pod.metadata.namespace,
        "annotations": annotations,
    }
    if pod.metadata.labels:
        meta["labels"] = dict(pod.metadata.labels)
    if node_uid:
        owner = {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        meta["ownerReferences"] = [{**owner, "controller": True}]
    spec = pod.spec.to_api()
    spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class MirrorPods:
    def __init__(
        self,
        pods: PodView,
        source: ApiSource,
        node: NodeAgent,
        node_name: str,
        period: float = PERIOD,
    ) -> None:
        self._pods = pods
        self._node_name = node_name
        self.source = source
        self.node = node
        self.period = period
        self._wake = asyncio.Event()
        self._created: dict[Key, tuple[str, float]] = {}  # key -> (hash, when) awaiting the watch
        self._deleting: dict[str, float] = {}  # mirror uid -> when the delete was sent
        self._blocked: set[Key] = set()
        self._failures = Failures("syncing mirror pods")
        self.creates = 0
        self.deletes = 0
        source.add_listener(self._wake.set)

    def static_pods(self) -> dict[Key, Pod]:
        return {(p.metadata.namespace, p.metadata.name): p for p in self._pods.static()}

    def static_uids(self) -> list[str]:
        return [p.uid for p in self._pods.static()]

    def mirror_of(self, static_uid: str) -> Obj | None:
        """The mirror pod showing the static pod `static_uid`, if the API server has it."""
        pod = self._pods.get(static_uid)
        if pod is None or not is_static(pod):
            return None
        obj = self.source.mirror_pods().get((pod.metadata.namespace, pod.metadata.name))
        if obj is None or mirror_hash(obj) != pod.metadata.annotations.get(CONFIG_HASH, pod.uid):
            return None
        return obj

    async def run(self, api: KubeApi) -> None:
        await self.node.registered.wait()
        await self.source.synced.wait()
        while True:
            try:
                await self.reconcile(api)
                self._failures.ok()
            except ApiError as exc:
                self._failures.failed(exc, " (retrying)")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.period):
                    await self._wake.wait()
            self._wake.clear()

    async def reconcile(self, api: KubeApi) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        static = self.static_pods()
        mirrors = self.source.mirror_pods()
        for key, obj in mirrors.items():
            pod = static.get(key)
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid", ""))
            want = pod.metadata.annotations.get(CONFIG_HASH, pod.uid) if pod is not None else None
            if want is not None and mirror_hash(obj) == want and not meta.get("deletionTimestamp"):
                self._created.pop(key, None)
                continue
            if now - self._deleting.get(uid, -PENDING_SECONDS) < PENDING_SECONDS:
                continue  # sent already; the watch has not shown it gone yet
            self._deleting[uid] = now
            why = "its static pod is gone" if pod is None else "its static pod changed"
            log.info("deleting mirror pod %s/%s: %s", key[0], key[1], why)
            await self._delete(api, key, uid)
        live_uids = {str((o.get("metadata") or {}).get("uid", "")) for o in mirrors.values()}
        self._deleting = {u: t for u, t in self._deleting.items() if u in live_uids}
        for key, pod in static.items():
            if key in mirrors:
                continue
            want = pod.metadata.annotations.get(CONFIG_HASH, pod.uid)
            pending = self._created.get(key)
            if pending is not None and pending[0] == want and now - pending[1] < PENDING_SECONDS:
                continue
            if key in self._blocked and self.source.has_pod(key):
                continue
            await self._create(api, key, pod, want, now)
        for key in [k for k in self._created if k not in static]:
            del self._created[key]

    async def _create(self, api: KubeApi, key: Key, pod: Pod, want: str, now: float) -> None:
        body = mirror_body(pod, self._node_name, self.node.node_uid)
        try:
            await api.create(f"/api/v1/namespaces/{key[0]}/pods", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            if self.source.has_pod(key):
                if key not in self._blocked:
                    self._blocked.add(key)
                    log.warning(
                        "no mirror pod for static pod %s/%s: the API server has a pod of that "
                        "name already",
                        key[0],
                        key[1],
                    )
                return
            # A mirror the watch has not delivered yet: wait for it.
        else:
            self.creates += 1
            self._blocked.discard(key)
            log.info("created mirror pod %s/%s", key[0], key[1])
        self._created[key] = (want, now)

    async def _delete(self, api: KubeApi, key: Key, uid: str) -> None:
        try:
            await api.delete(f"/api/v1/namespaces/{key[0]}/pods/{key[1]}", grace=0, uid=uid)
            self.deletes += 1
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
