"""Pod status to the API server: a PATCH of `pods/{name}/status` when the computed status changes
(the kubelet's status manager).

- Each changed status marks its pod, due at once (as the kubelet's status manager syncs on
  each update); a sender sends the pod's latest status when it takes the pod, so the changes
  made while a pod waits for a sender go in one patch. Senders take the pods in the order they
  were marked, at most 16 patches in flight and never two of one pod (they could land out of
  order); a sender takes the next pod as soon as its patch is answered, so a status waits for
  the patches marked before it, never for a whole round of them. Every request takes a token
  of the API client's rate limiter. (A mark used to be due 100 ms later, to fold a pod's
  creation and start into one patch: in a burst of 1,000 bound pods the senders fold them by
  themselves, and the delay made the status lag's p99 1.02 s against 0.86 s, with more
  requests, not fewer: `bench/HISTORY.md`, session 20.)
- The patch is a strategic merge patch against the status the API server has (the answer to our
  last patch, else the object the watch delivered): only what changed, with `null` for what went
  away, so a container that went from running to terminated does not keep both states. Lists
  merge by key (conditions by type, container statuses by name); conditions of types we do not
  own (the scheduler's, a controller's) are left alone. Times are sent at one-second precision,
  as the API server stores them.
- The patch carries `metadata.uid`: a pod deleted and recreated under the same name is not
  given the old pod's status (409). A conflict re-reads the pod and retries (3 times); a pod
  that is gone (404) is forgotten; other failures retry with back-off.
- Static pods have their status written to their mirror pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pykubelet.api.model import PodStatus
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.client.throttle import Failures, Retry

log = logging.getLogger(__name__)

Obj = dict[str, Any]

BATCH_DELAY = 0.0  # a mark is due at once (a test may hold marks back)
CONCURRENCY = 16
CONFLICT_RETRIES = 3
# The status fields the kubelet owns; others (nominatedNodeName, a controller's) are left alone.
OWNED_FIELDS = (
    "phase",
    "conditions",
    "message",
    "reason",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
    "qosClass",
)
LIST_KEYS = {
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "podIPs": "ip",
    "hostIPs": "ip",
}
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@dataclass(frozen=True)
class Target:
    """The API pod a status goes to, and the status the API server has."""

    namespace: str
    name: str
    uid: str  # the API object's UID (a mirror pod's own for a static pod)
    status: Obj


Resolver = Callable[[str], Target | None]


def _normalize(value: Any) -> Any:
    """As the API server stores it: times at second precision, in UTC."""
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, str) and _TIME.match(value):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when.utcoffset() is not None else value
    return value


def api_status(status: PodStatus) -> Obj:
    return _normalize(status.to_api())  # type: ignore[no-any-return]


def _diff_map(old: Any, new: Obj) -> Obj:
    """The merge patch turning `old` into `new` (maps recurse, the rest is replaced)."""
    if not isinstance(old, dict):
        return new
    patch: Obj = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = _diff_map(before, value)
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def _diff_list(old: Any, new: list[Any], key: str, delete_missing: bool) -> list[Any] | None:
    before = {o.get(key): o for o in old if isinstance(o, dict)} if isinstance(old, list) else {}
    items: list[Any] = []
    for item in new:
        prior = before.get(item.get(key))
        if prior == item:
            continue
        items.append({**_diff_map(prior, item), key: item[key]} if prior else item)
    if delete_missing:
        wanted = {item.get(key) for item in new}
        items.extend({key: k, "$patch": "delete"} for k in before if k not in wanted)
    return items or None


def status_patch(base: Obj, new: Obj) -> Obj | None:
    """The strategic merge patch of the owned status fields; None if nothing changed."""
    patch: Obj = {}
    for field in OWNED_FIELDS:
        before, after = base.get(field), new.get(field)
        if field == "qosClass" and before:
            continue  # set by the API server at creation and immutable since 1.32
        if field in LIST_KEYS and isinstance(after, list):
            items = _diff_list(before, after, LIST_KEYS[field], field != "conditions")
            if items is not None:
                patch[field] = items
        elif before != after:
            if isinstance(after, dict):
                patch[field] = _diff_map(before, after)
            else:
                patch[field] = after  # None deletes it
    return patch or None


class StatusSync:
    """Sends each pod's latest status; `resolve(uid)` says where it goes (None: not yet)."""

    def __init__(
        self,
        resolve: Resolver,
        batch_delay: float = BATCH_DELAY,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self._resolve = resolve
        self.batch_delay = batch_delay
        self._concurrency = concurrency
        self._latest: dict[str, Obj] = {}  # uid -> the status to have in the API server
        self._sent: dict[str, tuple[str, Obj]] = {}  # uid -> (API uid, the API's status after)
        # uid -> when it may be sent (marked + batch_delay, or after a failure's back-off), in
        # the order the pods were marked.
        self._dirty: dict[str, float] = {}
        self._inflight: set[str] = set()
        self._wake = asyncio.Event()
        # When each waiting sender looks at the marks again by itself (inf: only when woken). A
        # mark wakes them only if it is due before that: waking all of them for each mark of a
        # burst (each then walking the marks) was 7 % of the event loop's time.
        self._sleepers: list[float] = []
        self._semaphore = asyncio.Semaphore(concurrency)
        self._idle = asyncio.Condition()
        self._failures = Failures("patching pod status")
        self._retry = Retry(0.5, 10.0)
        self.patches = 0

    # --- input ---

    def on_status(self, uid: str, status: PodStatus) -> None:
        self.set(uid, api_status(status))

    def set(self, uid: str, status: Obj) -> None:
        self._latest[uid] = status
        self.mark(uid)

    def mark(self, uid: str, after: float | None = None) -> None:
        """Send the pod's latest status (no sooner than `after` seconds from now)."""
        if uid in self._latest and uid not in self._dirty:
            delay = self.batch_delay if after is None else after
            due = time.monotonic() + delay
            self._dirty[uid] = due
            self._wake_for(due)

    def _wake_for(self, due: float) -> None:
        """Wake the waiting senders if none of them looks again by `due` on its own."""
        if self._sleepers and due < min(self._sleepers):
            self._wake.set()

    def resend(self, uid: str) -> None:
        """Send the whole status again (its target changed: a mirror pod was recreated)."""
        self._sent.pop(uid, None)
        self.mark(uid)

    def forget(self, uid: str) -> None:
        self._latest.pop(uid, None)
        self._sent.pop(uid, None)
        self._dirty.pop(uid, None)

    def retarget(self, uids: Iterable[str]) -> None:
        """The API's view changed: send again the statuses of `uids` (the static pods: an API
        pod's object is the pod itself) that now go to another object (a mirror pod that
        appeared or was recreated)."""
        for uid in uids:
            if uid not in self._latest or uid in self._dirty or uid in self._inflight:
                continue
            target = self._resolve(uid)
            sent = self._sent.get(uid)
            if target is not None and (sent is None or sent[0] != target.uid):
                self.mark(uid)

    def known(self) -> list[str]:
        return list(self._latest)

    def pending(self, uid: str) -> bool:
        return uid in self._dirty or uid in self._inflight

    # --- sending ---

    async def run(self, api: KubeApi) -> None:
        senders = [
            asyncio.create_task(self._sender(api), name="status-sender")
            for _ in range(self._concurrency)
        ]
        try:
            await asyncio.gather(*senders)
        finally:
            for sender in senders:
                sender.cancel()
            await asyncio.gather(*senders, return_exceptions=True)

    async def _sender(self, api: KubeApi) -> None:
        while True:
            uid, wait = self._take()
            if uid is None:
                wakes_at = math.inf if wait is None else time.monotonic() + wait
                self._sleepers.append(wakes_at)
                self._wake.clear()
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._wake.wait()
                finally:
                    self._sleepers.remove(wakes_at)
                continue
            try:
                sent = await self._sync_guarded(api, uid)
            finally:
                self._inflight.discard(uid)  # also when cancelled before it began
            if sent:
                self._retry.reset()
            else:
                self.mark(uid, after=self._retry.delay())
            due = self._dirty.get(uid)
            if due is not None:
                self._wake_for(due)  # marked again while it was sent: it can go when due

    def _take(self) -> tuple[str | None, float | None]:
        """The pod marked first that may be sent now and is not being sent, or (None, how long
        until one may be: None for no pod marked)."""
        now = time.monotonic()
        soonest: float | None = None
        for uid, due in self._dirty.items():
            if uid in self._inflight:
                continue
            if due <= now:
                del self._dirty[uid]
                # In flight from here, before any await: marked again meanwhile, it waits.
                self._inflight.add(uid)
                return uid, None
            soonest = due if soonest is None else min(soonest, due)
        return None, None if soonest is None else soonest - now

    async def _sync_guarded(self, api: KubeApi, uid: str) -> bool:
        async with self._semaphore:
            self._inflight.add(uid)
            try:
                return await self._sync_one(api, uid)
            except ApiError as exc:
                self._failures.failed(exc, " (retrying)")
                return False
            except Exception:
                log.exception("patching the status of pod %s failed unexpectedly", uid)
                return False
            finally:
                self._inflight.discard(uid)
                async with self._idle:
                    self._idle.notify_all()

    async def _sync_one(self, api: KubeApi, uid: str) -> bool:
        for _ in range(CONFLICT_RETRIES):
            status = self._latest.get(uid)
            target = self._resolve(uid)
            if status is None or target is None:
                return True  # nowhere to send it yet; a resend comes when there is
            sent = self._sent.get(uid)
            base = sent[1] if sent is not None and sent[0] == target.uid else target.status
            patch = status_patch(base, status)
            if patch is None:
                self._sent[uid] = (target.uid, base)
                return True
            path = f"/api/v1/namespaces/{target.namespace}/pods/{target.name}/status"
            body = {"metadata": {"uid": target.uid}, "status": patch}
            try:
                answer = await api.patch(path, body)
            except ApiError as exc:
                if exc.status == 404:
                    log.debug(
                        "pod %s/%s is gone: its status is not sent", target.namespace, target.name
                    )
                    self._sent.pop(uid, None)
                    return True
                if exc.status != 409:
                    raise
                # A stale view or another pod under the name: re-read, then decide again.
                self._sent.pop(uid, None)
                try:
                    current = await api.get(
                        f"/api/v1/namespaces/{target.namespace}/pods/{target.name}"
                    )
                except ApiError as err:
                    if err.status == 404:
                        return True
                    raise
                if current.get("metadata", {}).get("uid") != target.uid:
                    return True  # not our pod any more
                self._sent[uid] = (target.uid, current.get("status") or {})
                continue
            self.patches += 1
            self._failures.ok()
            self._sent[uid] = (target.uid, answer.get("status") or {})
            return True
        return False

    async def flush(self, api: KubeApi, uids: list[str] | None = None, within: float = 2.0) -> bool:
        """Send what is pending now (of `uids`, or all) within `within` seconds; True if all
        went."""
        wanted = set(self._latest if uids is None else uids)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while True:
                    # Never two patches of one pod at once: they could land out of order.
                    async with self._idle:
                        await self._idle.wait_for(lambda: not wanted & self._inflight)
                    todo = [uid for uid in self._dirty if uid in wanted]
                    if not todo:
                        return True
                    for uid in todo:
                        del self._dirty[uid]
                    results = await asyncio.gather(*(self._sync_guarded(api, u) for u in todo))
                    failed = [u for u, ok in zip(todo, results, strict=True) if not ok]
                    for uid in failed:
                        self.mark(uid, after=0.0)
                    if failed:
                        await asyncio.sleep(0.2)
        return False
