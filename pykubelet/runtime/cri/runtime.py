"""Containers through the CRI (`--container-runtime=remote`): containerd, CRI-O, any runtime that
serves Kubernetes' runtime.v1 RuntimeService and ImageService over gRPC, as the kubelet uses them.

The Runtime is the shared sandbox core (runtime/sandbox/core.py) over this backend's engine
(engine.py: the calls, polling, log files; convert.py: configs, resources, OOM scores and the
parsing of statuses; client.py: the gRPC client; log.py: the CRI log format).
"""

from __future__ import annotations

from pathlib import Path

from pykubelet.runtime.cri import oomreason
from pykubelet.runtime.cri.engine import NAME, POLL_INTERVAL, CreateRequest, CriEngine
from pykubelet.runtime.sandbox.core import SandboxRuntime

__all__ = ["NAME", "CriRuntime"]


class CriRuntime(SandboxRuntime[CreateRequest]):
    def __init__(
        self,
        endpoint: str,
        infra_image: str,
        root_dir: Path,
        node_ip: str = "127.0.0.1",
        poll_interval: float = POLL_INTERVAL,
        oom_reason_wait: float = oomreason.WAIT_SECONDS,
    ) -> None:
        self.endpoint = endpoint
        self.node_ip = node_ip
        engine = CriEngine(endpoint, infra_image, root_dir, node_ip, poll_interval, oom_reason_wait)
        super().__init__(engine, infra_image)
