"""The `--config` file: a KubeletConfiguration (kubelet.config.k8s.io/v1beta1).

Fields map onto the same options as the flags; a flag given on the command line wins over the file,
as with the kubelet. Unknown fields, and kubelet fields pykubelet does not implement, are errors
with their path, so a typo is never silently ignored.

The file `kubeadm join` writes is accepted as a whole (tests/data/kubeadm-1.32-config.yaml):
- a zero duration means the kubelet's default, as its v1beta1 defaulting does (kubeadm writes
  `syncFrequency: 0s` and the like);
- fields that mean something only to the kubelet's Go internals (IGNORED) are accepted and
  reported as ignored, with why; where a value other than the default would change what the
  user gets (a shutdown grace period, swap), only the default is accepted and another value is
  refused naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from pykubelet.api.decode import format_path
from pykubelet.api.quantity import to_bytes
from pykubelet.cmd import node_resources
from pykubelet.common.node_registration import Taint, check_duplicate_taints, make_taint
from pykubelet.common.options import parse_duration

KIND = "KubeletConfiguration"
API_VERSION = "kubelet.config.k8s.io/v1beta1"

# KubeletConfiguration fields we know and do not implement: named so, not "unknown".
NOT_SUPPORTED = frozenset(
    {
        "featureGates", "serializeImagePulls",
        "nodeLeaseDurationSeconds",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Ignored:
    """A field accepted and not acted on: why, and which values may be (others are refused)."""

    reason: str
    accepts: Callable[[Any], bool] = lambda value: True
    refusal: str = ""

    def check(self, value: Any) -> str | None:
        return None if self.accepts(value) else self.refusal


def _duration_is(*defaults: float) -> Callable[[Any], bool]:
    def accepts(value: Any) -> bool:
        try:
            return parse_duration(str(value)) in (0.0, *defaults)
        except ValueError:
            return False

    return accepts


def _one_of(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: value in allowed


def _empty_or(key: str, *allowed: Any) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, dict) and value.get(key, allowed[0]) in allowed


_GO_ONLY = "it tunes the kubelet's Go internals, which pykubelet does not have"
# Fields kubeadm (and others) write that pykubelet accepts without acting on them; the README's
# table lists them.
IGNORED: dict[str, Ignored] = {
    "cgroupDriver": Ignored(
        "pykubelet asks the container runtime for no cgroup parent (the runtime places containers "
        "under its own, in its own driver's format) and the process runtime writes cgroupfs "
        "directly, so there is no driver to match",
        _one_of("systemd", "cgroupfs"),
        "must be systemd or cgroupfs",
    ),
    "cpuManagerPolicy": Ignored(
        "the CPU manager is not implemented: policy none (the default) pins nothing",
        _one_of("none", ""),
        "only none is supported (the static CPU manager is not implemented)",
    ),
    "cpuManagerReconcilePeriod": Ignored(
        "the CPU manager is not implemented (policy none has nothing to reconcile)"
    ),
    "crashLoopBackOff": Ignored(
        "the back-off of restarted containers is the kubelet's default (10s doubling to 5m)",
        _empty_or("maxContainerRestartPeriod", "0s", "5m", "5m0s", "300s"),
        "maxContainerRestartPeriod: only the default 5m is supported",
    ),
    "healthzBindAddress": Ignored(
        "pykubelet serves /healthz on the read-only port (--read-only-port) and the kubelet API "
        "(--port), not on a separate healthz server"
    ),
    "healthzPort": Ignored(
        "pykubelet serves /healthz on the read-only port (--read-only-port) and the kubelet API "
        "(--port), not on a separate healthz server"
    ),
    "imageMaximumGCAge": Ignored(
        "images are collected by the file system's usage (imageGCHigh/LowThresholdPercent); "
        "an age limit is off, the kubelet's default 0s",
        _duration_is(),
        "only 0s (off, the default) is supported: images are collected by usage",
    ),
    "memorySwap": Ignored(
        "containers get no swap, as with the kubelet's default NoSwap",
        _empty_or("swapBehavior", "", "NoSwap"),
        "swapBehavior: only NoSwap (the default) is supported",
    ),
    "nodeStatusReportFrequency": Ignored(
        "pykubelet reports the node status when it changes and at least every minute"
    ),
    "nodeStatusUpdateFrequency": Ignored(
        "pykubelet computes the node status every 10s, the kubelet's default",
        _duration_is(10.0),
        "only the default 10s is supported",
    ),
    "runtimeRequestTimeout": Ignored("pykubelet's runtime calls carry their own timeouts"),
    "shutdownGracePeriod": Ignored(
        "graceful node shutdown is off, as with the kubelet's default 0s",
        _duration_is(),
        "graceful node shutdown is not implemented: only 0s (off, the default) is supported",
    ),
    "shutdownGracePeriodCriticalPods": Ignored(
        "graceful node shutdown is off, as with the kubelet's default 0s",
        _duration_is(),
        "graceful node shutdown is not implemented: only 0s (off, the default) is supported",
    ),
}
LOGGING_IGNORED = "klog's buffering and flushing, which pykubelet's logging does not have"
# Durations the kubelet's defaulting replaces when zero (SetDefaults_KubeletConfiguration).
ZERO_IS_DEFAULT = frozenset(
    {
        "sync_frequency", "file_check_frequency", "http_check_frequency",
        "streaming_connection_idle_timeout", "volume_stats_agg_period",
    }
)  # fmt: skip


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class LoggingConfiguration(_Model):
    format: Literal["text", "json", "logfmt"] = "text"
    verbosity: int = 0
    flush_frequency: int | str | None = None  # ignored: LOGGING_IGNORED
    options: dict[str, Any] | None = None  # ignored: LOGGING_IGNORED


class X509Authentication(_Model):
    client_ca_file: str | None = Field(default=None, alias="clientCAFile")


def _check_duration(value: str | None) -> str | None:
    if value is not None:
        parse_duration(value)  # raises ValueError with the reason
    return value


class WebhookAuthentication(_Model):
    enabled: bool | None = None
    cache_ttl: str | None = Field(default=None, alias="cacheTTL")

    @field_validator("cache_ttl")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return _check_duration(value)


class AnonymousAuthentication(_Model):
    enabled: bool | None = None


class Authentication(_Model):
    x509: X509Authentication | None = None
    webhook: WebhookAuthentication | None = None
    anonymous: AnonymousAuthentication | None = None


class WebhookAuthorization(_Model):
    cache_authorized_ttl: str | None = Field(default=None, alias="cacheAuthorizedTTL")
    cache_unauthorized_ttl: str | None = Field(default=None, alias="cacheUnauthorizedTTL")

    @field_validator("cache_authorized_ttl", "cache_unauthorized_ttl")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return _check_duration(value)


class Authorization(_Model):
    mode: Literal["AlwaysAllow", "Webhook"] | None = None
    webhook: WebhookAuthorization | None = None


class TaintConfig(_Model):
    key: str
    value: str = ""
    effect: str
    time_added: str | None = None

    def taint(self) -> Taint:
        spec = (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )
        return make_taint(self.key, self.value, self.effect, spec)


class KubeletConfiguration(_Model):
    _ignored: list[str] = PrivateAttr(default_factory=list)
    kind: Literal["KubeletConfiguration"]
    api_version: Literal["kubelet.config.k8s.io/v1beta1"]
    static_pod_path: str | None = None
    static_pod_url: str | None = Field(default=None, alias="staticPodURL")
    static_pod_url_header: dict[str, list[str]] | None = Field(
        default=None, alias="staticPodURLHeader"
    )
    file_check_frequency: str | None = None
    http_check_frequency: str | None = None
    sync_frequency: str | None = None
    streaming_connection_idle_timeout: str | None = None
    volume_stats_agg_period: str | None = None
    address: str | None = None
    read_only_port: int | None = Field(default=None, ge=0, le=65535)
    port: int | None = Field(default=None, ge=0, le=65535)
    tls_cert_file: str | None = None
    tls_private_key_file: str | None = None
    tls_min_version: (
        Literal["VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13"] | None
    ) = None
    authentication: Authentication | None = None
    authorization: Authorization | None = None
    max_pods: int | None = Field(default=None, ge=1)
    pod_pids_limit: int | None = Field(default=None, ge=-1)
    allowed_unsafe_sysctls: list[str] | None = None
    container_runtime_endpoint: str | None = None
    cluster_dns: list[str] | None = Field(default=None, alias="clusterDNS")
    cluster_domain: str | None = None
    resolv_conf: str | None = None
    logging: LoggingConfiguration | None = None
    kube_reserved: dict[str, str] | None = None
    system_reserved: dict[str, str] | None = None
    eviction_hard: dict[str, str] | None = None
    enforce_node_allocatable: list[str] | None = None
    system_reserved_cgroup: str | None = None
    kube_reserved_cgroup: str | None = None
    cgroup_root: str | None = None
    image_gc_high_threshold_percent: int | None = Field(
        default=None, alias="imageGCHighThresholdPercent"
    )
    image_gc_low_threshold_percent: int | None = Field(
        default=None, alias="imageGCLowThresholdPercent"
    )
    image_minimum_gc_age: str | None = Field(default=None, alias="imageMinimumGCAge")
    container_log_max_size: str | None = None
    container_log_max_files: int | None = None
    container_log_monitor_interval: str | None = None

    @field_validator("container_log_max_size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            to_bytes(value)  # raises QuantityError (a ValueError) saying why
        return value

    eviction_soft: dict[str, str] | None = None
    eviction_soft_grace_period: dict[str, str] | None = None
    eviction_max_pod_grace_period: int | None = None
    eviction_minimum_reclaim: dict[str, str] | None = None
    eviction_pressure_transition_period: str | None = None
    rotate_certificates: bool | None = None
    server_tls_bootstrap: bool | None = Field(default=None, alias="serverTLSBootstrap")

    @field_validator("kube_reserved", "system_reserved")
    @classmethod
    def _reserved(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            node_resources.parse_reserved(value)  # raises ValueError with the kubelet's reason
        return value

    @field_validator("eviction_hard", "eviction_soft")
    @classmethod
    def _thresholds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            node_resources.parse_thresholds(value)
        return value

    kube_api_qps: float | None = Field(default=None, alias="kubeAPIQPS")
    kube_api_burst: int | None = Field(default=None, alias="kubeAPIBurst")
    event_record_qps: float | None = Field(default=None, alias="eventRecordQPS")
    event_burst: int | None = None
    config_map_and_secret_change_detection_strategy: str | None = None
    register_node: bool | None = None
    register_with_taints: list[TaintConfig] | None = None
    provider_id: str | None = Field(default=None, alias="providerID")

    @field_validator("register_with_taints")
    @classmethod
    def _taints(cls, value: list[TaintConfig] | None) -> list[TaintConfig] | None:
        taints = [t.taint() for t in value or []]  # raises ValueError with the kubelet's reason
        check_duplicate_taints(taints)
        return value

    @field_validator("eviction_soft_grace_period")
    @classmethod
    def _grace_periods(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            node_resources.parse_grace_periods(value)
        return value

    @field_validator("eviction_minimum_reclaim")
    @classmethod
    def _minimum_reclaims(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            node_resources.parse_minimum_reclaims(value)
        return value

    @field_validator(
        "file_check_frequency",
        "http_check_frequency",
        "sync_frequency",
        "streaming_connection_idle_timeout",
        "volume_stats_agg_period",
        "image_minimum_gc_age",
        "container_log_monitor_interval",
        "eviction_pressure_transition_period",
    )
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return _check_duration(value)


class ConfigFileError(Exception):
    pass


def _drop_ignored(data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Take the IGNORED fields out of `data` (those the model does not know): their names, and
    the refusals of values that would change what the user gets."""
    known = {f.alias or name for name, f in KubeletConfiguration.model_fields.items()}
    names, problems = [], []
    for name in [k for k in data if k in IGNORED and k not in known]:
        problem = IGNORED[name].check(data.pop(name))
        if problem is not None:
            problems.append(f"{name}: {problem}")
        names.append(name)
    return sorted(names), problems


