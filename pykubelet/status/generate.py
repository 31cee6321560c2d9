"""Pod status computed from the runtime's view of a pod (the kubelet's status/generate.go).

The phase follows the kubelet's getPhase; container states and conditions are those
`kubectl get pods` shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from pykubelet.api.model import (
    Container,
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    Pod,
    PodCondition,
    PodIP,
    PodStatus,
)
from pykubelet.api.qos import qos_class
from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class ProbeView(Protocol):
    """What the status needs from the prober."""

    def is_ready(self, pod: Pod, spec: Container, container_id: str) -> bool: ...

    def is_started(self, pod: Pod, spec: Container, container_id: str) -> bool: ...


@dataclass(frozen=True)
class Waiting:
    """Why a container is not running now, as the sync decided (back-off, start errors)."""

    reason: str
    message: str = ""


def _terminated(c: RuntimeContainer) -> ContainerStateTerminated:
    return ContainerStateTerminated(
        exit_code=c.exit_code if c.exit_code is not None else 137,
        reason=c.reason or ("Completed" if c.exit_code == 0 else "Error"),
        message=c.message,
        started_at=c.started_at,
        finished_at=c.finished_at,
        container_id=c.container_id,
    )


def _state_of(c: RuntimeContainer) -> ContainerState:
    if c.state is ContainerRunState.RUNNING:
        return ContainerState(running=ContainerStateRunning(started_at=c.started_at))
    if c.state is ContainerRunState.CREATED:
        return ContainerState(waiting=ContainerStateWaiting(reason="ContainerCreating"))
    return ContainerState(terminated=_terminated(c))


def container_status(
    spec: Container,
    instances: list[RuntimeContainer],
    waiting: Waiting | None,
    default_waiting: str,
    started: Callable[[RuntimeContainer], bool] = lambda c: True,
    ready: Callable[[RuntimeContainer], bool] = lambda c: True,
) -> ContainerStatus:
    latest = instances[-1] if instances else None
    previous = instances[-2] if len(instances) > 1 else None
    status = ContainerStatus(name=spec.name, image=spec.image)
    if latest is None:
        reason = waiting or Waiting(default_waiting)
        status.state = ContainerState(
            waiting=ContainerStateWaiting(reason=reason.reason, message=reason.message or None)
        )
        return status
    status.restart_count = latest.attempt
    status.container_id = latest.container_id
    status.image_id = latest.image_id or latest.image
    if waiting is not None and latest.state is not ContainerRunState.RUNNING:
        # Exited and not restarted yet (back-off, a failing start): waiting, with the last run.
        status.state = ContainerState(
            waiting=ContainerStateWaiting(reason=waiting.reason, message=waiting.message or None)
        )
        status.last_state = ContainerState(terminated=_terminated(latest))
        status.started = False
        return status
    status.state = _state_of(latest)
    if previous is not None and previous.state is ContainerRunState.EXITED:
        status.last_state = ContainerState(terminated=_terminated(previous))
    running = latest.state is ContainerRunState.RUNNING
    status.started = running and started(latest)
    status.ready = running and ready(latest)
    return status


def pod_phase(pod: Pod, statuses: list[ContainerStatus], initialized: bool) -> str:
    """The kubelet's getPhase over the regular containers."""
    if not initialized:
        return "Pending"
    running = waiting = stopped = succeeded = 0
    for st in statuses:
        if st.state.running is not None:
            running += 1
        elif st.state.terminated is not None:
            stopped += 1
            if st.state.terminated.exit_code == 0:
                succeeded += 1
        elif st.state.waiting is not None:
            if st.last_state.terminated is not None:
                stopped += 1
            else:
                waiting += 1
    policy = pod.spec.restart_policy
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if policy == "OnFailure":
            return "Running"
        return "Failed"
    return "Pending"


def _condition(
    type_: str, ok: bool, previous: PodStatus | None, now: datetime, reason: str | None = None
) -> PodCondition:
    value = "True" if ok else "False"
    since = now
    if previous is not None:
        for cond in previous.conditions:
            if cond.type == type_ and cond.status == value and cond.last_transition_time:
                since = cond.last_transition_time
    return PodCondition(
        type=type_, status=value, last_transition_time=since, reason=None if ok else reason
    )


