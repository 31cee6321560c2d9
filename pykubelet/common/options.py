"""The agent's typed options, and Go-style durations ("20s", "1m30s", "500ms")."""

from __future__ import annotations

import re
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path

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
    manifest_url: str | None = None
    manifest_url_headers: list[tuple[str, str]] = field(default_factory=list)
    http_check_frequency: float = 20.0
    manifest_url_max_bytes: int = 10 * 1024 * 1024
    manifest_url_ca_file: Path | None = None
    kubeconfig: Path | None = None
    # None: the runtime's default (DEFAULT_ENDPOINTS).
    container_runtime_endpoint: str | None = None
    pod_infra_container_image: str = "registry.k8s.io/pause:3.10"
    node_ip: str | None = None
    keep_pods_on_exit: bool = False
    max_pods: int = 110
    # hostPath volumes are refused unless below one of these; privileged containers unless set.
    allowed_host_paths: list[str] = field(default_factory=list)
    allow_privileged: bool = False
    pod_max_pids: int = -1  # per pod; -1: unlimited
    # Sysctls (names, or prefixes ending in "*") pods may set beyond the kubelet's safe set.
    allowed_unsafe_sysctls: list[str] = field(default_factory=list)
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
            "podPidsLimit": self.pod_max_pids,
            "allowedUnsafeSysctls": list(self.allowed_unsafe_sysctls),
            "containerRuntimeEndpoint": self.container_runtime_endpoint or "",
            "logging": {"format": self.log_format, "verbosity": self.verbosity},
        }

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
        if self.container_runtime not in RUNTIMES:
            problems.append(
                f"--container-runtime: unsupported value {self.container_runtime!r}: "
                f"supported are {', '.join(RUNTIMES)}"
            )
        return problems


RUNTIMES = ("process", "docker", "remote")
TLS_MIN_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")
AUTHORIZATION_MODES = ("AlwaysAllow", "Webhook")
# The kubelet's default for remote runtimes is containerd's socket.
DEFAULT_ENDPOINTS = {
    "docker": "unix:///var/run/docker.sock",
    "remote": "unix:///run/containerd/containerd.sock",
}
