"""Who may use the kubelet API, as the kubelet decides it (`pkg/kubelet/server/auth.go` and the
delegating authenticator and authorizer it builds).

Authentication, in order:
1. a client certificate verified against --client-ca-file in the TLS handshake: the user is its
   Common Name, the groups its Organizations;
2. a bearer token, with --authentication-token-webhook: a TokenReview sent to the API server,
   its answer (yes or no) cached for --authentication-token-webhook-cache-ttl; a failed review is
   not cached and answers 401;
3. anonymous (`system:anonymous`, group `system:unauthenticated`) with --anonymous-auth.
Nothing of these: 401.

Authorization: AlwaysAllow, or Webhook (a SubjectAccessReview for the attributes the kubelet
derives from the request: verb from the method, resource `nodes`, the node's name, and the
subresource `stats`, `metrics` or `log` for paths below /stats, /metrics and /logs, `proxy` for
everything else); allowed answers are cached for --authorization-webhook-cache-authorized-ttl,
denials for --authorization-webhook-cache-unauthorized-ttl. Denied: 403.

Tokens are kept only as their SHA-256 and never logged.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

Obj = dict[str, Any]

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CACHE_LIMIT = 10_000

_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_SUBRESOURCES = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"))


@dataclass(frozen=True)
class UserInfo:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = UserInfo("system:anonymous", groups=("system:unauthenticated",))


class ReviewError(Exception):
    """A review the API server could not answer."""


class Reviews(Protocol):
    """Creates a review object in the API server and returns what it answered."""

    async def review(self, path: str, body: Obj) -> Obj: ...


class _TtlCache:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, Any]] = {}

    def get(self, key: str) -> Any:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: str, value: Any, ttl: float) -> None:
        if ttl <= 0:
            return
        if len(self._entries) >= CACHE_LIMIT:
            now = self._clock()
            self._entries = {k: e for k, e in self._entries.items() if e[0] > now}
            if len(self._entries) >= CACHE_LIMIT:
                self._entries.pop(next(iter(self._entries)))
        self._entries[key] = (self._clock() + ttl, value)


def user_of_certificate(peercert: Mapping[str, Any]) -> UserInfo | None:
    """The user of a verified client certificate (ssl's getpeercert() form)."""
    name = ""
    groups: list[str] = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and not name:
                name = str(value)
            elif key == "organizationName":
                groups.append(str(value))
    return UserInfo(name, groups=tuple(groups)) if name else None


class Authenticator:
    def __init__(
        self,
        *,
        anonymous: bool,
        token_reviews: Reviews | None = None,
        token_cache_ttl: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._anonymous = anonymous
        self._reviews = token_reviews
        self._ttl = token_cache_ttl
        self._cache = _TtlCache(clock)

    async def authenticate(
        self, peercert: Mapping[str, Any] | None, authorization: str | None
    ) -> UserInfo | None:
        """The user, or None: 401."""
        if peercert:
            return user_of_certificate(peercert)
        token = _bearer(authorization)
        if token is not None and self._reviews is not None:
            return await self._review_token(token)
        return ANONYMOUS if self._anonymous else None

    async def _review_token(self, token: str) -> UserInfo | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None:
            return cached if isinstance(cached, UserInfo) else None
        assert self._reviews is not None
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            answer = await self._reviews.review(TOKEN_REVIEWS, body)
        except ReviewError as exc:
            log.warning("token review failed: %s (answered 401)", exc)
            return None
        status = answer.get("status") or {}
        user: UserInfo | None = None
        if status.get("authenticated"):
            info = status.get("user") or {}
            user = UserInfo(
                str(info.get("username", "")),
                uid=str(info.get("uid", "")),
                groups=tuple(str(g) for g in info.get("groups") or ()),
                extra={str(k): tuple(map(str, v)) for k, v in (info.get("extra") or {}).items()},
            )
        self._cache.put(key, user if user is not None else False, self._ttl)
        return user


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class Attributes:
    """What is asked of the node, in the API server's terms (nodes/<subresource>)."""

    verb: str
    name: str
    subresource: str
    path: str
    resource: str = "nodes"
    api_version: str = "v1"

    def describe(self, user: UserInfo) -> str:
        return (
            f"user={user.name}, verb={self.verb}, resource={self.resource}, "
            f"subresource={self.subresource}"
        )


def request_attributes(method: str, path: str, node_name: str) -> Attributes:
    subresource = "proxy"
    for prefix, name in _SUBRESOURCES:
        if path == prefix or path.startswith(prefix + "/"):
            subresource = name
            break
    return Attributes(_VERBS.get(method.upper(), ""), node_name, subresource, path)


class Authorizer(Protocol):
    async def authorize(self, user: UserInfo, attrs: Attributes) -> bool:
        """Allowed or not; raises ReviewError when it cannot tell (500)."""
        ...


class AlwaysAllow:
    async def authorize(self, user: UserInfo, attrs: Attributes) -> bool:
        return True


class WebhookAuthorizer:
    def __init__(
        self,
        reviews: Reviews,
        authorized_ttl: float = 300.0,
        unauthorized_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviews = reviews
        self._authorized_ttl = authorized_ttl
        self._unauthorized_ttl = unauthorized_ttl
        self._cache = _TtlCache(clock)

    async def authorize(self, user: UserInfo, attrs: Attributes) -> bool:
        spec: Obj = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": {
                "verb": attrs.verb,
                "group": "",
                "version": attrs.api_version,
                "resource": attrs.resource,
                "subresource": attrs.subresource,
                "name": attrs.name,
                "namespace": "",
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        key = repr(sorted(spec.items()))
        cached = self._cache.get(key)
        if cached is not None:
            return bool(cached)
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        answer = await self._reviews.review(SUBJECT_ACCESS_REVIEWS, body)
        allowed = bool((answer.get("status") or {}).get("allowed"))
        self._cache.put(key, allowed, self._authorized_ttl if allowed else self._unauthorized_ttl)
        return allowed
