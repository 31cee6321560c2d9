"""readinessGates in cluster mode: the pod's containers run and are ready, but the pod is Ready
only once a controller sets the gate's condition True in the API server (as a load balancer
controller does), and it goes back to not Ready when the condition does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.kubelet_node import https_apiserver, start_kubelet_node
from tests.integration.test_cluster import KubeClient, pod_body

NODE = "gate-node"
GATE = "target-health.example.com/web"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


def ready(client: KubeClient) -> tuple[str, str | None] | None:
    pod = client.pod("gated")
    conditions = {c["type"]: c for c in (pod or {}).get("status", {}).get("conditions", [])}
    if "Ready" not in conditions or "ContainersReady" not in conditions:
        return None
    return conditions["Ready"]["status"], conditions["Ready"].get("reason")


def set_gate(client: KubeClient, value: str) -> None:
    # A controller's status patch: strategic, so the kubelet's own conditions stay.
    status, body = client.request(
        "PATCH",
        "/api/v1/namespaces/default/pods/gated/status",
        {"status": {"conditions": [{"type": GATE, "status": value}]}},
        content_type="application/strategic-merge-patch+json",
    )
    assert status == 200, body


def test_the_pod_is_ready_once_its_gate_condition_is_true(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    _, client, _ = start_kubelet_node(apiserver, start_agent, tmp_path, NODE)
    body = pod_body("gated", NODE, "sleep 600")
    body["spec"]["readinessGates"] = [{"conditionType": GATE}]
    client.create_pod(body)
    wait_for(
        "containers ready, the pod held back by its gate",
        lambda: (
            ready(client) == ("False", "ReadinessGatesNotReady")
            and client.pod("gated")["status"]["containerStatuses"][0]["ready"]
        ),  # type: ignore[index]
    )
    pod = client.pod("gated")
    assert pod is not None
    ready_condition = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready_condition["message"] == (
        f'corresponding condition of pod readiness gate "{GATE}" does not exist.'
    )
    assert pod["status"]["hostIPs"] == [{"ip": "127.0.0.1"}]

    set_gate(client, "True")
    wait_for("Ready once the gate is True", lambda: ready(client) == ("True", None))
    set_gate(client, "False")
    wait_for("not Ready again", lambda: ready(client) == ("False", "ReadinessGatesNotReady"))
    pod = client.pod("gated")
    assert pod is not None
    kinds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert kinds[GATE] == "False" and kinds["ContainersReady"] == "True"
