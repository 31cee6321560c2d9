"""The Docker Engine API as the docker runtime speaks it: the create requests of sandboxes and
containers, what an inspect result or a listing means, the multiplexed log stream. Pure
functions and data, unit-tested without an engine; the calls are in client.py and engine.py."""

from __future__ import annotations

import re
import struct
from datetime import UTC, datetime
from typing import Any

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
    Mount,
    SandboxConfig,
    StartError,
)
from pykubelet.runtime.docker.security import container_security, sandbox_sysctls
from pykubelet.runtime.logfiles import parse_time as parse_record_time
from pykubelet.runtime.resources import CPU_PERIOD, cpu_quota, cpu_shares, request_milli_cpu
from pykubelet.runtime.sandbox.engine import ContainerEntry, Kind, Listing, SandboxEntry
from pykubelet.runtime.sandbox.naming import pod_hostname
from pykubelet.runtime.termination import ANNOTATION_PATH, ANNOTATION_POLICY

# The labels of the kubelet's Docker integration (dockershim), beside those of base.py.
LABEL_TYPE = "io.kubernetes.docker.type"
LABEL_SANDBOX_ID = "io.kubernetes.sandbox.id"
LABEL_GRACE = "io.kubernetes.pod.terminationGracePeriod"
TYPE_SANDBOX = "podsandbox"
TYPE_CONTAINER = "container"
SANDBOX_NAME = "POD"

_RUN_STATES = {
    "running": ContainerRunState.RUNNING,
    "paused": ContainerRunState.RUNNING,
    "restarting": ContainerRunState.RUNNING,
    "stopping": ContainerRunState.RUNNING,
    "created": ContainerRunState.CREATED,
    "configured": ContainerRunState.CREATED,
    "initialized": ContainerRunState.CREATED,
    "exited": ContainerRunState.EXITED,
    "stopped": ContainerRunState.EXITED,
    "dead": ContainerRunState.EXITED,
    "removing": ContainerRunState.EXITED,
}


def _now() -> datetime:
    return datetime.now(UTC)


# --- request bodies and parsing -----------------------------------------------------------------


def resource_limits(
    limits: dict[str, str], requests: dict[str, str] | None = None
) -> dict[str, int]:
    """The HostConfig fields for a container's resources, as the kubelet sets them."""
    out: dict[str, int] = {}
    memory = limits.get("memory")
    if memory is not None:
        value = to_bytes(memory)
        # No swap beyond the limit: what the kubelet does, and what makes the limit a limit.
        out["Memory"] = value
        out["MemorySwap"] = value
    cpu = limits.get("cpu")
    if cpu is not None:
        milli = to_millicpu(cpu)
        out["CpuPeriod"] = CPU_PERIOD
        out["CpuQuota"] = cpu_quota(milli)
    if cpu is not None or "cpu" in (requests or {}):
        out["CpuShares"] = cpu_shares(request_milli_cpu(limits, requests or {}))
    return out


def security_fields(config: ContainerConfig, pids_limit: int) -> dict[str, Any]:
    """HostConfig/config fields for mounts, the securityContext and the pids limit, as the
    kubelet's Docker integration set them. Keys prefixed "HostConfig." go into HostConfig."""
    out: dict[str, Any] = {}
    binds = []
    mounts = list(config.mounts)
    if config.resolv_conf is not None:
        # The pod's resolv.conf, as the kubelet's Docker integration rewrote the sandbox's.
        mounts.append(Mount(config.resolv_conf, "/etc/resolv.conf", read_only=False))
    for m in mounts:
        for path in (m.host_path, m.container_path):
            if not path.startswith("/") or ":" in path:
                raise StartError(
                    "CreateContainerConfigError",
                    f"mount {m.host_path} -> {m.container_path}: {path!r} must be an absolute "
                    "path without ':' for the docker runtime",
                )
        binds.append(f"{m.host_path}:{m.container_path}" + (":ro" if m.read_only else ""))
    if binds:
        out["HostConfig.Binds"] = binds
    if config.run_as_user is not None:
        user = str(config.run_as_user)
        if config.run_as_group is not None:
            user += f":{config.run_as_group}"
        out["User"] = user
    elif config.run_as_group is not None:
        raise StartError(
            "CreateContainerConfigError", "runAsGroup is specified without a runAsUser"
        )
    if config.supplemental_groups:
        out["HostConfig.GroupAdd"] = [str(g) for g in config.supplemental_groups]
    if config.read_only_root_filesystem:
        out["HostConfig.ReadonlyRootfs"] = True
    if config.privileged:
        out["HostConfig.Privileged"] = True
    if pids_limit > 0:
        out["HostConfig.PidsLimit"] = pids_limit
    return out


