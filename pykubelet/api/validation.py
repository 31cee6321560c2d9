"""Semantic validation of a decoded Pod, after the structural checks pydantic does.

Each rule reports a `FieldError` with the API path of the offending field, and all rules run, so
a user sees every problem of a manifest at once.
"""

from __future__ import annotations

import re

from pykubelet.api.errors import FieldError
from pykubelet.api.model import Container, Pod

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes accepts any printable ASCII but '=' in env names; we follow it.
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

SUPPORTED_FIELD_REFS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "metadata.uid",
        "spec.nodeName",
        "spec.serviceAccountName",
        "status.podIP",
        "status.hostIP",
    }
)
SUPPORTED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})


def dns_subdomain_error(value: str) -> str | None:
    if not value:
        return "required"
    if len(value) > 253:
        return f"must be no more than 253 characters (is {len(value)})"
    if not DNS1123_SUBDOMAIN.match(value):
        return (
            f"invalid value {value!r}: must be a lowercase RFC 1123 subdomain "
            "(lowercase letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )
    return None


def dns_label_error(value: str) -> str | None:
    if not value:
        return "required"
    if len(value) > 63:
        return f"must be no more than 63 characters (is {len(value)})"
    if not DNS1123_LABEL.match(value):
        return (
            f"invalid value {value!r}: must be a lowercase RFC 1123 label "
            "(lowercase letters, digits and '-', starting and ending with a letter or digit)"
        )
    return None


def _label_key_error(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and dns_subdomain_error(prefix):
        return f"invalid label key {key!r}: prefix must be a DNS subdomain"
    if not name or len(name) > 63 or not QUALIFIED_NAME.match(name):
        return f"invalid label key {key!r}: name part must be 63 characters or less, alphanumeric"
    return None


def validate_pod(pod: Pod) -> list[FieldError]:
    errors: list[FieldError] = []
    meta = pod.metadata
    if err := dns_subdomain_error(meta.name):
        errors.append(FieldError("metadata.name", err))
    if meta.namespace and (err := dns_label_error(meta.namespace)):
        errors.append(FieldError("metadata.namespace", err))
    for key, value in meta.labels.items():
        if err := _label_key_error(key):
            errors.append(FieldError(f"metadata.labels[{key}]", err))
        if len(value) > 63 or not LABEL_VALUE.match(value):
            errors.append(
                FieldError(
                    f"metadata.labels[{key}]",
                    f"invalid label value {value!r}: 63 characters or less, alphanumeric, "
                    "'-', '_' or '.', starting and ending alphanumeric",
                )
            )

    spec = pod.spec
    if not spec.containers:
        errors.append(FieldError("spec.containers", "required: a pod needs at least one container"))
    if spec.termination_grace_period_seconds < 0:
        errors.append(FieldError("spec.terminationGracePeriodSeconds", "must be >= 0"))
    if spec.active_deadline_seconds is not None:
        errors.append(FieldError("spec.activeDeadlineSeconds", "not supported by pykubelet yet"))

    names: dict[str, str] = {}
    for kind, containers in (
        ("initContainers", spec.init_containers),
        ("containers", spec.containers),
    ):
        for i, container in enumerate(containers):
            path = f"spec.{kind}[{i}]"
            errors.extend(_validate_container(container, path, is_init=kind == "initContainers"))
            if container.name in names:
                errors.append(
                    FieldError(
                        f"{path}.name",
                        f"duplicate name {container.name!r} (also {names[container.name]})",
                    )
                )
            elif container.name:
                names[container.name] = path

    host_ports: dict[tuple[int, str], str] = {}
    for i, container in enumerate(spec.containers):
        for j, port in enumerate(container.ports):
            if port.host_port:
                bound = (port.host_port, port.protocol)
                where = f"spec.containers[{i}].ports[{j}].hostPort"
                if bound in host_ports:
                    errors.append(
                        FieldError(where, f"duplicate host port {port.host_port}/{port.protocol}")
                    )
                host_ports[bound] = where
    return errors


def _validate_container(container: Container, path: str, *, is_init: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    if err := dns_label_error(container.name):
        errors.append(FieldError(f"{path}.name", err))
    if not container.image.strip():
        errors.append(FieldError(f"{path}.image", "required"))
    if container.restart_policy is not None and not is_init:
        errors.append(FieldError(f"{path}.restartPolicy", "may only be set on init containers"))
    if container.working_dir is not None and not container.working_dir.startswith("/"):
        errors.append(FieldError(f"{path}.workingDir", "must be an absolute path"))

    env_seen: set[str] = set()
    for k, env in enumerate(container.env):
        where = f"{path}.env[{k}]"
        if not env.name or not ENV_NAME.match(env.name):
            errors.append(
                FieldError(
                    f"{where}.name",
                    f"invalid value {env.name!r}: a valid environment variable name",
                )
            )
        if env.value is not None and env.value_from is not None:
            errors.append(FieldError(where, "may not have both value and valueFrom"))
        if env.value_from is not None:
            field_path = env.value_from.field_ref.field_path
            if field_path not in SUPPORTED_FIELD_REFS and not _is_label_or_annotation_ref(
                field_path
            ):
                errors.append(
                    FieldError(
                        f"{where}.valueFrom.fieldRef.fieldPath",
                        f"unsupported value {field_path!r}: supported are "
                        + ", ".join(sorted(SUPPORTED_FIELD_REFS))
                        + ", metadata.labels['KEY'], metadata.annotations['KEY']",
                    )
                )
        env_seen.add(env.name)

    errors.extend(_validate_handlers(container, path, is_init=is_init))
    port_names: set[str] = set()
    for j, port in enumerate(container.ports):
        where = f"{path}.ports[{j}]"
        if not 1 <= port.container_port <= 65535:
            errors.append(
                FieldError(f"{where}.containerPort", "must be between 1 and 65535, inclusive")
            )
        if port.host_port is not None and not 0 <= port.host_port <= 65535:
            errors.append(FieldError(f"{where}.hostPort", "must be between 0 and 65535, inclusive"))
        if port.name is not None:
            if len(port.name) > 15 or not PORT_NAME.match(port.name) or port.name.isdigit():
                errors.append(
                    FieldError(
                        f"{where}.name",
                        f"invalid value {port.name!r}: an IANA service name (1-15 chars)",
                    )
                )
            elif port.name in port_names:
                errors.append(FieldError(f"{where}.name", f"duplicate port name {port.name!r}"))
            port_names.add(port.name)

    for section, values in (
        ("limits", container.resources.limits),
        ("requests", container.resources.requests),
    ):
        for name, raw in values.items():
            where = f"{path}.resources.{section}[{name}]"
            if name not in SUPPORTED_RESOURCES and "/" not in name:
                errors.append(FieldError(where, f"unsupported resource name {name!r}"))
            if isinstance(raw, bool) or not QUANTITY.match(str(raw)):
                errors.append(FieldError(where, f"invalid quantity {raw!r}"))
    return errors


def _validate_port_ref(port: int | str, container: Container, where: str) -> list[FieldError]:
    if isinstance(port, int):
        if not 1 <= port <= 65535:
            return [FieldError(where, "must be between 1 and 65535, inclusive")]
        return []
    if port not in {p.name for p in container.ports if p.name}:
        return [FieldError(where, f"port name {port!r} is not a named port of this container")]
    return []


def _validate_handlers(container: Container, path: str, *, is_init: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    for kind, probe in container.probes().items():
        where = f"{path}.{kind}Probe"
        if is_init and container.restart_policy != "Always":
            errors.append(FieldError(where, "may not be set on init containers (only sidecars)"))
        handlers = (probe.exec, probe.http_get, probe.tcp_socket, probe.grpc)
        if len([a for a in handlers if a is not None]) != 1:
            errors.append(
                FieldError(where, "must have exactly one of exec, httpGet, tcpSocket, grpc")
            )
        if probe.grpc is not None and not 1 <= probe.grpc.port <= 65535:
            errors.append(
                FieldError(f"{where}.grpc.port", "must be between 1 and 65535, inclusive")
            )
        if probe.http_get is not None:
            errors.extend(
                _validate_port_ref(probe.http_get.port, container, f"{where}.httpGet.port")
            )
        if probe.tcp_socket is not None:
            errors.extend(
                _validate_port_ref(probe.tcp_socket.port, container, f"{where}.tcpSocket.port")
            )
        if probe.exec is not None and not probe.exec.command:
            errors.append(FieldError(f"{where}.exec.command", "required"))
        for name in ("period_seconds", "timeout_seconds", "success_threshold", "failure_threshold"):
            if getattr(probe, name) < 1:
                errors.append(FieldError(f"{where}.{_camel(name)}", "must be >= 1"))
        if probe.initial_delay_seconds < 0:
            errors.append(FieldError(f"{where}.initialDelaySeconds", "must be >= 0"))
        if kind in ("liveness", "startup") and probe.success_threshold != 1:
            errors.append(FieldError(f"{where}.successThreshold", "must be 1"))
    if container.lifecycle is not None:
        for hook in ("post_start", "pre_stop"):
            handler = getattr(container.lifecycle, hook)
            if handler is None:
                continue
            where = f"{path}.lifecycle.{_camel(hook)}"
            actions = [a for a in (handler.exec, handler.http_get, handler.sleep) if a is not None]
            if len(actions) != 1:
                errors.append(FieldError(where, "must have exactly one of exec, httpGet, sleep"))
            if handler.http_get is not None:
                errors.extend(
                    _validate_port_ref(handler.http_get.port, container, f"{where}.httpGet.port")
                )
            if handler.sleep is not None and handler.sleep.seconds < 0:
                errors.append(FieldError(f"{where}.sleep.seconds", "must be >= 0"))
    return errors


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _is_label_or_annotation_ref(field_path: str) -> bool:
    return bool(re.fullmatch(r"metadata\.(labels|annotations)\['[^']+'\]", field_path))
