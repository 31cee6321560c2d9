"""The agent's typed options, and Go-style durations ("20s", "1m30s", "500ms")."""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from pykubelet.common.allocatable import (
    DEFAULT_THRESHOLDS,
    ENFORCE_KUBE_RESERVED,
    ENFORCE_NONE,
    ENFORCE_PODS,
    ENFORCE_SYSTEM_RESERVED,
    ENFORCEMENT_KEYS,
    Reserved,
    Threshold,
)
from pykubelet.common.node_registration import Taint, check_duplicate_taints, validate_node_labels
from pykubelet.common.nodeip import parse_node_ip

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string. Raises ValueError naming what is wrong."""
    value = text.strip()
    if value in {"0", "+0", "-0"}:
        return 0.0
    sign = 1.0
    if value[:1] in {"+", "-"}:
        sign = -1.0 if value[0] == "-" else 1.0
        value = value[1:]
    if not value:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(value):
        match = _PART.match(value, pos)
        if not match:
            raise ValueError(
                f"invalid duration {text!r}: expected a number and a unit (ns, us, ms, s, m, h), "
                "e.g. 20s or 1m30s"
            )
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def format_duration(seconds: float) -> str:
    if seconds == int(seconds):
        whole = int(seconds)
        hours, rest = divmod(whole, 3600)
        minutes, secs = divmod(rest, 60)
        out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
        return out + (f"{secs}s" if secs or not out else "")
    return f"{seconds:g}s"


# The kubelet's ResourceChangeDetectionStrategy values pykubelet has (Cache, a TTL cache, not).
CHANGE_DETECTION = ("Watch", "Get")


def default_node_name() -> str:
    return socket.gethostname().lower()


@dataclass
class Options:
    node_name: str = field(default_factory=default_node_name)
    pod_manifest_path: Path | None = None
    file_check_frequency: float = 20.0
    root_dir: Path = Path("/var/lib/pykubelet")
    container_runtime: str = "process"
    address: str = "127.0.0.1"
    read_only_port: int = 10255
    # The secure kubelet API (auth.py, secure.py); 0: a free port, logged and advertised.
    port: int = 10250
    tls_cert_file: Path | None = None
    tls_private_key_file: Path | None = None
    cert_dir: Path | None = None  # None: <root-dir>/pki
    tls_min_version: str = "VersionTLS12"
    client_ca_file: Path | None = None
    anonymous_auth: bool = False
    authentication_token_webhook: bool = False
    authentication_token_webhook_cache_ttl: float = 120.0
    authorization_mode: str = "AlwaysAllow"
    authorization_webhook_cache_authorized_ttl: float = 300.0
    authorization_webhook_cache_unauthorized_ttl: float = 30.0
    sync_frequency: float = 60.0
    # Exec, attach and port-forward sessions with no frame either way for this long are closed
    # (0: never).
    streaming_connection_idle_timeout: float = 4 * 3600.0
    manifest_url: str | None = None
    manifest_url_headers: list[tuple[str, str]] = field(default_factory=list)
    http_check_frequency: float = 20.0
    manifest_url_max_bytes: int = 10 * 1024 * 1024
    manifest_url_ca_file: Path | None = None
    kubeconfig: Path | None = None
    # The API client's bucket (the kubelet's kubeAPIQPS, kubeAPIBurst), the events' own
    # (eventRecordQPS, eventBurst; 0: no limit) and how ConfigMaps and Secrets are read.
    kube_api_qps: float = 50.0
    kube_api_burst: int = 100
    event_qps: float = 50.0
    event_burst: int = 100
    config_map_and_secret_change_detection_strategy: str = "Watch"
    # TLS bootstrap and rotation (cluster/bootstrap.py, cluster/certificates.py).
    bootstrap_kubeconfig: Path | None = None
    rotate_certificates: bool = False
    server_tls_bootstrap: bool = False
    # None: the runtime's default (DEFAULT_ENDPOINTS).
    container_runtime_endpoint: str | None = None
    pod_infra_container_image: str = "registry.k8s.io/pause:3.10"
    node_ip: str | None = None
    # Registration (cluster mode): what the Node is created with.
    register_node: bool = True
    node_labels: dict[str, str] = field(default_factory=dict)
    register_with_taints: list[Taint] = field(default_factory=list)
    provider_id: str = ""
    # KubeletConfiguration fields of --config accepted and not acted on, with why (logged).
    ignored_config_fields: list[str] = field(default_factory=list)
    keep_pods_on_exit: bool = False
    max_pods: int = 110
    # hostPath volumes are refused unless below one of these; privileged containers unless set.
    allowed_host_paths: list[str] = field(default_factory=list)
    allow_privileged: bool = False
    pod_max_pids: int = -1  # per pod; -1: unlimited
    # Pod DNS (pod/dns.py): the kubelet's clusterDNS, clusterDomain, resolvConf ("": none).
    cluster_dns: list[str] = field(default_factory=list)
    cluster_domain: str = ""
    resolv_conf: str = "/etc/resolv.conf"
    # Node allocatable (common/allocatable.py).
    kube_reserved: Reserved = field(default_factory=Reserved)
    system_reserved: Reserved = field(default_factory=Reserved)
    eviction_hard: tuple[Threshold, ...] = DEFAULT_THRESHOLDS
    enforce_node_allocatable: list[str] = field(default_factory=lambda: [ENFORCE_PODS])
    system_reserved_cgroup: str = ""
    kube_reserved_cgroup: str = ""
    # The cgroup (absolute in each hierarchy) under which the process runtime makes `kubepods`;
    # "" is its own default, a `pykubelet` cgroup under the agent's own.
    cgroup_root: str = ""
    # Sysctls (names, or prefixes ending in "*") pods may set beyond the kubelet's safe set.
    allowed_unsafe_sysctls: list[str] = field(default_factory=list)
    # Garbage collection (kubelet/container_gc.py, kubelet/image_gc.py); the periods are the
    # kubelet's constants (1 min, 5 min), options here so that tests can shorten them.
    maximum_dead_containers_per_container: int = 1
    maximum_dead_containers: int = -1
    minimum_container_ttl_duration: float = 0.0
    container_gc_period: float = 60.0
    image_gc_high_threshold: int = 85
    image_gc_low_threshold: int = 80
    image_minimum_gc_age: float = 120.0
    image_gc_period: float = 300.0
    # Container log rotation (kubelet/log_rotation.py), the kubelet's defaults.
    container_log_max_size: int = 10 * 1024 * 1024
    container_log_max_files: int = 5
    container_log_monitor_interval: float = 10.0
    # Eviction (kubelet/eviction.py): soft thresholds and their grace periods (seconds, by
    # signal), the longest grace a soft eviction gives, what must be reclaimed past a
    # threshold (by signal; Threshold used as an amount), how long a pressure condition stays
    # after it was last observed, and how often the signals are observed.
    eviction_soft: tuple[Threshold, ...] = ()
    eviction_soft_grace_period: dict[str, float] = field(default_factory=dict)
    eviction_max_pod_grace_period: int = 0
    eviction_minimum_reclaim: dict[str, Threshold] = field(default_factory=dict)
    eviction_pressure_transition_period: float = 300.0
    eviction_monitoring_interval: float = 10.0
    # How often the stats collector samples (cAdvisor's flag, which the kubelet keeps).
    housekeeping_interval: float = 10.0
    # How often the file systems (volumes, logs, writable layers) are measured: the kubelet's
    # volume usage cache period.
    volume_stats_agg_period: float = 60.0
    log_format: str = "text"
    verbosity: int = 0

    @property
    def certificate_dir(self) -> Path:
        return self.cert_dir if self.cert_dir is not None else self.root_dir / "pki"

    def kubelet_configuration(self) -> dict[str, object]:
        """The configuration in effect as a KubeletConfiguration (what /configz serves)."""
        return {
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "staticPodPath": str(self.pod_manifest_path or ""),
            "staticPodURL": self.manifest_url or "",
            "syncFrequency": format_duration(self.sync_frequency),
            "fileCheckFrequency": format_duration(self.file_check_frequency),
            "httpCheckFrequency": format_duration(self.http_check_frequency),
            "address": self.address,
            "port": self.port,
            "readOnlyPort": self.read_only_port,
            "streamingConnectionIdleTimeout": format_duration(
                self.streaming_connection_idle_timeout
            ),
            "tlsCertFile": str(self.tls_cert_file or ""),
            "tlsPrivateKeyFile": str(self.tls_private_key_file or ""),
            "tlsMinVersion": self.tls_min_version,
            "authentication": {
                "x509": {"clientCAFile": str(self.client_ca_file or "")},
                "webhook": {
                    "enabled": self.authentication_token_webhook,
                    "cacheTTL": format_duration(self.authentication_token_webhook_cache_ttl),
                },
                "anonymous": {"enabled": self.anonymous_auth},
            },
            "authorization": {
                "mode": self.authorization_mode,
                "webhook": {
                    "cacheAuthorizedTTL": format_duration(
                        self.authorization_webhook_cache_authorized_ttl
                    ),
                    "cacheUnauthorizedTTL": format_duration(
                        self.authorization_webhook_cache_unauthorized_ttl
                    ),
                },
            },
            "maxPods": self.max_pods,
            "registerNode": self.register_node,
            "kubeAPIQPS": self.kube_api_qps,
            "kubeAPIBurst": self.kube_api_burst,
            "eventRecordQPS": self.event_qps,
            "eventBurst": self.event_burst,
            "configMapAndSecretChangeDetectionStrategy": (
                self.config_map_and_secret_change_detection_strategy
            ),
            "registerWithTaints": [t.as_api() for t in self.register_with_taints],
            "providerID": self.provider_id,
            "podPidsLimit": self.pod_max_pids,
            "allowedUnsafeSysctls": list(self.allowed_unsafe_sysctls),
            "containerRuntimeEndpoint": self.container_runtime_endpoint or "",
            "clusterDNS": list(self.cluster_dns),
            "clusterDomain": self.cluster_domain,
            "resolvConf": self.resolv_conf,
            "kubeReserved": dict(self.kube_reserved.given),
            "systemReserved": dict(self.system_reserved.given),
            "evictionHard": {t.signal: t.given for t in self.eviction_hard},
            "enforceNodeAllocatable": list(self.enforce_node_allocatable),
            "systemReservedCgroup": self.system_reserved_cgroup,
            "kubeReservedCgroup": self.kube_reserved_cgroup,
            "volumeStatsAggPeriod": format_duration(self.volume_stats_agg_period),
            "cgroupRoot": self.cgroup_root,
            "imageGCHighThresholdPercent": self.image_gc_high_threshold,
            "imageGCLowThresholdPercent": self.image_gc_low_threshold,
            "imageMinimumGCAge": format_duration(self.image_minimum_gc_age),
            "containerLogMaxSize": str(self.container_log_max_size),
            "containerLogMaxFiles": self.container_log_max_files,
            "containerLogMonitorInterval": format_duration(self.container_log_monitor_interval),
            "evictionSoft": {t.signal: t.given for t in self.eviction_soft},
            "evictionSoftGracePeriod": {
                k: format_duration(v) for k, v in self.eviction_soft_grace_period.items()
            },
            "evictionMaxPodGracePeriod": self.eviction_max_pod_grace_period,
            "evictionMinimumReclaim": {
                k: t.given for k, t in self.eviction_minimum_reclaim.items()
            },
            "evictionPressureTransitionPeriod": format_duration(
                self.eviction_pressure_transition_period
            ),
            "logging": {"format": self.log_format, "verbosity": self.verbosity},
            "rotateCertificates": self.rotate_certificates,
            "serverTLSBootstrap": self.server_tls_bootstrap,
        }

    def _gc_problems(self) -> list[str]:
        # The kubelet's ValidateKubeletConfiguration words for the image thresholds.
        problems = []
        high, low = self.image_gc_high_threshold, self.image_gc_low_threshold
        if not 0 <= high <= 100:
            problems.append(
                f"--image-gc-high-threshold: imageGCHighThresholdPercent ({high}) must be "
                "between 0 and 100"
            )
        if not 0 <= low <= 100:
            problems.append(
                f"--image-gc-low-threshold: imageGCLowThresholdPercent ({low}) must be "
                "between 0 and 100"
            )
        if low >= high:
            problems.append(
                f"--image-gc-low-threshold: imageGCLowThresholdPercent ({low}) must be less "
                f"than imageGCHighThresholdPercent ({high})"
            )
        if self.image_minimum_gc_age < 0:
            problems.append("--image-minimum-gc-age: must not be negative")
        if self.minimum_container_ttl_duration < 0:
            problems.append("--minimum-container-ttl-duration: must not be negative")
        if self.container_log_max_files < 2:
            problems.append(
                f"--container-log-max-files: containerLogMaxFiles ({self.container_log_max_files})"
                " must be 2 or more"
            )
        if self.container_log_max_size <= 0:
            problems.append("--container-log-max-size: must be greater than 0")
        for flag, value in (
            ("--container-gc-period", self.container_gc_period),
            ("--image-gc-period", self.image_gc_period),
            ("--container-log-monitor-interval", self.container_log_monitor_interval),
        ):
            if value <= 0:
                problems.append(f"{flag}: must be greater than 0")
        return problems

    def validate(self) -> list[str]:
        problems: list[str] = []
        if not self.node_name:
            problems.append("--node-name: must not be empty")
        for flag, value in (
            ("--file-check-frequency", self.file_check_frequency),
            ("--sync-frequency", self.sync_frequency),
            ("--http-check-frequency", self.http_check_frequency),
        ):
            if value <= 0:
                problems.append(f"{flag}: must be greater than 0")
        if self.streaming_connection_idle_timeout < 0:
            problems.append("--streaming-connection-idle-timeout: must not be negative")
        if self.kube_api_qps <= 0:
            problems.append("--kube-api-qps: must be greater than 0")
        if self.kube_api_burst < 1:
            problems.append("--kube-api-burst: must be at least 1")
        if self.event_qps < 0:
            problems.append("--event-qps: must not be negative (0: no limit)")
        if self.event_qps > 0 and self.event_burst < 1:
            problems.append("--event-burst: must be at least 1 (with --event-qps above 0)")
        if self.config_map_and_secret_change_detection_strategy not in CHANGE_DETECTION:
            problems.append(
                "configMapAndSecretChangeDetectionStrategy: "
                f"{self.config_map_and_secret_change_detection_strategy!r}: "
                + (
                    "not supported by pykubelet (its TTL cache is not implemented; Watch, the "
                    "default, or Get)"
                    if self.config_map_and_secret_change_detection_strategy == "Cache"
                    else "must be Watch or Get"
                )
            )
        if self.max_pods < 1:
            problems.append("--max-pods: must be at least 1")
        for path in self.allowed_host_paths:
            if not path.startswith("/"):
                problems.append(f"--allowed-host-paths: {path!r} is not an absolute path")
        if self.pod_max_pids < -1:
            problems.append("--pod-max-pids: must be -1 (unlimited) or more")
        elif self.pod_max_pids != -1 and self.container_runtime == "remote":
            # The CRI has no pids limit per container; the kubelet sets it on the pod's cgroup,
            # which pykubelet does not manage for CRI runtimes.
            problems.append(
                "--pod-max-pids: not supported with --container-runtime remote yet "
                "(process and docker support it)"
            )
        problems.extend(self._node_allocatable_problems())
        problems.extend(self._gc_problems())
        problems.extend(self._eviction_problems())
        if not 0 <= self.read_only_port <= 65535:
            problems.append("--read-only-port: must be between 0 and 65535")
        if not 0 <= self.port <= 65535:
            problems.append("--port: must be between 0 and 65535")
        if (self.tls_cert_file is None) != (self.tls_private_key_file is None):
            problems.append("--tls-cert-file and --tls-private-key-file: give both or neither")
        if self.tls_min_version not in TLS_MIN_VERSIONS:
            problems.append(
                f"--tls-min-version: unsupported value {self.tls_min_version!r}: "
                f"supported are {', '.join(TLS_MIN_VERSIONS)}"
            )
        if self.authorization_mode not in AUTHORIZATION_MODES:
            problems.append(
                f"--authorization-mode: unsupported value {self.authorization_mode!r}: "
                f"supported are {', '.join(AUTHORIZATION_MODES)}"
            )
        if self.kubeconfig is None:
            if self.bootstrap_kubeconfig is not None:
                problems.append("--bootstrap-kubeconfig: needs --kubeconfig (written by it)")
            if self.server_tls_bootstrap:
                problems.append("serverTLSBootstrap: needs --kubeconfig")
        if self.server_tls_bootstrap and self.tls_cert_file is not None:
            problems.append("serverTLSBootstrap: cannot be used with --tls-cert-file")
        if self.kubeconfig is None:
            if self.authentication_token_webhook:
                problems.append("--authentication-token-webhook: needs --kubeconfig")
            if self.authorization_mode == "Webhook":
                problems.append("--authorization-mode Webhook: needs --kubeconfig")
        if self.manifest_url is not None and not self.manifest_url.startswith(
            ("http://", "https://")
        ):
            problems.append(
                f"--manifest-url: {self.manifest_url!r} is not an http:// or https:// URL"
            )
        if self.manifest_url_headers and self.manifest_url is None:
            problems.append("--manifest-url-header: needs --manifest-url")
        if self.manifest_url_max_bytes <= 0:
            problems.append("--manifest-url-max-bytes: must be greater than 0")
        if self.manifest_url_ca_file is not None:
            try:
                ssl.create_default_context(cafile=self.manifest_url_ca_file)
            except (OSError, ssl.SSLError) as exc:
                problems.append(
                    f"--manifest-url-ca-file: {self.manifest_url_ca_file}: not a readable PEM "
                    f"CA bundle ({exc})"
                )
        problems.extend(_dns_problems(self.cluster_dns, self.cluster_domain))
        problems.extend(self._registration_problems())
        if self.container_runtime not in RUNTIMES:
            problems.append(
                f"--container-runtime: unsupported value {self.container_runtime!r}: "
                f"supported are {', '.join(RUNTIMES)}"
            )
        return problems

    def _eviction_problems(self) -> list[str]:
        """The kubelet's ParseThresholdConfig: a soft threshold needs its grace period."""
        out = [
            f"--eviction-soft: grace period must be specified for the soft eviction threshold "
            f"{t.signal}"
            for t in self.eviction_soft
            if t.signal not in self.eviction_soft_grace_period
        ]
        if self.eviction_pressure_transition_period < 0:
            out.append("--eviction-pressure-transition-period: must not be negative")
        if self.eviction_monitoring_interval <= 0:
            out.append("--eviction-monitoring-interval: must be greater than 0")
        if self.volume_stats_agg_period < 0:
            out.append("--volume-stats-agg-period: must not be negative")
        if self.housekeeping_interval <= 0:
            out.append("--housekeeping-interval: must be greater than 0")
        return out

    def _node_allocatable_problems(self) -> list[str]:
        """The kubelet's validation of enforceNodeAllocatable, in its words."""
        out = []
        if self.cgroup_root:
            if self.container_runtime != "process":
                out.append(
                    f"--cgroup-root: not supported with --container-runtime "
                    f"{self.container_runtime} (the engine places the pods' cgroups; the process "
                    "runtime places them under it)"
                )
            elif not self.cgroup_root.startswith("/") or ".." in self.cgroup_root.split("/"):
                out.append(f"--cgroup-root {self.cgroup_root!r}: must be an absolute cgroup path")
        for key in self.enforce_node_allocatable:
            if key == ENFORCE_SYSTEM_RESERVED and not self.system_reserved_cgroup:
                out.append(
                    "invalid configuration: systemReservedCgroup (--system-reserved-cgroup) "
                    f'must be specified when "{key}" contained in enforceNodeAllocatable '
                    "(--enforce-node-allocatable)"
                )
            elif key == ENFORCE_KUBE_RESERVED and not self.kube_reserved_cgroup:
                out.append(
                    "invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) "
                    f'must be specified when "{key}" contained in enforceNodeAllocatable '
                    "(--enforce-node-allocatable)"
                )
            elif key == ENFORCE_NONE and len(self.enforce_node_allocatable) > 1:
                out.append(
                    "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) "
                    f'may not contain additional enforcements when "{key}" is specified'
                )
            elif key in (ENFORCE_SYSTEM_RESERVED, ENFORCE_KUBE_RESERVED) and (
                self.container_runtime != "process"
            ):
                # pykubelet manages cgroups on the process runtime only.
                out.append(
                    f"--enforce-node-allocatable {key}: not supported with --container-runtime "
                    f"{self.container_runtime} (the process runtime enforces it)"
                )
            elif key not in ENFORCEMENT_KEYS:
                valid = ", ".join(f'"{k}"' for k in ENFORCEMENT_KEYS[:3])
                out.append(
                    f'invalid configuration: option "{key}" specified for enforceNodeAllocatable '
                    f'(--enforce-node-allocatable). Valid options are {valid}, or "{ENFORCE_NONE}"'
                )
        return out

    def _registration_problems(self) -> list[str]:
        problems = []
        try:
            validate_node_labels(self.node_labels)
        except ValueError as exc:
            problems.append(f"--node-labels: {exc}")
        try:
            check_duplicate_taints(self.register_with_taints)
        except ValueError as exc:
            problems.append(f"--register-with-taints: {exc}")
        if self.node_ip:
            try:
                parse_node_ip(self.node_ip)
            except ValueError as exc:
                problems.append(str(exc))
        return problems


def _dns_problems(cluster_dns: list[str], cluster_domain: str) -> list[str]:
    problems = []
    for ip in cluster_dns:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            problems.append(f"--cluster-dns: {ip!r} is not an IP address")
    labels = cluster_domain.removesuffix(".").split(".")
    if cluster_domain and not all(_DNS_LABEL.match(label) for label in labels):
        problems.append(f"--cluster-domain: {cluster_domain!r} is not a DNS domain name")
    return problems


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
RUNTIMES = ("process", "docker", "remote")
TLS_MIN_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")
AUTHORIZATION_MODES = ("AlwaysAllow", "Webhook")
# The kubelet's default for remote runtimes is containerd's socket.
DEFAULT_ENDPOINTS = {
    "docker": "unix:///var/run/docker.sock",
    "remote": "unix:///run/containerd/containerd.sock",
}