def container_name(kind_name: str, pod: Pod, attempt: int) -> str:
    meta = pod.metadata
    return f"k8s_{kind_name}_{meta.name}_{meta.namespace}_{pod.uid}_{attempt}"


def _labels(pod: Pod, kind: str, name: str, attempt: int) -> dict[str, str]:
    return {
        LABEL_TYPE: kind,
        LABEL_POD_UID: pod.uid,
        LABEL_POD_NAME: pod.metadata.name,
        LABEL_POD_NAMESPACE: pod.metadata.namespace,
        LABEL_CONTAINER_NAME: name,
        LABEL_ATTEMPT: str(attempt),
        LABEL_GRACE: str(pod.spec.termination_grace_period_seconds),
    }


def sandbox_body(
    pod: Pod, image: str, attempt: int, config: SandboxConfig | None = None
) -> dict[str, Any]:
    """The create request of a pod's infra container, which owns its namespaces and ports, with
    the hostname of `config` (its DNS reaches each container as a bind: container_body)."""
    host_config: dict[str, Any] = {"RestartPolicy": {"Name": "no"}}
    body: dict[str, Any] = {
        "Image": image,
        "Labels": _labels(pod, TYPE_SANDBOX, SANDBOX_NAME, attempt),
        "HostConfig": host_config,
    }
    if sysctls := sandbox_sysctls(pod):
        host_config["Sysctls"] = sysctls
    if pod.spec.host_network:
        host_config["NetworkMode"] = "host"
        host_config["UTSMode"] = "host"
        host_config["IpcMode"] = "shareable"
        return body
    hostname = config.hostname if config is not None else None
    body["Hostname"] = hostname or pod_hostname(pod)
    # Docker lets others join the IPC namespace only of a container created "shareable".
    host_config["IpcMode"] = "shareable"
    exposed: dict[str, dict[str, Any]] = {}
    bindings: dict[str, list[dict[str, str]]] = {}
    for spec in [*pod.spec.init_containers, *pod.spec.containers]:
        for port in spec.ports:
            if not port.host_port:
                continue
            key = f"{port.container_port}/{port.protocol.lower()}"
            exposed[key] = {}
            bindings.setdefault(key, []).append(
                {"HostIp": port.host_ip or "", "HostPort": str(port.host_port)}
            )
    if bindings:
        body["ExposedPorts"] = exposed
        host_config["PortBindings"] = bindings
    return body


def container_body(
    pod: Pod, sandbox_id: str, config: ContainerConfig, *, podman: bool, pids_limit: int = -1
) -> dict[str, Any]:
    """The create request of one container, joined to the pod's infra container."""
    join = f"container:{sandbox_id}"
    host_config: dict[str, Any] = {
        "NetworkMode": join,
        "IpcMode": join,
        "RestartPolicy": {"Name": "no"},
    }
    # Docker joins the UTS namespace along with the network one (and rejects a "container:"
    # UTS mode); Podman does not, and needs it asked for.
    if podman:
        host_config["UTSMode"] = join
    if config.target_container_id:
        # An ephemeral container's targetContainerName: it sees the target's processes.
        host_config["PidMode"] = f"container:{config.target_container_id}"
    try:
        host_config.update(resource_limits(config.limits, config.requests))
    except ValueError as e:
        raise StartError("CreateContainerConfigError", str(e)) from None
    env: dict[str, str] = {}
    for key, value in config.env:
        env[key] = value  # the last value wins, at the first position, as the kubelet does
    labels = _labels(pod, TYPE_CONTAINER, config.name, config.attempt)
    labels[LABEL_SPEC_HASH] = config.spec_hash
    labels[LABEL_SANDBOX_ID] = sandbox_id
    labels[ANNOTATION_PATH] = config.termination_message_path
    labels[ANNOTATION_POLICY] = config.termination_message_policy
    body: dict[str, Any] = {
        "Image": config.image,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": labels,
        "HostConfig": host_config,
    }
    # Kubernetes semantics: a command replaces the image's entrypoint *and* its cmd; args alone
    # replace only the cmd. The engines do the same when Entrypoint is given without Cmd.
    if config.command:
        body["Entrypoint"] = config.command
        body["Cmd"] = config.args
    elif config.args:
        body["Cmd"] = config.args
    if config.working_dir:
        body["WorkingDir"] = config.working_dir
    if config.stdin or config.tty:
        # As the kubelet's docker integration: stdin kept open for attaches, closed after the
        # first one ends with StdinOnce; a terminal with Tty.
        body.update(OpenStdin=config.stdin, StdinOnce=config.stdin_once, Tty=config.tty)
    for key, value in security_fields(config, pids_limit).items():
        if key.startswith("HostConfig."):
            host_config[key.removeprefix("HostConfig.")] = value
        else:
            body[key] = value
    host_config.update(container_security(config, podman=podman))
    return body