def load(path: Path) -> KubeletConfiguration:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a KubeletConfiguration object")
    ignored, refused = _drop_ignored(data)
    if refused:
        raise ConfigFileError("; ".join(f"{path}: {p}" for p in refused))
    try:
        config = KubeletConfiguration.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            where = format_path(err["loc"])
            field = str(err["loc"][-1]) if err["loc"] else ""
            if err["type"] == "extra_forbidden":
                reason = (
                    "not supported by pykubelet yet" if field in NOT_SUPPORTED else "unknown field"
                )
            elif err["type"] == "missing":
                reason = f"required ({field}: {KIND if field == 'kind' else API_VERSION})"
            else:
                reason = err["msg"].removeprefix("Value error, ")
            problems.append(f"{path}: {where}: {reason}")
        raise ConfigFileError("; ".join(problems)) from None
    config._ignored = ignored
    return config


def ignored_fields(config: KubeletConfiguration) -> list[str]:
    """The fields of the file accepted and not acted on, each with why (logged at start)."""
    notes = [f"{name}: ignored: {IGNORED[name].reason}" for name in config._ignored]
    if config.logging is not None:
        for name, value in (
            ("flushFrequency", config.logging.flush_frequency),
            ("options", config.logging.options),
        ):
            if value is not None:
                notes.append(f"logging.{name}: ignored: {LOGGING_IGNORED}")
    return notes


