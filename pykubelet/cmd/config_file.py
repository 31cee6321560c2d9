"""The `--config` file: a KubeletConfiguration (kubelet.config.k8s.io/v1beta1).

Fields map onto the same options as the flags; a flag given on the command line wins over the file,
as with the kubelet. Unknown fields, and kubelet fields pykubelet does not implement, are errors
with their path, so a typo is never silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from pykubelet.api.decode import format_path
from pykubelet.cmd import node_resources
from pykubelet.common.options import parse_duration

KIND = "KubeletConfiguration"
API_VERSION = "kubelet.config.k8s.io/v1beta1"

# KubeletConfiguration fields we know and do not implement: named so, not "unknown".
NOT_SUPPORTED = frozenset(
    {
        "cgroupDriver", "cgroupRoot",
        "healthzPort", "healthzBindAddress", "evictionSoft", "featureGates",
        "imageGCHighThresholdPercent", "imageGCLowThresholdPercent", "serializeImagePulls",
        "registerNode",
        "nodeStatusUpdateFrequency", "nodeLeaseDurationSeconds", "shutdownGracePeriod",
        "memorySwap", "cpuManagerPolicy",
    }
)  # fmt: skip


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class LoggingConfiguration(_Model):
    format: Literal["text", "json", "logfmt"] = "text"
    verbosity: int = 0


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


class KubeletConfiguration(_Model):
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
    rotate_certificates: bool | None = None
    server_tls_bootstrap: bool | None = Field(default=None, alias="serverTLSBootstrap")

    @field_validator("kube_reserved", "system_reserved")
    @classmethod
    def _reserved(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            node_resources.parse_reserved(value)  # raises ValueError with the kubelet's reason
        return value

    @field_validator("eviction_hard")
    @classmethod
    def _thresholds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            node_resources.parse_thresholds(value)
        return value

    @field_validator(
        "file_check_frequency",
        "http_check_frequency",
        "sync_frequency",
        "streaming_connection_idle_timeout",
    )
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        return _check_duration(value)


class ConfigFileError(Exception):
    pass


def load(path: Path) -> KubeletConfiguration:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a KubeletConfiguration object")
    try:
        return KubeletConfiguration.model_validate(data)
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
        "kube_reserved": ("kube_reserved", node_resources.parse_reserved),
        "system_reserved": ("system_reserved", node_resources.parse_reserved),
        "eviction_hard": ("eviction_hard", node_resources.parse_thresholds),
        "enforce_node_allocatable": ("enforce_node_allocatable", list),
        "system_reserved_cgroup": ("system_reserved_cgroup", str),
        "kube_reserved_cgroup": ("kube_reserved_cgroup", str),
        "rotate_certificates": ("rotate_certificates", bool),
        "server_tls_bootstrap": ("server_tls_bootstrap", bool),
    }
    for field, (dest, convert) in simple.items():
        value = getattr(config, field)
        if value is not None:
            out[dest] = convert(value)
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
            if authn.webhook.cache_ttl is not None:
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
                if value is not None:
                    out[dest] = parse_duration(value)
    if config.logging is not None:
        out["log_format"] = config.logging.format
        out["verbosity"] = config.logging.verbosity
    return out


def dump(values: dict[str, Any]) -> str:
    """A KubeletConfiguration document for these camelCase fields (used by tests and docs)."""
    return yaml.safe_dump({"kind": KIND, "apiVersion": API_VERSION, **values}, sort_keys=False)