class LogDemuxer:
    """The engine's multiplexed log stream (8-byte frame headers) as the bytes written, in order.

    Fed chunks as they arrive: a frame may be split anywhere across chunks. With `retime` each
    frame starts with its record's time (the engine's `timestamps`: RFC3339Nano on Docker,
    whole seconds on Podman 4.3), rewritten as the kubelet prints it (nine digits); a TTY
    container's stream has no frames and is passed as the engine wrote it.
    """

    def __init__(self, tty: bool = False, *, retime: bool = False) -> None:
        self._tty = tty
        self._retime = retime
        self._buf = bytearray()

    def feed(self, data: bytes) -> bytes:
        if self._tty:
            return data
        self._buf += data
        out = bytearray()
        while len(self._buf) >= 8:
            stream, size = struct.unpack(">BxxxL", self._buf[:8])
            if stream not in (0, 1, 2):
                # Not a multiplexed stream after all (a TTY container): pass it through.
                self._tty = True
                out += self._buf
                self._buf.clear()
                break
            if len(self._buf) < 8 + size:
                break
            frame = bytes(self._buf[8 : 8 + size])
            out += _retimed(frame) if self._retime else frame
            del self._buf[: 8 + size]
        return bytes(out)


def _retimed(frame: bytes) -> bytes:
    head, sep, rest = frame.partition(b" ")
    parsed = parse_record_time(head) if sep else None
    return frame if parsed is None else parsed[1] + b" " + rest


def tail_offset(data: bytes, lines: int) -> int:
    """Where the last `lines` lines of `data` begin; a final newline ends the last line."""
    if lines <= 0:
        return len(data)
    pos = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(lines):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1


_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(text: str | None) -> datetime | None:
    """An engine timestamp (RFC 3339 with nanoseconds); None for Go's zero time."""
    if not text or text.startswith("0001-01-01"):
        return None
    cleaned = _FRACTION.sub(r"\1", text.strip()).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(cleaned)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def run_state(status: str) -> ContainerRunState:
    return _RUN_STATES.get(status.lower(), ContainerRunState.UNKNOWN)


# --- what a listing, an inspect and an event say ------------------------------------------------


def listing_rows(rows: list[dict[str, Any]]) -> Listing:
    """A container list: infra containers are sandboxes, the rest the pods' containers."""
    listing = Listing()
    for row in rows:
        table = (
            listing.sandboxes
            if (row.get("Labels") or {}).get(LABEL_TYPE) == TYPE_SANDBOX
            else listing.containers
        )
        table[str(row["Id"])] = run_state(str(row.get("State", "")))
    return listing


