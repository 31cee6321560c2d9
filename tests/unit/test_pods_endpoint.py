"""GET /pods through the read-only port's real app: each item is the pod with the status the
agent holds, exactly as the whole pod serialises, while the pods and statuses change."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from pykubelet.api.model import Pod, PodStatus
from pykubelet.common.events import EventRecorder
from pykubelet.server.endpoints import build_app, with_status
from tests.fakes.runtime import FakeRuntime


def _pod(name: str, image: str = "busybox") -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {
                "containers": [{"name": "main", "image": image, "command": ["sleep", "60"]}],
                "nodeName": "n1",
            },
        }
    )


def _running(pod: Pod, ip: str) -> PodStatus:
    return PodStatus.model_validate(
        {
            "phase": "Running",
            "podIP": ip,
            "startTime": datetime(2026, 12, 6, 9, 0, tzinfo=UTC).isoformat(),
            "containerStatuses": [
                {
                    "name": pod.spec.containers[0].name,
                    "image": pod.spec.containers[0].image,
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-12-06T09:00:01Z"}},
                }
            ],
        }
    )


class Node:
    """What the read-only port needs of the agent: pods and the statuses it holds."""

    node_name = "n1"

    def __init__(self) -> None:
        self.runtime = FakeRuntime()
        self.recorder = EventRecorder()
        self.pods: list[tuple[Pod, PodStatus | None]] = []

    def pods_with_status(self) -> list[tuple[Pod, PodStatus | None]]:
        return list(self.pods)

    def find_pod(self, namespace: str, name: str) -> Pod | None:
        return None

    def health_problems(self) -> list[str]:
        return []


async def test_items_are_the_whole_pods_with_their_current_status() -> None:
    node = Node()
    a, b = _pod("a"), _pod("b", image="nginx")
    async with TestClient(TestServer(build_app(node), host="127.0.0.1")) as client:

        async def items() -> list[Any]:
            resp = await client.get("/pods")
            assert resp.status == 200
            body = await resp.json()
            assert (body["kind"], body["apiVersion"]) == ("PodList", "v1")
            return body["items"]  # type: ignore[no-any-return]

        def expected() -> list[Any]:
            return [with_status(pod, status).to_api() for pod, status in node.pods]

        node.pods = [(a, None), (b, None)]  # no status held yet: the pod's own
        assert await items() == expected()
        assert list((await items())[0]) == ["apiVersion", "kind", "metadata", "spec", "status"]
        node.pods = [(a, _running(a, "10.0.0.1")), (b, None)]  # a status changes alone
        assert await items() == expected()
        node.pods = [(a, _running(a, "10.0.0.2")), (b, _running(b, "10.0.0.3"))]
        assert await items() == expected()
        edited = _pod("a", image="alpine")  # the pod itself replaced, its status kept
        node.pods = [(edited, node.pods[0][1]), node.pods[1]]
        got = await items()
        assert got == expected() and got[0]["spec"]["containers"][0]["image"] == "alpine"
        node.pods = [node.pods[1]]  # a pod gone
        assert await items() == expected()
        raw = json.dumps(expected(), separators=(",", ":")).encode()
        resp = await client.get("/pods")
        assert raw[1:-1] in await resp.read()  # byte for byte as the whole pod's encoding
