"""The API server source: the pods bound to this node, by list + watch (through
`client/kubeapi.py`, the one client of the API server).

The source is the kubelet's pod reflector: a list of all namespaces with
`fieldSelector=spec.nodeName=<node>`, then a watch from the list's resourceVersion with bookmarks,
resumed from the last version seen (an event's or a bookmark's) whenever the stream ends or
breaks; a `410 Gone` (the version was compacted away) re-lists. Every change sends the source's
whole state as a SET; building it looks again only at the pods the events since the last one
named (all of them after a list), and a pod whose change is in its status alone (the agent's own
status patches, coming back) is not decoded again. While the API server cannot be reached
nothing is sent, so the running pods keep running and, until the first list, the source is not
ready and no pod of any source is garbage-collected.

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
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pykubelet.api.decode import pod_from_object
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.static import CONFIG_MIRROR
from pykubelet.client.kubeapi import KubeApi
from pykubelet.client.reflector import WATCH_TIMEOUT, Reflector, uid_key
from pykubelet.common import metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.config.types import API_SOURCE, Op, PodUpdate

log = logging.getLogger(__name__)

Obj = dict[str, Any]

FAILED_VALIDATION = "FailedValidation"


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
    doc: Obj  # what was decoded (prepare_api_pod): the same doc is the same pod
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
        self._reflector: Reflector[str] = Reflector(
            f"pods bound to {node_name}",
            self._list_page,
            self._watch,
            self._schedule_flush,
            watch_timeout,
            key=uid_key,
            on_event=self._changed,
            on_success=self._listed_or_bookmarked,
            on_failure=self._failed,
            failure_suffix=self._failure_suffix,
        )
        self._decoded: dict[str, _Decoded] = {}
        self._good: dict[str, Pod] = {}  # uid -> last good pod
        self._reported: dict[str, str] = {}  # uid -> the problem last reported
        self._set: dict[str, Pod] = {}  # what the last SET held, by uid, in its order
        self._sent = False  # a SET was pushed
        # The uids to look at again, in the order their events came (None: all, after a list).
        self._dirty: dict[str, None] | None = None
        self._mirrors: dict[str, Obj] = {}  # the mirror pods, by uid
        self._flush_scheduled = False
        self._listeners: list[Callable[[], None]] = []
        self.synced = asyncio.Event()

    # --- what the rest of the cluster mode reads ---

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called after each change of the API's view has been applied."""
        self._listeners.append(listener)

    def api_object(self, uid: str) -> Obj | None:
        """The API's latest object of a (non-mirror) pod bound to us."""
        obj = self._reflector.objects.get(uid)
        return obj if obj is not None and not is_mirror(obj) else None

    def mirror_pods(self) -> dict[tuple[str, str], Obj]:
        out = {}
        for obj in self._mirrors.values():
            meta = _meta(obj)
            out[(str(meta.get("namespace", "")), str(meta.get("name", "")))] = obj
        return out

    def deleting(self) -> dict[str, Obj]:
        """Non-mirror pods with a deletionTimestamp, by UID."""
        return {
            uid: obj
            for uid, obj in self._reflector.objects.items()
            if not is_mirror(obj) and _meta(obj).get("deletionTimestamp")
        }

    def deleting_object(self, uid: str) -> Obj | None:
        """The API's latest object of one pod of `deleting()`, else None, looked up alone: 1,000
        pods deleted at once, each building all of `deleting()` twice, took 0.5 s of the loop."""
        obj = self.api_object(uid)
        return obj if obj is not None and _meta(obj).get("deletionTimestamp") else None

    def has_pod(self, key: tuple[str, str]) -> bool:
        """Whether a non-mirror pod `(namespace, name)` bound to us exists."""
        for obj in self._reflector.objects.values():
            meta = _meta(obj)
            if (meta.get("namespace"), meta.get("name")) == key and not is_mirror(obj):
                return True
        return False

    def pushed(self, uid: str) -> bool:
        return uid in self._set

    # --- the reflector ---

    @property
    def resource_version(self) -> str | None:
        """Where the watch resumes; None: it re-lists."""
        return self._reflector.resource_version

    @property
    def lists(self) -> int:
        return self._reflector.lists

    @property
    def watches(self) -> int:
        return self._reflector.watches

    async def run(self, api: KubeApi) -> None:
        await self._reflector.run(api)

    async def _list_page(self, api: KubeApi, limit: int, cont: str | None) -> Obj:
        return await api.list_pods(self.selector, limit, cont)

    def _watch(self, api: KubeApi, version: str, timeout: int) -> AsyncIterator[Obj]:
        return api.watch_pods(self.selector, version, timeout)

    def _listed_or_bookmarked(self) -> None:
        metrics.source_last_success.labels(API_SOURCE).set(time.time())

    def _failed(self, reason: str) -> None:
        metrics.source_errors.labels(API_SOURCE, reason).inc()

    @staticmethod
    def _failure_suffix(synced: bool) -> str:
        if synced:
            return " (running pods keep running; retrying)"
        return " (not ready: no pod of any source is removed until it answers)"

    def _changed(self, uid: str | None) -> None:
        """A watch event changed `uid` (None: a list, all may have): the mirror pods' index
        follows at once, the SET at the next flush."""
        objects = self._reflector.objects
        if uid is None:
            self._dirty = None
            self._mirrors = {u: o for u, o in objects.items() if is_mirror(o)}
            return
        if self._dirty is not None:
            self._dirty[uid] = None
        obj = objects.get(uid)
        if obj is not None and is_mirror(obj):
            self._mirrors[uid] = obj
        else:
            self._mirrors.pop(uid, None)

    def _schedule_flush(self) -> None:
        # Events already buffered are read without yielding to the loop: a burst becomes one SET.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    # --- building the SET ---

    def _flush(self) -> None:
        self._flush_scheduled = False
        objects = self._reflector.objects
        dirty, self._dirty = self._dirty, {}
        if dirty is None:  # the list's order, as the SET was built before
            dirty = dict.fromkeys([*objects, *self._set, *self._decoded])
        changed = not self._sent
        for uid in dirty:
            obj = objects.get(uid)
            before = self._set.get(uid)
            pod = None
            if obj is None:
                self._decoded.pop(uid, None)
                self._good.pop(uid, None)
                self._reported.pop(uid, None)
            elif is_mirror(obj) or (obj.get("spec") or {}).get("nodeName") != self.node_name:
                pass
            elif _meta(obj).get("deletionTimestamp") and before is None:
                pass  # never ran here: nothing to stop, only the final delete is left
            else:
                pod = self._decode(uid, obj)
            if pod is None:
                self._set.pop(uid, None)
            else:
                self._set[uid] = pod  # a pod already there keeps its place
            changed = changed or pod is not before
        self.synced.set()
        if changed:
            self._sent = True
            metrics.source_updates.labels(API_SOURCE).inc()
            self._push(PodUpdate(list(self._set.values()), Op.SET, API_SOURCE))
        for listener in self._listeners:
            listener()

    def _decode(self, uid: str, obj: Obj) -> Pod | None:
        version = str(_meta(obj).get("resourceVersion") or "")
        cached = self._decoded.get(uid)
        if cached is None or cached.version != version:
            doc = prepare_api_pod(obj)
            if cached is not None and cached.doc == doc:
                cached.version = version  # its status alone changed: the same pod
            else:
                try:
                    pod = pod_from_object(doc, pod_location(obj), api_pod=True)
                    cached = _Decoded(version, doc, pod, None)
                except ManifestError as exc:
                    cached = _Decoded(version, doc, None, exc)
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
