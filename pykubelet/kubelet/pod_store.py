"""The desired pods (the kubelet's pod manager): every pod a source wants on this node, by UID
and by full name (namespace/name).

The sync loop is the only writer (`PodStore`); everything else reads through `PodView`, the
read-only protocol the server, the mirror pods and the final delete depend on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from pykubelet.api.model import Pod
from pykubelet.api.static import CONFIG_SOURCE
from pykubelet.config.types import FILE_SOURCE, HTTP_SOURCE
from pykubelet.pod.volumes import ObjectRegistry

STATIC_SOURCES = frozenset({FILE_SOURCE, HTTP_SOURCE})


def is_static(pod: Pod) -> bool:
    """A pod of the file or http source: the kubelet's static pods (mirrored in cluster mode)."""
    return pod.metadata.annotations.get(CONFIG_SOURCE) in STATIC_SOURCES


class PodView(Protocol):
    """What others may read of the desired pods."""

    def get(self, uid: str) -> Pod | None: ...

    def find(self, namespace: str, name: str) -> Pod | None: ...

    def __contains__(self, uid: object) -> bool: ...

    def __iter__(self) -> Iterator[Pod]: ...

    def __len__(self) -> int: ...

    def static(self) -> list[Pod]:
        """The static pods among them (`is_static`), without a pass over the others."""
        ...


class PodStore:
    """The desired pods, by UID and by (namespace, name); a name points at the UID stored last.

    `registry` hears of each pod stored, changed and removed (the ConfigMaps and Secrets it
    will read are watched from then on, in cluster mode).
    """

    def __init__(self, registry: ObjectRegistry | None = None) -> None:
        self._registry = registry
        self._pods: dict[str, Pod] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        # The static pods by UID: what a mirror or a status target is looked for, for every
        # change the API server shows (a pass over 1,000 pods for each of a burst's events).
        self._static: dict[str, Pod] = {}

    def get(self, uid: str) -> Pod | None:
        return self._pods.get(uid)

    def find(self, namespace: str, name: str) -> Pod | None:
        uid = self._by_name.get((namespace, name))
        return self._pods.get(uid) if uid else None

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def __iter__(self) -> Iterator[Pod]:
        return iter(list(self._pods.values()))

    def __len__(self) -> int:
        return len(self._pods)

    def uids(self) -> set[str]:
        return set(self._pods)

    def static(self) -> list[Pod]:
        return list(self._static.values())

    def _index(self, pod: Pod) -> None:
        if is_static(pod):
            self._static[pod.uid] = pod
        else:
            self._static.pop(pod.uid, None)

    def put(self, pod: Pod) -> None:
        self._pods[pod.uid] = pod
        self._by_name[(pod.metadata.namespace, pod.metadata.name)] = pod.uid
        self._index(pod)
        if self._registry is not None:
            self._registry.register_pod(pod)

    def replace(self, pod: Pod) -> None:
        """A new version of a stored pod that the workers need not hear of (a reconcile)."""
        if pod.uid in self._pods:
            self._pods[pod.uid] = pod
            self._index(pod)
            if self._registry is not None:
                self._registry.register_pod(pod)

    def remove(self, uid: str) -> Pod | None:
        pod = self._pods.pop(uid, None)
        self._static.pop(uid, None)
        if pod is not None:
            key = (pod.metadata.namespace, pod.metadata.name)
            if self._by_name.get(key) == uid:
                del self._by_name[key]
            if self._registry is not None:
                self._registry.unregister_pod(uid)
        return pod
