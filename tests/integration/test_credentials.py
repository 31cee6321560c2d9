"""The real agent with an exec credential plugin in its --kubeconfig: each ExecCredential lives
three seconds and the fixture API server accepts only the last one issued; the node registers,
and a pod created after the first credential expired is run and its status reported, with the
plugin run again and no request refused."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import NODE, Agent, wait_for
from tests.integration.test_cluster import pod_body
from tests.unit.test_credentials import (
    exec_user,
    kubeconfig_with,
    only_the_last_issued,
    runs,
    unauthorized,
    write_plugin,
)


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer(bookmark_interval=0.5)
    server.start()
    yield server
    server.close()


def test_the_agent_runs_pods_across_exec_credential_expiries(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    issued = tmp_path / "issued"
    apiserver.set_token_resolver(only_the_last_issued(issued, f"system:node:{NODE}"))
    plugin = write_plugin(tmp_path)
    kubeconfig = kubeconfig_with(apiserver, tmp_path, exec_user(plugin, issued, 3.0))
    start_agent("--kubeconfig", str(kubeconfig), "--node-ip", "127.0.0.1")
    wait_for("the Node", lambda: apiserver.get("nodes", NODE), timeout=30)
    first = runs(issued)
    time.sleep(3.5)  # the credential it registered with has expired
    apiserver.create("pods", pod_body("web", NODE, "sleep 300", grace=1))

    def running() -> object:
        pod = apiserver.get("pods", "web")
        return pod is not None and (pod.get("status") or {}).get("phase") == "Running"

    wait_for("the pod Running in the API server", running, timeout=30)
    assert runs(issued) > first
    lease = apiserver.get("leases", NODE, "kube-node-lease")
    assert lease is not None
    assert unauthorized(apiserver) == 0
    assert {r.user for r in apiserver.requests() if r.user_agent.startswith("pykubelet/")} == {
        f"system:node:{NODE}"
    }
