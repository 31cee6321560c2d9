"""The Services of the cluster for the pods' service variables (the kubelet's service informer):
a list + watch of the Services of all namespaces (`client/reflector.py`), read by `pod/` through
its `ServiceEnv` protocol.

Until the first list has answered, `not_synced()` says why, and an API pod's containers wait
(the kubelet waits for its informer's HasSynced); a Service added or changed later reaches only
the containers started after the change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pykubelet.client.kubeapi import KubeApi
from pykubelet.client.reflector import Key, Reflector, name_key
from pykubelet.pod.envvars import Service, ServicePort

Obj = dict[str, Any]


def service_from_object(obj: Obj) -> Service | None:
    """What the environment needs of a Service as the API serves it; None if unusable (a port
    without a number: the API server never serves one)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    ports: list[ServicePort] = []
    for raw in spec.get("ports") or []:
        if not isinstance(raw, dict) or not isinstance(raw.get("port"), int):
            return None
        ports.append(
            ServicePort(
                port=int(raw["port"]),
                name=str(raw.get("name") or ""),
                protocol=str(raw.get("protocol") or "TCP"),
            )
        )
    return Service(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        cluster_ip=str(spec.get("clusterIP") or ""),
        ports=tuple(ports),
    )


async def _list_page(api: KubeApi, limit: int, cont: str | None) -> Obj:
    return await api.list_services(limit, cont)


class ServiceWatch:
    """The `ServiceEnv` of cluster mode: every Service, kept by list + watch."""

    def __init__(self) -> None:
        self.reflector = Reflector(
            "services",
            _list_page,
            lambda api, rv, timeout: api.watch_services(rv, timeout),
            key=name_key,
        )
        self._decoded: dict[Key, tuple[str, Service | None]] = {}  # key -> (version, service)
        self._connected = False

    async def run(self, api: KubeApi) -> None:
        self._connected = True
        await self.reflector.run(api)

    def not_synced(self) -> str | None:
        if self.reflector.synced.is_set():
            return None
        if not self._connected:
            return "not connected to the API server yet"
        return self.reflector.problem

    def services(self) -> Iterable[Service]:
        objects = self.reflector.objects
        for key in [k for k in self._decoded if k not in objects]:
            del self._decoded[key]
        out: list[Service] = []
        for key, obj in objects.items():
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            cached = self._decoded.get(key)
            if cached is None or cached[0] != version:
                cached = (version, service_from_object(obj))
                self._decoded[key] = cached
            if cached[1] is not None:
                out.append(cached[1])
        return out
