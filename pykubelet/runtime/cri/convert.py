"""The CRI (runtime.v1) as the remote runtime speaks it: the configs of sandboxes and containers,
their resources and OOM score as the kubelet sets them, and what a status or a listing means.
Pure functions over the generated messages, unit-tested without a runtime.

Identity: the sandbox and every container carry labels naming the pod (UID, name, namespace)
and, for a container, its name, attempt and spec hash, so the runtime alone says what runs;
LABEL_MANAGED marks what this agent created (a runtime may also run another kubelet's pods).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from pykubelet.api import qos
from pykubelet.api.model import Pod
from pykubelet.api.quantity import to_bytes, to_millicpu
from pykubelet.runtime.base import (
    LABEL_ATTEMPT,
    LABEL_CONTAINER_NAME,
    LABEL_POD_NAME,
    LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
    LABEL_SPEC_HASH,
    ContainerConfig,
    ContainerRunState,
    SandboxConfig,
    StartError,
)
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.resources import CPU_PERIOD, cpu_quota, cpu_shares, request_milli_cpu
from pykubelet.runtime.sandbox.engine import ContainerEntry, SandboxEntry
from pykubelet.runtime.sandbox.naming import pod_hostname
from pykubelet.runtime.termination import ANNOTATION_PATH, ANNOTATION_POLICY

LABEL_MANAGED = "io.pykubelet.managed"

_STATES = {
    api.CONTAINER_CREATED: ContainerRunState.CREATED,
    api.CONTAINER_RUNNING: ContainerRunState.RUNNING,
    api.CONTAINER_EXITED: ContainerRunState.EXITED,
    api.CONTAINER_UNKNOWN: ContainerRunState.UNKNOWN,
}


def _time(ns: int) -> datetime | None:
    return datetime.fromtimestamp(ns / 1e9, UTC) if ns > 0 else None


def _now() -> datetime:
    return datetime.now(UTC)


def ours(labels: Any) -> bool:
    return labels.get(LABEL_MANAGED) == "true" and bool(labels.get(LABEL_POD_UID))


def container_state(state: api.ContainerState) -> ContainerRunState:
    return _STATES.get(state, ContainerRunState.UNKNOWN)


def sandbox_state(state: api.PodSandboxState) -> ContainerRunState:
    """A sandbox is RUNNING when ready; a CRI sandbox is never merely created."""
    return ContainerRunState.RUNNING if state == api.SANDBOX_READY else ContainerRunState.EXITED


# --- requests -----------------------------------------------------------------------------------


def _wants_privileged(pod: Pod) -> bool:
    """A runtime refuses a privileged container in a sandbox not created for one."""
    return any(
        c.security_context is not None and bool(c.security_context.privileged)
        for c in pod.all_containers()
    )


def sandbox_config(
    pod: Pod, attempt: int, log_directory: str, config: SandboxConfig | None = None
) -> Any:
    """The PodSandboxConfig, with the hostname and DNSConfig of `config` (the runtime writes
    the sandbox's /etc/hostname and /etc/resolv.conf from them)."""
    meta = pod.metadata
    host_network = bool(pod.spec.host_network)
    if config is None:
        hostname = "" if host_network else pod_hostname(pod)
        dns = None
    else:
        hostname = config.hostname or ""
        dns = (
            api.DNSConfig(
                servers=config.dns.servers,
                searches=config.dns.searches,
                options=config.dns.options,
            )
            if config.dns
            else None
        )
    ports = []
    for spec in [*pod.spec.init_containers, *pod.spec.containers]:
        for port in spec.ports:
            if not port.host_port:
                continue
            ports.append(
                api.PortMapping(
                    protocol=port.protocol.upper(),
                    container_port=port.container_port,
                    host_port=port.host_port,
                    host_ip=port.host_ip or "",
                )
            )
    return api.PodSandboxConfig(
        metadata=api.PodSandboxMetadata(
            name=meta.name, uid=pod.uid, namespace=meta.namespace, attempt=attempt
        ),
        hostname=hostname,
        log_directory=log_directory,
        dns_config=dns,
        port_mappings=ports,
        labels={
            LABEL_MANAGED: "true",
            LABEL_POD_UID: pod.uid,
            LABEL_POD_NAME: meta.name,
            LABEL_POD_NAMESPACE: meta.namespace,
        },
        linux=api.LinuxPodSandboxConfig(
            security_context=api.LinuxSandboxSecurityContext(
                namespace_options=api.NamespaceOption(
                    network=api.NODE if host_network else api.POD,
                    pid=api.CONTAINER,
                    ipc=api.POD,
                ),
                privileged=_wants_privileged(pod),
            )
        ),
    )


def container_config(pod: Pod, config: ContainerConfig, memory_capacity: int) -> Any:
    """The ContainerConfig of CreateContainer; StartError if the resources cannot be read."""
    meta = pod.metadata
    env: dict[str, str] = {}
    for key, value in config.env:
        env[key] = value  # the last value wins, at the first position, as the kubelet does
    try:
        resources = linux_resources(config.limits, config.requests)
        resources.oom_score_adj = oom_score_adj(pod, config, memory_capacity)
    except ValueError as e:
        raise StartError("CreateContainerConfigError", str(e)) from None
    security = api.LinuxContainerSecurityContext(
        privileged=config.privileged,
        namespace_options=api.NamespaceOption(
            network=api.NODE if pod.spec.host_network else api.POD,
            # An ephemeral container's targetContainerName: the target's PID namespace.
            pid=api.TARGET if config.target_container_id else api.CONTAINER,
            ipc=api.POD,
            target_id=config.target_container_id or "",
        ),
        readonly_rootfs=config.read_only_root_filesystem,
        supplemental_groups=config.supplemental_groups,
    )
    if config.run_as_user is not None:
        security.run_as_user.value = config.run_as_user
    if config.run_as_group is not None:
        security.run_as_group.value = config.run_as_group
    return api.ContainerConfig(
        metadata=api.ContainerMetadata(name=config.name, attempt=config.attempt),
        image=api.ImageSpec(image=config.image),
        command=config.command,
        args=config.args,
        working_dir=config.working_dir or "",
        envs=[api.KeyValue(key=k, value=v) for k, v in env.items()],
        mounts=[
            api.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.read_only)
            for m in config.mounts
        ],
        labels={
            LABEL_MANAGED: "true",
            LABEL_POD_UID: pod.uid,
            LABEL_POD_NAME: meta.name,
            LABEL_POD_NAMESPACE: meta.namespace,
            LABEL_CONTAINER_NAME: config.name,
            LABEL_ATTEMPT: str(config.attempt),
            LABEL_SPEC_HASH: config.spec_hash,
        },
        # As the kubelet's: the runtime keeps them, the kubelet reads them back at the exit.
        annotations={
            ANNOTATION_PATH: config.termination_message_path,
            ANNOTATION_POLICY: config.termination_message_policy,
        },
        log_path=f"{config.name}/{config.attempt}.log",
        stdin=config.stdin,
        stdin_once=config.stdin_once,
        tty=config.tty,
        linux=api.LinuxContainerConfig(resources=resources, security_context=security),
    )


