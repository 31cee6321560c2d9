"""ConfigMaps and Secrets through a watch of each object the pods use: the kubelet's default
change-detection strategy (`configMapAndSecretChangeDetectionStrategy: Watch`, its
watch-based manager), the `ObjectLookup` of `pod/volumes.py` and the pod store's
`ObjectRegistry` in cluster mode.

What it promises, as the kubelet's:
- a pod entering the desired pods (`register_pod`) adds a reference to each ConfigMap and Secret
  it names (volumes, projected sources, env, envFrom, imagePullSecrets); the first reference
  starts a list + watch of that one object (`fieldSelector=metadata.name=<name>` in its
  namespace, `client/reflector.py`); a pod changed adds and drops the difference; a pod leaving
  (`unregister_pod`) drops its references, and the last one stops the watch;
- a read is served from the watched copy: a change reaches the next sync of the pods that use
  the object with no request; a read waits at most 1 s for the first list, then fails with the
  kubelet's "failed to sync configmaps cache: timed out waiting for the condition" (the pod's
  containers wait, event FailedMount, retried);
- an object found immutable (`immutable: true`) is kept and its watch stopped for good;
- a watch not read for 5 x --sync-frequency (at least 1 min; the objects of a pod are read at
  each of its syncs, so only those of pods that no longer sync, terminated ones, go idle) is
  stopped, looked at every minute, and started again by the next read, which waits for its
  list as the first did (the kubelet's too);
- an object no registered pod names (a pod the store never held) is read from the API server
  at once, as the `Get` strategy does.

Service-account tokens go to `objects.py`'s TokenRequest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pykubelet.api.model import Pod
from pykubelet.client.kubeapi import KubeApi
from pykubelet.client.reflector import Key, Reflector, name_key
from pykubelet.client.throttle import Failures
from pykubelet.cluster.connection import ApiConnection
from pykubelet.cluster.objects import ApiObjectLookup
from pykubelet.pod.envvars import EnvError
from pykubelet.pod.volumes import referenced_objects

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ObjectKey = tuple[str, str, str]  # (resource, namespace, name)

SYNC_WAIT = 1.0  # how long a read waits for the object's first list (the kubelet's)
MIN_IDLE = 60.0  # the shortest idle time before a watch is stopped (the kubelet's minIdleTime)
RECYCLE_PERIOD = 60.0  # how often idle watches are looked for


def pod_references(pod: Pod) -> frozenset[ObjectKey]:
    """Every ConfigMap and Secret the pod names, as (resource, namespace, name): those of its
    volumes and environment and its image pull secrets (the kubelet's VisitPodSecretNames)."""
    namespace = pod.metadata.namespace
    config_maps, secrets = referenced_objects(pod)
    secrets |= {ref.name for ref in pod.spec.image_pull_secrets or [] if ref.name}
    return frozenset(
        [("configmaps", namespace, name) for name in config_maps]
        + [("secrets", namespace, name) for name in secrets]
    )


@dataclass
class _Watched:
    """One watched object: who names it, its reflector while it runs, when it was last read."""

    refs: int = 0
    reflector: Reflector[Key] | None = None
    task: asyncio.Task[None] | None = None
    last_read: float = 0.0
    immutable: Obj | None = None  # the object, once found immutable (no watch any more)


class WatchedObjects(ApiObjectLookup):
    """ConfigMaps and Secrets by a watch each; reads served from the watched copies (decoded,
    and tokens requested, as ApiObjectLookup's)."""

    def __init__(
        self,
        connection: ApiConnection,
        max_idle: float,
        *,
        sync_wait: float = SYNC_WAIT,
        recycle_period: float = RECYCLE_PERIOD,
        min_idle: float = MIN_IDLE,
    ) -> None:
        super().__init__(connection)
        self._max_idle = max(max_idle, min_idle)
        self._sync_wait = sync_wait
        self._recycle_period = recycle_period
        self._items: dict[ObjectKey, _Watched] = {}
        self._pods: dict[str, frozenset[ObjectKey]] = {}  # pod UID -> the objects it names
        self._failures = Failures("the ConfigMap and Secret watches of the API server")
        self.direct_reads = 0

    # --- the registry (the pod store's) ---

    def register_pod(self, pod: Pod) -> None:
        new = pod_references(pod)
        old = self._pods.get(pod.uid, frozenset())
        if new == old:
            return
        for key in new - old:
            item = self._items.get(key)
            if item is None:
                item = self._items[key] = _Watched(last_read=_now())
                self._start(key, item)
            item.refs += 1
        self._drop(old - new)
        if new:
            self._pods[pod.uid] = new
        else:
            self._pods.pop(pod.uid, None)

    def unregister_pod(self, uid: str) -> None:
        self._drop(self._pods.pop(uid, frozenset()))

    def _drop(self, keys: frozenset[ObjectKey]) -> None:
        for key in keys:
            item = self._items.get(key)
            if item is None:
                continue
            item.refs -= 1
            if item.refs <= 0:
                self._stop(item)
                del self._items[key]

    def watching(self) -> list[ObjectKey]:
        """The objects watched now (for tests and the bench)."""
        return sorted(key for key, item in self._items.items() if item.task is not None)

    # --- the reflectors ---

    def _start(self, key: ObjectKey, item: _Watched) -> None:
        resource, namespace, name = key
        selector = f"metadata.name={name}"

        async def list_page(api: KubeApi, limit: int, cont: str | None) -> Obj:
            return await api.list_namespaced(resource, namespace, selector, limit, cont)

        def watch(api: KubeApi, version: str, timeout: int) -> AsyncIterator[Obj]:
            return api.watch_namespaced(resource, namespace, selector, version, timeout)

        reflector: Reflector[Key] = Reflector(
            f'{resource} "{namespace}/{name}"',
            list_page,
            watch,
            key=name_key,
            list_log_level=logging.DEBUG,
            failures=self._failures,
        )
        item.reflector = reflector
        item.task = asyncio.create_task(
            self._connection.with_api(reflector.run), name=f"watch-{resource}-{namespace}-{name}"
        )

    def _stop(self, item: _Watched) -> None:
        if item.task is not None:
            item.task.cancel()
        item.task = None
        item.reflector = None

    async def run(self) -> None:
        """Stops the watches not read for the idle time, every minute; at its end, all."""
        try:
            while True:
                await asyncio.sleep(self._recycle_period)
                self.recycle()
        finally:
            for item in self._items.values():
                self._stop(item)

    def recycle(self) -> None:
        now = _now()
        for key, item in self._items.items():
            reflector = item.reflector
            if (
                reflector is not None
                and reflector.synced.is_set()
                and now - item.last_read > self._max_idle
            ):
                self._stop(item)
                log.debug("%s/%s/%s: not read for %gs, its watch stopped", *key, self._max_idle)

    # --- the lookup (pod/'s ObjectLookup: ApiObjectLookup's, reading the watched copies) ---

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The object from its watch; one no registered pod names from the API server."""
        key = (kind, namespace, name)
        item = self._items.get(key)
        if item is None:
            self.direct_reads += 1
            return await super().get(kind, namespace, name)
        item.last_read = _now()
        if item.immutable is not None:
            return item.immutable
        if item.reflector is None:
            self._start(key, item)  # stopped while idle: watched again
        reflector = item.reflector
        assert reflector is not None
        if not reflector.synced.is_set():
            try:
                async with asyncio.timeout(self._sync_wait):
                    await reflector.synced.wait()
            except TimeoutError:
                why = reflector.problem or ""
                if self._connection.api is None:
                    why = "not connected to the API server yet"
                raise EnvError(
                    f"failed to sync {kind} cache: timed out waiting for the condition"
                    + (f" ({why})" if why else "")
                ) from None
        obj = reflector.objects.get((namespace, name))
        if obj is not None and obj.get("immutable") is True:
            item.immutable = obj
            self._stop(item)
            log.debug("%s %s/%s is immutable: its watch stopped", kind, namespace, name)
        return obj


def _now() -> float:
    return asyncio.get_running_loop().time()
