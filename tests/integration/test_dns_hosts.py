"""A pod's /etc/resolv.conf, /etc/hosts and hostname as the pod sees them, on each runtime, and a
name resolved through a real DNS server (dnsmasq) the test starts on a loopback address."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.agent import Backend, pod_yaml, wait_for, write_pod

CLUSTER_FLAGS = ["--cluster-dns", "10.96.0.10", "--cluster-domain", "cluster.local"]
SHOW = (
    "cat /etc/resolv.conf; echo ===; cat /etc/hosts; echo ===; cat /etc/hostname; "
    "echo ===; hostname; echo ===; "
)
ALIASES = """\
  hostAliases:
  - ip: 10.1.2.3
    hostnames: [foo.remote, bar.remote]
"""
CLUSTER_RESOLV = (
    "search default.svc.cluster.local svc.cluster.local cluster.local\n"
    "nameserver 10.96.0.10\n"
    "options ndots:5\n"
)
ALIAS_LINES = "\n# Entries added by HostAliases.\n10.1.2.3\tfoo.remote\tbar.remote\n"


def _node_file(path: str) -> str:
    return Path(path).read_text()


def _shown(agent, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    return wait_for(  # type: ignore[no-any-return]
        f"{name}'s files",
        lambda: (parts := agent.logs(name, "main").split("===\n")) and len(parts) >= 5 and parts,
        timeout=60,
    )


def test_resolv_conf_hosts_and_hostname_as_the_kubelet_gives_them(
    start_agent, manifests: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    forever = backend.forever()
    write_pod(
        manifests,
        "web",
        pod_yaml(
            "web",
            SHOW + forever,
            extra_spec="  hostname: web-0\n  subdomain: web\n" + ALIASES,
        ),
    )
    write_pod(
        manifests,
        "hostnet",
        pod_yaml(
            "hostnet",
            SHOW + forever,
            extra_spec="  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n" + ALIASES,
        ),
    )
    write_pod(
        manifests,
        "custom",
        pod_yaml(
            "custom",
            SHOW + forever,
            extra_spec="""\
  dnsPolicy: None
  dnsConfig:
    nameservers: [1.2.3.4]
    searches: [ns1.svc.cluster-domain.example, my.dns.search.suffix]
    options: [{name: ndots, value: "2"}, {name: edns0}]
""",
        ),
    )
    agent = start_agent(*backend.flags, *CLUSTER_FLAGS)
    node_hosts = "# Kubernetes-managed hosts file (host network).\n" + _node_file("/etc/hosts")
    node_hostname = socket.gethostname()

    resolv, hosts, etc_hostname, kernel, _ = _shown(agent, "hostnet")
    # On the node's network: the node's hosts and hostname, the cluster's DNS as asked.
    assert resolv == CLUSTER_RESOLV
    assert hosts == node_hosts + ALIAS_LINES
    assert kernel.strip() == node_hostname

    resolv, hosts, etc_hostname, kernel, _ = _shown(agent, "custom")
    # The documentation's dnsConfig example, and what its page says the pod sees.
    assert resolv == (
        "search ns1.svc.cluster-domain.example my.dns.search.suffix\n"
        "nameserver 1.2.3.4\n"
        "options ndots:2 edns0\n"
    )

    resolv, hosts, etc_hostname, kernel, _ = _shown(agent, "web")
    if backend.engine is None:
        # Process pods all run on the node's network: the rules of hostNetwork pods apply
        # (ClusterFirst is Default there, the node's own resolver; the node's hostname).
        assert resolv == _node_file("/etc/resolv.conf")
        assert hosts == node_hosts + ALIAS_LINES
        assert kernel.strip() == node_hostname
    else:
        pod = agent.pod("web")
        assert pod is not None
        ip = pod["status"]["podIP"]
        assert resolv == CLUSTER_RESOLV
        assert hosts == (
            "# Kubernetes-managed hosts file.\n"
            "127.0.0.1\tlocalhost\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
            "fe00::0\tip6-localnet\n"
            "fe00::0\tip6-mcastprefix\n"
            "fe00::1\tip6-allnodes\n"
            "fe00::2\tip6-allrouters\n"
            f"{ip}\tweb-0.web.default.svc.cluster.local\tweb-0\n" + ALIAS_LINES
        )
        # (Podman writes /etc/hostname without the final newline containerd writes.)
        assert etc_hostname.strip() == "web-0" and kernel == "web-0\n"


@pytest.fixture
def dnsmasq() -> Iterator[str]:
    """A real DNS server on a loopback address, port 53, answering the cluster names the test
    needs (Debian's dnsmasq-base: the binary, without the system service of the dnsmasq
    package). An address of its own per pytest-xdist worker (127.0.53.<n>): two workers may run
    this test at once, and port 53 is the only one a resolv.conf can name."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    address = f"127.0.53.{1 + int(worker.removeprefix('gw') or 0)}"
    binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    proc = subprocess.Popen(
        [
            binary,
            "--no-resolv",
            "--no-hosts",
            "--no-daemon",
            f"--listen-address={address}",
            "--bind-interfaces",
            "--port=53",
            # It binds port 53 as root, then runs as nobody (its default user).
            "--pid-file=",
            "--address=/my-svc.my-ns.svc.cluster.local/10.96.0.42",
            # The cluster's zone is its own (NXDOMAIN for other names there, as CoreDNS).
            "--local=/cluster.local/",
            "--log-queries",  # to stderr (--no-daemon): in the test's output if it fails
        ],
    )
    try:
        # dnsmasq exits at once (saying why) if it cannot listen there.
        wait_for(
            f"dnsmasq listening on {address}:53",
            lambda: proc.poll() is None and _answers(address),
            timeout=10,
        )
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(server: str) -> bool:
    # A minimal query for my-svc.my-ns.svc.cluster.local A.
    name = b"".join(bytes([len(p)]) + p for p in b"my-svc.my-ns.svc.cluster.local".split(b"."))
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + name + b"\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1)
        try:
            s.sendto(query, (server, 53))
            return bool(s.recv(512))
        except OSError:
            return False


def test_a_service_name_resolves_through_the_cluster_dns(
    start_agent, manifests: Path, dnsmasq: str, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    # On the node's network 127.0.53.<n>:53 is the test's dnsmasq: with ClusterFirstWithHostNet
    # the pod's resolver is the cluster's. A process pod (the host's glibc) resolves the short
    # name through the search list; busybox's nslookup in the image asks for the full name.
    if backend.engine is None:
        lookup = "getent hosts my-svc.my-ns; echo rc=$?"
    else:
        lookup = "nslookup my-svc.my-ns.svc.cluster.local; echo rc=$?"
    write_pod(
        manifests,
        "client",
        pod_yaml(
            "client",
            f"{lookup}; {backend.forever()}",
            extra_spec="  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n",
        ),
    )
    agent = start_agent(
        *backend.flags, "--cluster-dns", dnsmasq, "--cluster-domain", "cluster.local"
    )
    out = wait_for("the lookup", lambda: "rc=" in (o := agent.logs("client", "main")) and o, 60)
    if backend.engine is None:
        assert out.splitlines()[0].split() == ["10.96.0.42", "my-svc.my-ns.svc.cluster.local"]
        assert "rc=0" in out
    else:
        assert "Name:\tmy-svc.my-ns.svc.cluster.local\nAddress: 10.96.0.42\n" in out
