"""Container environment as Kubernetes builds it: envFrom, `$(VAR)` expansion, valueFrom, and
the service variables (the kubelet's getServiceEnvVarMap and envvars.FromServices).

The service variables are computed here from the Services a `ServiceEnv` lists (in cluster mode,
the API server's, through a watch): `KUBERNETES_SERVICE_HOST`, `KUBERNETES_PORT_443_TCP`, ... of
the `kubernetes` Service in `default` always, and, with `enableServiceLinks` (true unless set
false), the docker-links variables of every Service of the pod's namespace that has a ClusterIP.
"""

from __future__ import annotations

import re
from collections import ChainMap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

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


# --- service variables --------------------------------------------------------------------------

# The kubelet's --master-service-namespace (deprecated, default "default") and its master services.
MASTER_SERVICE_NAMESPACE = "default"
MASTER_SERVICES = frozenset({"kubernetes"})


@dataclass(frozen=True)
class ServicePort:
    port: int
    name: str = ""
    protocol: str = "TCP"  # an unset protocol is TCP, as the kubelet reads it


@dataclass(frozen=True)
class Service:
    """What the environment needs of a Service."""

    namespace: str
    name: str
    cluster_ip: str  # "" or "None" (headless): no variables
    ports: tuple[ServicePort, ...] = ()

    @property
    def ip_set(self) -> bool:
        """The kubelet's IsServiceIPSet: a ClusterIP that is neither "None" nor empty."""
        return self.cluster_ip not in ("", "None")


class ServiceEnv(Protocol):
    """The Services the environment is built from (the kubelet's service lister)."""

    def services(self) -> Iterable[Service]:
        """Every Service known, of every namespace."""
        ...

    def not_synced(self) -> str | None:
        """None once the Services have been listed at least once; else why not yet."""
        ...


class NoServices:
    """Without an API server there are no Services: no service variables, as the kubelet's
    ("Kubelets without masters ... don't set env vars")."""

    def services(self) -> Iterable[Service]:
        return ()

    def not_synced(self) -> str | None:
        return None


class ServicesNotSynced(EnvError):
    """The Services have not been listed yet: an API pod's container waits for them."""


SERVICES_NOT_SYNCED = "services have not yet been read at least once, cannot construct envvars"


def env_var_name(name: str) -> str:
    """A Service's or port's name as a variable name: uppercased, '-' becomes '_'."""
    return name.upper().replace("-", "_")


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"  # Go's net.JoinHostPort


def service_variables(services: Iterable[Service]) -> dict[str, str]:
    """The kubelet's envvars.FromServices: for each Service with a ClusterIP, `<NAME>_SERVICE_HOST`,
    `<NAME>_SERVICE_PORT` (the first port) and `<NAME>_SERVICE_PORT_<PORT NAME>` (each named
    port), then the docker-links variables: `<NAME>_PORT` (the first port's URL) and, per port,
    `<NAME>_PORT_<port>_<PROTO>` with its `_PROTO`, `_PORT` and `_ADDR`."""
    out: dict[str, str] = {}
    for svc in services:
        # API validation gives every Service with a ClusterIP a port; one without has no vars.
        if not svc.ip_set or not svc.ports:
            continue
        prefix = env_var_name(svc.name)
        out[f"{prefix}_SERVICE_HOST"] = svc.cluster_ip
        out[f"{prefix}_SERVICE_PORT"] = str(svc.ports[0].port)
        for sp in svc.ports:
            if sp.name:
                out[f"{prefix}_SERVICE_PORT_{env_var_name(sp.name)}"] = str(sp.port)
        for i, sp in enumerate(svc.ports):
            protocol = sp.protocol or "TCP"
            url = f"{protocol.lower()}://{_host_port(svc.cluster_ip, sp.port)}"
            if i == 0:
                out[f"{prefix}_PORT"] = url  # docker special-cases the first port
            port_prefix = f"{prefix}_PORT_{sp.port}_{protocol.upper()}"
            out[port_prefix] = url
            out[f"{port_prefix}_PROTO"] = protocol.lower()
            out[f"{port_prefix}_PORT"] = str(sp.port)
            out[f"{port_prefix}_ADDR"] = svc.cluster_ip
    return out


def service_env(
    services: Iterable[Service],
    namespace: str,
    enable_service_links: bool,
    master_namespace: str = MASTER_SERVICE_NAMESPACE,
) -> dict[str, str]:
    """The kubelet's getServiceEnvVarMap: the variables a pod of `namespace` sees.

    The master services (`kubernetes` in `default`) always; the Services of the pod's own
    namespace only with enableServiceLinks, and one of them named `kubernetes` then takes the
    place of the master's (for a pod of `default` they are the same). Headless Services and those
    without a ClusterIP give nothing.
    """
    chosen: dict[str, Service] = {}
    for svc in services:
        if not svc.ip_set:
            continue
        if svc.namespace == master_namespace and svc.name in MASTER_SERVICES:
            chosen.setdefault(svc.name, svc)
        elif svc.namespace == namespace and enable_service_links:
            chosen[svc.name] = svc
    return service_variables(chosen[name] for name in sorted(chosen))


def pod_service_env(pod: Pod, lister: ServiceEnv, *, wait: bool) -> dict[str, str]:
    """The pod's service variables. With `wait` (an API pod's container about to start, as the
    kubelet waits for its service informer) raises ServicesNotSynced until the Services have
    been listed once; static pods never wait (the API server may be down for good)."""
    problem = lister.not_synced()
    if wait and problem is not None:
        raise ServicesNotSynced(f"{SERVICES_NOT_SYNCED} ({problem})")
    links = pod.spec.enable_service_links is not False  # the API server's default: true
    return service_env(lister.services(), pod.metadata.namespace, links)


# --- the other variables ------------------------------------------------------------------------


def field_ref_value(pod: Pod, field_path: str, host_ip: str, pod_ip: str) -> str:
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name or "",
        "status.podIP": pod_ip,
        "status.hostIP": host_ip,
        # The lists, comma-separated as the kubelet joins them: one address each here.
        "status.podIPs": pod_ip,
        "status.hostIPs": host_ip,
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
    services: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """The container's variables in order: envFrom's first, then env, each value expanded
    against the ones before it and the service variables, then the service variables the
    container does not set itself (its own win). Raises EnvError for a missing ConfigMap,
    Secret or key."""
    objects = objects or ApiObjects()
    services = services or {}
    namespace = pod.metadata.namespace
    resolved, _ = _env_from(container, objects, namespace)
    # As the kubelet's expansion.MappingFuncFor(tmpEnv, serviceEnv): the container's first.
    known = ChainMap(resolved, dict(services))
    for var in container.env:
        source = var.value_from
        value: str | None
        if source is None:
            value = expand(var.value or "", known)
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
    return [*resolved.items(), *((k, v) for k, v in services.items() if k not in resolved)]


def skipped_env_names(container: Container, objects: ApiObjects) -> list[str]:
    """envFrom keys that are no valid variable names (the kubelet skips them with an event)."""
    try:
        return _env_from(container, objects, "")[1]
    except EnvError:
        return []
