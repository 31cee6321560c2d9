"""Container environment as Kubernetes builds it: envFrom, `$(VAR)` expansion, valueFrom."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from pykubelet.api.model import (
    ConfigMapKeySelector,
    Container,
    Pod,
    ResourceFieldSelector,
    SecretKeySelector,
)
from pykubelet.api.quantity import ceil_div, parse_quantity


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion: `$(VAR)` from env, `$$` is `$`, anything else is kept literally.

    An undefined `$(VAR)` stays as written, so a typo is visible rather than silently empty.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")
# Kubernetes' rule for the names envFrom may bring in (it skips the others, with an event).
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


@dataclass(frozen=True)
class Allocatable:
    """What the node offers: resourceFieldRef shows it for a limit the container does not set."""

    cpu: Fraction  # cores
    memory: int  # bytes
    ephemeral_storage: int  # bytes


@dataclass
class ApiObjects:
    """The ConfigMaps and Secrets (namespace-local, by name) a pod's env and volumes use.

    A name maps to None when the API server says there is no such object.
    """

    # A ConfigMap's `data` as text, its `binaryData` as bytes (only volumes show those).
    config_maps: dict[str, dict[str, str | bytes] | None] = field(default_factory=dict)
    secrets: dict[str, dict[str, bytes] | None] = field(default_factory=dict)


class EnvError(Exception):
    """The environment cannot be built (a missing ConfigMap or key): the container waits."""


def field_ref_value(pod: Pod, field_path: str, host_ip: str, pod_ip: str) -> str:
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name or "",
        "status.podIP": pod_ip,
        "status.hostIP": host_ip,
    }
    if field_path in simple:
        return simple[field_path]
    match = _LABEL_REF.fullmatch(field_path)
    if match:
        source = pod.metadata.labels if match.group(1) == "labels" else pod.metadata.annotations
        return source.get(match.group(2), "")
    # Validation rejects every other path before a pod gets here.
    raise ValueError(f"unsupported fieldRef {field_path!r}")


def resource_value(
    pod: Pod, container_name: str, ref: ResourceFieldSelector, node: Allocatable
) -> str:
    """The downward API's value of `limits.cpu`, `requests.memory`, ... for a container.

    As the kubelet: an unset limit is the node's allocatable amount, an unset request is the
    limit (the API server's defaulting) or else 0; the value is rounded up to whole divisors.
    """
    name = ref.container_name or container_name
    container = next((c for c in pod.all_containers() if c.name == name), None)
    if container is None:  # validation checks the name; kept for a pod changed under us
        raise EnvError(f"resourceFieldRef: no container named {name!r}")
    kind, _, resource = ref.resource.partition(".")
    limits, requests = container.resources.limits, container.resources.requests
    raw = limits.get(resource) if kind == "limits" else requests.get(resource, limits.get(resource))
    if raw is not None:
        value = parse_quantity(raw)
    elif kind == "requests":
        value = Fraction(0)
    elif resource == "cpu":
        value = node.cpu
    elif resource == "memory":
        value = Fraction(node.memory)
    else:
        value = Fraction(node.ephemeral_storage)
    divisor = parse_quantity(ref.divisor) if ref.divisor is not None else Fraction(1)
    return str(ceil_div(value, divisor))


def _text_only(data: dict[str, str | bytes]) -> dict[str, str]:
    """As the kubelet: the environment takes a ConfigMap's `data`, never its `binaryData`."""
    return {k: v for k, v in data.items() if isinstance(v, str)}


def _key_value(
    data: dict[str, str] | None,
    ref: ConfigMapKeySelector | SecretKeySelector,
    kind: str,
    namespace: str,
) -> str | None:
    """One key of a ConfigMap or Secret, with the kubelet's messages; None: optional, absent."""
    if data is None:
        if ref.optional:
            return None
        raise EnvError(f'{kind.lower()} "{ref.name}" not found')
    if ref.key not in data:
        if ref.optional:
            return None
        raise EnvError(f"couldn't find key {ref.key} in {kind} {namespace}/{ref.name}")
    return data[ref.key]


def _config_map_value(objects: ApiObjects, ref: ConfigMapKeySelector, namespace: str) -> str | None:
    found = objects.config_maps.get(ref.name)
    return _key_value(None if found is None else _text_only(found), ref, "ConfigMap", namespace)


def _secret_value(objects: ApiObjects, ref: SecretKeySelector, namespace: str) -> str | None:
    found = objects.secrets.get(ref.name)
    data = None if found is None else {k: v.decode("utf-8", "replace") for k, v in found.items()}
    return _key_value(data, ref, "Secret", namespace)


def _env_from(
    container: Container, objects: ApiObjects, namespace: str
) -> tuple[dict[str, str], list[str]]:
    """The variables of envFrom, and the keys skipped because they are no variable names."""
    out: dict[str, str] = {}
    skipped: list[str] = []
    for source in container.env_from or []:
        data: dict[str, str] | None
        if source.config_map_ref is not None:
            ref = source.config_map_ref
            found = objects.config_maps.get(ref.name)
            data = None if found is None else _text_only(found)
            kind = "configmap"
        elif source.secret_ref is not None:
            ref = source.secret_ref
            secret = objects.secrets.get(ref.name)
            data = (
                None
                if secret is None
                else {k: v.decode("utf-8", errors="replace") for k, v in secret.items()}
            )
            kind = "secret"
        else:
            continue
        if data is None:
            if ref.optional:
                continue
            raise EnvError(f'{kind} "{ref.name}" not found')
        for key, value in sorted(data.items()):
            name = (source.prefix or "") + key
            if _ENV_NAME.match(name):
                out[name] = value
            else:
                skipped.append(name)
    return out, skipped


def container_env(
    pod: Pod,
    container: Container,
    host_ip: str,
    pod_ip: str,
    objects: ApiObjects | None = None,
    node: Allocatable | None = None,
) -> list[tuple[str, str]]:
    """The container's variables in order: envFrom's first, then env, each value expanded
    against the ones before it. Raises EnvError for a missing ConfigMap, Secret or key."""
    objects = objects or ApiObjects()
    namespace = pod.metadata.namespace
    resolved, _ = _env_from(container, objects, namespace)
    for var in container.env:
        source = var.value_from
        value: str | None
        if source is None:
            value = expand(var.value or "", resolved)
        elif source.field_ref is not None:
            value = field_ref_value(pod, source.field_ref.field_path, host_ip, pod_ip)
        elif source.resource_field_ref is not None:
            if node is None:
                raise EnvError("resourceFieldRef needs the node's allocatable resources")
            value = resource_value(pod, container.name, source.resource_field_ref, node)
        elif source.config_map_key_ref is not None:
            value = _config_map_value(objects, source.config_map_key_ref, namespace)
        elif source.secret_key_ref is not None:
            value = _secret_value(objects, source.secret_key_ref, namespace)
        else:
            value = ""
        if value is not None:  # an optional reference that is missing sets nothing
            resolved[var.name] = value
    return list(resolved.items())


def skipped_env_names(container: Container, objects: ApiObjects) -> list[str]:
    """envFrom keys that are no valid variable names (the kubelet skips them with an event)."""
    try:
        return _env_from(container, objects, "")[1]
    except EnvError:
        return []
