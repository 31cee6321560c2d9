"""Fixtures shared by the unit tests: the fixture API server and the agent's own client of it;
a process runtime (`rt`, which a module may define again with other settings)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pykubelet.client.kubeapi import KubeApi
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.fixtures.apiserver import ApiServer

NODE = "n1"


@pytest.fixture
def server() -> Iterator[ApiServer]:
    """The fixture API server (plain HTTP), bookmarks every 0.2 s."""
    srv = ApiServer(bookmark_interval=0.2)
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
async def api(server: ApiServer, tmp_path: Path) -> AsyncIterator[KubeApi]:
    """The agent's client of `server`, as node n1."""
    client = await KubeApi.connect(server.write_kubeconfig(tmp_path / "kc"), NODE)
    yield client
    await client.close()


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    """A process runtime keeping its state under tmp_path; its pods removed and it closed after."""
    runtime = ProcessRuntime(tmp_path)
    await runtime.start()
    yield runtime
    for pod in await runtime.list_pods():
        await runtime.remove_pod(pod.uid)
    await runtime.close()
