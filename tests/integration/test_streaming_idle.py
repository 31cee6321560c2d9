"""--streaming-connection-idle-timeout, end to end: a node started with a short one (1s) closes
the exec and port-forward sessions the real kubectl leaves idle, over WebSocket and SPDY alike
(kubectl's port-forward WebSocket tunnels SPDY), and keeps open the ones that carry data;
/configz says the value."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.kubelet_node import https_apiserver, start_kubelet_node
from tests.integration.test_cluster import KubeClient, running_in_api
from tests.integration.test_kubelet_api import NODE, call, kubectl_stream, shell_pod
from tests.integration.test_port_forward import PROTOCOLS, PortForward, free_port, listening

SERVER = (
    "import socket,sys\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('127.0.0.1',int(sys.argv[1])));s.listen(8)\n"
    "while True:\n"
    " c,_=s.accept()\n"
    " with c:\n"
    "  while d:=c.recv(65536): c.sendall(d)\n"
)


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


@pytest.fixture
def node(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> tuple[Agent, KubeClient, Path]:
    return start_kubelet_node(
        apiserver, start_agent, tmp_path, NODE, "--streaming-connection-idle-timeout", "1s"
    )


@pytest.fixture
def forwards() -> Iterator[list[PortForward]]:
    started: list[PortForward] = []
    yield started
    for forward in started:
        forward.stop()


@PROTOCOLS
def test_an_exec_left_idle_is_closed_by_the_node(
    node: tuple[Agent, KubeClient, Path], apiserver: ApiServer, websockets: str
) -> None:
    agent, client, kubeconfig = node
    admin = apiserver.pki.kubelet_client
    code, body = call(agent, "/configz", cert=admin)
    assert code == 200, body
    assert json.loads(body)["kubeletconfig"]["streamingConnectionIdleTimeout"] == "1s"

    shell_pod(client, "quiet")
    # Output more often than the timeout keeps the session open to the end ...
    talking = kubectl_stream(
        kubeconfig,
        websockets,
        "exec",
        "quiet",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.3; done",
    )
    assert talking.returncode == 0, talking.stderr
    assert talking.stdout.split() == [str(i) for i in range(1, 9)]
    # ... a command that says nothing for longer has its session closed by the node: kubectl
    # returns long before `sleep 600` could end (else its 30 s run out and the test fails), as
    # it does when a kubelet closes an idle session (no outcome: exit 0).
    silent = kubectl_stream(kubeconfig, websockets, "exec", "quiet", "--", "sleep", "600")
    assert (silent.returncode, silent.stdout) == (0, ""), silent
    transport = "exec/attach WebSocket" if websockets == "true" else "SPDY session"
    assert f"{transport} idle for 1s: closing it" in agent.log()


@PROTOCOLS
def test_a_port_forward_left_idle_is_closed_by_the_node(
    node: tuple[Agent, KubeClient, Path], forwards: list[PortForward], websockets: str
) -> None:
    _, client, kubeconfig = node
    port = free_port()
    client.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "echo", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "main",
                        "image": "python",
                        "command": ["python3", "-c", SERVER, str(port)],
                    }
                ],
            },
        }
    )
    wait_for("the pod running", lambda: running_in_api(client, "echo"), timeout=30)
    wait_for("the echo server listening", lambda: listening(port))
    forward = PortForward(kubeconfig, websockets, "echo", f"{free_port()}:{port}")
    forwards.append(forward)
    forward.wait_forwarding(1)
    # Left alone (no connection, so no frame), the node ends the session and kubectl says so.
    assert forward.proc.wait(timeout=30) == 1, forward.output()
    assert "lost connection to pod" in forward.output(), forward.output()