def as_flag_defaults(config: KubeletConfiguration) -> dict[str, Any]:
    """The file's values keyed by the argparse destinations of the matching flags."""
    out: dict[str, Any] = {}
    simple: dict[str, tuple[str, Callable[[Any], Any]]] = {
        "static_pod_path": ("pod_manifest_path", Path),
        "static_pod_url": ("manifest_url", str),
        "address": ("address", str),
        "read_only_port": ("read_only_port", int),
        "port": ("port", int),
        "tls_cert_file": ("tls_cert_file", Path),
        "tls_private_key_file": ("tls_private_key_file", Path),
        "tls_min_version": ("tls_min_version", str),
        "max_pods": ("max_pods", int),
        "pod_pids_limit": ("pod_max_pids", int),
        "container_runtime_endpoint": ("container_runtime_endpoint", str),
        "cluster_dns": ("cluster_dns", list),
        "cluster_domain": ("cluster_domain", str),
        "resolv_conf": ("resolv_conf", str),
        "file_check_frequency": ("file_check_frequency", parse_duration),
        "http_check_frequency": ("http_check_frequency", parse_duration),
        "sync_frequency": ("sync_frequency", parse_duration),
        "streaming_connection_idle_timeout": ("streaming_connection_idle_timeout", parse_duration),
        "volume_stats_agg_period": ("volume_stats_agg_period", parse_duration),
        "kube_reserved": ("kube_reserved", node_resources.parse_reserved),
        "system_reserved": ("system_reserved", node_resources.parse_reserved),
        "eviction_hard": ("eviction_hard", node_resources.parse_thresholds),
        "enforce_node_allocatable": ("enforce_node_allocatable", list),
        "system_reserved_cgroup": ("system_reserved_cgroup", str),
        "kube_reserved_cgroup": ("kube_reserved_cgroup", str),
        "cgroup_root": ("cgroup_root", str),
        "register_node": ("register_node", bool),
        "kube_api_qps": ("kube_api_qps", float),
        "kube_api_burst": ("kube_api_burst", int),
        "event_record_qps": ("event_qps", float),
        "event_burst": ("event_burst", int),
        "config_map_and_secret_change_detection_strategy": (
            "config_map_and_secret_change_detection_strategy",
            str,
        ),
        "provider_id": ("provider_id", str),
        "image_gc_high_threshold_percent": ("image_gc_high_threshold", int),
        "image_gc_low_threshold_percent": ("image_gc_low_threshold", int),
        "image_minimum_gc_age": ("image_minimum_gc_age", parse_duration),
        "container_log_max_size": ("container_log_max_size", to_bytes),
        "container_log_max_files": ("container_log_max_files", int),
        "container_log_monitor_interval": ("container_log_monitor_interval", parse_duration),
        "eviction_soft": ("eviction_soft", node_resources.parse_thresholds),
        "eviction_soft_grace_period": (
            "eviction_soft_grace_period",
            node_resources.parse_grace_periods,
        ),
        "eviction_max_pod_grace_period": ("eviction_max_pod_grace_period", int),
        "eviction_minimum_reclaim": (
            "eviction_minimum_reclaim",
            node_resources.parse_minimum_reclaims,
        ),
        "eviction_pressure_transition_period": (
            "eviction_pressure_transition_period",
            parse_duration,
        ),
        "rotate_certificates": ("rotate_certificates", bool),
        "server_tls_bootstrap": ("server_tls_bootstrap", bool),
    }
    for field, (dest, convert) in simple.items():
        value = getattr(config, field)
        if value is None or (value == "" and field != "resolv_conf"):
            # An empty string is the default, as with the kubelet; but resolvConf is a pointer
            # there, and "" is its own value: no resolver file to start pods' DNS from.
            continue
        converted = convert(value)
        if field in ZERO_IS_DEFAULT and converted == 0:
            continue
        out[dest] = converted
    if config.register_with_taints is not None:
        out["register_with_taints"] = [t.taint() for t in config.register_with_taints]
    if config.allowed_unsafe_sysctls is not None:
        out["allowed_unsafe_sysctls"] = list(config.allowed_unsafe_sysctls)
    if config.static_pod_url_header:
        out["manifest_url_header"] = [
            (key, value) for key, values in config.static_pod_url_header.items() for value in values
        ]
    authn = config.authentication
    if authn is not None:
        if authn.x509 is not None and authn.x509.client_ca_file:
            out["client_ca_file"] = Path(authn.x509.client_ca_file)
        if authn.webhook is not None:
            if authn.webhook.enabled is not None:
                out["authentication_token_webhook"] = authn.webhook.enabled
            if authn.webhook.cache_ttl is not None and parse_duration(authn.webhook.cache_ttl):
                out["authentication_token_webhook_cache_ttl"] = parse_duration(
                    authn.webhook.cache_ttl
                )
        if authn.anonymous is not None and authn.anonymous.enabled is not None:
            out["anonymous_auth"] = authn.anonymous.enabled
    authz = config.authorization
    if authz is not None:
        if authz.mode is not None:
            out["authorization_mode"] = authz.mode
        if authz.webhook is not None:
            for field, dest in (
                ("cache_authorized_ttl", "authorization_webhook_cache_authorized_ttl"),
                ("cache_unauthorized_ttl", "authorization_webhook_cache_unauthorized_ttl"),
            ):
                value = getattr(authz.webhook, field)
                if value is not None and parse_duration(value):  # 0s: the default
                    out[dest] = parse_duration(value)
    if config.logging is not None:
        out["log_format"] = config.logging.format
        out["verbosity"] = config.logging.verbosity
    return out


def dump(values: dict[str, Any]) -> str:
    """A KubeletConfiguration document for these camelCase fields (used by tests and docs)."""
    return yaml.safe_dump({"kind": KIND, "apiVersion": API_VERSION, **values}, sort_keys=False)
