"""Semantic validation of a decoded Pod, after the structural checks pydantic does.

Each rule reports a `FieldError` with the API path of the offending field, and all rules run, so
a user sees every problem of a manifest at once.
"""

from __future__ import annotations

import re

from pykubelet.api.errors import FieldError
from pykubelet.api.model import (
    Container,
    DownwardAPIVolumeFile,
    KeyToPath,
    Pod,
    PodSecurityContext,
    ProjectedVolumeSource,
    ResourceFieldSelector,
    SecurityContext,
    Volume,
)
from pykubelet.api.quantity import QuantityError, parse_quantity
from pykubelet.api.security import validate_container_security, validate_pod_security

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# Kubernetes accepts any printable ASCII but '=' in env names; we follow it.
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A ConfigMap or Secret key, as the API server allows them.
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
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
        "status.podIPs",
        "status.hostIP",
        "status.hostIPs",
    }
)
SUPPORTED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
RESOURCE_FIELDS = frozenset(
    f"{kind}.{name}" for kind in ("limits", "requests") for name in SUPPORTED_RESOURCES
)
# What a downwardAPI volume file may show (labels and annotations also as a whole).
VOLUME_FIELD_REFS = frozenset(
    {"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels",
     "metadata.annotations"}
)  # fmt: skip


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


# ValidateAnnotations: keys and values together at most this many bytes.
TOTAL_ANNOTATION_SIZE_LIMIT = 256 * 1024


def _validate_annotations(annotations: dict[str, str]) -> list[FieldError]:
    """As the API server's ValidateAnnotations: each key a qualified name (case folded), and
    all of them at most 256 KiB, so a static pod the API server would refuse is refused here."""
    errors: list[FieldError] = []
    total = 0
    for key, value in annotations.items():
        if err := _label_key_error(key.lower()):
            errors.append(
                FieldError(f"metadata.annotations[{key}]", err.replace("label key", "key"))
            )
        total += len(key.encode()) + len(value.encode())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        errors.append(
            FieldError(
                "metadata.annotations",
                f"Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes (is {total})",
            )
        )
    return errors


def validate_pod(pod: Pod, *, api_pod: bool = False) -> list[FieldError]:
    """Every problem of the pod. `api_pod`: it comes from the API server, the only source that
    may carry ephemeral containers (the kubelet validates file and URL pods as created pods)."""
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

    errors.extend(_validate_annotations(meta.annotations))

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

    volume_names = {v.name for v in spec.volumes or []}
    errors.extend(_validate_ephemeral(pod, names, volume_names, api_pod=api_pod))
    errors.extend(_validate_volumes(spec.volumes or [], pod))
    if spec.security_context is not None:
        errors.extend(
            _validate_security(
                spec.security_context, "spec.securityContext", host_network=bool(spec.host_network)
            )
        )
    container_names = {c.name for c in pod.all_containers()}
    for kind, containers in (
        ("initContainers", spec.init_containers),
        ("containers", spec.containers),
    ):
        for i, container in enumerate(containers):
            path = f"spec.{kind}[{i}]"
            errors.extend(_validate_mounts(container, path, volume_names))
            errors.extend(_validate_env_sources(container, path, container_names))
            if container.security_context is not None:
                errors.extend(
                    _validate_security(container.security_context, f"{path}.securityContext")
                )

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


def _ephemeral_forbidden(c: Container) -> list[str]:
    """The fields an ephemeral container sets that it may not (the API server's allow list,
    inverted): they are not relied upon for the pod's service, so no ports, probes, lifecycle
    hooks or resources."""
    found = {
        "ports": bool(c.ports),
        "resources": bool(c.resources.limits or c.resources.requests),
        "restartPolicy": c.restart_policy is not None,
        "livenessProbe": c.liveness_probe is not None,
        "readinessProbe": c.readiness_probe is not None,
        "startupProbe": c.startup_probe is not None,
        "lifecycle": c.lifecycle is not None,
    }
    return [name for name, is_set in found.items() if is_set]


