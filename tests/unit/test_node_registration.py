"""Registration as configured: --node-labels and --register-with-taints checked in the kubelet's
words, the node IP chosen from the host's interfaces as the kubelet chooses it, and the Node's
addresses and images as it reports them."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from pykubelet.cluster.node import node_addresses, node_images
from pykubelet.cmd.cli import parse_options
from pykubelet.common.node_registration import (
    KUBELET_LABELS,
    Taint,
    parse_label_pairs,
    parse_taints,
    validate_node_labels,
)
from pykubelet.common.nodeip import (
    LOOPBACK,
    HostNetwork,
    choose_node_ips,
    node_ip_problem,
    parse_if_inet6,
    parse_node_ip,
    parse_route_v4,
    parse_route_v6,
)
from pykubelet.runtime.base import RuntimeImage
from pykubelet.runtime.docker.convert import docker_image_id


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_options(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


# --- labels --------------------------------------------------------------------------------------


def test_a_node_may_not_give_itself_a_role() -> None:
    with pytest.raises(ValueError) as exc:
        validate_node_labels({"node-role.kubernetes.io/control-plane": "", "team": "a"})
    assert str(exc.value) == (
        "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: "
        "[node-role.kubernetes.io/control-plane]\n"
        "--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix "
        "(kubelet.kubernetes.io, node.kubernetes.io) or be in the specifically allowed set "
        "(beta.kubernetes.io/arch, beta.kubernetes.io/instance-type, beta.kubernetes.io/os, "
        "failure-domain.beta.kubernetes.io/region, failure-domain.beta.kubernetes.io/zone, "
        "kubernetes.io/arch, kubernetes.io/hostname, kubernetes.io/os, "
        "node.kubernetes.io/instance-type, topology.kubernetes.io/region, "
        "topology.kubernetes.io/zone)"
    )


@pytest.mark.parametrize(
    "key",
    [
        "app.kubernetes.io/name",
        "kubernetes.io/role",
        "k8s.io/x",
        "example.k8s.io/x",
    ],
)
def test_reserved_namespaces_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=r"unknown 'kubernetes.io' or 'k8s.io' labels"):
        validate_node_labels({key: "v"})


@pytest.mark.parametrize(
    "key",
    [
        *KUBELET_LABELS,
        "node.kubernetes.io/pool",
        "kubelet.kubernetes.io/x",
        "sub.node.kubernetes.io/x",
        "example.com/team",
        "team",
    ],
)
def test_allowed_labels(key: str) -> None:
    validate_node_labels({key: "v"})


def test_label_syntax_in_the_kubelets_words() -> None:
    with pytest.raises(ValueError) as exc:
        validate_node_labels({"bad key": "ok"})
    assert str(exc.value) == (
        "invalid node labels: 'bad key' - name part must consist of alphanumeric characters, "
        "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
        "'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
        "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    )
    with pytest.raises(ValueError, match=r"invalid node labels: '-x' - a valid label must be"):
        validate_node_labels({"k": "-x"})


def test_label_pairs() -> None:
    assert parse_label_pairs("a=1, b=2,,c=") == {"a": "1", "b": "2", "c": ""}
    with pytest.raises(ValueError, match="malformed pair 'b', expect string=string"):
        parse_label_pairs("a=1,b")


def test_cli_merges_repeated_node_labels_and_refuses_reserved_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    opts = parse_options(["--node-labels", "a=1,b=2", "--node-labels", "b=3,node.kubernetes.io/x="])
    assert opts.node_labels == {"a": "1", "b": "3", "node.kubernetes.io/x": ""}
    err = refused(capsys, "--node-labels", "node-role.kubernetes.io/worker=")
    assert "--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels specified with " in err
    assert "[node-role.kubernetes.io/worker]" in err


# --- taints --------------------------------------------------------------------------------------


def test_taints() -> None:
    assert parse_taints("dedicated=gpu:NoSchedule,spot:PreferNoSchedule") == [
        Taint("dedicated", "NoSchedule", "gpu"),
        Taint("spot", "PreferNoSchedule"),
    ]
    assert Taint("spot", "NoExecute").as_api() == {"key": "spot", "effect": "NoExecute"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("a=b:NoExcute", "invalid taint effect: NoExcute, unsupported taint effect"),
        ("a=b", "invalid taint effect: , unsupported taint effect"),
        ("a=b=c:NoSchedule", "invalid taint spec: a=b=c:NoSchedule"),
        ("a:b:NoSchedule", "invalid taint spec: a:b:NoSchedule"),
        ("bad key=v:NoSchedule", "invalid taint spec: bad key=v:NoSchedule, name part must"),
        ("k=-v:NoSchedule", "invalid taint spec: k=-v:NoSchedule, a valid label must be"),
    ],
)
def test_bad_taints(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_taints(spec)
    assert str(exc.value).startswith(message)


def test_cli_taints(capsys: pytest.CaptureFixture[str]) -> None:
    opts = parse_options(["--register-with-taints", "a=1:NoSchedule"])
    assert opts.register_with_taints == [Taint("a", "NoSchedule", "1")]
    err = refused(capsys, "--register-with-taints", "a=1:Never")
    assert "argument --register-with-taints: invalid taint effect: Never" in err
    err = refused(capsys, "--register-with-taints", "a=1:NoSchedule,a=2:NoSchedule")
    assert "--register-with-taints: duplicate taint a:NoSchedule" in err


def test_cli_register_node_and_provider_id() -> None:
    opts = parse_options([])
    assert opts.register_node is True and opts.provider_id == ""
    opts = parse_options(["--register-node=false", "--provider-id", "aws:///eu-west-1a/i-0abc"])
    assert opts.register_node is False and opts.provider_id == "aws:///eu-west-1a/i-0abc"


# --- the node IP ---------------------------------------------------------------------------------

HOST = HostNetwork(
    addresses={
        "lo": [ip("127.0.0.1"), ip("::1")],
        "eth0": [ip("192.0.2.2"), ip("fd00::2"), ip("fe80::1")],
        "br0": [ip("10.88.0.1")],
    },
    default_v4="eth0",
    default_v6="eth0",
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.1", ["10.0.0.1"]),
        ("fd00::2", ["fd00::2"]),
        ("10.0.0.1,fd00::2", ["10.0.0.1", "fd00::2"]),
        ("fd00::2, 10.0.0.1", ["fd00::2", "10.0.0.1"]),
    ],
)
def test_node_ip_forms(text: str, expected: list[str]) -> None:
    assert [str(i) for i in parse_node_ip(text)] == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0", 'bad --node-ip "10.0.0": could not parse "10.0.0"'),
        (
            "10.0.0.1,10.0.0.2",
            'bad --node-ip "10.0.0.1,10.0.0.2"; must contain either a single IP or a dual-stack '
            "pair of IPs",
        ),
        ("10.0.0.1,fd00::1,10.0.0.2", "must contain either a single IP or a dual-stack pair"),
        ("0.0.0.0,fd00::1", "dual-stack --node-ip \"0.0.0.0,fd00::1\" cannot include '0.0.0.0'"),
    ],
)
def test_bad_node_ip(text: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError) as exc:
        parse_node_ip(text)
    assert message in str(exc.value)
    assert message in refused(capsys, "--node-ip", text)


def test_node_ip_problems() -> None:
    assert node_ip_problem(ip("224.0.0.1"), True) == "nodeIP can't be a multicast address"
    assert node_ip_problem(ip("fe80::1"), True) == "nodeIP can't be a link-local unicast address"
    assert node_ip_problem(ip("0.0.0.0"), True) == "nodeIP can't be an all zeros address"
    assert node_ip_problem(ip("198.51.100.9"), False) == (
        'node IP: "198.51.100.9" not found in the host\'s network interfaces'
    )
    assert node_ip_problem(ip("192.0.2.2"), HOST.is_local(ip("192.0.2.2"))) is None


def test_given_node_ips_are_used_as_given() -> None:
    given = parse_node_ip("fd00::2,192.0.2.2")
    assert choose_node_ips(given, "n1", HOST) == given


def test_detected_from_the_default_route_not_loopback() -> None:
    # The hostname resolving to 127.0.1.1 (Debian's /etc/hosts) no longer makes it loopback.
    net = HostNetwork(HOST.addresses, "eth0", "eth0", resolved=[ip("127.0.1.1")])
    assert choose_node_ips([], "n1", net) == [ip("192.0.2.2")]
    assert choose_node_ips(parse_node_ip("::"), "n1", net) == [ip("fd00::2")]
    assert choose_node_ips(parse_node_ip("0.0.0.0"), "n1", net) == [ip("192.0.2.2")]


def test_detected_from_the_node_name() -> None:
    resolved = HostNetwork(
        HOST.addresses, "eth0", "eth0", resolved=[ip("fd00::2"), ip("10.88.0.1")]
    )
    assert choose_node_ips([], "n1", resolved) == [ip("10.88.0.1")]  # IPv4 preferred
    assert choose_node_ips(parse_node_ip("::"), "n1", resolved) == [ip("fd00::2")]
    # A name resolving to an address that is not this host's is passed over.
    elsewhere = HostNetwork(HOST.addresses, "eth0", None, resolved=[ip("198.51.100.9")])
    assert choose_node_ips([], "n1", elsewhere) == [ip("192.0.2.2")]
    assert choose_node_ips([], "10.1.2.3", HOST) == [ip("10.1.2.3")]  # the name is an IP


def test_loopback_only_when_nothing_else() -> None:
    lonely = HostNetwork({"lo": [ip("127.0.0.1")]}, None, None)
    assert choose_node_ips([], "n1", lonely) == [LOOPBACK]
    v6_only = HostNetwork({"eth0": [ip("fd00::2")]}, None, "eth0")
    assert choose_node_ips([], "n1", v6_only) == [ip("fd00::2")]  # IPv4 preferred, not there


def test_host_tables() -> None:
    route = (
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "br0\t0058000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "wlan0\t00000000\t010200C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    )
    assert parse_route_v4(route) == "eth0"
    assert parse_route_v4(route.splitlines()[0]) is None
    zero = "0" * 32
    ipv6_route = (
        f"{zero} 00 {zero} 00 {zero} ffffffff 00000001 00000000 00200200       lo\n"
        f"{zero} 00 {zero} 00 fe800000000000000000000000000001 00000400 00000001 00000000 "
        "00000003     eth0\n"
        f"fd000000000000000000000000000000 40 {zero} 00 {zero} 00000100 00000001 00000000 "
        "00000001     eth0\n"
    )
    assert parse_route_v6(ipv6_route) == "eth0"
    inet6 = (
        "fd000000000000000000000000000002 04 40 00 80     eth0\n"
        "00000000000000000000000000000001 01 80 10 80       lo\n"
    )
    assert parse_if_inet6(inet6) == {"eth0": [ip("fd00::2")], "lo": [ip("::1")]}


# --- what the Node shows -------------------------------------------------------------------------


def test_addresses_dual_stack_then_hostname() -> None:
    assert node_addresses(["192.0.2.2", "fd00::2"], "n1") == [
        {"type": "InternalIP", "address": "192.0.2.2"},
        {"type": "InternalIP", "address": "fd00::2"},
        {"type": "Hostname", "address": "n1"},
    ]


def test_images_largest_first_fifty_five_names_each() -> None:
    many = [RuntimeImage((f"img{i}@sha256:{i}", f"img{i}:1"), i) for i in range(60)]
    named = [RuntimeImage(tuple(f"n{j}" for j in range(8)), 1000), RuntimeImage((), 5000)]
    images = node_images(many + named)
    assert len(images) == 50
    assert images[0] == {"names": ["n0", "n1", "n2", "n3", "n4"], "sizeBytes": 1000}
    assert images[1] == {"names": ["img59@sha256:59", "img59:1"], "sizeBytes": 59}
    assert images[-1]["sizeBytes"] == 11


def test_config_file_taints_provider_and_register_node(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"
        "registerNode: false\nproviderID: gce://p/z/i\n"
        "registerWithTaints: [{key: dedicated, value: gpu, effect: NoSchedule}]\n"
    )
    opts = parse_options(["--config", str(config)])
    assert opts.register_node is False and opts.provider_id == "gce://p/z/i"
    assert opts.register_with_taints == [Taint("dedicated", "NoSchedule", "gpu")]
    # A flag wins over the file, as with the kubelet.
    opts = parse_options(["--config", str(config), "--register-with-taints", "a:NoExecute"])
    assert opts.register_with_taints == [Taint("a", "NoExecute")]


def test_docker_image_ids_as_the_kubelet_reports_them() -> None:
    digest = "docker.io/library/busybox@sha256:" + "a" * 64
    assert docker_image_id("sha256:" + "b" * 64, digest) == f"docker-pullable://{digest}"
    assert docker_image_id("sha256:" + "b" * 64) == "docker://sha256:" + "b" * 64
    assert docker_image_id("b" * 64) == "docker://sha256:" + "b" * 64  # Podman's bare ID
    assert docker_image_id("") == ""
