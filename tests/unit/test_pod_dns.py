"""A pod's DNS, hostname and /etc/hosts as the kubelet forms them (pod/dns.py, pod/network.py),
and the API server's checks of the fields (api/dns_validation.py)."""

from __future__ import annotations

import asyncio
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.decode import decode_pod
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import HostAlias, Pod
from pykubelet.common.events import EventRecorder
from pykubelet.pod.dns import (
    ClusterSettings,
    DnsError,
    ResolvConf,
    hostname_and_domain,
    kernel_hostname,
    managed_hosts,
    node_hosts,
    parse_resolv_conf,
    pod_dns,
)
from pykubelet.pod.envvars import Allocatable
from pykubelet.pod.network import PodNetwork
from pykubelet.pod.volumes import VolumeManager
from pykubelet.runtime.base import DNSConfig, Mount
from tests.unit.test_kubelet import NodeFactory, eventually, make_node  # noqa: F401 (the fixture)
from tests.unit.test_kubelet import make_pod as kubelet_pod

NODE = ResolvConf(("10.255.255.53",), ("corp.example",), ("edns0",))
CLUSTER = ClusterSettings(("10.96.0.10",), "cluster.local")


def make_pod(**spec: Any) -> Pod:
    body = {
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }
    return Pod.model_validate(body)


def errors_of(**spec: Any) -> list[str]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }
    with pytest.raises(ManifestError) as info:
        decode_pod(json.dumps(body).encode(), "web.yaml")
    return info.value.lines()


# --- GetPodDNS ----------------------------------------------------------------------------------


def test_cluster_first_gives_the_cluster_servers_searches_and_ndots() -> None:
    dns = pod_dns(make_pod(), CLUSTER, NODE, host_network=False)
    assert dns.config == DNSConfig(
        ("10.96.0.10",),
        ("shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"),
        ("ndots:5",),
    )
    assert dns.events == [] and not dns.nodes_own
    assert dns.config.resolv_conf() == (
        "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example\n"
        "nameserver 10.96.0.10\n"
        "options ndots:5\n"
    )


def test_cluster_first_without_cluster_dns_falls_back_to_default_with_the_kubelets_events() -> None:
    dns = pod_dns(make_pod(), ClusterSettings(), NODE, host_network=False)
    assert dns.config == DNSConfig(NODE.servers, NODE.searches, NODE.options)
    assert dns.nodes_own
    assert [(e.on_node, e.reason) for e in dns.events] == [
        (True, "MissingClusterDNS"),
        (False, "MissingClusterDNS"),
    ]
    assert dns.events[0].message == (
        "kubelet does not have ClusterDNS IP configured and cannot create Pod using "
        '"ClusterFirst" policy. Falling back to "Default" policy.'
    )
    assert dns.events[1].message.startswith('pod: "web_shop(u-1)". kubelet does not have')


def test_host_network_cluster_first_is_default_and_with_host_net_is_the_clusters() -> None:
    host = pod_dns(make_pod(hostNetwork=True), CLUSTER, NODE, host_network=True)
    assert host.config.servers == NODE.servers and host.events == []
    with_net = pod_dns(
        make_pod(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet"),
        CLUSTER,
        NODE,
        host_network=True,
    )
    assert with_net.config.servers == ("10.96.0.10",)
    assert with_net.config.searches[0] == "shop.svc.cluster.local"


def test_no_resolv_conf_means_the_local_resolver_and_search_dot() -> None:
    settings = ClusterSettings(resolv_conf="")
    dns = pod_dns(make_pod(dnsPolicy="Default"), settings, None, host_network=False)
    assert dns.config == DNSConfig(("127.0.0.1",), (".",), ())
    v6 = ClusterSettings(resolv_conf="", node_ip="fd00::1")
    assert pod_dns(make_pod(dnsPolicy="Default"), v6, None, host_network=False).config.servers == (
        "::1",
    )


def test_none_starts_empty_and_dns_config_is_appended_and_merged() -> None:
    none = make_pod(
        dnsPolicy="None",
        dnsConfig={
            "nameservers": ["1.2.3.4"],
            "searches": ["ns1.svc.cluster-domain.example", "my.dns.search.suffix"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}],
        },
    )
    dns = pod_dns(none, CLUSTER, NODE, host_network=False)
    # The documentation's example pod and what its page says the container sees.
    assert dns.config.resolv_conf() == (
        "search ns1.svc.cluster-domain.example my.dns.search.suffix\n"
        "nameserver 1.2.3.4\n"
        "options ndots:2 edns0\n"
    )
    merged = make_pod(
        dnsConfig={
            "nameservers": ["10.96.0.10", "8.8.8.8"],
            "searches": ["cluster.local", "extra.example"],
            "options": [{"name": "ndots", "value": "1"}, {"name": "single-request"}],
        }
    )
    dns = pod_dns(merged, CLUSTER, NODE, host_network=False)
    assert dns.config.servers == ("10.96.0.10", "8.8.8.8")
    assert dns.config.searches[-2:] == ("corp.example", "extra.example")
    assert dns.config.options == ("ndots:1", "single-request")


