"""Service-account tokens for projected volumes, kept as the kubelet's token manager keeps them.

A token comes from the API server's TokenRequest (`serviceaccounts/<name>/token`), bound to the
pod, for the projection's audience and requested life. The manager answers from its cache until
the token needs a refresh: when 80 % of its life has passed, or it is older than 24 hours, each
less a few seconds of jitter so that the pods of a node do not all ask at once. If a refresh
fails while the cached token is still valid, the pod keeps that one (and the next sync tries
again); an expired one is never handed out.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_EXPIRATION_SECONDS = 3600  # the API's default for a projection's expirationSeconds
MAX_TOKEN_AGE = 24 * 3600.0  # refresh a token older than this whatever its life
MAX_JITTER = 10.0


@dataclass(frozen=True)
class TokenRequest:
    """What a projected `serviceAccountToken` asks for, for one pod."""

    namespace: str
    service_account: str
    audience: str | None  # None: the API server's own audiences
    expiration_seconds: int
    pod_name: str
    pod_uid: str


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expires: float  # Unix time
    expiration_seconds: int  # the life the API server granted (it may differ from the request)


class TokenError(Exception):
    """No valid token can be had: the volume cannot be set up."""


class TokenIssuer(Protocol):
    async def request_token(self, request: TokenRequest) -> IssuedToken:
        """A new token from the API server's TokenRequest; raises with the server's reason."""
        ...


class TokenManager:
    """Tokens by request, from the cache while they are fresh."""

    def __init__(
        self,
        issuer: TokenIssuer,
        *,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[], float] = lambda: random.uniform(0.0, MAX_JITTER),
    ) -> None:
        self._issuer = issuer
        self._clock = clock
        self._jitter = jitter
        self._cache: dict[TokenRequest, IssuedToken] = {}

    async def token(self, request: TokenRequest) -> str:
        cached = self._cache.get(request)
        now = self._clock()
        if cached is not None and not self._needs_refresh(cached, now):
            return cached.token
        try:
            issued = await self._issuer.request_token(request)
        except Exception as exc:
            if cached is not None and now < cached.expires:
                log.warning(
                    "token for service account %s/%s (pod %s): refresh failed, the current one "
                    "is valid for %.0fs more: %s",
                    request.namespace,
                    request.service_account,
                    request.pod_name,
                    cached.expires - now,
                    exc,
                )
                return cached.token
            raise TokenError(
                f'failed to fetch token for service account "{request.namespace}/'
                f'{request.service_account}": {exc}'
            ) from exc
        self._cache[request] = issued
        return issued.token

    def forget_pod(self, pod_uid: str) -> None:
        """Drop the tokens of a pod that is gone."""
        for request in [r for r in self._cache if r.pod_uid == pod_uid]:
            del self._cache[request]

    def _needs_refresh(self, issued: IssuedToken, now: float) -> bool:
        if now >= issued.expires:
            return True
        issued_at = issued.expires - issued.expiration_seconds
        jitter = self._jitter()
        if now > issued_at + MAX_TOKEN_AGE - jitter:
            return True
        return now > issued.expires - issued.expiration_seconds * 0.2 - jitter
