"""Names the sandbox backends derive the same way: a pod's hostname, an endpoint flag's URL."""

from __future__ import annotations

from pykubelet.api.model import Pod

HOSTNAME_MAX = 63


def pod_hostname(pod: Pod) -> str:
    """spec.hostname, else the pod's name, cut to a DNS label."""
    name = pod.spec.hostname or pod.metadata.name
    return name[:HOSTNAME_MAX].rstrip("-.") or "pod"


def normalize_endpoint(endpoint: str) -> str:
    """The kubelet also accepted a bare socket path."""
    if endpoint.startswith("/"):
        return "unix://" + endpoint
    return endpoint