def linux_resources(limits: dict[str, str], requests: dict[str, str]) -> Any:
    """LinuxContainerResources as the kubelet fills them: CPU limit → CFS quota over a 100 ms
    period, CPU request (the limit when there is none) → shares, memory limit → bytes (memory
    and swap)."""
    res = api.LinuxContainerResources()
    cpu_limit = limits.get("cpu")
    res.cpu_shares = cpu_shares(request_milli_cpu(limits, requests))  # BestEffort: 2
    if cpu_limit is not None:
        res.cpu_period = CPU_PERIOD
        res.cpu_quota = cpu_quota(to_millicpu(cpu_limit))
    memory = limits.get("memory")
    if memory is not None:
        res.memory_limit_in_bytes = to_bytes(memory)
        # No swap beyond the limit (the kubelet's NoSwap): else the limit only pushes to swap.
        res.memory_swap_limit_in_bytes = res.memory_limit_in_bytes
    return res


def oom_score_adj(pod: Pod, config: ContainerConfig, memory_capacity: int) -> int:
    """The kubelet's OOM score of one container (api/qos.py): by the pod's QoS class, and for a
    Burstable one by the share of the node's memory it requests (its limit if it requests
    none)."""
    request = config.requests.get("memory", config.limits.get("memory"))
    memory = to_bytes(request) if request is not None else 0
    return qos.oom_score_adj(qos.qos_class(pod), memory, memory_capacity)


