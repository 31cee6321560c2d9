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
from pykubelet.common.options import parse_duration

KIND = "KubeletConfiguration"
API_VERSION = "kubelet.config.k8s.io/v1beta1"

# KubeletConfiguration fields we know and do not implement: named so, not "unknown".
NOT_SUPPORTED = frozenset(
    {
        "cgroupDriver", "cgroupRoot", "clusterDNS", "clusterDomain",
        "authentication", "authorization", "tlsCertFile", "tlsPrivateKeyFile", "port",
        "healthzPort", "healthzBindAddress", "evictionHard", "evictionSoft", "kubeReserved",
        "systemReserved", "featureGates", "imageGCHighThresholdPercent",
        "imageGCLowThresholdPercent", "serializeImagePulls", "registerNode",
        "nodeStatusUpdateFrequency", "nodeLeaseDurationSeconds", "shutdownGracePeriod",
        "memorySwap", "cpuManagerPolicy",
    }
)  # fmt: skip


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class LoggingConfiguration(_Model):
    format: Literal["text", "json", "logfmt"] = "text"
    verbosity: int = 0


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
    address: str | None = None
    read_only_port: int | None = Field(default=None, ge=0, le=65535)
    max_pods: int | None = Field(default=None, ge=1)
    pod_pids_limit: int | None = Field(default=None, ge=-1)
    container_runtime_endpoint: str | None = None
    logging: LoggingConfiguration | None = None

    @field_validator("file_check_frequency", "http_check_frequency", "sync_frequency")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)  # raises ValueError with the reason
        return value


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
        "max_pods": ("max_pods", int),
        "pod_pids_limit": ("pod_max_pids", int),
        "container_runtime_endpoint": ("container_runtime_endpoint", str),
        "file_check_frequency": ("file_check_frequency", parse_duration),
        "http_check_frequency": ("http_check_frequency", parse_duration),
        "sync_frequency": ("sync_frequency", parse_duration),
    }
    for field, (dest, convert) in simple.items():
        value = getattr(config, field)
        if value is not None:
            out[dest] = convert(value)
    if config.static_pod_url_header:
        out["manifest_url_header"] = [
            (key, value) for key, values in config.static_pod_url_header.items() for value in values
        ]
    if config.logging is not None:
        out["log_format"] = config.logging.format
        out["verbosity"] = config.logging.verbosity
    return out


def dump(values: dict[str, Any]) -> str:
    """A KubeletConfiguration document for these camelCase fields (used by tests and docs)."""
    return yaml.safe_dump({"kind": KIND, "apiVersion": API_VERSION, **values}, sort_keys=False)
