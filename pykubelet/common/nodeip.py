"""The node's IP addresses: `--node-ip` checked, or chosen as the kubelet chooses them.

`--node-ip` is one IP, or a dual-stack pair (one IPv4, one IPv6, either first: the first is the
primary, the pods' hostIP). `0.0.0.0` / `::` mean "detect, preferring that family". A given
address must be this host's (validateNodeIP: not multicast, link-local or unspecified, on one
of its interfaces); a loopback one is accepted with a warning (the kubelet refuses it; a
one-machine cluster needs it).

Without one, as the kubelet's NodeAddress setter: the node name if it is an IP; else the first
address the node name resolves to that is this host's and not loopback (of the preferred family
first); else the address of the interface of the default route (ChooseHostInterface), IPv4's
route first unless IPv6 is preferred; loopback only when nothing else exists.

The choice is a pure function of `HostNetwork`; `read_host_network` reads it (/proc/net/route,
/proc/net/ipv6_route, /proc/net/if_inet6, the interfaces' IPv4 addresses), in a thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
_SIOCGIFADDR = 0x8915


def parse_node_ip(text: str) -> list[IP]:
    """The addresses of `--node-ip`; ValueError with the kubelet's reason."""
    ips: list[IP] = []
    for part in text.split(","):
        try:
            ips.append(ipaddress.ip_address(part.strip()))
        except ValueError:
            raise ValueError(f'bad --node-ip "{text}": could not parse "{part.strip()}"') from None
    if len(ips) > 2 or (len(ips) == 2 and ips[0].version == ips[1].version):
        raise ValueError(
            f'bad --node-ip "{text}"; must contain either a single IP or a dual-stack pair of IPs'
        )
    if len(ips) == 2 and any(ip.is_unspecified for ip in ips):
        raise ValueError(f"dual-stack --node-ip \"{text}\" cannot include '0.0.0.0' or '::'")
    return ips


def node_ip_problem(ip: IP, is_local: bool) -> str | None:
    """validateNodeIP's reason an address cannot be the node's (loopback is the caller's call)."""
    if ip.is_multicast:
        return "nodeIP can't be a multicast address"
    if ip.is_link_local:
        return "nodeIP can't be a link-local unicast address"
    if ip.is_unspecified:
        return "nodeIP can't be an all zeros address"
    if not is_local:
        return f'node IP: "{ip}" not found in the host\'s network interfaces'
    return None


@dataclass(frozen=True)
class HostNetwork:
    """What the choice depends on: the interfaces' addresses and the default routes."""

    addresses: dict[str, list[IP]] = field(default_factory=dict)  # by interface, in order
    default_v4: str | None = None  # the interface of the IPv4 default route
    default_v6: str | None = None
    resolved: list[IP] = field(default_factory=list)  # what the node name resolves to

    def is_local(self, ip: IP) -> bool:
        return ip.is_loopback or any(ip in addrs for addrs in self.addresses.values())


def _usable(ip: IP) -> bool:
    return not (ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified)


def choose_node_ips(requested: list[IP], node_name: str, net: HostNetwork) -> list[IP]:
    """The node's addresses, primary first: `requested` when given (and specified), else
    detected. Never empty: 127.0.0.1 when the host has nothing else."""
    if requested and not requested[0].is_unspecified:
        return list(requested)
    prefer_v6 = bool(requested) and requested[0].version == 6
    with contextlib.suppress(ValueError):
        return [ipaddress.ip_address(node_name)]

    def preferred_first(ips: Iterable[IP]) -> list[IP]:
        return sorted(ips, key=lambda ip: (ip.version == 6) != prefer_v6)

    for ip in preferred_first(net.resolved):
        if _usable(ip) and net.is_local(ip):
            return [ip]
    routes = [(6, net.default_v6), (4, net.default_v4)]
    if not prefer_v6:
        routes.reverse()
    for version, iface in routes:
        if iface is None:
            continue
        for ip in net.addresses.get(iface, []):
            if ip.version == version and _usable(ip):
                return [ip]
    return [LOOPBACK]


# --- reading the host's network (blocking: call in a thread) -------------------------------------


def parse_route_v4(route_table: str) -> str | None:
    best: tuple[int, str] | None = None
    for line in route_table.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 8 and cols[1] == "00000000" and cols[7] == "00000000":
            metric = int(cols[6])
            if best is None or metric < best[0]:
                best = (metric, cols[0])
    return best[1] if best else None


def parse_route_v6(route_table: str) -> str | None:
    best: tuple[int, str] | None = None
    for line in route_table.splitlines():
        cols = line.split()
        # dest, dest prefix, src, src prefix, next hop, metric, refcnt, use, flags, interface
        if len(cols) == 10 and cols[0] == "0" * 32 and cols[1] == "00" and cols[9] != "lo":
            if int(cols[8], 16) & 0x0200:  # RTF_REJECT: the "unreachable" default
                continue
            metric = int(cols[5], 16)
            if best is None or metric < best[0]:
                best = (metric, cols[9])
    return best[1] if best else None


def parse_if_inet6(table: str) -> dict[str, list[IP]]:
    out: dict[str, list[IP]] = {}
    for line in table.splitlines():
        cols = line.split()
        if len(cols) == 6:
            with contextlib.suppress(ValueError):
                out.setdefault(cols[5], []).append(ipaddress.IPv6Address(int(cols[0], 16)))
    return out


def _ipv4_of(iface: str) -> IP | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            reply = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return None
    return ipaddress.IPv4Address(reply[20:24])


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def read_host_network(node_name: str) -> HostNetwork:
    addresses: dict[str, list[IP]] = {}
    for _, name in socket.if_nameindex():
        v4 = _ipv4_of(name)
        if v4 is not None:
            addresses.setdefault(name, []).append(v4)
    for name, v6 in parse_if_inet6(_read("/proc/net/if_inet6")).items():
        addresses.setdefault(name, []).extend(v6)
    resolved: list[IP] = []
    try:
        for *_, sockaddr in socket.getaddrinfo(node_name, None, proto=socket.IPPROTO_TCP):
            with contextlib.suppress(ValueError):
                ip = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
                if ip not in resolved:
                    resolved.append(ip)
    except OSError:
        pass
    return HostNetwork(
        addresses=addresses,
        default_v4=parse_route_v4(_read("/proc/net/route")),
        default_v6=parse_route_v6(_read("/proc/net/ipv6_route")),
        resolved=resolved,
    )


class NodeIPError(Exception):
    pass


def node_ips(node_ip: str | None, node_name: str) -> list[str]:
    """The node's addresses for `--node-ip` (None: detect); NodeIPError if a given one is not
    usable. Blocking: call in a thread."""
    requested = parse_node_ip(node_ip) if node_ip else []
    net = read_host_network(node_name)
    for ip in requested:
        if ip.is_unspecified and len(requested) == 1:
            break
        problem = node_ip_problem(ip, net.is_local(ip))
        if problem is not None:
            raise NodeIPError(f"--node-ip {node_ip}: {problem}")
        if ip.is_loopback:
            log.warning(
                "--node-ip %s is a loopback address (the kubelet refuses it): only this machine "
                "reaches the node and its pods there",
                ip,
            )
    chosen = choose_node_ips(requested, node_name, net)
    if not requested or requested[0].is_unspecified:
        if chosen[0].is_loopback:
            log.warning(
                "no non-loopback address found on this host: the node's IP is %s", chosen[0]
            )
        else:
            log.info("node IP %s (detected; --node-ip sets it)", chosen[0])
    return [str(ip) for ip in chosen]