# --- answers ------------------------------------------------------------------------------------


def listed(
    items: Iterable[Any], state: Callable[[Any], ContainerRunState]
) -> dict[str, ContainerRunState]:
    """id → state of the listed sandboxes or containers that are ours."""
    return {item.id: state(item.state) for item in items if ours(item.labels)}


def host_network_of(status: Any) -> bool:
    return bool(status.linux.namespaces.options.network == api.NODE)


def sandbox_entry(id: str, status: Any, ip: str | None) -> SandboxEntry | None:
    """A PodSandboxStatus as the cache keeps it; None if not ours."""
    labels = status.labels
    if not ours(labels):
        return None
    return SandboxEntry(
        id=id,
        pod_uid=labels[LABEL_POD_UID],
        pod_name=labels.get(LABEL_POD_NAME, status.metadata.name),
        pod_namespace=labels.get(LABEL_POD_NAMESPACE, status.metadata.namespace),
        attempt=int(status.metadata.attempt),
        state=sandbox_state(status.state),
        ip=ip,
        created_at=_time(status.created_at) or _now(),
    )


def container_entry(id: str, reply: Any) -> ContainerEntry | None:
    """A ContainerStatusResponse (verbose) as the cache keeps it; None if not ours."""
    st = reply.status
    labels = dict(st.labels)
    if not ours(labels):
        return None
    state = container_state(st.state)
    info: Any = {}
    with contextlib.suppress(ValueError, TypeError):
        info = json.loads(reply.info.get("info", "{}")) or {}
    pid = info.get("pid") if isinstance(info, dict) else None
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, st.metadata.attempt))
    except ValueError:
        attempt = int(st.metadata.attempt)
    exited = state is ContainerRunState.EXITED
    annotations = dict(st.annotations)
    message_path = annotations.get(ANNOTATION_PATH, "")
    # The first mount at the path, as the kubelet's getTerminationMessage looks.
    bound = [m.host_path for m in st.mounts if message_path and m.container_path == message_path]
    return ContainerEntry(
        id=id,
        pod_uid=labels[LABEL_POD_UID],
        pod_name=labels.get(LABEL_POD_NAME, ""),
        pod_namespace=labels.get(LABEL_POD_NAMESPACE, ""),
        name=labels.get(LABEL_CONTAINER_NAME, st.metadata.name),
        attempt=attempt,
        spec_hash=labels.get(LABEL_SPEC_HASH, ""),
        # The digest reference, what the kubelet reports as imageID.
        image=st.image_ref or st.image.image,
        image_id=st.image_ref,
        state=state,
        created_at=_time(st.created_at) or _now(),
        started_at=_time(st.started_at),
        finished_at=_time(st.finished_at) if exited else None,
        exit_code=int(st.exit_code) if exited else None,
        oom_killed=st.reason == "OOMKilled",
        message=st.message,
        log_path=st.log_path,
        termination_message_path=message_path,
        termination_message_policy=annotations.get(ANNOTATION_POLICY, ""),
        termination_file=bound[0] if bound else "",
        pid=pid
        if isinstance(pid, int) and pid > 0 and state is ContainerRunState.RUNNING
        else None,
    )


def sandbox_netns_path(info: Any) -> str | None:
    """The network namespace in a sandbox's verbose info: the runtime spec's path for it (the
    namespace the runtime bind-mounted), else its pid's; None if neither is there."""
    if not isinstance(info, dict):
        return None
    spec = info.get("runtimeSpec")
    linux = spec.get("linux") if isinstance(spec, dict) else None
    namespaces = linux.get("namespaces") if isinstance(linux, dict) else None
    for namespace in namespaces if isinstance(namespaces, list) else []:
        if (
            isinstance(namespace, dict)
            and namespace.get("type") == "network"
            and namespace.get("path")
        ):
            return str(namespace["path"])
    pid = info.get("pid")
    if isinstance(pid, int) and pid > 0:
        return f"/proc/{pid}/ns/net"
    return None
