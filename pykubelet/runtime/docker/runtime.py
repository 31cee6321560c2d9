"""Containers through the Docker Engine API (`--container-runtime=docker`): Docker, or Podman's
compatible service.

The Runtime is the shared sandbox core (runtime/sandbox/core.py) over this backend's engine
(engine.py: the calls; convert.py: request bodies and the parsing of answers; client.py: the
HTTP client; oom.py: the OOM kills Podman does not report on cgroup v1). The engine's labels on
the containers are the only state: nothing is kept under --root-dir.
"""

from __future__ import annotations

from pathlib import Path

from pykubelet.runtime.docker.engine import NAME, CreateRequest, DockerEngine
from pykubelet.runtime.sandbox.core import SandboxRuntime
from pykubelet.runtime.sandbox.naming import normalize_endpoint

__all__ = ["NAME", "DockerRuntime"]


class DockerRuntime(SandboxRuntime[CreateRequest]):
    def __init__(
        self,
        endpoint: str,
        infra_image: str,
        root_dir: Path,
        node_ip: str = "127.0.0.1",
        pod_pids_limit: int = -1,
    ) -> None:
        # root_dir: only for Localhost seccomp profiles (<root-dir>/seccomp); the engine's
        # labels are the state.
        self.endpoint = normalize_endpoint(endpoint)
        self.node_ip = node_ip
        super().__init__(
            DockerEngine(self.endpoint, infra_image, node_ip, pod_pids_limit, root_dir), infra_image
        )
