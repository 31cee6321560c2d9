"""Pod phase, container states and conditions computed from the runtime's view."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pykubelet.api.model import Pod
from pykubelet.api.qos import qos_class
from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod, RuntimeSandbox
from pykubelet.status.generate import Waiting, compute_pod_status

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def pod(policy: str = "Always", containers: int = 1) -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "restartPolicy": policy,
                "containers": [{"name": f"c{i}", "image": "i"} for i in range(containers)],
            },
        }
    )


def instance(
    name: str, state: ContainerRunState, attempt: int = 0, code: int | None = None
) -> RuntimeContainer:
    return RuntimeContainer(
        id=f"{name}-{attempt}",
        runtime="process",
        pod_uid="u",
        pod_name="p",
        pod_namespace="default",
        name=name,
        attempt=attempt,
        spec_hash="h",
        image="i",
        state=state,
        created_at=T0,
        started_at=T0,
        finished_at=T0 if state is ContainerRunState.EXITED else None,
        exit_code=code,
    )


def runtime_pod(*containers: RuntimeContainer) -> RuntimePod:
    sandbox = RuntimeSandbox("s", "u", "p", "default", True, "10.0.0.5", T0)
    return RuntimePod("u", "p", "default", sandbox, list(containers))


R, E = ContainerRunState.RUNNING, ContainerRunState.EXITED


@pytest.mark.parametrize(
    ("policy", "states", "phase"),
    [
        ("Always", [(R, None)], "Running"),
        ("Always", [(E, 0)], "Running"),  # about to be restarted
        ("OnFailure", [(E, 0)], "Succeeded"),
        ("OnFailure", [(E, 1)], "Running"),
        ("Never", [(E, 1)], "Failed"),
        ("Never", [(E, 0), (E, 0)], "Succeeded"),
        ("Never", [(E, 0), (R, None)], "Running"),
        ("Never", [(E, 0), (E, 2)], "Failed"),
    ],
)
def test_phase(policy: str, states: list[tuple[ContainerRunState, int | None]], phase: str) -> None:
    p = pod(policy, len(states))
    rp = runtime_pod(*(instance(f"c{i}", s, code=c) for i, (s, c) in enumerate(states)))
    assert compute_pod_status(p, rp, {}, None, "10.0.0.1", True).phase == phase


def test_running_pod_status() -> None:
    status = compute_pod_status(pod(), runtime_pod(instance("c0", R)), {}, None, "10.0.0.1", True)
    cs = status.container_statuses[0]  # type: ignore[index]
    assert cs.ready and cs.started and cs.state.running is not None
    conditions = {c.type: c.status for c in status.conditions}
    assert conditions == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert status.pod_ip == "10.0.0.5" and status.host_ip == "10.0.0.1"


def test_backoff_waiting_with_last_state() -> None:
    rp = runtime_pod(instance("c0", E, 0, 1), instance("c0", E, 1, 1))
    waiting = {"c0": Waiting("CrashLoopBackOff", "back-off 10s")}
    status = compute_pod_status(pod(), rp, waiting, None, "h", True)
    cs = status.container_statuses[0]  # type: ignore[index]
    assert cs.state.waiting is not None and cs.state.waiting.reason == "CrashLoopBackOff"
    assert cs.last_state.terminated is not None and cs.last_state.terminated.exit_code == 1
    assert cs.restart_count == 1 and not cs.ready
    assert status.phase == "Running"
    assert {c.type: c.reason for c in status.conditions}["Ready"] == "ContainersNotReady"


def test_not_started_yet_and_transition_times_kept() -> None:
    first = compute_pod_status(pod(), None, {}, None, "h", True, now=T0)
    assert first.phase == "Pending"
    assert first.container_statuses[0].state.waiting.reason == "ContainerCreating"  # type: ignore[index,union-attr]
    later = datetime(2026, 1, 2, tzinfo=UTC)
    second = compute_pod_status(pod(), None, {}, first, "h", True, now=later)
    assert {c.type: c.last_transition_time for c in second.conditions}["Ready"] == T0
    assert second.start_time == T0


def test_terminal_phase_sticks() -> None:
    done = compute_pod_status(
        pod("Never"), runtime_pod(instance("c0", E, code=0)), {}, None, "h", True
    )
    assert done.phase == "Succeeded"
    again = compute_pod_status(pod("Never"), None, {}, done, "h", True)
    assert again.phase == "Succeeded"


def test_qos() -> None:
    p = pod()
    assert qos_class(p) == "BestEffort"
    p.spec.containers[0].resources.limits = {"cpu": "1", "memory": "1Gi"}
    assert qos_class(p) == "Guaranteed"
    p.spec.containers[0].resources.requests = {"cpu": "500m"}
    assert qos_class(p) == "Burstable"
