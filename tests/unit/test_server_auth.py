"""The kubelet API's authentication and authorization (server/auth.py), over an in-memory
review API: what is asked of the API server, what is cached, and for how long."""

from __future__ import annotations

from typing import Any

import pytest

from pykubelet.server.auth import (
    ANONYMOUS,
    SUBJECT_ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    Authenticator,
    ReviewError,
    UserInfo,
    WebhookAuthorizer,
    request_attributes,
    user_of_certificate,
)

Obj = dict[str, Any]


class Reviews:
    """The API server's side: tokens it knows, users it allows; counts what it was asked."""

    def __init__(self) -> None:
        self.tokens: dict[str, Obj] = {"good": {"username": "alice", "groups": ["dev"]}}
        self.allowed: set[tuple[str, str]] = {("alice", "proxy")}
        self.asked: list[tuple[str, Obj]] = []
        self.down = False

    async def review(self, path: str, body: Obj) -> Obj:
        self.asked.append((path, body))
        if self.down:
            raise ReviewError("503 ServiceUnavailable")
        spec = body["spec"]
        if path == TOKEN_REVIEWS:
            user = self.tokens.get(spec["token"])
            return {"status": {"authenticated": user is not None, "user": user or {}}}
        assert path == SUBJECT_ACCESS_REVIEWS
        key = (spec["user"], spec["resourceAttributes"]["subresource"])
        return {"status": {"allowed": key in self.allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("method", "path", "verb", "subresource"),
    [
        ("GET", "/pods", "get", "proxy"),
        ("POST", "/exec/ns/pod/c", "create", "proxy"),
        ("GET", "/containerLogs/ns/pod/c", "get", "proxy"),
        ("GET", "/stats/summary", "get", "stats"),
        ("GET", "/stats", "get", "stats"),
        ("GET", "/statsfoo", "get", "proxy"),  # a path component, not a prefix of a name
        ("GET", "/metrics/resource", "get", "metrics"),
        ("GET", "/logs/syslog", "get", "log"),
        ("PUT", "/configz", "update", "proxy"),
        ("DELETE", "/pods", "delete", "proxy"),
        ("PATCH", "/pods", "patch", "proxy"),
    ],
)
def test_request_attributes_follow_the_kubelet(
    method: str, path: str, verb: str, subresource: str
) -> None:
    attrs = request_attributes(method, path, "node-1")
    assert (attrs.verb, attrs.resource, attrs.subresource, attrs.name) == (
        verb,
        "nodes",
        subresource,
        "node-1",
    )


def test_a_certificate_user_is_its_common_name_and_groups_its_organizations() -> None:
    peercert = {
        "subject": (
            (("organizationName", "system:masters"),),
            (("organizationName", "ops"),),
            (("commonName", "kube-apiserver-kubelet-client"),),
        )
    }
    assert user_of_certificate(peercert) == UserInfo(
        "kube-apiserver-kubelet-client", groups=("system:masters", "ops")
    )
    assert user_of_certificate({"subject": ((("organizationName", "x"),),)}) is None


async def test_tokens_are_reviewed_once_per_ttl_and_failures_are_not_cached() -> None:
    reviews, clock = Reviews(), Clock()
    auth = Authenticator(anonymous=False, token_reviews=reviews, token_cache_ttl=120, clock=clock)
    alice = await auth.authenticate(None, "Bearer good")
    assert alice == UserInfo("alice", groups=("dev",))
    assert await auth.authenticate(None, "bearer good") == alice
    assert await auth.authenticate(None, "Bearer bad") is None
    assert await auth.authenticate(None, "Bearer bad") is None
    assert len(reviews.asked) == 2  # one per token: both answers kept
    clock.now += 121
    assert await auth.authenticate(None, "Bearer good") == alice
    assert len(reviews.asked) == 3
    reviews.down = True
    assert await auth.authenticate(None, "Bearer other") is None
    reviews.down = False
    reviews.tokens["other"] = {"username": "bob"}
    assert await auth.authenticate(None, "Bearer other") == UserInfo("bob")


async def test_anonymous_only_when_allowed_and_only_without_credentials() -> None:
    reviews = Reviews()
    open_ = Authenticator(anonymous=True, token_reviews=reviews)
    closed = Authenticator(anonymous=False, token_reviews=reviews)
    assert await open_.authenticate(None, None) == ANONYMOUS
    assert await closed.authenticate(None, None) is None
    # A bad token is not anonymous: it is refused.
    assert await open_.authenticate(None, "Bearer bad") is None
    # Without the webhook a token means nothing; the request is anonymous if that is allowed.
    assert await Authenticator(anonymous=True).authenticate(None, "Bearer good") == ANONYMOUS
    assert await Authenticator(anonymous=False).authenticate(None, "Bearer good") is None


async def test_access_reviews_ask_for_the_node_and_cache_each_answer_for_its_ttl() -> None:
    reviews, clock = Reviews(), Clock()
    authz = WebhookAuthorizer(reviews, authorized_ttl=300, unauthorized_ttl=30, clock=clock)
    alice = UserInfo("alice", uid="u-1", groups=("dev",))
    proxy = request_attributes("GET", "/pods", "node-1")
    stats = request_attributes("GET", "/stats/summary", "node-1")
    assert await authz.authorize(alice, proxy) is True
    assert await authz.authorize(alice, stats) is False
    path, body = reviews.asked[0]
    assert path == SUBJECT_ACCESS_REVIEWS
    assert body["spec"] == {
        "user": "alice",
        "uid": "u-1",
        "groups": ["dev"],
        "resourceAttributes": {
            "verb": "get",
            "group": "",
            "version": "v1",
            "resource": "nodes",
            "subresource": "proxy",
            "name": "node-1",
            "namespace": "",
        },
    }
    clock.now += 31  # the denial expired, the permission not
    reviews.allowed.add(("alice", "stats"))
    assert await authz.authorize(alice, proxy) is True
    assert await authz.authorize(alice, stats) is True
    assert len(reviews.asked) == 3
    reviews.down = True
    with pytest.raises(ReviewError):
        await authz.authorize(UserInfo("carol"), proxy)