def test_limits_cut_with_the_kubelets_dns_config_forming_events() -> None:
    pod = make_pod(
        dnsConfig={"nameservers": ["1.1.1.1", "8.8.8.8", "9.9.9.9"]},
    )
    dns = pod_dns(pod, CLUSTER, NODE, host_network=False)
    assert dns.config.servers == ("10.96.0.10", "1.1.1.1", "8.8.8.8")
    assert [e.reason for e in dns.events] == ["DNSConfigForming"]
    assert dns.events[0].message == (
        "Nameserver limits were exceeded, some nameservers have been omitted, the applied "
        "nameserver line is: 10.96.0.10 1.1.1.1 8.8.8.8"
    )
    many = ResolvConf(("10.0.0.1",), tuple(f"d{i}.example" for i in range(40)), ())
    dns = pod_dns(make_pod(), CLUSTER, many, host_network=False)
    assert len(dns.config.searches) == 32
    assert dns.events[0].message.startswith("Search Line limits were exceeded")
    long = ResolvConf(("10.0.0.1",), tuple(("x" * 60 + f".d{i}") for i in range(31)), ())
    dns = pod_dns(make_pod(), ClusterSettings(("10.96.0.10",), "c.local"), long, host_network=False)
    assert len(" ".join(dns.config.searches)) <= 2048 and len(dns.config.searches) < 34


def test_resolv_conf_parsing_as_the_kubelet() -> None:
    text = "# c\nnameserver 1.1.1.1\nsearch a.example. b.example\nnameserver 2.2.2.2\n"
    text += "search c.example.\noptions ndots:3 rotate\ndomain ignored\n"
    parsed, problems = parse_resolv_conf(text)
    assert parsed == ResolvConf(("1.1.1.1", "2.2.2.2"), ("c.example",), ("ndots:3", "rotate"))
    assert problems == []
    assert parse_resolv_conf("nameserver\n")[1] == ["nameserver list is empty"]


# --- hostname -----------------------------------------------------------------------------------


def test_hostname_subdomain_and_fqdn() -> None:
    pod = make_pod(hostname="db-0", subdomain="db", setHostnameAsFQDN=True)
    name, domain = hostname_and_domain(pod, "cluster.local")
    assert (name, domain) == ("db-0", "db.shop.svc.cluster.local")
    assert kernel_hostname(name, domain, True) == "db-0.db.shop.svc.cluster.local"
    assert kernel_hostname(name, domain, False) == "db-0"
    assert hostname_and_domain(make_pod(), "cluster.local") == ("web", "")
    cut = make_pod(hostname=None)
    cut.metadata.name = "a" * 62 + "-b-c"
    assert hostname_and_domain(cut, "")[0] == "a" * 62
    with pytest.raises(DnsError, match=r"FQDN .* is too long \(64 characters is the max"):
        kernel_hostname("h" * 40, "sub.shop.svc.cluster.local", True)


# --- /etc/hosts ---------------------------------------------------------------------------------


def test_managed_hosts_file_as_the_kubelet_writes_it() -> None:
    aliases = [HostAlias(ip="127.0.0.1", hostnames=["foo.local", "bar.local"])]
    assert managed_hosts(["10.88.0.5"], "db-0", "db.shop.svc.cluster.local", aliases) == (
        "# Kubernetes-managed hosts file.\n"
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "fe00::0\tip6-localnet\n"
        "fe00::0\tip6-mcastprefix\n"
        "fe00::1\tip6-allnodes\n"
        "fe00::2\tip6-allrouters\n"
        "10.88.0.5\tdb-0.db.shop.svc.cluster.local\tdb-0\n"
        "\n"
        "# Entries added by HostAliases.\n"
        "127.0.0.1\tfoo.local\tbar.local\n"
    )
    assert managed_hosts(["10.88.0.5"], "web", "", []).endswith("10.88.0.5\tweb\n")
    assert node_hosts("127.0.0.1 localhost\n", aliases) == (
        "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        "\n# Entries added by HostAliases.\n127.0.0.1\tfoo.local\tbar.local\n"
    )


