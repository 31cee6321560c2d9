"""The latest status of each pod: what /pods serves and what is sent to an API server."""

from __future__ import annotations

from collections.abc import Callable

from pykubelet.api.model import PodStatus

StatusListener = Callable[[str, PodStatus], None]


class StatusManager:
    """The latest computed status per pod UID (what /pods serves, and what is sent to an API
    server); listeners hear of each status that changed."""

    def __init__(self) -> None:
        self._statuses: dict[str, PodStatus] = {}
        self._listeners: list[StatusListener] = []
        self._forget_listeners: list[Callable[[str], None]] = []

    def add_listener(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    def get(self, uid: str) -> PodStatus | None:
        return self._statuses.get(uid)

    def set(self, uid: str, status: PodStatus) -> None:
        previous = self._statuses.get(uid)
        if previous == status:
            return  # the same object stays: /pods reuses what it serialised of it
        self._statuses[uid] = status
        for listener in self._listeners:
            listener(uid, status)

    def add_forget_listener(self, listener: Callable[[str], None]) -> None:
        """`listener(uid)` hears of each status forgotten."""
        self._forget_listeners.append(listener)

    def forget(self, uid: str) -> None:
        if self._statuses.pop(uid, None) is not None:
            for listener in self._forget_listeners:
                listener(uid)
