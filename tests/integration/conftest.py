from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Containerd
from tests.integration.agent import Agent, Backend, CriEngine, Engine, unmount_below

INFRA_IMAGE_VARIABLE = "PYKUBELET_TEST_INFRA_IMAGE"


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "manifests"
    path.mkdir()
    return path


@pytest.fixture
def start_agent(
    tmp_path: Path, manifests: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Agent]]:
    """Start the real agent on a temp manifest directory; stops it (and its pods) afterwards."""
    for name in ("backend", "docker_backend", "cri_backend"):
        if name in request.fixturenames:
            # Set up first so that it is torn down last, once the agent has stopped.
            request.getfixturevalue(name)
    started: list[Agent] = []

    def start(*extra: str) -> Agent:
        agent = Agent(manifests, tmp_path / "root", tmp_path / "agent.log", list(extra))
        started.append(agent)
        return agent.start()

    yield start
    failed = getattr(request.node, "rep_call", None)
    try:
        for agent in started:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.stop(signal.SIGTERM)
    finally:  # also when an agent had to be killed (its mounts stay then)
        unmount_below(tmp_path)
    if failed is not None and failed.failed and started:
        print("---- agent log ----\n" + started[-1].log()[-20000:])


@pytest.fixture(scope="session")
def container_engine(podman_endpoint: str) -> Engine:
    """The session's Docker Engine API (tests/conftest.py's podman_endpoint)."""
    return Engine(podman_endpoint)


def _engine_backend(
    name: str, endpoint: str, engine: Engine | CriEngine, infra_image: str
) -> Iterator[Backend]:
    engine.remove_all()  # whatever an earlier test left behind
    flags = ["--container-runtime", name, "--container-runtime-endpoint", endpoint]
    backend = Backend(name, [*flags, "--pod-infra-container-image", infra_image], engine)
    yield backend
    backend.close()


@pytest.fixture
def docker_backend(container_engine: Engine) -> Iterator[Backend]:
    infra_image = os.environ.get(INFRA_IMAGE_VARIABLE, "localhost/pause:test")
    yield from _engine_backend("docker", container_engine.endpoint, container_engine, infra_image)


@pytest.fixture
def cri_backend(containerd: Containerd) -> Iterator[Backend]:
    engine = CriEngine(containerd.endpoint, containerd.gateway)
    yield from _engine_backend("remote", containerd.endpoint, engine, "localhost/pause:test")


@pytest.fixture(
    params=[
        "process",
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("remote", marks=pytest.mark.cri),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Run the test once per runtime."""
    engine_backend = {"docker": "docker_backend", "remote": "cri_backend"}.get(request.param)
    if engine_backend is not None:
        yield request.getfixturevalue(engine_backend)
        return
    backend = Backend("process")
    yield backend
    backend.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if call.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
