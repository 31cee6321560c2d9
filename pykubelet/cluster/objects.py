"""ConfigMaps and Secrets for the pods' environment and volumes, read from the API server, and
service-account tokens from its TokenRequest API (the `ObjectLookup` of `pod/volumes.py` in
cluster mode with `configMapAndSecretChangeDetectionStrategy: Get`; `watched_objects.py`, the
default, builds on it)."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from pykubelet.client.kubeapi import ApiError
from pykubelet.cluster.connection import ApiConnection
from pykubelet.pod.envvars import EnvError
from pykubelet.pod.tokens import IssuedToken, TokenRequest

Obj = dict[str, Any]


class ApiObjectLookup:
    """ConfigMaps and Secrets for the pods' env and volumes, read from the API server.

    Read at each sync of a pod that uses them (the kubelet's "Get" strategy,
    `configMapAndSecretChangeDetectionStrategy: Get`): a change reaches the pod's volumes at its
    next sync, at most --sync-frequency later. The default, `watched_objects.py`'s watch, is
    this class with `get` reading the watched copies.
    """

    def __init__(self, connection: ApiConnection) -> None:
        self._connection = connection

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The object (`kind`: "configmaps" or "secrets"), or None if there is none."""
        api = self._connection.api
        if api is None:
            raise EnvError(f'{kind[:-1]} "{name}": not connected to the API server yet')
        try:
            return await api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise EnvError(f'cannot read {kind[:-1]} "{namespace}/{name}": {exc}') from None

    async def config_map(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        obj = await self.get("configmaps", namespace, name)
        if obj is None:
            return None
        data: dict[str, str | bytes] = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        try:
            for key, value in (obj.get("binaryData") or {}).items():
                data[str(key)] = base64.b64decode(value)  # bytes as they are: a keystore, a gzip
        except (ValueError, TypeError) as exc:
            raise EnvError(
                f'configmap "{namespace}/{name}": binaryData is not base64: {exc}'
            ) from None
        return data

    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        typed = await self.typed_secret(namespace, name)
        return typed[1] if typed is not None else None

    async def typed_secret(self, namespace: str, name: str) -> tuple[str, dict[str, bytes]] | None:
        obj = await self.get("secrets", namespace, name)
        if obj is None:
            return None
        try:
            data = {str(k): base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        except (ValueError, TypeError) as exc:
            raise EnvError(f'secret "{namespace}/{name}": data is not base64: {exc}') from None
        for key, value in (obj.get("stringData") or {}).items():
            data[str(key)] = str(value).encode()
        return str(obj.get("type") or "Opaque"), data

    async def request_token(self, request: TokenRequest) -> IssuedToken:
        """POST a TokenRequest bound to the pod, as the kubelet's token manager does."""
        api = self._connection.api
        if api is None:
            raise EnvError("not connected to the API server yet")
        spec: Obj = {
            "audiences": [request.audience] if request.audience else [],
            "expirationSeconds": request.expiration_seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": request.pod_name,
                "uid": request.pod_uid,
            },
        }
        path = (
            f"/api/v1/namespaces/{request.namespace}/serviceaccounts/"
            f"{request.service_account}/token"
        )
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        try:
            answer = await api.create(path, body)
        except ApiError as exc:
            raise EnvError(str(exc)) from None
        status = answer.get("status") or {}
        token, expires = status.get("token"), status.get("expirationTimestamp")
        if not isinstance(token, str) or not token or not isinstance(expires, str):
            raise EnvError("the TokenRequest answer has no status.token or expirationTimestamp")
        try:
            when = datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise EnvError(f"the TokenRequest answer's expirationTimestamp {expires!r}") from None
        granted = (answer.get("spec") or {}).get("expirationSeconds")
        seconds = (
            granted if isinstance(granted, int) and granted > 0 else request.expiration_seconds
        )
        return IssuedToken(token, when, seconds)