def parse_inspect(info: dict[str, Any], node_ip: str) -> SandboxEntry | ContainerEntry | None:
    """An inspect result as the cache keeps it; None if the container is not one of ours."""
    config = info.get("Config") or {}
    labels: dict[str, str] = config.get("Labels") or {}
    kind = labels.get(LABEL_TYPE)
    uid = labels.get(LABEL_POD_UID)
    if kind not in (TYPE_SANDBOX, TYPE_CONTAINER) or not uid:
        return None
    state_info = info.get("State") or {}
    state = run_state(str(state_info.get("Status", "")))
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, "0"))
    except ValueError:
        attempt = 0
    exited = state is ContainerRunState.EXITED
    exit_code = state_info.get("ExitCode")
    code = int(exit_code) if exited and isinstance(exit_code, int) else None
    created_at = parse_time(info.get("Created")) or _now()
    if kind == TYPE_SANDBOX:
        return SandboxEntry(
            id=str(info["Id"]),
            pod_uid=uid,
            pod_name=labels.get(LABEL_POD_NAME, ""),
            pod_namespace=labels.get(LABEL_POD_NAMESPACE, ""),
            attempt=attempt,
            state=state,
            ip=_ip_of(info, node_ip),
            created_at=created_at,
            exit_code=code,
        )
    pid = state_info.get("Pid")
    message_path = labels.get(ANNOTATION_PATH, "")
    return ContainerEntry(
        id=str(info["Id"]),
        pod_uid=uid,
        pod_name=labels.get(LABEL_POD_NAME, ""),
        pod_namespace=labels.get(LABEL_POD_NAMESPACE, ""),
        name=labels.get(LABEL_CONTAINER_NAME, ""),
        attempt=attempt,
        spec_hash=labels.get(LABEL_SPEC_HASH, ""),
        image=str(config.get("Image") or info.get("Image") or ""),
        state=state,
        created_at=created_at,
        started_at=parse_time(state_info.get("StartedAt")),
        finished_at=(parse_time(state_info.get("FinishedAt")) or _now()) if exited else None,
        exit_code=code,
        oom_killed=bool(state_info.get("OOMKilled")),
        message=str(state_info.get("Error") or ""),
        pid=int(pid)
        if state is ContainerRunState.RUNNING and isinstance(pid, int) and pid > 0
        else None,
        tty=bool(config.get("Tty")),
        image_id=docker_image_id(str(info.get("Image") or "")),
        termination_message_path=message_path,
        termination_message_policy=labels.get(ANNOTATION_POLICY, ""),
        termination_file=_bound_at(info, message_path),
    )


def _bound_at(info: dict[str, Any], path: str) -> str:
    """The host file bound at `path` ("": none), as the kubelet finds it in the mounts."""
    if not path:
        return ""
    for m in info.get("Mounts") or []:
        if isinstance(m, dict) and m.get("Destination") == path:
            return str(m.get("Source") or "")
    return ""


def docker_image_id(image: str, repo_digest: str | None = None) -> str:
    """status.imageID as the kubelet reports it for Docker (dockershim, cri-dockerd): the
    repository digest if the image has one, else the image's ID."""
    if repo_digest:
        return f"docker-pullable://{repo_digest}"
    if not image:
        return ""
    return f"docker://{image if image.startswith('sha256:') else 'sha256:' + image}"


def memory_limit(info: dict[str, Any]) -> int:
    """The container's memory limit in bytes (0: none)."""
    return int((info.get("HostConfig") or {}).get("Memory") or 0)


def _ip_of(info: dict[str, Any], node_ip: str) -> str | None:
    if (info.get("HostConfig") or {}).get("NetworkMode") == "host":
        return node_ip
    settings = info.get("NetworkSettings") or {}
    if settings.get("IPAddress"):
        return str(settings["IPAddress"])
    for network in (settings.get("Networks") or {}).values():
        if network and network.get("IPAddress"):
            return str(network["IPAddress"])
    return None


def event_time_ns(event: dict[str, Any]) -> int | None:
    """When an event happened, on the engine's clock: its timeNano (whole seconds, the `time`
    of old engines, are too coarse to order it against an inspect)."""
    nano = event.get("timeNano")
    return nano if isinstance(nano, int) and nano > 0 else None


def event_kind(attributes: dict[str, Any], by_name: bool) -> Kind | None:
    """What an event's actor is, if the event tells: Docker puts the labels in the attributes;
    Podman (`by_name`) gives only the name, and our names say it (container_name: a container
    of a pod cannot be named POD, which is not a DNS label)."""
    kind = attributes.get(LABEL_TYPE)
    if kind is None and by_name:
        name = str(attributes.get("name") or "")
        if name.startswith(f"k8s_{SANDBOX_NAME}_"):
            kind = TYPE_SANDBOX
        elif name.startswith("k8s_"):
            kind = TYPE_CONTAINER
    if kind == TYPE_SANDBOX:
        return Kind.SANDBOX
    return Kind.CONTAINER if kind == TYPE_CONTAINER else None