async def test_pod_network_writes_the_files_in_the_pod_directory(tmp_path: Path) -> None:
    resolv = tmp_path / "node-resolv.conf"
    resolv.write_text("nameserver 10.255.255.53\nsearch corp.example\n")
    hosts = tmp_path / "node-hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    recorder = EventRecorder()
    network = PodNetwork(
        ClusterSettings(("10.96.0.10",), "cluster.local", str(resolv)),
        recorder,
        "node-1",
        lambda uid: tmp_path / "pods" / uid,
        node_hosts_file=str(hosts),
    )
    pod = make_pod(
        hostname="db-0",
        subdomain="db",
        hostAliases=[{"ip": "10.1.2.3", "hostnames": ["x.example"]}],
    )
    config = await network.sandbox_config(pod)
    assert config.hostname == "db-0" and config.dns.servers == ("10.96.0.10",)
    extra, resolv_conf = await network.container_files(pod, "10.88.0.7", [])
    pod_dir = tmp_path / "pods" / "u-1"
    assert extra == [Mount(str(pod_dir / "etc-hosts"), "/etc/hosts")]
    assert (
        "10.88.0.7\tdb-0.db.shop.svc.cluster.local\tdb-0\n" in (pod_dir / "etc-hosts").read_text()
    )
    assert resolv_conf == str(pod_dir / "resolv.conf")
    assert (pod_dir / "resolv.conf").read_text().startswith("search shop.svc.cluster.local ")
    # A container that mounts its own /etc/hosts keeps it, as with the kubelet.
    own = [Mount("/somewhere", "/etc/hosts"), Mount("/x", "/etc/resolv.conf")]
    assert await network.container_files(pod, "10.88.0.7", own) == ([], None)

    # On the node's network: the node's files; the hosts file only with hostAliases.
    host = PodNetwork(
        ClusterSettings((), "", "/etc/resolv.conf"),
        recorder,
        "node-1",
        lambda uid: tmp_path / "pods" / uid,
        all_host_network=True,
        node_hosts_file=str(hosts),
    )
    plain = make_pod()
    plain.metadata.uid = "u-2"
    assert (await host.sandbox_config(plain)).hostname is None
    assert await host.container_files(plain, "10.0.0.1", []) == ([], None)
    # A hostNetwork pod of a runtime with pod networks: the kubelet's file, header first.
    hostnet = make_pod(hostNetwork=True)
    hostnet.metadata.uid = "u-3"
    extra, _ = await network.container_files(hostnet, "10.0.0.1", [])
    assert extra == [Mount(str(tmp_path / "pods" / "u-3" / "etc-hosts"), "/etc/hosts")]
    assert (tmp_path / "pods" / "u-3" / "etc-hosts").read_text() == (
        "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
    )
    # A pod that ended while no agent ran: housekeeping finds its directory by these files too.
    volumes = VolumeManager(tmp_path, Allocatable(Fraction(1), 1 << 30, 1 << 30))
    assert await volumes.pod_uids() == ["u-1", "u-3"]
    extra, _ = await host.container_files(pod, "10.0.0.1", [])
    assert (
        (pod_dir / "etc-hosts")
        .read_text()
        .startswith("# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n")
    )
    assert extra == [Mount(str(pod_dir / "etc-hosts"), "/etc/hosts")]


# --- validation ---------------------------------------------------------------------------------


def test_validation_names_the_field_with_the_api_servers_reasons() -> None:
    assert errors_of(dnsPolicy="ClusterFirstt") == [
        'web.yaml: spec.dnsPolicy: Unsupported value: "ClusterFirstt": supported values: '
        '"ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"'
    ]
    assert errors_of(dnsPolicy="None") == [
        "web.yaml: spec.dnsConfig: required: must provide `dnsConfig` when `dnsPolicy` is None"
    ]
    assert errors_of(dnsPolicy="None", dnsConfig={"searches": ["a"]}) == [
        "web.yaml: spec.dnsConfig.nameservers: required: must provide at least one DNS "
        "nameserver when `dnsPolicy` is None"
    ]
    lines = errors_of(
        dnsConfig={
            "nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3", "nope"],
            "searches": ["Bad_Domain", "ok.example."],
            "options": [{"value": "1"}],
        }
    )
    assert lines[0] == (
        "web.yaml: spec.dnsConfig.nameservers: must not have more than 3 nameservers (has 4)"
    )
    assert lines[1].startswith("web.yaml: spec.dnsConfig.nameservers[3]: invalid value 'nope'")
    assert lines[2].startswith("web.yaml: spec.dnsConfig.searches[0]: invalid value")
    assert lines[3] == "web.yaml: spec.dnsConfig.options[0]: required: must not be empty"
    assert len(lines) == 4
    many = errors_of(dnsConfig={"searches": [f"d{i}.example" for i in range(33)]})
    assert many == [
        "web.yaml: spec.dnsConfig.searches: must not have more than 32 search paths (has 33)"
    ]
    long = errors_of(dnsConfig={"searches": ["a" * 60 + f".x{i}" for i in range(32)]})
    assert long == [
        "web.yaml: spec.dnsConfig.searches: must not have more than 2048 characters "
        "(including spaces) in the search list"
    ]
    aliases = errors_of(
        hostname="Web_1",
        subdomain="-x",
        hostAliases=[{"ip": "300.1.1.1", "hostnames": ["ok.example", "NO"]}],
    )
    assert [line.split(": ")[1] for line in aliases] == [
        "spec.hostname",
        "spec.subdomain",
        "spec.hostAliases[0].ip",
        "spec.hostAliases[0].hostnames[1]",
    ]


