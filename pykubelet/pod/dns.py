"""A pod's resolver, hostname and hosts file, decided as the kubelet decides them. Pure.

What this module promises (the facts are the kubelet's pkg/kubelet/network/dns/dns.go and
kubelet_pods.go):

- `pod_dns` is GetPodDNS: dnsPolicy ClusterFirst (the default) gives the cluster's nameservers
  (--cluster-dns), the searches `<namespace>.svc.<domain> svc.<domain> <domain>` followed by the
  node's, and `options ndots:5`; ClusterFirst without --cluster-dns falls back to Default, with
  the kubelet's MissingClusterDNS events on the node and the pod; a pod on the host's network
  with ClusterFirst gets Default, ClusterFirstWithHostNet the cluster's; Default is the node's
  resolver file (--resolv-conf; none: 127.0.0.1 and the search "."); None starts empty. The
  pod's dnsConfig is then appended (duplicates dropped, its options replacing those of the same
  name), and the result cut to the resolver's limits (3 nameservers, 32 searches, 2048
  characters, no search over 253) with the kubelet's DNSConfigForming events;
- `hostname_and_domain` and `kernel_hostname` are GeneratePodHostNameAndDomain and
  GetNodenameForKernel: spec.hostname or the pod's name cut to 63 characters, the domain
  `<subdomain>.<namespace>.svc.<cluster domain>`, the FQDN as kernel hostname with
  setHostnameAsFQDN (at most 64 characters);
- `managed_hosts` and `node_hosts` are the kubelet's /etc/hosts of a pod: its header, localhost
  lines, each pod IP with the hostname (and FQDN), the hostAliases after "# Entries added by
  HostAliases."; on the host's network, the node's own file after its header.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

from pykubelet.api.dns_validation import (
    MAX_DNS_NAMESERVERS,
    MAX_DNS_SEARCH_LIST_CHARS,
    MAX_DNS_SEARCH_PATHS,
)
from pykubelet.api.model import HostAlias, Pod
from pykubelet.runtime.base import DNSConfig

DEFAULT_DNS_OPTIONS = ("ndots:5",)
SEARCH_PATH_MAX = 253  # longer ones make some resolvers (glibc 2.28) abort: dropped
HOSTNAME_MAX = 63
FQDN_MAX = 64  # the kernel's limit of a hostname
ETC_HOSTS = "/etc/hosts"
ETC_RESOLV_CONF = "/etc/resolv.conf"
MANAGED_HOSTS_HEADER = "# Kubernetes-managed hosts file.\n"
MANAGED_HOSTS_HEADER_WITH_HOST_NETWORK = "# Kubernetes-managed hosts file (host network).\n"

DnsType = Literal["cluster", "host", "none"]


class DnsError(Exception):
    """The pod's hostname or DNS cannot be formed (the kubelet fails its sandbox so)."""


@dataclass(frozen=True)
class ResolvConf:
    """What the kubelet reads of a resolver file: nameservers (they accumulate), the last
    search line (trailing dots dropped), the last options line."""

    servers: tuple[str, ...] = ()
    searches: tuple[str, ...] = ()
    options: tuple[str, ...] = ()


def parse_resolv_conf(text: str) -> tuple[ResolvConf, list[str]]:
    """The file parsed, with the kubelet's complaints ("nameserver list is empty")."""
    servers: list[str] = []
    searches: list[str] = []
    options: list[str] = []
    problems: list[str] = []
    for line in text.split("\n"):
        trimmed = line.strip()
        if trimmed.startswith("#"):
            continue
        fields = trimmed.split()
        if not fields:
            continue
        if fields[0] == "nameserver":
            if len(fields) >= 2:
                servers.append(fields[1])
            else:
                problems.append("nameserver list is empty")
        elif fields[0] == "search":
            searches = [s.removesuffix(".") for s in fields[1:]]
        elif fields[0] == "options":
            options = fields[1:]
    return ResolvConf(tuple(servers), tuple(searches), tuple(options)), problems


@dataclass(frozen=True)
class DnsEvent:
    """An event the kubelet records while forming a pod's DNS (on the node or on the pod)."""

    on_node: bool
    reason: str
    message: str


@dataclass(frozen=True)
class ClusterSettings:
    """The kubelet's DNS flags: --cluster-dns, --cluster-domain, --resolv-conf ("": none)."""

    cluster_dns: tuple[str, ...] = ()
    cluster_domain: str = ""
    resolv_conf: str = ETC_RESOLV_CONF
    node_ip: str | None = None