def _validate_ephemeral(
    pod: Pod, names: dict[str, str], volumes: set[str], *, api_pod: bool
) -> list[FieldError]:
    """spec.ephemeralContainers as kube-apiserver's validateEphemeralContainers checks them:
    names unique across every container, a target that is a regular or init container, none
    of the forbidden fields, no subPath."""
    ephemeral = pod.ephemeral_containers()
    if not ephemeral:
        return []
    if not api_pod:
        return [
            FieldError(
                "spec.ephemeralContainers",
                "cannot be set on create: only the API server adds ephemeral containers, to a "
                "running pod (pods/{name}/ephemeralcontainers)",
            )
        ]
    errors: list[FieldError] = []
    others = set(names)
    seen = dict(names)
    container_names = {c.name for c in pod.all_containers()}
    for i, container in enumerate(ephemeral):
        path = f"spec.ephemeralContainers[{i}]"
        errors.extend(_validate_container(container, path, is_init=False))
        errors.extend(_validate_mounts(container, path, volumes))
        errors.extend(_validate_env_sources(container, path, container_names))
        if container.security_context is not None:
            errors.extend(_validate_security(container.security_context, f"{path}.securityContext"))
        if container.name in seen:
            errors.append(
                FieldError(
                    f"{path}.name",
                    f"duplicate name {container.name!r} (also {seen[container.name]})",
                )
            )
        elif container.name:
            seen[container.name] = path
        target = container.target_container_name
        if target and target not in others:
            errors.append(
                FieldError(
                    f"{path}.targetContainerName",
                    f"not found: {target!r} is not a container or init container of the pod",
                )
            )
        errors.extend(
            FieldError(f"{path}.{field}", "cannot be set for an Ephemeral Container")
            for field in _ephemeral_forbidden(container)
        )
        for k, mount in enumerate(container.volume_mounts or []):
            if mount.sub_path:
                errors.append(
                    FieldError(
                        f"{path}.volumeMounts[{k}].subPath",
                        "cannot be set for an Ephemeral Container",
                    )
                )
    return errors


