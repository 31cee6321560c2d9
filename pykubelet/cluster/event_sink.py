"""The recorder's events, posted to the API server, best effort: on a bucket of their own, not
the client's (the kubelet's event client: --event-qps 50 a second, --event-burst 100; 0: no
limit), so a burst of events never delays a status or a token."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.client.throttle import RateLimiter
from pykubelet.common.events import Event

log = logging.getLogger(__name__)

EVENT_QPS, EVENT_BURST = 50.0, 100
EVENT_QUEUE = 1000


class EventSink:
    """Posts the recorder's events to `/api/v1/namespaces/{ns}/events`; a repeated event (its
    count went up) patches the one posted. Best effort: a full queue drops the oldest, a failure
    drops the event (and logs at debug only: reporting it as an event would feed a loop)."""

    def __init__(self, node_name: str, qps: float = EVENT_QPS, burst: int = EVENT_BURST) -> None:
        self.node_name = node_name
        self._pending: OrderedDict[str, Event] = OrderedDict()
        self._posted: OrderedDict[str, None] = OrderedDict()
        self._wake = asyncio.Event()
        self._limiter = RateLimiter(qps, burst)  # qps 0: no limit
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
                await api.patch(
                    f"{base}/{meta['name']}", patch, kind="merge", limiter=self._limiter
                )
                return
            except ApiError as exc:
                if exc.status != 404:
                    raise
        try:
            await api.create(base, body, self._limiter)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._posted[event.name] = None
        while len(self._posted) > EVENT_QUEUE:
            self._posted.popitem(last=False)
