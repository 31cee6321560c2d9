"""/containerLogs' query as the kubelet validates it, before any pod is looked up: a bad value
of one parameter is a 400 naming it, options that are invalid together a 422 Status with the
API server's words (PodLogOptions validation)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from pykubelet.api.model import Pod, PodStatus
from pykubelet.common.events import EventRecorder
from pykubelet.server.endpoints import build_app
from tests.fakes.runtime import FakeRuntime


class EmptyNode:
    """A node with no pods: what the read-only port needs of the agent."""

    node_name = "n1"

    def __init__(self) -> None:
        self.runtime = FakeRuntime()
        self.recorder = EventRecorder()

    def pods_with_status(self) -> list[tuple[Pod, PodStatus | None]]:
        return []

    def find_pod(self, namespace: str, name: str) -> Pod | None:
        return None

    def health_problems(self) -> list[str]:
        return []


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with TestClient(TestServer(build_app(EmptyNode()), host="127.0.0.1")) as c:
        yield c


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "sinceSeconds=10&sinceTime=2027-01-01T00:00:00Z",
            "PodLogOptions is invalid: at most one of `sinceTime` or `sinceSeconds` may be "
            "specified",
        ),
        ("sinceSeconds=0", "PodLogOptions is invalid: sinceSeconds: Invalid value: must be "),
    ],
)
async def test_invalid_together_is_a_422_status(
    client: TestClient,  # type: ignore[type-arg]
    query: str,
    message: str,
) -> None:
    resp = await client.get(f"/containerLogs/default/web/main?{query}")
    assert resp.status == 422
    status = json.loads(await resp.text())
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Invalid", 422)
    assert status["message"].startswith(message), status


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sinceSeconds=soon", "sinceSeconds: must be an integer, got 'soon'"),
        ("sinceTime=yesterday", "sinceTime: must be an RFC3339 time (2006-01-02T15:04:05Z)"),
        ("sinceTime=2027-01-01T00:00:00", "sinceTime: must be an RFC3339 time"),  # no zone
        ("timestamps=maybe", "timestamps: must be true or false, got 'maybe'"),
    ],
)
async def test_a_bad_value_is_a_400_naming_its_parameter(
    client: TestClient,  # type: ignore[type-arg]
    query: str,
    message: str,
) -> None:
    resp = await client.get(f"/containerLogs/default/web/main?{query}")
    assert resp.status == 400
    assert message in await resp.text()


async def test_valid_options_reach_the_pod_lookup(client: TestClient) -> None:  # type: ignore[type-arg]
    for query in ("sinceSeconds=5&timestamps=true", "sinceTime=2027-01-01T00:00:00.5%2B02:00"):
        resp = await client.get(f"/containerLogs/default/web/main?{query}")
        assert resp.status == 404, await resp.text()
        assert json.loads(await resp.text())["message"] == 'pod "default/web" not found'
