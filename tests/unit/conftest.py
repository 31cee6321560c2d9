"""Fixtures shared by the unit tests that talk to the fixture API server through the agent's
own client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from pykubelet.client.kubeapi import KubeApi
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