@dataclass(frozen=True)
class PodDNS:
    config: DNSConfig
    events: list[DnsEvent] = field(default_factory=list)
    # The pod sees exactly the node's own /etc/resolv.conf (policy Default from it, nothing
    # added or cut): a backend may leave the node's file in place.
    nodes_own: bool = False


def _omit_duplicates(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def dns_type(pod: Pod, host_network: bool) -> DnsType:
    """getPodDNSType. The API server defaults an unset policy to ClusterFirst."""
    policy = pod.spec.dns_policy or "ClusterFirst"
    if policy == "None":
        return "none"
    if policy == "ClusterFirstWithHostNet":
        return "cluster"
    if policy == "ClusterFirst" and not host_network:
        return "cluster"
    return "host"


def pod_dns(
    pod: Pod, settings: ClusterSettings, node: ResolvConf | None, *, host_network: bool
) -> PodDNS:
    """GetPodDNS. `node`: the parsed --resolv-conf (None when it is ""); `host_network`: the
    pod runs in the node's network namespace."""
    base = node or ResolvConf()
    servers, searches, options = list(base.servers), list(base.searches), list(base.options)
    events: list[DnsEvent] = []
    kind = dns_type(pod, host_network)
    from_node = kind == "host"
    if kind == "none":
        servers, searches, options = [], [], []
    elif kind == "cluster":
        if settings.cluster_dns:
            # The cluster's servers only: they forward what they do not know themselves.
            servers = list(settings.cluster_dns)
            searches = _cluster_searches(pod, settings.cluster_domain, searches)
            options = list(DEFAULT_DNS_OPTIONS)
        else:
            message = (
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using "
                '"ClusterFirst" policy. Falling back to "Default" policy.'
            )
            events.append(DnsEvent(True, "MissingClusterDNS", message))
            events.append(
                DnsEvent(False, "MissingClusterDNS", f'pod: "{_pod_format(pod)}". {message}')
            )
            from_node = True
    if from_node and not settings.resolv_conf:
        # No resolver file: the node's own resolver only, and no search (the kubelet's words:
        # what the resolver library does with no nameserver).
        ipv6 = settings.node_ip is not None and ipaddress.ip_address(settings.node_ip).version == 6
        servers = ["::1" if ipv6 else "127.0.0.1"]
        searches = ["."]
    extra = pod.spec.dns_config
    if extra is not None:
        servers = _omit_duplicates([*servers, *(extra.nameservers or [])])
        searches = _omit_duplicates([*searches, *(extra.searches or [])])
        options = _merge_options(options, [(o.name, o.value) for o in extra.options or []])
    servers, cut_servers = _fit_nameservers(servers)
    searches, cut_searches = _fit_searches(searches)
    for cut in (cut_servers, cut_searches):
        if cut:
            events.append(DnsEvent(False, "DNSConfigForming", cut))
    config = DNSConfig(tuple(servers), tuple(searches), tuple(options))
    nodes_own = (
        from_node
        and settings.resolv_conf == ETC_RESOLV_CONF
        and extra is None
        and not (cut_servers or cut_searches)
    )
    return PodDNS(config, events, nodes_own)


def _pod_format(pod: Pod) -> str:
    """format.Pod: name_namespace(uid)."""
    return f"{pod.metadata.name}_{pod.metadata.namespace}({pod.uid})"


def _cluster_searches(pod: Pod, domain: str, node_searches: list[str]) -> list[str]:
    if not domain:
        return node_searches
    namespace = pod.metadata.namespace
    cluster = [f"{namespace}.svc.{domain}", f"svc.{domain}", domain]
    return _omit_duplicates([*cluster, *node_searches])


def _merge_options(existing: list[str], pod_options: list[tuple[str, str | None]]) -> list[str]:
    """mergeDNSOptions: the pod's options replace those of the same name. (The kubelet's
    order is a Go map's, unspecified; here the node's come first, then the pod's new ones.)"""
    merged: dict[str, str] = {}
    for option in existing:
        name, sep, value = option.partition(":")
        merged[name] = value if sep else ""
    for name, pod_value in pod_options:
        merged[name] = pod_value or ""
    return [f"{name}:{value}" if value else name for name, value in merged.items()]


def _fit_nameservers(servers: list[str]) -> tuple[list[str], str]:
    if len(servers) <= MAX_DNS_NAMESERVERS:
        return servers, ""
    kept = servers[:MAX_DNS_NAMESERVERS]
    return kept, (
        "Nameserver limits were exceeded, some nameservers have been omitted, the applied "
        "nameserver line is: " + " ".join(kept)
    )


def _fit_searches(searches: list[str]) -> tuple[list[str], str]:
    """formDNSSearchFitsLimits: at most 32, none over 253 characters, 2048 in all (cut from
    the end)."""
    exceeded = False
    if len(searches) > MAX_DNS_SEARCH_PATHS:
        searches = searches[:MAX_DNS_SEARCH_PATHS]
        exceeded = True
    kept = [s for s in searches if len(s) <= SEARCH_PATH_MAX]
    exceeded = exceeded or len(kept) != len(searches)
    length = len(" ".join(kept))
    if length > MAX_DNS_SEARCH_LIST_CHARS:
        cut, cut_len = 0, 0
        for search in reversed(kept):
            cut_len += len(search) + 1
            cut += 1
            if length - cut_len <= MAX_DNS_SEARCH_LIST_CHARS:
                break
        kept = kept[: len(kept) - cut]
        exceeded = True
    if not exceeded:
        return kept, ""
    return kept, (
        "Search Line limits were exceeded, some search paths have been omitted, the applied "
        "search line is: " + " ".join(kept)
    )


# --- hostname -----------------------------------------------------------------------------------


def hostname_and_domain(pod: Pod, cluster_domain: str) -> tuple[str, str]:
    """GeneratePodHostNameAndDomain: (hostname, domain); the domain is "" without a
    subdomain. DnsError if the hostname cut to 63 characters is empty."""
    name = pod.spec.hostname or pod.metadata.name
    if len(name) > HOSTNAME_MAX:
        # As the kubelet: cut, then no '-' or '.' at the end.
        name = name[:HOSTNAME_MAX].rstrip("-.")
        if not name:
            raise DnsError(f"hostname for pod {pod.metadata.name!r} was invalid: empty")
    domain = ""
    if pod.spec.subdomain:
        domain = f"{pod.spec.subdomain}.{pod.metadata.namespace}.svc.{cluster_domain}"
    return name, domain


def kernel_hostname(hostname: str, domain: str, set_hostname_as_fqdn: bool) -> str:
    """GetNodenameForKernel: the FQDN with setHostnameAsFQDN and a domain, else the hostname."""
    if not (set_hostname_as_fqdn and domain):
        return hostname
    fqdn = f"{hostname}.{domain}"
    if len(fqdn) > FQDN_MAX:
        raise DnsError(
            f"failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is "
            f"too long ({FQDN_MAX} characters is the max, {len(fqdn)} characters requested)"
        )
    return fqdn


# --- /etc/hosts ---------------------------------------------------------------------------------


def _alias_entries(aliases: list[HostAlias]) -> str:
    if not aliases:
        return ""
    lines = "".join(f"{a.ip}\t" + "\t".join(a.hostnames or []) + "\n" for a in aliases)
    return "\n# Entries added by HostAliases.\n" + lines


def managed_hosts(pod_ips: list[str], hostname: str, domain: str, aliases: list[HostAlias]) -> str:
    """managedHostsFileContent: the /etc/hosts of a pod with its own network."""
    out = MANAGED_HOSTS_HEADER
    out += "127.0.0.1\tlocalhost\n"
    out += "::1\tlocalhost ip6-localhost ip6-loopback\n"
    out += "fe00::0\tip6-localnet\n"
    out += "fe00::0\tip6-mcastprefix\n"
    out += "fe00::1\tip6-allnodes\n"
    out += "fe00::2\tip6-allrouters\n"
    for ip in pod_ips:
        if domain:
            out += f"{ip}\t{hostname}.{domain}\t{hostname}\n"
        else:
            out += f"{ip}\t{hostname}\n"
    return out + _alias_entries(aliases)


def node_hosts(node_content: str, aliases: list[HostAlias]) -> str:
    """nodeHostsFileContent: the /etc/hosts of a pod on the node's network."""
    return MANAGED_HOSTS_HEADER_WITH_HOST_NETWORK + node_content + _alias_entries(aliases)
