"""A list + watch that keeps a local copy of one resource in step with the API server (client-go's
reflector and informer, for the kinds that need nothing but a cache).

The copy is listed in pages, then watched from the list's resourceVersion with bookmarks; the
watch resumes from the last version seen whenever the stream ends or breaks (a random 5 to 10
minutes, as the kubelet's reflectors, so a fleet does not reconnect at once), and a `410 Gone`
(the version was compacted away) or an event too long for the client re-lists. Failures are
retried with a jittered back-off, logged once and their recovery logged. `synced` is set by the
first complete list (client-go's HasSynced) and stays set; until then `problem` says why not.

Used for the pods bound to the node (config/apiserver.py, keyed by UID, with its metrics through
the hooks), for Services (cluster/services.py) and for each ConfigMap and Secret the pods use
(cluster/watched_objects.py, one object each).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.client.throttle import Failures, Retry

log = logging.getLogger(__name__)

Obj = dict[str, Any]

LIST_PAGE = 500
WATCH_TIMEOUT = (300, 600)

ListPage = Callable[[KubeApi, int, str | None], Awaitable[Obj]]
"""`list_page(api, limit, continue)`: one page of the list."""
Watch = Callable[[KubeApi, str, int], AsyncIterator[Obj]]
"""`watch(api, resource_version, timeout_seconds)`: the watch events."""
Key = tuple[str, str]
K = TypeVar("K", bound=Hashable)


def _no_failure(reason: str) -> None:
    return None


def name_key(obj: Obj) -> Key | None:
    """(namespace, name): the key of most kinds."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        return None
    return str(meta.get("namespace") or ""), str(meta["name"])


def uid_key(obj: Obj) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("uid"):
        return None
    return str(meta["uid"])


class Reflector(Generic[K]):
    """The objects of one resource by `key(obj)`, kept by list + watch.

    `on_change()` is called after each list and after each watch event (a caller that wants one
    reaction per burst schedules it); before it, `on_event(key)` with the key the event changed,
    or None after a list (any may have), for a caller that keeps work per object. `on_success()`
    after each list and bookmark (the source's last success), `on_failure(reason)` with each
    failure's reason ("expired", "connection", "http_<status>", "internal");
    `failure_suffix(synced)` ends the failure's log line.
    """

    def __init__(
        self,
        what: str,
        list_page: ListPage,
        watch: Watch,
        on_change: Callable[[], None] = lambda: None,
        watch_timeout: tuple[int, int] = WATCH_TIMEOUT,
        *,
        key: Callable[[Obj], K | None],
        on_success: Callable[[], None] = lambda: None,
        on_failure: Callable[[str], None] = _no_failure,
        failure_suffix: Callable[[bool], str] = lambda synced: " (retrying)",
        list_log_level: int = logging.INFO,
        failures: Failures | None = None,
        on_event: Callable[[K | None], None] = lambda key: None,
    ) -> None:
        self.what = what
        self._list_page = list_page
        self._watch = watch
        self._on_change = on_change
        self._key = key
        self._on_success = on_success
        self._on_failure = on_failure
        self._failure_suffix = failure_suffix
        self._list_log_level = list_log_level
        self._on_event = on_event
        self.watch_timeout = watch_timeout
        self.objects: dict[K, Obj] = {}
        self.resource_version: str | None = None  # where the watch resumes; None: re-list
        self.synced = asyncio.Event()
        self.problem: str | None = f"the {what} have not been listed yet"
        # Shared by many reflectors of one kind, so an outage is logged once, not once each.
        self._failures = failures or Failures(f"{what} list/watch of the API server")
        self.lists = 0
        self.watches = 0

    async def run(self, api: KubeApi) -> None:
        retry = Retry()
        loop = asyncio.get_running_loop()
        last_list = 0.0
        while True:
            try:
                if self.resource_version is None:
                    if loop.time() - last_list < 1.0:
                        await asyncio.sleep(retry.delay())  # 410 right after a list: slow down
                    last_list = loop.time()
                    await self._list(api)
                    self._failures.ok()
                started = loop.time()
                events = await self._watch_once(api)
                self._failures.ok()
                if events == 0 and loop.time() - started < 1.0:
                    await asyncio.sleep(retry.delay())  # a stream that ended at once: no spin
                else:
                    retry.reset()
            except ApiError as exc:
                if exc.status == 410:
                    version = self.resource_version
                    log.info(
                        "%s watch: resourceVersion %s is too old (410 Gone): re-listing",
                        self.what,
                        version,
                    )
                    self._on_failure("expired")
                    self.resource_version = None
                    continue
                if exc.reason == "TooLong":
                    self.resource_version = None  # resuming would read the same event again
                synced = self.synced.is_set()
                if not synced:
                    self.problem = f"the {self.what} list failed: {exc}"
                self._on_failure("connection" if exc.unreachable else f"http_{exc.status}")
                self._failures.failed(exc, self._failure_suffix(synced))
                await asyncio.sleep(retry.delay())
            except Exception:
                # A bug must not end the watch for good: the copy would never change again.
                log.exception("the %s list/watch failed unexpectedly; re-listing", self.what)
                self._on_failure("internal")
                self.resource_version = None
                await asyncio.sleep(retry.delay())

    async def _list(self, api: KubeApi) -> None:
        objects: dict[K, Obj] = {}
        cont: str | None = None
        version = ""
        while True:
            try:
                page = await self._list_page(api, LIST_PAGE, cont)
            except ApiError as exc:
                if exc.status == 410 and cont is not None:
                    objects, cont = {}, None  # the paging snapshot expired: start again
                    continue
                raise
            meta = page.get("metadata") or {}
            if cont is None:
                version = str(meta.get("resourceVersion") or "")
            for item in page.get("items") or []:
                if isinstance(item, dict) and (key := self._key(item)) is not None:
                    objects[key] = item
            cont = meta.get("continue") or None
            if cont is None:
                break
        self.lists += 1
        self.objects = objects
        self.resource_version = version or None
        self.problem = None
        self.synced.set()
        self._on_success()
        self._on_event(None)
        log.log(
            self._list_log_level,
            "listed %d %s at resourceVersion %s",
            len(objects),
            self.what,
            version,
        )
        self._on_change()

    async def _watch_once(self, api: KubeApi) -> int:
        """One watch from the current version; returns the number of events it carried."""
        assert self.resource_version is not None
        self.watches += 1
        timeout = random.randint(*self.watch_timeout)
        events = 0
        async for event in self._watch(api, self.resource_version, timeout):
            if events == 0:
                self._failures.ok()
            events += 1
            kind, obj = event["type"], event["object"]
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if kind == "BOOKMARK":
                if version:
                    self.resource_version = str(version)
                self._on_success()
                continue
            key = self._key(obj)
            if key is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
                log.debug("%s watch: ignoring a %s event without a name", self.what, kind)
                continue
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            if version:
                self.resource_version = str(version)
            self._on_event(key)
            self._on_change()
        return events
