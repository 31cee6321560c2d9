"""Events: what happened to a pod or the node, kept in a bounded ring and logged."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pykubelet.common.ids import random_hex

log = logging.getLogger("pykubelet.common.events")

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class ObjectRef:
    kind: str  # Pod or Node
    name: str
    namespace: str = ""
    uid: str = ""
    field_path: str = ""  # e.g. spec.containers{web}

    @staticmethod
    def node(name: str) -> ObjectRef:
        return ObjectRef("Node", name, uid=name)


@dataclass
class Event:
    type: EventType
    reason: str
    message: str
    involved: ObjectRef
    first_seen: datetime
    last_seen: datetime
    count: int = 1
    name: str = field(default_factory=lambda: random_hex(8))

    def to_api(self, node_name: str) -> dict[str, Any]:
        obj: dict[str, Any] = {"kind": self.involved.kind, "name": self.involved.name}
        if self.involved.namespace:
            obj["namespace"] = self.involved.namespace
        if self.involved.uid:
            obj["uid"] = self.involved.uid
        if self.involved.field_path:
            obj["fieldPath"] = self.involved.field_path
        obj["apiVersion"] = "v1"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{self.involved.name}.{self.name}",
                "namespace": self.involved.namespace or "default",
            },
            "involvedObject": obj,
            "type": self.type,
            "reason": self.reason,
            "message": self.message,
            "count": self.count,
            "firstTimestamp": _ts(self.first_seen),
            "lastTimestamp": _ts(self.last_seen),
            "source": {"component": "pykubelet", "host": node_name},
        }


def _ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """A bounded ring of events; a repeat of the last identical event only bumps its count."""

    def __init__(self, capacity: int = 1000) -> None:
        self._events: deque[Event] = deque(maxlen=capacity)
        self._index: dict[tuple[ObjectRef, str, str], Event] = {}
        self._listeners: list[Callable[[Event], None]] = []

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        """Called with each new or repeated event (e.g. to send it to an API server)."""
        self._listeners.append(listener)

    def record(self, type_: EventType, reason: str, message: str, involved: ObjectRef) -> None:
        now = datetime.now(UTC)
        key = (involved, reason, message)
        existing = self._index.get(key)
        if existing is not None:
            existing.count += 1
            existing.last_seen = now
            event = existing
        else:
            event = Event(type_, reason, message, involved, now, now)
            if len(self._events) == self._events.maxlen:
                dropped = self._events[0]
                self._index.pop((dropped.involved, dropped.reason, dropped.message), None)
            self._events.append(event)
            self._index[key] = event
        for listener in self._listeners:
            listener(event)
        level = logging.WARNING if type_ == "Warning" else logging.INFO
        target = f"{involved.namespace}/{involved.name}" if involved.namespace else involved.name
        fields = {"kind": involved.kind, "object": target, "reason": reason, "type": type_}
        log.log(
            level,
            "%s %s %s: %s",
            involved.kind.lower(),
            target,
            reason,
            message,
            extra={"fields": fields},
        )

    def events(self) -> list[Event]:
        return list(self._events)

    def for_object(self, kind: str, name: str, namespace: str = "") -> list[Event]:
        return [
            e
            for e in self._events
            if e.involved.kind == kind
            and e.involved.name == name
            and e.involved.namespace == namespace
        ]
