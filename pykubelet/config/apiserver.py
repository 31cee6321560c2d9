"""The API server source: the pods bound to this node, by list + watch (through
`client/kubeapi.py`, the one client of the API server).

The source is the kubelet's pod reflector: a list of all namespaces with
`fieldSelector=spec.nodeName=<node>`, then a watch from the list's resourceVersion with bookmarks,
resumed from the last version seen (an event's or a bookmark's) whenever the stream ends or
breaks; a `410 Gone` (the version was compacted away) re-lists. Every change sends the source's
whole state as a SET. While the API server cannot be reached nothing is sent, so the running pods
keep running and, until the first list, the source is not ready and no pod of any source is
garbage-collected.

What goes into the SET:
- pods whose `spec.nodeName` is this node (the selector says so; checked again in case a server
  ignores it), decoded into our Pod model. The API's status is dropped: we compute our own.
- not mirror pods (annotation `kubernetes.io/config.mirror`): they reflect our static pods.
- not pods first seen already being deleted (deletionTimestamp set): there is nothing to run and
  nothing to stop; the cluster's finalizer deletes them (the kubelet's final delete).
- the fields that only the scheduler acts on (preemptionPolicy, affinity, topology spread,
  scheduling gates) and the service-account token volume that the API server's admission injects
  into every pod are set aside before decoding: they have no effect on the process runtime, and
  without that no pod of a real cluster would run. Anything else we cannot run is reported (a
  `FailedValidation` event on the pod, and the pod is marked Failed in the API server, as the
  kubelet does with a pod it cannot admit) and not run; a pod that was good and turns bad keeps its
  last good version.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pykubelet.api.decode import pod_from_object
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.static import CONFIG_MIRROR
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.client.throttle import Failures, Retry
from pykubelet.common import metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.config.types import API_SOURCE, Op, PodUpdate

log = logging.getLogger(__name__)

Obj = dict[str, Any]

FAILED_VALIDATION = "FailedValidation"
LIST_PAGE = 500
# The kubelet's reflector watches for a random 5 to 10 minutes, then re-watches from where it was:
# spread so a fleet does not reconnect at once.
WATCH_TIMEOUT = (300, 600)


# --- decoding API pods --------------------------------------------------------------------------


def _readiness_gate_conditions(obj: Obj) -> list[Obj]:
    """The status conditions the pod's readinessGates name: set by controllers through the API
    server, read by the kubelet for the pod's Ready condition. Only these are kept of the
    status, so that a change of one is a change of the pod (and of nothing else)."""
    spec = obj.get("spec")
    status = obj.get("status")
    if not isinstance(spec, dict) or not isinstance(status, dict):
        return []
    gates = spec.get("readinessGates")
    conditions = status.get("conditions")
    if not isinstance(gates, list) or not isinstance(conditions, list):
        return []
    wanted = {g.get("conditionType") for g in gates if isinstance(g, dict)}
    return [
        {"type": c["type"], "status": c.get("status", "Unknown")}
        for c in conditions
        if isinstance(c, dict) and c.get("type") in wanted
    ]


def prepare_api_pod(obj: Obj) -> Obj:
    """The object our Pod model decodes: without status (but the conditions of its readiness
    gates).

    resourceVersion and managedFields go too: they change with every write (our own status
    patches included), and a pod that differs only in them is the same pod to run.
    """
    doc = {k: v for k, v in obj.items() if k != "status"}
    gates = _readiness_gate_conditions(obj)
    if gates:
        doc["status"] = {"conditions": gates}
    doc["apiVersion"], doc["kind"] = "v1", "Pod"  # list items carry neither
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        doc["metadata"] = {
            k: v for k, v in meta.items() if k not in ("resourceVersion", "managedFields")
        }
    return doc  # the spec as served: decoding reads it and changes nothing


def pod_location(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"api pod {meta.get('namespace', '')}/{meta.get('name', '')}"


def decode_api_pod(obj: Obj) -> Pod:
    """Raises ManifestError naming the pod, the field and the reason."""
    return pod_from_object(prepare_api_pod(obj), pod_location(obj), api_pod=True)


def is_mirror(obj: Obj) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, dict) and CONFIG_MIRROR in annotations


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


# --- the source ---------------------------------------------------------------------------------


@dataclass
class _Decoded:
    version: str  # resourceVersion decoded
    pod: Pod | None
    error: ManifestError | None


Rejected = Callable[[Obj, str], None]
"""`rejected(api_object, message)`: a pod that cannot run, never good."""


class ApiSource:
    """List + watch of the pods bound to the node; pushes SETs; keeps the API's view for the
    rest of the cluster mode (mirror pods, pods being deleted, their API status)."""

    def __init__(
        self,
        node_name: str,
        push: Callable[[PodUpdate], None],
        recorder: EventRecorder,
        rejected: Rejected | None = None,
        watch_timeout: tuple[int, int] = WATCH_TIMEOUT,
    ) -> None:
        self.node_name = node_name
        self.selector = f"spec.nodeName={node_name}"
        self._push = push
        self._recorder = recorder
        self._rejected = rejected
        self.watch_timeout = watch_timeout
        self.resource_version: str | None = None  # where the watch resumes; None: re-list
        self._objects: dict[str, Obj] = {}  # uid -> the API's object (mirror pods included)
        self._decoded: dict[str, _Decoded] = {}
        self._good: dict[str, Pod] = {}  # uid -> last good pod
        self._reported: dict[str, str] = {}  # uid -> the problem last reported
        self._pushed: dict[str, Pod] | None = None  # what the last SET held
        self._flush_scheduled = False
        self._listeners: list[Callable[[], None]] = []
        self._failures = Failures("pod list/watch of the API server")
        self.lists = 0
        self.watches = 0
        self.synced = asyncio.Event()

    # --- what the rest of the cluster mode reads ---

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called after each change of the API's view has been applied."""
        self._listeners.append(listener)

    def api_object(self, uid: str) -> Obj | None:
        """The API's latest object of a (non-mirror) pod bound to us."""
        obj = self._objects.get(uid)
        return obj if obj is not None and not is_mirror(obj) else None

    def mirror_pods(self) -> dict[tuple[str, str], Obj]:
        out = {}
        for obj in self._objects.values():
            if is_mirror(obj):
                meta = _meta(obj)
                out[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = obj
        return out

    def deleting(self) -> dict[str, Obj]:
        """Non-mirror pods with a deletionTimestamp, by UID."""
        return {
            uid: obj
            for uid, obj in self._objects.items()
            if not is_mirror(obj) and _meta(obj).get("deletionTimestamp")
        }

    def has_pod(self, key: tuple[str, str]) -> bool:
        """Whether a non-mirror pod `(namespace, name)` bound to us exists."""
        for obj in self._objects.values():
            meta = _meta(obj)
            if (meta.get("namespace"), meta.get("name")) == key and not is_mirror(obj):
                return True
        return False

    def pushed(self, uid: str) -> bool:
        return self._pushed is not None and uid in self._pushed

    # --- the reflector ---

    async def run(self, api: KubeApi) -> None:
        retry = Retry()
        last_relist = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self.resource_version is None:
                    if loop.time() - last_relist < 1.0:
                        await asyncio.sleep(retry.delay())  # 410 right after a list: slow down
                    last_relist = loop.time()
                    await self._list(api)
                    self._failures.ok()
                started = loop.time()
                events = await self._watch(api)
                self._failures.ok()
                if events == 0 and loop.time() - started < 1.0:
                    # An empty stream that ended at once: do not spin on a misbehaving server.
                    await asyncio.sleep(retry.delay())
                else:
                    retry.reset()
            except ApiError as exc:
                if exc.status == 410:
                    log.info(
                        "pod watch: resourceVersion %s is too old (410 Gone): re-listing",
                        self.resource_version,
                    )
                    metrics.source_errors.labels(API_SOURCE, "expired").inc()
                    self.resource_version = None
                    continue
                if exc.reason == "TooLong":
                    self.resource_version = None  # resuming would read the same event again
                reason = "connection" if exc.unreachable else f"http_{exc.status}"
                metrics.source_errors.labels(API_SOURCE, reason).inc()
                self._failures.failed(
                    exc,
                    " (running pods keep running; retrying)"
                    if self.synced.is_set()
                    else " (not ready: no pod of any source is removed until it answers)",
                )
                await asyncio.sleep(retry.delay())
            except Exception:
                # A bug must not end the source for good: its pods would never change again.
                log.exception("the API server pod source failed unexpectedly; re-listing")
                metrics.source_errors.labels(API_SOURCE, "internal").inc()
                self.resource_version = None
                await asyncio.sleep(retry.delay())

    async def _list(self, api: KubeApi) -> None:
        objects: dict[str, Obj] = {}
        cont: str | None = None
        version = ""
        while True:
            try:
                page = await api.list_pods(self.selector, LIST_PAGE, cont)
            except ApiError as exc:
                if exc.status == 410 and cont is not None:
                    # The paging snapshot expired: start again for a consistent list.
                    objects, cont = {}, None
                    continue
                raise
            meta = page.get("metadata") or {}
            if cont is None:
                version = str(meta.get("resourceVersion") or "")
            for item in page.get("items") or []:
                if isinstance(item, dict) and (uid := _meta(item).get("uid")):
                    objects[str(uid)] = item
            cont = meta.get("continue") or None
            if cont is None:
                break
        self.lists += 1
        self._objects = objects
        self.resource_version = version or None
        metrics.source_last_success.labels(API_SOURCE).set(time.time())
        log.info(
            "listed %d pods bound to %s at resourceVersion %s",
            len(objects),
            self.node_name,
            version,
        )
        self._flush()

    async def _watch(self, api: KubeApi) -> int:
        """One watch from the current version; returns the number of events it carried."""
        assert self.resource_version is not None
        self.watches += 1
        timeout = random.randint(*self.watch_timeout)
        events = 0
        async for event in api.watch_pods(self.selector, self.resource_version, timeout):
            if events == 0:
                self._failures.ok()
            events += 1
            kind, obj = event["type"], event["object"]
            meta = _meta(obj)
            version = meta.get("resourceVersion")
            if kind == "BOOKMARK":
                if version:
                    self.resource_version = str(version)
                metrics.source_last_success.labels(API_SOURCE).set(time.time())
                continue
            uid = meta.get("uid")
            if not uid or kind not in ("ADDED", "MODIFIED", "DELETED"):
                log.debug("pod watch: ignoring a %s event without uid", kind)
                continue
            if kind == "DELETED":
                self._objects.pop(str(uid), None)
            else:
                self._objects[str(uid)] = obj
            if version:
                self.resource_version = str(version)
            self._schedule_flush()
        self._flush()
        return events

    def _schedule_flush(self) -> None:
        # Events already buffered are read without yielding to the loop: a burst becomes one SET.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    # --- building the SET ---

    def _flush(self) -> None:
        self._flush_scheduled = False
        pods: dict[str, Pod] = {}
        for uid, obj in self._objects.items():
            if is_mirror(obj):
                continue
            if (obj.get("spec") or {}).get("nodeName") != self.node_name:
                continue
            if _meta(obj).get("deletionTimestamp") and not self.pushed(uid):
                continue  # never ran here: nothing to stop, only the final delete is left
            pod = self._decode(uid, obj)
            if pod is not None:
                pods[uid] = pod
        for uid in [u for u in self._decoded if u not in self._objects]:
            del self._decoded[uid]
            self._good.pop(uid, None)
            self._reported.pop(uid, None)
        self.synced.set()
        changed = self._pushed is None or self._pushed != pods
        if changed:
            self._pushed = pods
            metrics.source_updates.labels(API_SOURCE).inc()
            self._push(PodUpdate(list(pods.values()), Op.SET, API_SOURCE))
        for listener in self._listeners:
            listener()

    def _decode(self, uid: str, obj: Obj) -> Pod | None:
        version = str(_meta(obj).get("resourceVersion") or "")
        cached = self._decoded.get(uid)
        if cached is None or cached.version != version:
            try:
                cached = _Decoded(version, decode_api_pod(obj), None)
            except ManifestError as exc:
                cached = _Decoded(version, None, exc)
            self._decoded[uid] = cached
        if cached.pod is not None:
            # Keep the identity of an unchanged pod (a status-only change re-decodes to the
            # same pod), so comparing SETs stays cheap and nothing downstream sees a change.
            last = self._good.get(uid)
            if last is not None and last == cached.pod:
                cached.pod = last
            self._good[uid] = cached.pod
            self._reported.pop(uid, None)
            return cached.pod
        assert cached.error is not None
        self._report(uid, obj, cached.error)
        return self._good.get(uid)

    def _report(self, uid: str, obj: Obj, error: ManifestError) -> None:
        text = error.describe()
        if self._reported.get(uid) == text:
            return
        self._reported[uid] = text
        meta = _meta(obj)
        ref = ObjectRef("Pod", str(meta.get("name", "")), str(meta.get("namespace", "")), uid)
        kept = uid in self._good
        suffix = " (its last good version keeps running)" if kept else " (not run)"
        metrics.source_errors.labels(API_SOURCE, "invalid").inc()
        for line in error.lines():
            self._recorder.record("Warning", FAILED_VALIDATION, line + suffix, ref)
        if not kept and self._rejected is not None:
            self._rejected(obj, "; ".join(str(e) for e in error.errors))
