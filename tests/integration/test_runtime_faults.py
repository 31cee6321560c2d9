"""Faults of the container engine under the docker runtime: the engine restarts, pods carry on."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import DOCKER_ENDPOINT_VARIABLE as ENDPOINT_VARIABLE
from tests.conftest import PODMAN_SCRIPT as ENV_SCRIPT
from tests.integration.agent import Backend, container_state, pod_yaml, wait_for, write_pod


def running_container(agent, name: str) -> dict | None:  # type: ignore[no-untyped-def]
    pod = agent.pod(name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    state = container_state(pod)
    return state if "running" in state["state"] else None


@pytest.mark.docker
def test_an_engine_restart_loses_no_pod_and_duplicates_none(
    start_agent, manifests: Path, docker_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    if os.environ.get(ENDPOINT_VARIABLE):
        pytest.skip(f"{ENDPOINT_VARIABLE} names an engine this test may not restart")
    engine = docker_backend.engine
    assert engine is not None
    directory = Path(engine.path).parent.parent  # DIR/run/podman.sock
    write_pod(manifests, "steady", pod_yaml("steady", docker_backend.forever()))
    agent = start_agent(*docker_backend.flags)
    before = wait_for("steady running", lambda: running_container(agent, "steady"))

    subprocess.run([str(ENV_SCRIPT), "stop-service", str(directory)], check=True, timeout=60)
    # While the engine is away: a new manifest arrives, and the agent keeps serving.
    write_pod(manifests, "late", pod_yaml("late", docker_backend.forever()))
    time.sleep(3)
    assert agent.get("/pods")[0] == 200
    started = subprocess.run(
        [str(ENV_SCRIPT), "start", str(directory)], capture_output=True, text=True, timeout=300
    )
    assert started.returncode == 0, started.stderr

    wait_for("late running", lambda: running_container(agent, "late"), timeout=60)
    after = wait_for("steady running", lambda: running_container(agent, "steady"))
    # The same container, never restarted, and exactly one of it (plus the pod's infra).
    assert after["containerID"] == before["containerID"] and after["restartCount"] == 0
    assert len(engine.pod_containers("steady")) == 2
    assert len(engine.pod_containers("late")) == 2
    wait_for("healthy again", lambda: agent.get("/healthz") == (200, b"ok"), timeout=30)
