from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.agent import Agent


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
    started: list[Agent] = []

    def start(*extra: str) -> Agent:
        agent = Agent(manifests, tmp_path / "root", tmp_path / "agent.log", list(extra))
        started.append(agent)
        return agent.start()

    yield start
    failed = getattr(request.node, "rep_call", None)
    for agent in started:
        if agent.proc is not None and agent.proc.poll() is None:
            agent.stop(signal.SIGTERM)
    if failed is not None and failed.failed and started:
        print("---- agent log ----\n" + started[-1].log()[-20000:])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if call.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report
