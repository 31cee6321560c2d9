"""Registration as configured, end to end against the fixture API server: the Node the real agent
creates shows its --node-labels, --register-with-taints, --provider-id, its addresses (detected,
or a dual-stack --node-ip) and the runtime's own name, version and images; a label a node may
not give itself stops the agent; with --register-node=false the agent creates no Node and
reports the status of the one someone else creates."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pykubelet import __version__
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, Backend, CriEngine, Engine, wait_for
from tests.integration.test_cluster import KubeClient, apiserver, cluster, pod_body

__all__ = ["apiserver", "cluster"]  # the fixtures, for pytest

Cluster = tuple[ApiServer, Path, KubeClient]


def registered(client: KubeClient, node: str) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        "the node registered with its status",
        lambda: (n := client.node(node)) and n.get("status", {}).get("nodeInfo") and n,
    )


def is_this_hosts(address: str) -> bool:
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def has_default_route() -> bool:
    lines = Path("/proc/net/route").read_text().splitlines()[1:]
    return any(line.split()[1] == "00000000" for line in lines if len(line.split()) > 1)


def test_the_node_registers_with_its_labels_taints_provider_id_and_addresses(
    cluster: Cluster, start_agent: Callable[..., Agent]
) -> None:
    _, kubeconfig, client = cluster
    start_agent(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        "labelled",
        "--node-labels",
        "team=infra,node.kubernetes.io/pool=blue",
        "--node-labels",
        "topology.kubernetes.io/zone=z1",
        "--register-with-taints",
        "dedicated=infra:NoSchedule,spot:PreferNoSchedule",
        "--provider-id",
        "pykubelet://lab/labelled",
    )
    node = registered(client, "labelled")
    labels = node["metadata"]["labels"]
    assert {k: labels[k] for k in ("team", "node.kubernetes.io/pool")} == {
        "team": "infra",
        "node.kubernetes.io/pool": "blue",
    }
    assert labels["topology.kubernetes.io/zone"] == "z1"
    assert labels["kubernetes.io/hostname"] == "labelled"
    assert labels["kubernetes.io/os"] == labels["beta.kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] == labels["beta.kubernetes.io/arch"]
    assert node["spec"]["taints"] == [
        {"key": "dedicated", "value": "infra", "effect": "NoSchedule"},
        {"key": "spot", "effect": "PreferNoSchedule"},
    ]
    assert node["spec"]["providerID"] == "pykubelet://lab/labelled"

    # No --node-ip: an address of this host, not loopback when it has another (the hostname
    # resolving to 127.0.1.1 no longer makes the node 127.0.0.1).
    status = node["status"]
    internal = [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"]
    assert len(internal) == 1 and is_this_hosts(internal[0]), status["addresses"]
    if has_default_route():
        assert not ipaddress.ip_address(internal[0]).is_loopback, internal
    assert status["addresses"][-1] == {"type": "Hostname", "address": "labelled"}

    info = status["nodeInfo"]
    assert info["containerRuntimeVersion"] == f"process://{__version__}"
    assert (
        info["operatingSystem"] == "linux" and info["architecture"] == labels["kubernetes.io/arch"]
    )
    assert info["kernelVersion"] == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert info["osImage"] and info["kubeletVersion"].startswith("v")
    assert "images" not in status  # the process runtime holds none


def test_a_dual_stack_node_ip_gives_two_internal_ips(
    cluster: Cluster, start_agent: Callable[..., Agent]
) -> None:
    _, kubeconfig, client = cluster
    start_agent(
        "--kubeconfig", str(kubeconfig), "--node-name", "dual", "--node-ip", "::1,127.0.0.1"
    )  # fmt: skip
    node = registered(client, "dual")
    assert node["status"]["addresses"] == [
        {"type": "InternalIP", "address": "::1"},
        {"type": "InternalIP", "address": "127.0.0.1"},
        {"type": "Hostname", "address": "dual"},
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--node-labels", "node-role.kubernetes.io/control-plane="],
            "--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels specified with "
            "--node-labels: [node-role.kubernetes.io/control-plane]",
        ),
        (["--node-ip", "198.51.100.77"], "not found in the host's network interfaces"),
        (["--register-with-taints", "a=b:Sometimes"], "invalid taint effect: Sometimes"),
    ],
)
def test_what_a_node_may_not_register_with_stops_it(
    cluster: Cluster, start_agent: Callable[..., Agent], flags: list[str], message: str
) -> None:
    _, kubeconfig, client = cluster
    with pytest.raises(AssertionError) as exc:
        start_agent("--kubeconfig", str(kubeconfig), "--node-name", "refused", *flags)
    assert "agent exited with" in str(exc.value) and message in str(exc.value)
    assert client.node("refused") is None


def test_register_node_false_creates_no_node_and_reports_the_status_of_one_created(
    cluster: Cluster, start_agent: Callable[..., Agent]
) -> None:
    _, kubeconfig, client = cluster
    agent = start_agent(
        "--kubeconfig", str(kubeconfig), "--node-name", "byhand", "--register-node=false",
        "--node-labels", "team=x", "--register-with-taints", "a=b:NoSchedule",
    )  # fmt: skip
    wait_for(
        "the agent saying the node does not exist",
        lambda: 'error getting node "byhand"' in agent.log(),
    )
    assert client.node("byhand") is None
    status, body = client.request(
        "POST",
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "byhand", "labels": {"a": "1"}}},
    )
    assert status == 201, body
    node = wait_for(
        "the agent reporting the node's status",
        lambda: (n := client.node("byhand")) and n.get("status", {}).get("nodeInfo") and n,
        timeout=30,
    )
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    # Labels and taints are the creator's: the agent registers with its own only when it creates.
    assert node["metadata"]["labels"] == {"a": "1"}
    assert not node.get("spec", {}).get("taints")


def _engine_version(backend: Backend) -> str:
    if isinstance(backend.engine, Engine):
        return f"docker://{backend.engine.request('GET', 'version')['Version']}"
    assert isinstance(backend.engine, CriEngine)
    reply = backend.engine.call("Version", api.VersionRequest(version="v1"), api.VersionResponse)
    return f"{reply.runtime_name}://{reply.runtime_version}"


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("remote", marks=pytest.mark.cri),
    ],
    indirect=True,
)
def test_node_info_and_images_are_the_runtimes(
    cluster: Cluster, start_agent: Callable[..., Agent], backend: Backend
) -> None:
    _, kubeconfig, client = cluster
    start_agent(*backend.flags, "--kubeconfig", str(kubeconfig), "--node-name", "engine")
    client.create_pod(pod_body("img", "engine", "sleep 600", grace=0))
    pod = wait_for(
        "the pod running",
        lambda: (p := client.pod("img")) and p["status"].get("phase") == "Running" and p,
        timeout=60,
    )
    state = pod["status"]["containerStatuses"][0]
    assert state["containerID"].startswith(backend.scheme), state
    # imageID is the image's digest: dockershim's forms for Docker, the CRI's image_ref.
    image_id = state["imageID"]
    if backend.name == "docker":
        assert image_id.startswith(("docker-pullable://", "docker://sha256:")), state
    else:
        assert image_id.startswith("sha256:") or "@sha256:" in image_id, state
    assert "@sha256:" in image_id or len(image_id.rpartition("sha256:")[2]) == 64, state
    node = wait_for(
        "the node listing the pod's image",
        lambda: (
            (n := client.node("engine"))
            and any("busybox" in name for i in n["status"].get("images", []) for name in i["names"])
            and n
        ),
        timeout=30,
    )
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == _engine_version(backend)
    if backend.name == "remote":
        assert info["containerRuntimeVersion"].startswith("containerd://")
    images = node["status"]["images"]
    sizes = [i["sizeBytes"] for i in images]
    assert sizes == sorted(sizes, reverse=True) and all(s > 0 for s in sizes)
    assert all(1 <= len(i["names"]) <= 5 for i in images)
    client.delete_pod("img", grace=0)


def test_a_node_joins_with_kubeadms_config_yaml(
    cluster: Cluster, start_agent: Callable[..., Agent], tmp_path: Path, manifests: Path
) -> None:
    """kubeadm's file as kubeadm join writes it, its two paths moved under the test's directory
    (this machine has no /etc/kubernetes), and its resolvConf (systemd-resolved's, which kubeadm
    writes when that runs) the machine's: the node registers, runs the static pods of
    staticPodPath, and the log says which fields were ignored and why. (With a resolvConf that
    does not exist the kubelet, and pykubelet, fail the pods' sandboxes saying so.)"""
    server, kubeconfig, client = cluster
    kubeadm = Path(__file__).parent.parent / "data" / "kubeadm-1.32-kubelet-config.yaml"
    # staticPodPath: the directory the test agent also gets as --pod-manifest-path.
    ca = tmp_path / "ca.crt"
    ca.write_bytes(server.kubelet_client_ca.read_bytes())
    config = tmp_path / "config.yaml"
    config.write_text(
        kubeadm.read_text()
        .replace("/etc/kubernetes/manifests", str(manifests))
        .replace("/etc/kubernetes/pki/ca.crt", str(ca))
        .replace("/run/systemd/resolve/resolv.conf", "/etc/resolv.conf")
    )
    (manifests / "static-web.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: static-web}\nspec:\n  containers:\n"
        "  - {name: web, image: busybox:test, command: [sleep, '600']}\n"
    )
    agent = start_agent(
        "--config", str(config), "--kubeconfig", str(kubeconfig), "--node-name", "kubeadm"
    )
    node = registered(client, "kubeadm")
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    wait_for(
        "the static pod's mirror pod",
        lambda: (p := client.pod("static-web-kubeadm")) and p["status"].get("phase") == "Running",
        timeout=30,
    )
    log = agent.log()
    assert "--config: cgroupDriver: ignored: " in log
