"""What a pod asks of the node, as the kubelet's admission counts it."""

from __future__ import annotations

from pykubelet.api.model import Container, Pod
from pykubelet.api.quantity import to_bytes, to_millicpu

# cpu in millicores, memory and ephemeral-storage in bytes.
RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _container_requests(container: Container) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in RESOURCES:
        # The API's defaulting: a limit without a request is also the request.
        raw = container.resources.requests.get(name, container.resources.limits.get(name))
        if raw is not None:
            out[name] = to_millicpu(raw) if name == "cpu" else to_bytes(raw)
    return out


def pod_requests(pod: Pod) -> dict[str, int]:
    """The kubelet's effective pod request: the app containers and sidecars together, or the
    largest init container (with the sidecars started before it), whichever is more."""
    total = dict.fromkeys(RESOURCES, 0)
    sidecars = dict.fromkeys(RESOURCES, 0)
    init_peak = dict.fromkeys(RESOURCES, 0)
    for init in pod.spec.init_containers:
        asked = _container_requests(init)
        if init.restart_policy == "Always":
            for name, value in asked.items():
                sidecars[name] += value
        else:
            for name in RESOURCES:
                init_peak[name] = max(init_peak[name], sidecars[name] + asked.get(name, 0))
    for container in pod.spec.containers:
        for name, value in _container_requests(container).items():
            total[name] += value
    return {name: max(total[name] + sidecars[name], init_peak[name]) for name in RESOURCES}