def _validate_container(container: Container, path: str, *, is_init: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    if err := dns_label_error(container.name):
        errors.append(FieldError(f"{path}.name", err))
    if not container.image.strip():
        errors.append(FieldError(f"{path}.image", "required"))
    if container.restart_policy is not None and not is_init:
        errors.append(
            FieldError(
                f"{path}.restartPolicy",
                "may not be set for non-init containers (the API server's rule in 1.32; "
                "per-container restart rules are not supported by pykubelet yet)",
            )
        )
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
        field_ref = env.value_from.field_ref if env.value_from is not None else None
        if field_ref is not None:
            field_path = field_ref.field_path
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
            try:
                if parse_quantity(raw) < 0:
                    errors.append(FieldError(where, f"must be >= 0 (is {raw!r})"))
            except QuantityError as e:
                errors.append(FieldError(where, str(e)))
    for name, limit in container.resources.limits.items():
        request = container.resources.requests.get(name)
        if request is None:
            continue
        try:
            if parse_quantity(request) > parse_quantity(limit):
                errors.append(
                    FieldError(
                        f"{path}.resources.requests[{name}]",
                        f"must be less than or equal to the {name} limit of {limit}",
                    )
                )
        except QuantityError:
            pass  # reported above
    return errors


def _relative_path_error(value: str) -> str | None:
    """A path inside a volume: relative, and no '..' that could climb out of it."""
    if not value:
        return "required"
    if value.startswith("/"):
        return f"invalid value {value!r}: must be a relative path"
    if ".." in value.split("/"):
        return f"invalid value {value!r}: must not contain '..'"
    return None


def _absolute_path_error(value: str) -> str | None:
    if not value.startswith("/"):
        return f"invalid value {value!r}: must be an absolute path"
    if ".." in value.split("/"):
        return f"invalid value {value!r}: must not contain '..'"
    return None


def _mode_errors(mode: int | None, where: str) -> list[FieldError]:
    if mode is not None and not 0 <= mode <= 0o777:
        return [FieldError(where, f"must be a file mode between 0 and 0777 (is {mode})")]
    return []


def _validate_items(items: list[KeyToPath] | None, where: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for k, item in enumerate(items or []):
        if not CONFIG_KEY.match(item.key):
            errors.append(FieldError(f"{where}[{k}].key", f"invalid key {item.key!r}"))
        if err := _relative_path_error(item.path):
            errors.append(FieldError(f"{where}[{k}].path", err))
        errors.extend(_mode_errors(item.mode, f"{where}[{k}].mode"))
    return errors


def _validate_volumes(volumes: list[Volume], pod: Pod) -> list[FieldError]:
    errors: list[FieldError] = []
    seen: set[str] = set()
    for i, volume in enumerate(volumes):
        where = f"spec.volumes[{i}]"
        if err := dns_label_error(volume.name):
            errors.append(FieldError(f"{where}.name", err))
        elif volume.name in seen:
            errors.append(FieldError(f"{where}.name", f"duplicate volume name {volume.name!r}"))
        seen.add(volume.name)
        if len(volume.sources()) != 1:
            errors.append(
                FieldError(
                    where,
                    "must have exactly one of emptyDir, hostPath, configMap, secret, downwardAPI, "
                    "projected",
                )
            )
        if volume.empty_dir is not None and volume.empty_dir.size_limit is not None:
            try:
                parse_quantity(volume.empty_dir.size_limit)
            except QuantityError as e:
                errors.append(FieldError(f"{where}.emptyDir.sizeLimit", str(e)))
        if volume.host_path is not None and (err := _absolute_path_error(volume.host_path.path)):
            errors.append(FieldError(f"{where}.hostPath.path", err))
        if volume.config_map is not None:
            if err := dns_subdomain_error(volume.config_map.name):
                errors.append(FieldError(f"{where}.configMap.name", err))
            errors.extend(_validate_items(volume.config_map.items, f"{where}.configMap.items"))
            errors.extend(
                _mode_errors(volume.config_map.default_mode, f"{where}.configMap.defaultMode")
            )
        if volume.secret is not None:
            if err := dns_subdomain_error(volume.secret.secret_name):
                errors.append(FieldError(f"{where}.secret.secretName", err))
            errors.extend(_validate_items(volume.secret.items, f"{where}.secret.items"))
            errors.extend(_mode_errors(volume.secret.default_mode, f"{where}.secret.defaultMode"))
        if volume.downward_api is not None:
            errors.extend(_validate_downward_api(volume.downward_api.items, where, pod))
            errors.extend(
                _mode_errors(volume.downward_api.default_mode, f"{where}.downwardAPI.defaultMode")
            )
        if volume.projected is not None:
            errors.extend(_validate_projected(volume.projected, f"{where}.projected", pod))
    return errors


# The API server's bounds on a projected token's requested life.
MIN_TOKEN_SECONDS = 600
MAX_TOKEN_SECONDS = 1 << 32


def _validate_projected(projected: ProjectedVolumeSource, where: str, pod: Pod) -> list[FieldError]:
    """As the API server's validateProjectedVolumeSource: one source per projection, each
    source's own rules, and no path written by two of them."""
    errors = _mode_errors(projected.default_mode, f"{where}.defaultMode")
    paths: set[str] = set()

    def claim(path: str, at: str) -> None:
        if path in paths:
            errors.append(FieldError(at, f"conflicting duplicate paths {path!r}"))
        paths.add(path)

    for j, source in enumerate(projected.sources):
        at = f"{where}.sources[{j}]"
        if len(source.sources()) != 1:
            errors.append(
                FieldError(
                    at,
                    "must have exactly one of configMap, secret, downwardAPI, "
                    "serviceAccountToken, clusterTrustBundle",
                )
            )
        for kind, named in (("configMap", source.config_map), ("secret", source.secret)):
            if named is None:
                continue
            if err := dns_subdomain_error(named.name):
                errors.append(FieldError(f"{at}.{kind}.name", err))
            errors.extend(_validate_items(named.items, f"{at}.{kind}.items"))
            for k, item in enumerate(named.items or []):
                claim(item.path, f"{at}.{kind}.items[{k}].path")
        if source.downward_api is not None:
            errors.extend(_validate_downward_api(source.downward_api.items, at, pod))
            for k, file in enumerate(source.downward_api.items):
                claim(file.path, f"{at}.downwardAPI.items[{k}].path")
        token = source.service_account_token
        if token is not None:
            if err := _relative_path_error(token.path):
                errors.append(FieldError(f"{at}.serviceAccountToken.path", err))
            else:
                claim(token.path, f"{at}.serviceAccountToken.path")
            seconds = token.expiration_seconds
            if seconds is not None and seconds < MIN_TOKEN_SECONDS:
                errors.append(
                    FieldError(
                        f"{at}.serviceAccountToken.expirationSeconds",
                        "may not specify a duration less than 10 minutes",
                    )
                )
            elif seconds is not None and seconds > MAX_TOKEN_SECONDS:
                errors.append(
                    FieldError(
                        f"{at}.serviceAccountToken.expirationSeconds",
                        "may not specify a duration larger than 2^32 seconds",
                    )
                )
        if source.cluster_trust_bundle is not None:
            errors.append(
                FieldError(
                    f"{at}.clusterTrustBundle",
                    "not supported by pykubelet yet (ClusterTrustBundle is an alpha API the "
                    "kubelet serves only behind its ClusterTrustBundleProjection feature gate)",
                )
            )
    return errors


def _validate_downward_api(
    items: list[DownwardAPIVolumeFile], where: str, pod: Pod
) -> list[FieldError]:
    errors: list[FieldError] = []
    names = {c.name for c in pod.all_containers()}
    for k, item in enumerate(items):
        at = f"{where}.downwardAPI.items[{k}]"
        if err := _relative_path_error(item.path):
            errors.append(FieldError(f"{at}.path", err))
        errors.extend(_mode_errors(item.mode, f"{at}.mode"))
        if (item.field_ref is None) == (item.resource_field_ref is None):
            errors.append(FieldError(at, "must have exactly one of fieldRef, resourceFieldRef"))
        if item.field_ref is not None:
            field_path = item.field_ref.field_path
            if field_path not in VOLUME_FIELD_REFS and not _is_label_or_annotation_ref(field_path):
                errors.append(
                    FieldError(
                        f"{at}.fieldRef.fieldPath",
                        f"unsupported value {field_path!r}: supported are "
                        + ", ".join(sorted(VOLUME_FIELD_REFS))
                        + ", metadata.labels['KEY'], metadata.annotations['KEY']",
                    )
                )
        if item.resource_field_ref is not None:
            ref = item.resource_field_ref
            if not ref.container_name:
                errors.append(
                    FieldError(f"{at}.resourceFieldRef.containerName", "required in a volume")
                )
            errors.extend(_validate_resource_ref(ref, f"{at}.resourceFieldRef", names))
    return errors


def _validate_resource_ref(
    ref: ResourceFieldSelector, where: str, container_names: set[str]
) -> list[FieldError]:
    errors: list[FieldError] = []
    if ref.resource not in RESOURCE_FIELDS:
        errors.append(
            FieldError(
                f"{where}.resource",
                f"unsupported value {ref.resource!r}: supported are "
                + ", ".join(sorted(RESOURCE_FIELDS)),
            )
        )
    if ref.container_name and ref.container_name not in container_names:
        errors.append(
            FieldError(
                f"{where}.containerName", f"no container named {ref.container_name!r} in the pod"
            )
        )
    if ref.divisor is not None:
        try:
            if parse_quantity(ref.divisor) <= 0:
                errors.append(FieldError(f"{where}.divisor", "must be greater than 0"))
        except QuantityError as e:
            errors.append(FieldError(f"{where}.divisor", str(e)))
    return errors


def _validate_mounts(container: Container, path: str, volumes: set[str]) -> list[FieldError]:
    errors: list[FieldError] = []
    targets: dict[str, int] = {}
    for k, mount in enumerate(container.volume_mounts or []):
        where = f"{path}.volumeMounts[{k}]"
        if mount.name not in volumes:
            errors.append(
                FieldError(f"{where}.name", f"no volume named {mount.name!r} in spec.volumes")
            )
        if err := _absolute_path_error(mount.mount_path):
            errors.append(FieldError(f"{where}.mountPath", err))
        else:
            target = mount.mount_path.rstrip("/") or "/"
            if target == "/":
                errors.append(FieldError(f"{where}.mountPath", "must not be /"))
            elif target in targets:
                errors.append(
                    FieldError(
                        f"{where}.mountPath",
                        f"duplicate mount path {target!r} (also volumeMounts[{targets[target]}])",
                    )
                )
            targets[target] = k
        if mount.sub_path is not None and (err := _relative_path_error(mount.sub_path)):
            errors.append(FieldError(f"{where}.subPath", err))
    return errors


def _validate_env_sources(
    container: Container, path: str, container_names: set[str]
) -> list[FieldError]:
    errors: list[FieldError] = []
    for k, env in enumerate(container.env):
        if env.value_from is None:
            continue
        where = f"{path}.env[{k}].valueFrom"
        source = env.value_from
        if len(source.sources()) != 1:
            errors.append(
                FieldError(
                    where,
                    "must have exactly one of fieldRef, resourceFieldRef, configMapKeyRef, "
                    "secretKeyRef",
                )
            )
        if source.resource_field_ref is not None:
            errors.extend(
                _validate_resource_ref(
                    source.resource_field_ref, f"{where}.resourceFieldRef", container_names
                )
            )
        for name, ref in (
            ("configMapKeyRef", source.config_map_key_ref),
            ("secretKeyRef", source.secret_key_ref),
        ):
            if ref is None:
                continue
            if err := dns_subdomain_error(ref.name):
                errors.append(FieldError(f"{where}.{name}.name", err))
            if not CONFIG_KEY.match(ref.key):
                errors.append(FieldError(f"{where}.{name}.key", f"invalid key {ref.key!r}"))
    for k, env_from in enumerate(container.env_from or []):
        where = f"{path}.envFrom[{k}]"
        refs = [r for r in (env_from.config_map_ref, env_from.secret_ref) if r is not None]
        if len(refs) != 1:
            errors.append(FieldError(where, "must have exactly one of configMapRef, secretRef"))
        for name, local in (
            ("configMapRef", env_from.config_map_ref),
            ("secretRef", env_from.secret_ref),
        ):
            if local is not None and (err := dns_subdomain_error(local.name)):
                errors.append(FieldError(f"{where}.{name}.name", err))
        if env_from.prefix and not ENV_NAME.match(env_from.prefix):
            errors.append(
                FieldError(
                    f"{where}.prefix",
                    f"invalid value {env_from.prefix!r}: must start an environment variable name",
                )
            )
    return errors


def _validate_security(
    context: SecurityContext | PodSecurityContext, where: str, *, host_network: bool = False
) -> list[FieldError]:
    if isinstance(context, PodSecurityContext):
        return validate_pod_security(context, where, host_network=host_network)
    return validate_container_security(context, where)


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
