"""A pykubelet node in cluster mode as kubeadm sets a kubelet up, against the fixture API server
over HTTPS (kubectl sends no token over plain http): client certificates verified against the
API server's CA, tokens through TokenReview, authorization through SubjectAccessReview, no
anonymous access. The tests of the kubelet API (logs, exec, attach, port-forward, top) start
their node with `start_kubelet_node`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.test_cluster import KubeClient


def https_apiserver() -> Iterator[ApiServer]:
    server = ApiServer(bookmark_interval=0.5, tls=True)
    server.start()
    try:
        yield server
    finally:
        server.close()


def start_kubelet_node(
    apiserver: ApiServer,
    start_agent: Callable[..., Agent],
    tmp_path: Path,
    node: str,
    *flags: str,
) -> tuple[Agent, KubeClient, Path]:
    """The agent (with `flags`, e.g. a runtime's), registered and advertising its kubelet port;
    a client of the API server, and the kubeconfig kubectl uses."""
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    agent = start_agent(
        *flags,
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        node,
        "--node-ip",
        "127.0.0.1",
        "--client-ca-file",
        str(apiserver.kubelet_client_ca),
        "--authentication-token-webhook",
        "--authorization-mode",
        "Webhook",
    )
    client = KubeClient(kubeconfig)
    wait_for(
        "the node advertising its kubelet port",
        lambda: (
            (n := client.node(node))
            and n["status"].get("daemonEndpoints", {}).get("kubeletEndpoint", {}).get("Port")
        ),
    )
    return agent, client, kubeconfig