def test_real_server_fields_decode() -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "dnsPolicy": "ClusterFirst",
            "hostname": "web-0",
            "subdomain": "web",
            "setHostnameAsFQDN": False,
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.remote", "bar.remote"]}],
            "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        },
    }
    pod = decode_pod(json.dumps(body).encode(), "web.yaml")
    assert pod.spec.host_aliases is not None and pod.spec.host_aliases[0].ip == "10.1.2.3"
    assert pod.spec.dns_config is not None and pod.spec.dns_config.options is not None


def test_flags_and_config_file_fields(tmp_path: Path) -> None:
    from pykubelet.cmd.cli import parse_options
    from pykubelet.cmd.config_file import dump

    config = tmp_path / "kubelet.yaml"
    config.write_text(
        dump({"clusterDNS": ["10.96.0.10"], "clusterDomain": "cluster.local", "resolvConf": ""})
    )
    opts = parse_options(["--config", str(config)])
    assert (opts.cluster_dns, opts.cluster_domain, opts.resolv_conf) == (
        ["10.96.0.10"],
        "cluster.local",
        "",
    )
    served = opts.kubelet_configuration()
    assert served["clusterDNS"] == ["10.96.0.10"] and served["resolvConf"] == ""
    flags = parse_options(["--config", str(config), "--cluster-dns", "10.0.0.10,fd00::a"])
    assert flags.cluster_dns == ["10.0.0.10", "fd00::a"]
    with pytest.raises(SystemExit):
        parse_options(["--cluster-dns", "10.0.0.300"])
    with pytest.raises(SystemExit):
        parse_options(["--cluster-domain", "Bad_Domain"])


# --- through the sync loop, on the in-memory runtime --------------------------------------------


async def test_the_runtime_gets_the_sandbox_config_and_each_container_the_files(
    make_node: NodeFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.255.255.53\n")
    node = await make_node(
        container_runtime="docker",
        cluster_dns=["10.96.0.10"],
        cluster_domain="cluster.local",
        resolv_conf=str(resolv),
    )
    pod = kubelet_pod("web", hostname="web-0", subdomain="web", setHostnameAsFQDN=True)
    node.set_pods(pod)
    await node.started(pod)
    config = node.runtime.sandbox_configs[pod.uid]
    assert config is not None and config.hostname == "web-0.web.default.svc.cluster.local"
    assert config.dns.servers == ("10.96.0.10",) and config.dns.options == ("ndots:5",)
    latest = node.runtime.latest(pod.uid, "c")
    assert latest is not None
    started = node.runtime.config_of(latest.id)
    hosts = [m for m in started.mounts if m.container_path == "/etc/hosts"]
    assert len(hosts) == 1 and hosts[0].host_path.endswith(f"/pods/{pod.uid}/etc-hosts")
    assert started.resolv_conf is not None
    assert await asyncio.to_thread(Path(started.resolv_conf).read_text) == (
        "search default.svc.cluster.local svc.cluster.local cluster.local\n"
        "nameserver 10.96.0.10\noptions ndots:5\n"
    )

    # Without --cluster-dns: the kubelet's MissingClusterDNS, on the node and on the pod.
    bare = await make_node(container_runtime="docker", resolv_conf=str(resolv))
    other = kubelet_pod("db")
    bare.set_pods(other)
    await bare.started(other)
    assert [e.reason for e in bare.events(other, "MissingClusterDNS")] == ["MissingClusterDNS"]
    assert bare.recorder.for_object("Node", "node-1", "")


async def test_a_sandbox_that_cannot_be_formed_waits_in_container_creating(
    make_node: NodeFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    node = await make_node(
        container_runtime="docker", cluster_domain="cluster.local", resolv_conf=""
    )
    pod = kubelet_pod("web", hostname="h" * 40, subdomain="sub", setHostnameAsFQDN=True)
    node.set_pods(pod)

    def waiting() -> str | None:
        status = node.status(pod)
        if status is None or not status.container_statuses:
            return None
        state = status.container_statuses[0].state.waiting
        return state.message if state is not None and state.reason == "ContainerCreating" else None

    message = await eventually("ContainerCreating", waiting)
    assert message.startswith("Failed to create pod sandbox: failed to construct FQDN")
    assert node.events(pod, "FailedCreatePodSandBox")
    assert pod.uid not in node.runtime.sandbox_configs
