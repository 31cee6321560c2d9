"""The `pykubelet` command: kubelet flag names, Go-style durations, one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pykubelet import __version__
from pykubelet.api.security import sysctl_pattern_error
from pykubelet.cmd import config_file, flagtypes, logs, node_resources
from pykubelet.common.options import (
    AUTHORIZATION_MODES,
    RUNTIMES,
    TLS_MIN_VERSIONS,
    Options,
    default_node_name,
    format_duration,
)

log = logging.getLogger("pykubelet")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line a script can show, not argparse's usage dump.
        self.exit(2, f"pykubelet: error: {message} (see pykubelet --help)\n")


def _node_allocatable_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("node allocatable (what the pods may use of the node)")
    for flag, what in (("kube", "the node agent and the runtime"), ("system", "the system")):
        group.add_argument(
            f"--{flag}-reserved",
            type=flagtypes.key_value_map("="),
            action="append",
            dest=f"{flag}_reserved_flags",
            metavar="RESOURCE=QUANTITY[,...]",
            help=f"resources set aside for {what} (cpu, memory, ephemeral-storage, pid), "
            "e.g. cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000 (default none)",
        )
        group.add_argument(
            f"--{flag}-reserved-cgroup",
            default="",
            metavar="NAME",
            help=f"the cgroup of {what}, for --enforce-node-allocatable={flag}-reserved",
        )
    group.add_argument(
        "--eviction-hard",
        type=flagtypes.key_value_map("<"),
        action="append",
        dest="eviction_hard_flags",
        metavar="SIGNAL<QUANTITY[,...]",
        help="hard eviction thresholds; memory.available and nodefs.available also reduce "
        "allocatable (default memory.available<100Mi,nodefs.available<10%%,"
        "nodefs.inodesFree<5%%,imagefs.available<15%%; a value replaces them all)",
    )
    group.add_argument(
        "--eviction-soft",
        type=flagtypes.key_value_map("<"),
        action="append",
        dest="eviction_soft_flags",
        metavar="SIGNAL<QUANTITY[,...]",
        help="soft eviction thresholds: evict once crossed for their grace period (default none)",
    )
    for flag, metavar, what in (
        ("soft-grace-period", "SIGNAL=DURATION", "how long each soft threshold must hold"),
        ("minimum-reclaim", "SIGNAL=QUANTITY", "what eviction reclaims past each threshold"),
    ):
        group.add_argument(
            f"--eviction-{flag}",
            type=flagtypes.key_value_map("="),
            action="append",
            dest=f"eviction_{flag.replace('-', '_')}_flags",
            metavar=f"{metavar}[,...]",
            help=f"{what} (default none)",
        )
    group.add_argument(
        "--eviction-max-pod-grace-period",
        type=int,
        default=0,
        metavar="SECONDS",
        help="the longest grace period a soft eviction gives a pod (default 0)",
    )
    group.add_argument(
        "--eviction-pressure-transition-period",
        type=flagtypes.duration,
        default=300.0,
        metavar="DURATION",
        help="how long a pressure condition stays after its threshold was last crossed (5m)",
    )
    group.add_argument(
        "--eviction-monitoring-interval",
        type=flagtypes.duration,
        default=10.0,
        metavar="DURATION",
        help="how often the eviction signals are observed (10s, the kubelet's housekeeping)",
    )
    group.add_argument(
        "--housekeeping-interval",
        type=flagtypes.duration,
        default=10.0,
        metavar="DURATION",
        help="how often resource usage is sampled: CPU, memory, file systems (10s, cAdvisor's)",
    )
    group.add_argument(
        "--volume-stats-agg-period",
        type=flagtypes.duration,
        default=60.0,
        metavar="DURATION",
        help="how often the pods' volumes, logs and writable layers are measured (the Summary "
        "API's file systems; eviction measures at once when it needs to); 0: the default (1m)",
    )
    group.add_argument(
        "--cgroup-root",
        default="",
        metavar="PATH",
        help="the cgroup (absolute, e.g. /pykubelet) under which the process runtime makes the "
        "pods' kubepods cgroup (default: a pykubelet cgroup under the agent's own)",
    )
    group.add_argument(
        "--enforce-node-allocatable",
        type=flagtypes.comma_list,
        default=["pods"],
        metavar="KEY[,KEY...]",
        help="pods (default: the pods' kubepods cgroup sized to allocatable, process runtime "
        "as root), system-reserved, kube-reserved (their cgroups limited), or none",
    )


def _add_registration_flags(p: argparse.ArgumentParser) -> None:
    reg = p.add_argument_group("registration (cluster mode)")
    reg.add_argument(
        "--register-node",
        type=flagtypes.boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="create the Node if it does not exist (default true); false: only update the "
        "status of a Node someone else created",
    )
    reg.add_argument(
        "--node-labels",
        type=flagtypes.labels,
        action="append",
        default=[],
        metavar="KEY=VALUE[,...]",
        help="labels the Node is registered with (repeatable); in the kubernetes.io and "
        "k8s.io namespaces only kubelet.kubernetes.io/*, node.kubernetes.io/* and the "
        "kubelet's well-known labels",
    )
    reg.add_argument(
        "--register-with-taints",
        type=flagtypes.taints,
        default=[],
        metavar="KEY=VALUE:EFFECT[,...]",
        help="taints the Node is registered with (effect NoSchedule, PreferNoSchedule or "
        "NoExecute)",
    )
    reg.add_argument(
        "--provider-id",
        default="",
        metavar="ID",
        help="the Node's spec.providerID: the machine's ID in its cloud provider's database",
    )


def _gc_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("garbage collection and container log rotation")
    for flag, default, help_ in (
        ("--maximum-dead-containers-per-container", 1, "old instances kept per container"),
        ("--maximum-dead-containers", -1, "dead containers kept on the node (-1: no limit)"),
        ("--image-gc-high-threshold", 85, "image file system usage (%%) that starts image GC"),
        ("--image-gc-low-threshold", 80, "image file system usage (%%) image GC frees down to"),
        ("--container-log-max-files", 5, "a container's log files at most, the current one too"),
    ):
        group.add_argument(flag, type=int, default=default, metavar="N", help=f"{help_} "
                           f"(default {default})")  # fmt: skip
    for flag, seconds, help_ in (
        ("--minimum-container-ttl-duration", 0.0, "a dead container's least age before GC"),
        ("--image-minimum-gc-age", 120.0, "an unused image's least age before GC"),
        ("--container-gc-period", 60.0, "how often dead containers are collected"),
        ("--image-gc-period", 300.0, "how often image GC checks the usage"),
        ("--container-log-monitor-interval", 10.0, "how often log sizes are checked"),
    ):
        group.add_argument(flag, type=flagtypes.duration, default=seconds, metavar="DURATION",
                           help=f"{help_} (default {format_duration(seconds)})")  # fmt: skip
    group.add_argument(
        "--container-log-max-size",
        type=flagtypes.size,
        default=10 * 1024 * 1024,
        metavar="SIZE",
        help="a container log file's size before it is rotated (default 10Mi)",
    )


def _gc_options(ns: argparse.Namespace) -> dict[str, Any]:
    names = (
        "maximum_dead_containers_per_container", "maximum_dead_containers",
        "minimum_container_ttl_duration", "container_gc_period", "image_gc_high_threshold",
        "image_gc_low_threshold", "image_minimum_gc_age", "image_gc_period",
        "container_log_max_size", "container_log_max_files", "container_log_monitor_interval",
    )  # fmt: skip
    return {name: getattr(ns, name) for name in names}


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pykubelet",
        description="Run Kubernetes pods on this machine from manifest files, the way the "
        "kubelet does. To look at a running agent: pykubelet get pods | logs POD | "
        "describe pod NAME | version.",
    )
    p.add_argument(
        "--node-name",
        "--hostname-override",
        dest="node_name",
        default=None,
        help="this node's name; static pods are named <pod>-<node> (default: the hostname)",
    )
    p.add_argument(
        "--pod-manifest-path",
        type=Path,
        help="a manifest file, or a directory of them (*.yaml, *.yml, *.json): static pods",
    )
    p.add_argument(
        "--file-check-frequency",
        type=flagtypes.duration,
        default=20.0,
        metavar="DURATION",
        help="how often to re-list the manifest path besides inotify (default 20s)",
    )
    p.add_argument("--manifest-url", help="a URL serving pod manifests to run as static pods")
    p.add_argument(
        "--manifest-url-header",
        type=flagtypes.header,
        action="append",
        default=[],
        metavar="KEY:VALUE",
        help="an HTTP header sent with --manifest-url requests (repeatable)",
    )
    p.add_argument(
        "--http-check-frequency",
        type=flagtypes.duration,
        default=20.0,
        metavar="DURATION",
        help="how often --manifest-url is fetched (default 20s)",
    )
    p.add_argument(
        "--manifest-url-max-bytes",
        type=flagtypes.size,
        default=10 * 1024 * 1024,
        metavar="SIZE",
        help="the largest manifest body accepted (default 10Mi)",
    )
    p.add_argument(
        "--manifest-url-ca-file",
        type=Path,
        metavar="PATH",
        help="a PEM bundle of CAs trusted for an https --manifest-url (default: the system's)",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="PATH",
        help="join the cluster of this kubeconfig: register the node, run the pods bound to it "
        "(an empty value: the pod's in-cluster service account)",
    )
    p.add_argument(
        "--kube-api-qps",
        type=float,
        default=50.0,
        metavar="QPS",
        help="requests per second to the API server, on average (default 50)",
    )
    p.add_argument(
        "--kube-api-burst",
        type=int,
        default=100,
        metavar="N",
        help="requests to the API server at once above --kube-api-qps (default 100)",
    )
    p.add_argument(
        "--event-qps",
        type=float,
        default=50.0,
        metavar="QPS",
        help="events created per second, on a bucket of their own (default 50; 0: no limit)",
    )
    p.add_argument(
        "--event-burst",
        type=int,
        default=100,
        metavar="N",
        help="events created at once above --event-qps (default 100)",
    )
    p.add_argument(
        "--bootstrap-kubeconfig",
        type=Path,
        metavar="PATH",
        help="a kubeconfig with a bootstrap token: when --kubeconfig does not exist or its client "
        "certificate has expired, a certificate is requested with it (a CSR) and --kubeconfig "
        "written",
    )
    p.add_argument(
        "--rotate-certificates",
        action="store_true",
        default=False,
        help="renew the client certificate through a CSR as it nears expiry",
    )
    p.add_argument(
        "--rotate-server-certificates",
        dest="server_tls_bootstrap",
        action="store_true",
        default=False,
        help="serverTLSBootstrap: the kubelet API's serving certificate through a "
        "kubernetes.io/kubelet-serving CSR, renewed as it nears expiry",
    )
    p.add_argument(
        "--root-dir",
        type=Path,
        default=Path("/var/lib/pykubelet"),
        help="where pod state and container logs are kept (default /var/lib/pykubelet)",
    )
    p.add_argument(
        "--container-runtime",
        default="process",
        choices=RUNTIMES,
        help="the backend that runs containers: process (host processes, the default), "
        "docker (the Docker Engine API: Docker, or Podman's compatible service) or remote "
        "(a CRI runtime: containerd, CRI-O)",
    )
    p.add_argument(
        "--container-runtime-endpoint",
        default=None,
        help="the runtime's socket: docker's Docker Engine API (default "
        "unix:///var/run/docker.sock) or remote's CRI (default "
        "unix:///run/containerd/containerd.sock)",
    )
    p.add_argument(
        "--pod-infra-container-image",
        default="registry.k8s.io/pause:3.10",
        help="the image of the container holding each pod's namespaces (docker and remote "
        "runtimes; a CRI runtime may use its own configured one)",
    )
    p.add_argument(
        "--address", default="127.0.0.1", help="address of the read-only API (default 127.0.0.1)"
    )
    p.add_argument(
        "--read-only-port",
        type=flagtypes.port,
        default=10255,
        help="port of the read-only API; 0 picks a free one and logs it (default 10255)",
    )
    secure = p.add_argument_group("the kubelet API (secure port)")
    secure.add_argument(
        "--port",
        type=flagtypes.port,
        default=10250,
        help="port of the authenticated kubelet API (HTTPS); 0 picks a free one, logs it and "
        "advertises it on the Node (default 10250)",
    )
    secure.add_argument(
        "--tls-cert-file",
        type=Path,
        metavar="PATH",
        help="the serving certificate (PEM, with its chain); default: a self-signed one for the "
        "node under --cert-dir",
    )
    secure.add_argument("--tls-private-key-file", type=Path, metavar="PATH", help="its key")
    secure.add_argument(
        "--cert-dir",
        type=Path,
        metavar="PATH",
        help="where the self-signed serving certificate is kept (default <root-dir>/pki)",
    )
    secure.add_argument(
        "--tls-min-version",
        choices=TLS_MIN_VERSIONS,
        default="VersionTLS12",
        help="the lowest TLS version accepted (default VersionTLS12)",
    )
    secure.add_argument(
        "--client-ca-file",
        type=Path,
        metavar="PATH",
        help="CA bundle (PEM) that client certificates are verified against; the user is the "
        "certificate's CN, its groups the O values",
    )
    secure.add_argument(
        "--anonymous-auth",
        type=flagtypes.boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="serve requests without credentials as system:anonymous (default false; the "
        "kubelet's default is true)",
    )
    secure.add_argument(
        "--authentication-token-webhook",
        type=flagtypes.boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="authenticate bearer tokens with a TokenReview to the API server (needs --kubeconfig)",
    )
    secure.add_argument(
        "--authentication-token-webhook-cache-ttl",
        type=flagtypes.duration,
        default=120.0,
        metavar="DURATION",
        help="how long token review answers are kept (default 2m)",
    )
    secure.add_argument(
        "--authorization-mode",
        choices=AUTHORIZATION_MODES,
        default="AlwaysAllow",
        help="AlwaysAllow (default), or Webhook: a SubjectAccessReview to the API server for "
        "nodes/proxy, nodes/log, nodes/stats or nodes/metrics (needs --kubeconfig)",
    )
    secure.add_argument(
        "--authorization-webhook-cache-authorized-ttl",
        type=flagtypes.duration,
        default=300.0,
        metavar="DURATION",
        help="how long an allowed SubjectAccessReview is kept (default 5m)",
    )
    secure.add_argument(
        "--authorization-webhook-cache-unauthorized-ttl",
        type=flagtypes.duration,
        default=30.0,
        metavar="DURATION",
        help="how long a denied SubjectAccessReview is kept (default 30s)",
    )
    p.add_argument(
        "--sync-frequency",
        type=flagtypes.duration,
        default=60.0,
        metavar="DURATION",
        help="how often a running pod is re-synced (default 1m)",
    )
    p.add_argument(
        "--streaming-connection-idle-timeout",
        type=flagtypes.duration,
        default=4 * 3600.0,
        metavar="DURATION",
        help="how long an exec, attach or port-forward session may pass without a frame either "
        "way before the node closes it; 0: never (default 4h)",
    )
    p.add_argument(
        "--node-ip",
        default=None,
        metavar="IP[,IP]",
        help="the node's IP (the pods' hostIP), or a dual-stack pair of an IPv4 and an IPv6 one; "
        "default: what the node name resolves to, else the address of the default route's "
        "interface",
    )
    _add_registration_flags(p)
    p.add_argument(
        "--keep-pods-on-exit",
        type=flagtypes.boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="leave pods running when the agent stops (a restarted agent adopts them); "
        "by default SIGTERM/SIGINT stop every pod cleanly first",
    )
    p.add_argument(
        "--max-pods",
        type=int,
        default=110,
        help="pods admitted at once; more are rejected with reason OutOfpods (default 110)",
    )
    p.add_argument(
        "--allowed-host-paths",
        type=flagtypes.path_list,
        action="extend",
        default=[],
        metavar="PATH[,PATH...]",
        help="hostPath volumes may use these directories and what is below them (repeatable); "
        "by default every hostPath volume is refused",
    )
    p.add_argument(
        "--allow-privileged",
        type=flagtypes.boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="BOOL",
        help="admit pods with privileged containers (default false: they are rejected)",
    )
    p.add_argument(
        "--allowed-unsafe-sysctls",
        type=flagtypes.comma_list,
        action="extend",
        default=[],
        metavar="NAME[,NAME...]",
        help="sysctls (or patterns ending in '*', e.g. 'net.core.*') pods may set beyond the "
        "safe set (repeatable); by default a pod with another sysctl is rejected",
    )
    p.add_argument(
        "--pod-max-pids",
        type=int,
        default=-1,
        help="processes (pids) each pod may have at once; -1: unlimited (default -1)",
    )
    _node_allocatable_flags(p)
    _gc_flags(p)
    p.add_argument(
        "--cluster-dns",
        type=flagtypes.ip_list,
        action=flagtypes.Replace,
        default=[],
        metavar="IP[,IP...]",
        help="the cluster's DNS servers: the nameservers of pods with dnsPolicy ClusterFirst",
    )
    p.add_argument(
        "--cluster-domain",
        default="",
        metavar="DOMAIN",
        help="the cluster's domain (e.g. cluster.local): pods search <ns>.svc.DOMAIN, "
        "svc.DOMAIN and DOMAIN",
    )
    p.add_argument(
        "--resolv-conf",
        default="/etc/resolv.conf",
        metavar="PATH",
        help="the resolver file pods with dnsPolicy Default start from ('': none) "
        "(default /etc/resolv.conf)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="PATH",
        help="a KubeletConfiguration file (kubelet.config.k8s.io/v1beta1); flags override it",
    )
    p.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default="text",
        help="text (default), logfmt or json: one line per record; journal: systemd journal "
        "entries (what text becomes when stderr is the journal's stream, $JOURNAL_STREAM)",
    )
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=0, help="log verbosity (0-10)")
    p.add_argument("--version", action="version", version=f"pykubelet {__version__}")
    # A field of --config only (the kubelet has no flag for it).
    p.set_defaults(config_map_and_secret_change_detection_strategy="Watch")
    return p


def parse_options(argv: Sequence[str]) -> Options:
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    ignored: list[str] = []
    if first.config is not None:
        # The file's values become the defaults, so a flag given explicitly still wins.
        try:
            config = config_file.load(first.config)
            parser.set_defaults(**config_file.as_flag_defaults(config))
        except config_file.ConfigFileError as exc:
            parser.error(f"--config {exc}")
        ignored = config_file.ignored_fields(config)
    ns = parser.parse_args(argv)
    opts = Options(
        node_name=ns.node_name or default_node_name(),
        # Absolute: processes start in directories under the root, and a manifest's path is
        # part of its pod's UID, which must not depend on where the agent was started.
        pod_manifest_path=ns.pod_manifest_path.absolute() if ns.pod_manifest_path else None,
        file_check_frequency=ns.file_check_frequency,
        root_dir=ns.root_dir.absolute(),
        container_runtime=ns.container_runtime,
        address=ns.address,
        read_only_port=ns.read_only_port,
        port=ns.port,
        tls_cert_file=ns.tls_cert_file,
        tls_private_key_file=ns.tls_private_key_file,
        cert_dir=ns.cert_dir.absolute() if ns.cert_dir else None,
        tls_min_version=ns.tls_min_version,
        client_ca_file=ns.client_ca_file,
        anonymous_auth=ns.anonymous_auth,
        authentication_token_webhook=ns.authentication_token_webhook,
        authentication_token_webhook_cache_ttl=ns.authentication_token_webhook_cache_ttl,
        authorization_mode=ns.authorization_mode,
        authorization_webhook_cache_authorized_ttl=ns.authorization_webhook_cache_authorized_ttl,
        authorization_webhook_cache_unauthorized_ttl=ns.authorization_webhook_cache_unauthorized_ttl,
        sync_frequency=ns.sync_frequency,
        streaming_connection_idle_timeout=ns.streaming_connection_idle_timeout,
        kubeconfig=ns.kubeconfig,
        kube_api_qps=ns.kube_api_qps,
        kube_api_burst=ns.kube_api_burst,
        event_qps=ns.event_qps,
        event_burst=ns.event_burst,
        config_map_and_secret_change_detection_strategy=ns.config_map_and_secret_change_detection_strategy,
        bootstrap_kubeconfig=ns.bootstrap_kubeconfig,
        rotate_certificates=ns.rotate_certificates,
        server_tls_bootstrap=ns.server_tls_bootstrap,
        manifest_url=ns.manifest_url,
        manifest_url_headers=ns.manifest_url_header,
        http_check_frequency=ns.http_check_frequency,
        manifest_url_max_bytes=ns.manifest_url_max_bytes,
        manifest_url_ca_file=ns.manifest_url_ca_file,
        container_runtime_endpoint=ns.container_runtime_endpoint,
        pod_infra_container_image=ns.pod_infra_container_image,
        node_ip=ns.node_ip,
        register_node=ns.register_node,
        node_labels={k: v for labels in ns.node_labels for k, v in labels.items()},
        register_with_taints=ns.register_with_taints,
        provider_id=ns.provider_id,
        ignored_config_fields=ignored,
        keep_pods_on_exit=ns.keep_pods_on_exit,
        max_pods=ns.max_pods,
        allowed_host_paths=ns.allowed_host_paths,
        allow_privileged=ns.allow_privileged,
        pod_max_pids=ns.pod_max_pids,
        cluster_dns=ns.cluster_dns,
        cluster_domain=ns.cluster_domain,
        resolv_conf=ns.resolv_conf,
        **_node_allocatable(parser, ns),
        allowed_unsafe_sysctls=ns.allowed_unsafe_sysctls,
        **_gc_options(ns),
        log_format=ns.log_format,
        verbosity=ns.verbosity,
    )
    problems = opts.validate()
    problems += [
        f"--allowed-unsafe-sysctls: {err}"
        for pattern in opts.allowed_unsafe_sysctls
        if (err := sysctl_pattern_error(pattern))
    ]
    if problems:
        parser.error(problems[0])
    return opts


def _merged(given: list[dict[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for one in given:
        out.update(one)
    return out


def _node_allocatable(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> dict[str, Any]:
    """The allocatable options: a flag replaces the file's map; the file's are parsed already."""
    out: dict[str, Any] = {
        "enforce_node_allocatable": ns.enforce_node_allocatable,
        "system_reserved_cgroup": ns.system_reserved_cgroup,
        "kube_reserved_cgroup": ns.kube_reserved_cgroup,
        "cgroup_root": ns.cgroup_root,
        "eviction_max_pod_grace_period": ns.eviction_max_pod_grace_period,
        "eviction_pressure_transition_period": ns.eviction_pressure_transition_period,
        "eviction_monitoring_interval": ns.eviction_monitoring_interval,
        "housekeeping_interval": ns.housekeeping_interval,
        "volume_stats_agg_period": ns.volume_stats_agg_period or 60.0,
    }
    parsers: dict[str, Callable[[dict[str, str]], Any]] = {
        "kube_reserved": node_resources.parse_reserved,
        "system_reserved": node_resources.parse_reserved,
        "eviction_hard": node_resources.parse_thresholds,
        "eviction_soft": node_resources.parse_thresholds,
        "eviction_soft_grace_period": node_resources.parse_grace_periods,
        "eviction_minimum_reclaim": node_resources.parse_minimum_reclaims,
    }
    for dest, parse in parsers.items():
        flags = getattr(ns, f"{dest}_flags")
        if flags is None:
            if hasattr(ns, dest):  # from --config
                out[dest] = getattr(ns, dest)
            continue
        try:
            out[dest] = parse(_merged(flags))
        except ValueError as exc:
            parser.error(f"--{dest.replace('_', '-')}: {exc}")
    return out


def raise_open_file_limit() -> None:
    """Each running container holds a pidfd: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] and not args[0].startswith("-"):
        # A client verb (pykubelet get, exec, ...): their modules are not the agent's to hold.
        from pykubelet.cmd import ctl

        if args[0] in ctl.COMMANDS:
            return ctl.main(args)
    opts = parse_options(args)
    logs.setup(opts.log_format, opts.verbosity)
    for note in opts.ignored_config_fields:
        log.info("--config: %s", note)
    raise_open_file_limit()
    # Imported here: the agent's modules take a second or two to load, which the client verbs
    # above (pykubelet exec, get, ...) do not need.
    from pykubelet.app import run_agent

    return asyncio.run(run_agent(opts))


if __name__ == "__main__":
    raise SystemExit(main())
