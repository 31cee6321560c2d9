"""The service environment in cluster mode, end to end: the real agent (process runtime) against
the fixture API server, whose Services are made as kube-apiserver makes them (the `kubernetes`
Service at 10.96.0.1, ClusterIPs from 10.96.0.0/12). A pod whose command prints its environment
shows what a pod on a real node shows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.test_cluster import KubeClient, pod_body

Obj = dict[str, Any]
NODE = "testnode"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, KubeClient]]:
    with ApiServer(bookmark_interval=0.5) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield kubeconfig, KubeClient(kubeconfig)


def create(client: KubeClient, path: str, body: Obj) -> Obj:
    status, answer = client.request("POST", path, body)
    assert status == 201, answer
    return answer


def service(client: KubeClient, ns: str, name: str, *ports: Obj) -> str:
    body = {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": list(ports)}}
    made = create(client, f"/api/v1/namespaces/{ns}/services", body)
    return str(made["spec"]["clusterIP"])


def env_of(agent: Agent, ns: str, pod: str) -> dict[str, str]:
    """The environment the pod's container printed (`env`, then a line `END`)."""

    def printed() -> str | None:
        code, body = agent.get(f"/containerLogs/{ns}/{pod}/main")
        text = body.decode(errors="replace") if code == 200 else ""
        return text if "\nEND\n" in text else None

    text = wait_for(f"the environment of {ns}/{pod}", printed, timeout=30)
    block = text.rsplit("\nEND\n", 1)[0].split("\nEND\n")[-1]
    return dict(line.split("=", 1) for line in block.splitlines() if "=" in line)


def test_pods_see_the_services_of_their_namespace_and_the_api_servers(
    cluster: tuple[Path, KubeClient], start_agent: Callable[..., Agent]
) -> None:
    kubeconfig, client = cluster
    for ns in ("shop", "other"):
        create(client, "/api/v1/namespaces", {"metadata": {"name": ns}})
    web_ip = service(client, "shop", "web", {"port": 80, "targetPort": 8080})
    cart_ip = service(
        client,
        "shop",
        "cart-api",
        {"name": "http", "port": 8080},
        {"name": "dns", "port": 53, "protocol": "UDP"},
    )
    status, body = client.request(
        "POST",
        "/api/v1/namespaces/shop/services",
        {"metadata": {"name": "db"}, "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}},
    )
    assert status == 201 and body["spec"]["clusterIP"] == "None", body
    service(client, "other", "elsewhere", {"port": 80})

    script = "env; echo END; sleep 600"
    links = pod_body("links", NODE, script)
    links["spec"]["containers"][0]["env"] = [
        {"name": "WEB_SERVICE_PORT", "value": "mine"},
        {"name": "CART", "value": "$(CART_API_SERVICE_HOST):$(CART_API_SERVICE_PORT_HTTP)"},
    ]
    create(client, "/api/v1/namespaces/shop/pods", links)
    nolinks = pod_body("nolinks", NODE, script)
    nolinks["spec"]["enableServiceLinks"] = False
    create(client, "/api/v1/namespaces/shop/pods", nolinks)
    agent = start_agent("--kubeconfig", str(kubeconfig))

    env = env_of(agent, "shop", "links")
    master = {k: v for k, v in env.items() if k.startswith("KUBERNETES_")}
    assert master == {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_SERVICE_PORT_HTTPS": "443",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
        "KUBERNETES_PORT_443_TCP_PORT": "443",
        "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
    }
    assert env["WEB_SERVICE_HOST"] == web_ip
    assert env["WEB_SERVICE_PORT"] == "mine"  # the container's own variable wins
    assert env["WEB_PORT_80_TCP"] == f"tcp://{web_ip}:80"
    cart = {k: v for k, v in env.items() if k.startswith("CART_API_")}
    assert cart == {
        "CART_API_SERVICE_HOST": cart_ip,
        "CART_API_SERVICE_PORT": "8080",
        "CART_API_SERVICE_PORT_HTTP": "8080",
        "CART_API_SERVICE_PORT_DNS": "53",
        "CART_API_PORT": f"tcp://{cart_ip}:8080",
        "CART_API_PORT_8080_TCP": f"tcp://{cart_ip}:8080",
        "CART_API_PORT_8080_TCP_PROTO": "tcp",
        "CART_API_PORT_8080_TCP_PORT": "8080",
        "CART_API_PORT_8080_TCP_ADDR": cart_ip,
        "CART_API_PORT_53_UDP": f"udp://{cart_ip}:53",
        "CART_API_PORT_53_UDP_PROTO": "udp",
        "CART_API_PORT_53_UDP_PORT": "53",
        "CART_API_PORT_53_UDP_ADDR": cart_ip,
    }
    assert env["CART"] == f"{cart_ip}:8080"  # $(VAR) expansion sees the service variables
    assert not [k for k in env if k.startswith(("DB_", "ELSEWHERE_"))]  # headless; other ns

    # enableServiceLinks: false: the API server's variables only.
    quiet = env_of(agent, "shop", "nolinks")
    assert {k: v for k, v in quiet.items() if k.startswith("KUBERNETES_")} == master
    assert not [k for k in quiet if k.startswith(("WEB_", "CART_API_", "DB_", "ELSEWHERE_"))]

    # A Service made later reaches the containers started later: this one exits until it sees
    # it (the kubelet's advice: "detect missing service env var and exit and be restarted").
    late_ip = service(client, "shop", "late", {"port": 7000})
    later = pod_body(
        "later",
        NODE,
        '[ -n "$LATE_SERVICE_HOST" ] || exit 1; env; echo END; sleep 600',
        restart="OnFailure",
    )
    create(client, "/api/v1/namespaces/shop/pods", later)
    assert env_of(agent, "shop", "later")["LATE_PORT"] == f"tcp://{late_ip}:7000"
    # The running containers keep the environment they started with.
    assert "LATE_SERVICE_HOST" not in env_of(agent, "shop", "links")
