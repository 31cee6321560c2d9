"""readinessGates: the pod is Ready only once the conditions they name (set by a controller
through the API server) are True, as the kubelet's GeneratePodReadyCondition says; and the API
source keeps exactly those conditions of the served status."""

from __future__ import annotations

from typing import Any

from pykubelet.api.model import Pod
from pykubelet.config.apiserver import decode_api_pod
from pykubelet.status.generate import compute_pod_status
from tests.unit.test_status import R, instance, runtime_pod

GATE = "target-health.example.com/web"


def gated(conditions: list[dict[str, Any]]) -> Pod:
    return decode_api_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "readinessGates": [{"conditionType": GATE}],
                "containers": [{"name": "c0", "image": "i"}],
            },
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "False"},
                    *conditions,
                ],
            },
        }
    )


def ready_condition(pod: Pod) -> tuple[str, str | None, str | None]:
    status = compute_pod_status(pod, runtime_pod(instance("c0", R)), {}, None, "10.0.0.1", True)
    by_type = {c.type: c for c in status.conditions}
    assert by_type["ContainersReady"].status == "True"
    assert status.host_ips is not None and [i.ip for i in status.host_ips] == ["10.0.0.1"]
    ready = by_type["Ready"]
    return ready.status, ready.reason, ready.message


def test_ready_waits_for_the_gate_condition() -> None:
    assert ready_condition(gated([])) == (
        "False",
        "ReadinessGatesNotReady",
        f'corresponding condition of pod readiness gate "{GATE}" does not exist.',
    )
    assert ready_condition(gated([{"type": GATE, "status": "False"}])) == (
        "False",
        "ReadinessGatesNotReady",
        f'the status of pod readiness gate "{GATE}" is not "True", but False',
    )
    assert ready_condition(gated([{"type": GATE, "status": "True"}])) == ("True", None, None)


def test_only_the_gates_conditions_of_the_status_are_kept() -> None:
    pod = gated([{"type": GATE, "status": "True", "lastTransitionTime": "2026-12-03T10:00:00Z"}])
    assert [(c.type, c.status) for c in pod.status.conditions] == [(GATE, "True")]
    assert pod.status.phase is None  # the API's phase is the kubelet's to compute