def readiness_gates_not_ready(pod: Pod) -> list[str]:
    """Why each readiness gate holds the pod back, in the kubelet's words: its condition (set in
    the pod's status by a controller, through the API server) is missing or not True."""
    found = {c.type: c.status for c in pod.status.conditions}
    out: list[str] = []
    for gate in pod.spec.readiness_gates or []:
        kind = gate.condition_type
        if kind not in found:
            out.append(f'corresponding condition of pod readiness gate "{kind}" does not exist.')
        elif found[kind] != "True":
            out.append(
                f'the status of pod readiness gate "{kind}" is not "True", but {found[kind]}'
            )
    return out


def compute_pod_status(
    pod: Pod,
    runtime_pod: RuntimePod | None,
    waiting: dict[str, Waiting],
    previous: PodStatus | None,
    host_ip: str,
    initialized: bool,
    init_failed: bool = False,
    now: datetime | None = None,
    probes: ProbeView | None = None,
) -> PodStatus:
    now = now or datetime.now(UTC).replace(microsecond=0)
    by_name: dict[str, list[RuntimeContainer]] = {}
    if runtime_pod is not None:
        for c in runtime_pod.containers:
            by_name.setdefault(c.name, []).append(c)

    def status_of(spec: Container, default_waiting: str) -> ContainerStatus:
        if probes is None:
            return container_status(
                spec, by_name.get(spec.name, []), waiting.get(spec.name), default_waiting
            )
        return container_status(
            spec,
            by_name.get(spec.name, []),
            waiting.get(spec.name),
            default_waiting,
            started=lambda c: probes.is_started(pod, spec, c.id),
            ready=lambda c: probes.is_ready(pod, spec, c.id),
        )

    init_statuses = [status_of(c, "PodInitializing") for c in pod.spec.init_containers]
    statuses = [
        status_of(c, "ContainerCreating" if initialized else "PodInitializing")
        for c in pod.spec.containers
    ]
    # As the kubelet's: never ready, no started flag (no probes), not counted in the phase.
    ephemeral_statuses = [
        container_status(
            spec,
            by_name.get(spec.name, []),
            waiting.get(spec.name),
            "ContainerCreating",
            ready=lambda c: False,
        ).model_copy(update={"started": None})
        for spec in pod.ephemeral_containers()
    ]
    phase = "Failed" if init_failed else pod_phase(pod, statuses, initialized)
    reason = message = None
    if previous is not None and previous.phase in TERMINAL_PHASES:
        phase = previous.phase  # a terminal phase never changes back, nor why it was reached
        reason, message = previous.reason, previous.message
    ready = phase == "Running" and all(s.ready for s in statuses)
    not_ready = "ContainersNotReady"
    gates = readiness_gates_not_ready(pod)
    ready_condition = _condition("Ready", ready and not gates, previous, now, not_ready)
    if ready and gates:
        # The kubelet's GeneratePodReadyCondition: the containers are ready, the gates not.
        ready_condition.reason = "ReadinessGatesNotReady"
        ready_condition.message = ", ".join(gates)
    conditions = [
        _condition("PodReadyToStartContainers", runtime_pod is not None, previous, now),
        _condition("Initialized", initialized, previous, now, "ContainersNotInitialized"),
        ready_condition,
        _condition("ContainersReady", ready, previous, now, not_ready),
        _condition("PodScheduled", True, previous, now),
    ]
    sandbox = runtime_pod.sandbox if runtime_pod is not None else None
    pod_ip = sandbox.ip if sandbox is not None else None
    return PodStatus(
        phase=phase,
        reason=reason,
        message=message,
        conditions=conditions,
        host_ip=host_ip,
        pod_ip=pod_ip,
        pod_ips=[PodIP(ip=pod_ip)] if pod_ip else None,
        host_ips=[PodIP(ip=host_ip)] if host_ip else None,
        start_time=previous.start_time if previous and previous.start_time else now,
        init_container_statuses=init_statuses or None,
        container_statuses=statuses,
        ephemeral_container_statuses=ephemeral_statuses or None,
        qos_class=qos_class(pod),
    )
