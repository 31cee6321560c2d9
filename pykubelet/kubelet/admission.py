"""Pod admission, as the kubelet's `lifecycle.PodAdmitHandler`s: each handler looks at a pod and
what the node already runs and says admit, or a reason and a message.

The handlers, in the kubelet's order:
- `NodeFeatures`: what this node allows at all (Linux pods: `spec.os` and a `kubernetes.io/os`
  node selector; privileged containers with --allow-privileged, hostPath volumes below
  --allowed-host-paths);
- `ResourceFit`: at most --max-pods non-terminal pods, and the pod's cpu, memory and
  ephemeral-storage requests within what is left of the node's allocatable (`OutOfpods`,
  `OutOfcpu`, ...), with the kubelet's messages.

A pod turned away is Failed with that reason; the sync loop records it and never starts it.
`NodeUsage` is what the admitted pods use; the sync loop adds each pod it admits and removes
each pod that goes, counting over all pods again only after a change it does not make itself
(a worker terminated, a phase became terminal), so 1,000 additions stay linear and one edit
among 1,000 pods does not count 1,000.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pykubelet.api.model import Container, Pod
from pykubelet.api.quantity import to_bytes, to_millicpu
from pykubelet.pod.volumes import host_path_allowed

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


@dataclass(frozen=True)
class AdmitResult:
    admit: bool
    reason: str = ""
    message: str = ""


ADMIT = AdmitResult(True)


@dataclass
class NodeUsage:
    """What the admitted, non-terminal pods take of the node."""

    pods: int = 0
    resources: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESOURCES, 0))

    def add(self, requests: Mapping[str, int]) -> None:
        self.pods += 1
        for name in RESOURCES:
            self.resources[name] += requests.get(name, 0)

    def remove(self, requests: Mapping[str, int]) -> None:
        self.pods -= 1
        for name in RESOURCES:
            self.resources[name] -= requests.get(name, 0)


class AdmitHandler(Protocol):
    def admit(self, pod: Pod, requests: Mapping[str, int], usage: NodeUsage) -> AdmitResult: ...


class NodeFeatures:
    """Refuses what the node does not allow: privileged containers, hostPath volumes outside
    --allowed-host-paths."""

    def __init__(
        self,
        allow_privileged: bool,
        allowed_host_paths: Sequence[str],
    ) -> None:
        self._allow_privileged = allow_privileged
        self._allowed = list(allowed_host_paths)

    def admit(self, pod: Pod, requests: Mapping[str, int], usage: NodeUsage) -> AdmitResult:
        if pod.spec.os is not None and pod.spec.os.name != "linux":
            return AdmitResult(
                False,
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS",
            )
        selected = (pod.spec.node_selector or {}).get("kubernetes.io/os")
        if selected is not None and selected != "linux":
            return AdmitResult(
                False,
                "PodOSSelectorNodeLabelDoesNotMatch",
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
            )
        for kind, containers in (
            ("initContainers", pod.spec.init_containers),
            ("containers", pod.spec.containers),
        ):
            for i, container in enumerate(containers):
                ctx = container.security_context
                if ctx is not None and ctx.privileged and not self._allow_privileged:
                    return AdmitResult(
                        False,
                        "PrivilegedNotAllowed",
                        f"spec.{kind}[{i}].securityContext.privileged: "
                        "privileged containers are not allowed on this node "
                        "(pykubelet --allow-privileged)",
                    )
        for i, volume in enumerate(pod.spec.volumes or []):
            if volume.host_path is not None and not host_path_allowed(
                volume.host_path.path, self._allowed
            ):
                where = ", ".join(self._allowed) if self._allowed else "none are allowed"
                return AdmitResult(
                    False,
                    "HostPathNotAllowed",
                    f"spec.volumes[{i}].hostPath.path: "
                    f"{volume.host_path.path} is not below --allowed-host-paths ({where})",
                )
        return ADMIT


class ResourceFit:
    """The kubelet's predicate admission: the pod count against --max-pods, then each
    resource's request against what the admitted pods leave of the allocatable."""

    def __init__(self, max_pods: int, allocatable: Mapping[str, int]) -> None:
        self._max_pods = max_pods
        self._allocatable = dict(allocatable)

    def admit(self, pod: Pod, requests: Mapping[str, int], usage: NodeUsage) -> AdmitResult:
        if usage.pods >= self._max_pods:
            return AdmitResult(
                False,
                "OutOfpods",
                "Node didn't have enough resource: pods, "
                f"requested: 1, used: {usage.pods}, capacity: {self._max_pods}",
            )
        for name in RESOURCES:
            asked = requests.get(name, 0)
            used = usage.resources[name]
            allocatable = self._allocatable[name]
            if asked and used + asked > allocatable:
                return AdmitResult(
                    False,
                    f"OutOf{name}",
                    f"Node didn't have enough resource: {name}, "
                    f"requested: {asked}, used: {used}, capacity: {allocatable}",
                )
        return ADMIT


def admit(
    handlers: Sequence[AdmitHandler], pod: Pod, requests: Mapping[str, int], usage: NodeUsage
) -> AdmitResult:
    """The first refusal of the handlers, in order; admit if none refuses."""
    for handler in handlers:
        result = handler.admit(pod, requests, usage)
        if not result.admit:
            return result
    return ADMIT
