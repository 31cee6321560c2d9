"""Containers through the CRI (`--container-runtime=remote`): containerd, CRI-O, any runtime that
serves Kubernetes' runtime.v1 RuntimeService and ImageService over gRPC, as the kubelet uses them.

A pod is a CRI pod sandbox (RunPodSandbox: the runtime's pause container holds the network, IPC
and UTS namespaces, CNI gives it its IP and host ports); each container is created in it. The
sandbox and every container carry labels naming the pod (UID, name, namespace) and, for a
container, its name, attempt and spec hash, so the runtime alone says what runs: a restarted
agent lists them and adopts them. The CRI reserves the name of each (sandbox attempt) and
(container name, attempt) within a sandbox, so an interrupted start cannot leave a second
instance of the same attempt.

Reads are served from a cache. `list_pods` lists sandboxes and containers (two cheap calls) and
asks the status only of those whose state differs from the cache; a poller does the same every
POLL_INTERVAL and tells the listeners which pods changed (containerd 1.6 does not implement
GetContainerEvents; where a runtime streams container events, they trigger the same relist at
once). Our own operations refresh what they touched before returning.

Logs are files the runtime writes under --root-dir/pods/<namespace>_<name>_<uid>/<container>/
<attempt>.log in the CRI log format (cri_log.py); they are read from there, off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
from collections.abc import AsyncGenerator, Awaitable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pykubelet.api.model import Pod
from pykubelet.api.quantity import to_bytes, to_millicpu
from pykubelet.runtime.base import (
    LABEL_ATTEMPT,
    LABEL_CONTAINER_NAME,
    LABEL_POD_NAME,
    LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
    LABEL_SPEC_HASH,
    MAX_EXEC_OUTPUT,
    ChangeListener,
    ContainerConfig,
    ContainerRunState,
    ExecResult,
    RuntimeContainer,
    RuntimeFailure,
    RuntimePod,
    RuntimeSandbox,
    SharedPulls,
    StartError,
    ensure_image,
)
from pykubelet.runtime.cri.log import CriLogDecoder, decode_records, tail_start
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.docker.engine import normalize_endpoint, pod_hostname
from pykubelet.runtime.resources import CPU_PERIOD, cpu_quota, cpu_shares, request_milli_cpu

log = logging.getLogger(__name__)

NAME = "remote"
DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"

# Only what this agent created: a runtime may also run another kubelet's pods.
LABEL_MANAGED = "io.pykubelet.managed"

CALL_TIMEOUT = 120.0  # one ordinary call (the kubelet's default --runtime-request-timeout: 2m)
CONNECT_TIMEOUT = 10.0
STOP_SLACK = 30.0  # beyond the grace period, for the runtime to kill and reap
EXEC_SLACK = 10.0
PULL_TIMEOUT = 600.0
POLL_INTERVAL = 1.0
EVENTS_RETRY = 5.0
FOLLOW_INTERVAL = 0.2
MAX_MESSAGE = 16 * 1024 * 1024  # the kubelet's limit for CRI messages
REFRESH_CONCURRENCY = 8

# The kubelet's OOM score adjustments per QoS class (pkg/kubelet/qos).
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000

_STATES = {
    api.CONTAINER_CREATED: ContainerRunState.CREATED,
    api.CONTAINER_RUNNING: ContainerRunState.RUNNING,
    api.CONTAINER_EXITED: ContainerRunState.EXITED,
    api.CONTAINER_UNKNOWN: ContainerRunState.UNKNOWN,
}

T = TypeVar("T")


def _time(ns: int) -> datetime | None:
    return datetime.fromtimestamp(ns / 1e9, UTC) if ns > 0 else None


def _now() -> datetime:
    return datetime.now(UTC)


class CriError(Exception):
    """The runtime answered a call with an error status."""

    def __init__(self, call: str, code: str, details: str) -> None:
        super().__init__(f"{call}: {code}: {details}")
        self.call = call
        self.code = code
        self.details = details

    @property
    def not_found(self) -> bool:
        return self.code == "NOT_FOUND" or "not found" in self.details

    @property
    def unimplemented(self) -> bool:
        return self.code == "UNIMPLEMENTED"


# --- the gRPC client ----------------------------------------------------------------------------


class CriClient:
    """The calls we make, typed, over one grpc.aio channel. grpc has no type hints; everything
    untyped stays in here."""

    def __init__(self, endpoint: str) -> None:
        import grpc  # type: ignore[import-untyped]

        self.endpoint = endpoint
        self._grpc: Any = grpc
        self._channel: Any = grpc.aio.insecure_channel(
            normalize_endpoint(endpoint),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
        )
        self._methods: dict[str, Any] = {}

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._channel.channel_ready(), seconds)
        except TimeoutError:
            raise RuntimeFailure(
                f"cannot reach the container runtime at {self.endpoint}: no connection in "
                f"{seconds:g}s"
            ) from None

    def _method(self, service: str, name: str, response: type[Any], stream: bool) -> Any:
        key = f"/runtime.v1.{service}/{name}"
        method = self._methods.get(key)
        if method is None:
            make = self._channel.unary_stream if stream else self._channel.unary_unary
            method = make(
                key,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response.FromString,
            )
            self._methods[key] = method
        return method

    async def call(
        self,
        name: str,
        request: Any,
        response: type[T],
        deadline: float = CALL_TIMEOUT,
        service: str = "RuntimeService",
    ) -> T:
        method = self._method(service, name, response, stream=False)
        with self._errors(name):
            result: T = await method(request, timeout=deadline)
            return result

    async def stream(self, name: str, request: Any, response: type[T]) -> AsyncGenerator[T, None]:
        method = self._method("RuntimeService", name, response, stream=True)
        with self._errors(name):
            async for item in method(request):
                yield item

    @contextlib.contextmanager
    def _errors(self, call: str) -> Iterator[None]:
        grpc = self._grpc
        try:
            yield
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise RuntimeFailure(
                    f"cannot reach the container runtime at {self.endpoint} ({call}): {e.details()}"
                ) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"{call}: no answer from {self.endpoint} in time") from None
            raise CriError(call, code.name, e.details() or "") from None


def _unix_socket_path(endpoint: str) -> str | None:
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://") :]
    return endpoint if endpoint.startswith("/") else None


# --- the cache ----------------------------------------------------------------------------------


@dataclass
class _Sandbox:
    id: str
    uid: str
    name: str
    namespace: str
    attempt: int
    ready: bool
    ip: str | None
    created_at: datetime
    seq: int = 0  # when it was last read: what a relist started earlier did not see stays


@dataclass
class _Container:
    id: str
    sandbox_id: str
    uid: str
    pod_name: str
    pod_namespace: str
    name: str
    attempt: int
    spec_hash: str
    image: str
    state: ContainerRunState
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    log_path: str = ""
    pid: int | None = None
    seq: int = 0
    labels: dict[str, str] = field(default_factory=dict)


def _wants_privileged(pod: Pod) -> bool:
    """A runtime refuses a privileged container in a sandbox not created for one."""
    return any(
        c.security_context is not None and bool(c.security_context.privileged)
        for c in pod.all_containers()
    )


def _ours(labels: Any) -> bool:
    return labels.get(LABEL_MANAGED) == "true" and bool(labels.get(LABEL_POD_UID))


# --- the runtime --------------------------------------------------------------------------------


class CriRuntime:
    """The Runtime protocol over the CRI."""

    name = NAME

    def __init__(
        self,
        endpoint: str,
        infra_image: str,
        root_dir: Path,
        node_ip: str = "127.0.0.1",
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.endpoint = endpoint
        self.infra_image = infra_image
        self.root_dir = root_dir
        self.node_ip = node_ip
        self.poll_interval = poll_interval
        self.runtime_version = ""
        self._client: CriClient | None = None
        self._sandboxes: dict[str, _Sandbox] = {}
        self._containers: dict[str, _Container] = {}
        self._seq = 0
        self._listeners: list[ChangeListener] = []
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._pulls = SharedPulls(self._do_pull)
        self._resync_task: asyncio.Task[set[str]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._host_network: set[str] = set()  # sandbox ids in the node's network namespace
        self.memory_capacity = 0  # bytes, for the OOM score of burstable containers

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        try:
            self._client = CriClient(self.endpoint)
        except ValueError as e:
            raise RuntimeFailure(f"bad container runtime endpoint {self.endpoint!r}: {e}") from e
        self.memory_capacity = await asyncio.to_thread(_memory_capacity)
        try:
            socket = _unix_socket_path(self.endpoint)
            if socket is not None and not await asyncio.to_thread(os.path.exists, socket):
                # grpc would retry to connect until CONNECT_TIMEOUT: say it at once.
                raise RuntimeFailure(
                    f"cannot reach the container runtime at {self.endpoint}: {socket} does not "
                    "exist (is the runtime running?)"
                )
            await self._client.wait_ready(CONNECT_TIMEOUT)
            version = await self._call(
                "Version", api.VersionRequest(version="v1"), api.VersionResponse
            )
            self.runtime_version = f"{version.runtime_name} {version.runtime_version}"
            log.info(
                "container runtime at %s: %s (CRI %s)",
                self.endpoint,
                self.runtime_version,
                version.runtime_api_version,
            )
            await self._check_status()
            await self._resync()
            await self._drop_never_started()
        except CriError as e:
            await self.close()
            raise RuntimeFailure(f"{self.endpoint} does not answer as a CRI v1 runtime: {e}") from e
        except BaseException:
            await self.close()
            raise
        for c in self._containers.values():
            if c.state is ContainerRunState.RUNNING:
                log.info(
                    "adopted container %s of pod %s/%s (%s)",
                    c.name,
                    c.pod_namespace,
                    c.pod_name,
                    c.id[:12],
                )
        self._tasks.append(asyncio.create_task(self._poll(), name="cri-poll"))
        self._tasks.append(asyncio.create_task(self._watch_events(), name="cri-events"))

    async def _check_status(self) -> None:
        status = await self._call("Status", api.StatusRequest(verbose=True), api.StatusResponse)
        for cond in status.status.conditions:
            if not cond.status:
                log.warning(
                    "container runtime condition %s is false: %s %s",
                    cond.type,
                    cond.reason,
                    cond.message,
                )
        # containerd runs its own configured sandbox image, whatever the kubelet asks for.
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            config = json.loads(status.info.get("config", "{}"))
            configured = config.get("sandboxImage")
            if configured and configured != self.infra_image:
                log.warning(
                    "the runtime's sandbox image is %s, not --pod-infra-container-image %s",
                    configured,
                    self.infra_image,
                )

    async def close(self) -> None:
        """Stop polling; the containers keep running and the next start() adopts them."""
        tasks: list[asyncio.Task[Any]] = [*self._tasks, *self._pulls.cancel()]
        if self._resync_task is not None:
            tasks.append(self._resync_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._resync_task = None
        self._sandboxes.clear()
        self._containers.clear()
        if self._client is not None:
            await self._client.close()
            self._client = None

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # --- queries --------------------------------------------------------------------------------

    async def list_pods(self) -> list[RuntimePod]:
        await self._resync()
        return [pod for _, pod in sorted(self._pods().items())]

    async def get_pod(self, uid: str) -> RuntimePod | None:
        return self._pods(uid).get(uid)

    # --- logs -----------------------------------------------------------------------------------

    def _log_file(self, container: RuntimeContainer) -> Path | None:
        entry = self._containers.get(container.id)
        if entry is not None and entry.log_path:
            return Path(entry.log_path)
        return None

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> bytes:
        path = self._log_file(container)
        if path is None:
            return b""
        return await asyncio.to_thread(_read_log, path, tail_lines, limit_bytes)

    async def follow_log(
        self, container: RuntimeContainer, tail_lines: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The file so far, then what is appended, until the container has exited and the
        file was read to its end after that."""
        path = self._log_file(container)
        if path is None:
            return
        data, offset = await asyncio.to_thread(_read_whole_records, path, 0)
        start = 0 if tail_lines is None else tail_start(data, tail_lines)
        first = decode_records(data[start:])
        if first:
            yield first
        decoder = CriLogDecoder()
        while True:
            exited = self._has_exited(container.id)
            chunk, offset = await asyncio.to_thread(_read_from, path, offset)
            if chunk:
                out = decoder.feed(chunk)
                if out:
                    yield out
                continue
            if exited:
                return
            await asyncio.sleep(FOLLOW_INTERVAL)

    def _has_exited(self, cid: str) -> bool:
        entry = self._containers.get(cid)
        return entry is None or entry.state is ContainerRunState.EXITED

    # --- exec -----------------------------------------------------------------------------------

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        """ExecSync: the runtime runs the command with the container's environment (so `env`
        is not needed) and kills it at the timeout."""
        entry = self._containers.get(container.id)
        if entry is None or entry.state is not ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {container.name} is not running")
        what = f"{command[0]!r} in container {container.name}" if command else "nothing"
        seconds = max(math.ceil(timeout_seconds), 1)
        try:
            reply = await self._call(
                "ExecSync",
                api.ExecSyncRequest(container_id=container.id, cmd=command, timeout=seconds),
                api.ExecSyncResponse,
                deadline=timeout_seconds + EXEC_SLACK,
            )
        except TimeoutError:
            return ExecResult(None, b"")
        except CriError as e:
            # containerd: "failed to exec in container: timeout 1s exceeded: context deadline
            # exceeded" when the command outlived its timeout.
            if "timeout" in e.details and "exceeded" in e.details:
                return ExecResult(None, b"")
            raise RuntimeFailure(f"cannot run {what}: {e.details}") from e
        output = (reply.stdout + reply.stderr)[:MAX_EXEC_OUTPUT]
        return ExecResult(int(reply.exit_code), output)

    # --- sandboxes ------------------------------------------------------------------------------

    def _log_dir(self, pod_namespace: str, pod_name: str, uid: str) -> Path:
        # The kubelet's /var/log/pods layout, under the root dir: not in <root>/pods, which
        # holds the pods' volumes by UID.
        return self.root_dir / "logs" / "pods" / f"{pod_namespace}_{pod_name}_{uid}"

    def _sandbox_config(self, pod: Pod, attempt: int) -> Any:
        meta = pod.metadata
        host_network = bool(pod.spec.host_network)
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
            hostname="" if host_network else pod_hostname(pod),
            log_directory=str(self._log_dir(meta.namespace, meta.name, pod.uid)),
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

    async def run_sandbox(self, pod: Pod) -> RuntimeSandbox:
        async with self._pod_lock(pod.uid):
            current = self._sandbox_of(pod.uid)
            if current is not None and current.ready:
                return self._sandbox_view(current)
            attempt = 0
            if current is not None:
                attempt = current.attempt + 1
                await self._retire_sandbox(pod, current)
            await self._ensure_image(self.infra_image, "IfNotPresent", sandbox=True)
            config = self._sandbox_config(pod, attempt)
            await asyncio.to_thread(os.makedirs, config.log_directory, mode=0o755, exist_ok=True)
            try:
                reply = await self._call(
                    "RunPodSandbox",
                    api.RunPodSandboxRequest(config=config),
                    api.RunPodSandboxResponse,
                )
            except (CriError, TimeoutError) as e:
                raise RuntimeFailure(f"cannot run the sandbox of pod {pod.key}: {e}") from e
            sid = reply.pod_sandbox_id
            if pod.spec.host_network:
                self._host_network.add(sid)
            entry = await self._refresh_sandbox(sid)
            if entry is None or not entry.ready:
                raise RuntimeFailure(f"the sandbox of pod {pod.key} is not ready after its start")
            log.info("pod %s: sandbox %s at %s", pod.key, sid[:12], entry.ip or "no IP")
            self._notify(pod.uid)
            return self._sandbox_view(entry)

    async def _retire_sandbox(self, pod: Pod, old: _Sandbox) -> None:
        """The sandbox is not ready (its pause process died, or the node rebooted): its network
        went with it. As the kubelet does, its containers are stopped, and started again in a
        new sandbox; the old one is removed once nothing of it is running."""
        running = [
            c
            for c in self._containers.values()
            if c.sandbox_id == old.id and c.state is not ContainerRunState.EXITED
        ]
        if running:
            log.info(
                "pod %s: its sandbox is not ready; stopping %d container(s)", pod.key, len(running)
            )
        grace = float(pod.spec.termination_grace_period_seconds)
        await asyncio.gather(*(self._stop(c.id, grace) for c in running))
        with contextlib.suppress(CriError, TimeoutError):
            await self._call(
                "StopPodSandbox",
                api.StopPodSandboxRequest(pod_sandbox_id=old.id),
                api.StopPodSandboxResponse,
            )

    async def remove_pod(self, uid: str) -> None:
        async with self._pod_lock(uid):
            try:
                rows = await self._call(
                    "ListPodSandbox",
                    api.ListPodSandboxRequest(
                        filter=api.PodSandboxFilter(label_selector={LABEL_POD_UID: uid})
                    ),
                    api.ListPodSandboxResponse,
                )
            except (CriError, TimeoutError) as e:
                raise RuntimeFailure(f"cannot list the sandboxes of pod {uid}: {e}") from e
            ids = {s.id for s in rows.items if _ours(s.labels)}
            ids |= {s.id for s in self._sandboxes.values() if s.uid == uid}
            names: set[tuple[str, str]] = set()
            for sid in ids:
                entry = self._sandboxes.get(sid)
                if entry is not None:
                    names.add((entry.namespace, entry.name))
                for call, request, response in (
                    ("StopPodSandbox", api.StopPodSandboxRequest, api.StopPodSandboxResponse),
                    ("RemovePodSandbox", api.RemovePodSandboxRequest, api.RemovePodSandboxResponse),
                ):
                    try:
                        await self._call(call, request(pod_sandbox_id=sid), response)
                    except CriError as e:
                        if not e.not_found:
                            raise RuntimeFailure(
                                f"cannot remove the sandbox {sid[:12]} of pod {uid}: {e}"
                            ) from e
                    except TimeoutError as e:
                        raise RuntimeFailure(f"{e} (sandbox {sid[:12]} of pod {uid})") from e
                self._sandboxes.pop(sid, None)
                self._host_network.discard(sid)
            for c in [c for c in self._containers.values() if c.uid == uid]:
                names.add((c.pod_namespace, c.pod_name))
                with contextlib.suppress(CriError, TimeoutError):
                    await self._remove_container_call(c.id)
                self._containers.pop(c.id, None)
            for namespace, name in names:
                await asyncio.to_thread(
                    shutil.rmtree, self._log_dir(namespace, name, uid), ignore_errors=True
                )
        self._pod_locks.pop(uid, None)

    # --- containers -----------------------------------------------------------------------------

    def _container_config(self, pod: Pod, config: ContainerConfig) -> Any:
        meta = pod.metadata
        env: dict[str, str] = {}
        for key, value in config.env:
            env[key] = value  # the last value wins, at the first position, as the kubelet does
        try:
            resources = linux_resources(config.limits, config.requests)
            resources.oom_score_adj = oom_score_adj(pod, config, self.memory_capacity)
        except ValueError as e:
            raise StartError("CreateContainerConfigError", str(e)) from None
        security = api.LinuxContainerSecurityContext(
            privileged=config.privileged,
            namespace_options=api.NamespaceOption(
                network=api.NODE if pod.spec.host_network else api.POD,
                pid=api.CONTAINER,
                ipc=api.POD,
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
                api.Mount(
                    container_path=m.container_path, host_path=m.host_path, readonly=m.read_only
                )
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
            log_path=f"{config.name}/{config.attempt}.log",
            linux=api.LinuxContainerConfig(resources=resources, security_context=security),
        )

    async def start_container(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig
    ) -> RuntimeContainer:
        # Pulled before taking the pod's lock: a slow pull must not hold up its termination.
        await self._ensure_image(config.image, config.image_pull_policy)
        request = self._container_config(pod, config)
        async with self._pod_lock(pod.uid):
            current = self._sandboxes.get(sandbox.id)
            if current is None or current.uid != pod.uid:
                raise RuntimeFailure(f"pod {pod.key} has no sandbox {sandbox.id[:12]}")
            if not current.ready:
                raise RuntimeFailure(f"the sandbox of pod {pod.key} is not ready")
            sandbox_config = self._sandbox_config(pod, current.attempt)
            await asyncio.to_thread(
                os.makedirs,
                Path(sandbox_config.log_directory) / config.name,
                mode=0o755,
                exist_ok=True,
            )
            cid = await self._create(pod, sandbox.id, request, sandbox_config)
            try:
                await self._call(
                    "StartContainer",
                    api.StartContainerRequest(container_id=cid),
                    api.StartContainerResponse,
                )
            except (CriError, TimeoutError) as e:
                # What never ran is not kept: the next attempt reuses the number, as with the
                # other runtimes, and the waiting reason tells what happened.
                with contextlib.suppress(CriError, TimeoutError, RuntimeFailure):
                    await self._remove_container_call(cid)
                self._containers.pop(cid, None)
                message = e.details if isinstance(e, CriError) else str(e)
                raise StartError("RunContainerError", message) from e
            entry = await self._refresh_container(cid)
        if entry is None:
            raise RuntimeFailure(f"container {config.name} of pod {pod.key} vanished at start")
        self._notify(pod.uid)
        return self._container_view(entry)

    async def _create(self, pod: Pod, sandbox_id: str, request: Any, sandbox_config: Any) -> str:
        """CreateContainer; a leftover of the same name and attempt (an interrupted earlier
        try) is removed and the create tried once more."""
        for retry in (True, False):
            try:
                reply = await self._call(
                    "CreateContainer",
                    api.CreateContainerRequest(
                        pod_sandbox_id=sandbox_id, config=request, sandbox_config=sandbox_config
                    ),
                    api.CreateContainerResponse,
                )
                return str(reply.container_id)
            except TimeoutError as e:
                raise StartError("CreateContainerError", str(e)) from e
            except CriError as e:
                leftover = [
                    c.id
                    for c in self._containers.values()
                    if c.sandbox_id == sandbox_id
                    and c.name == request.metadata.name
                    and c.attempt == request.metadata.attempt
                ]
                if not (retry and "reserved" in e.details and leftover):
                    raise StartError("CreateContainerError", e.details) from e
                log.info("pod %s: replacing leftover container %s", pod.key, request.metadata.name)
                for cid in leftover:
                    await self._remove_container_call(cid)
                    self._containers.pop(cid, None)
        raise AssertionError("unreachable")

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        entry = self._containers.get(container.id)
        if entry is not None and entry.state is ContainerRunState.EXITED:
            return
        await self._stop(container.id, grace_seconds)
        self._notify(container.pod_uid)

    async def _stop(self, cid: str, grace_seconds: float) -> None:
        seconds = max(math.ceil(grace_seconds), 0)
        try:
            await self._call(
                "StopContainer",
                api.StopContainerRequest(container_id=cid, timeout=seconds),
                api.StopContainerResponse,
                deadline=seconds + STOP_SLACK,
            )
        except CriError as e:
            if not e.not_found:
                raise RuntimeFailure(f"cannot stop container {cid[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot stop container {cid[:12]}: {e}") from e
        entry = await self._refresh_container(cid)
        if entry is not None and entry.state is ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {cid[:12]} still runs after it was stopped")

    async def remove_container(self, container: RuntimeContainer) -> None:
        entry = self._containers.get(container.id)
        if entry is not None and entry.state is ContainerRunState.RUNNING:
            raise RuntimeFailure(
                f"container {entry.name} of pod {entry.pod_namespace}/{entry.pod_name} is "
                "running: stop it before removing it"
            )
        await self._remove_container_call(container.id)
        gone = self._containers.pop(container.id, None)
        if gone is not None and gone.log_path:
            # The runtime leaves the log file to the kubelet, which removes it with the container.
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.unlink, gone.log_path)

    async def _remove_container_call(self, cid: str) -> None:
        try:
            await self._call(
                "RemoveContainer",
                api.RemoveContainerRequest(container_id=cid),
                api.RemoveContainerResponse,
            )
        except CriError as e:
            if not e.not_found:
                raise RuntimeFailure(f"cannot remove container {cid[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot remove container {cid[:12]}: {e}") from e

    # --- images ---------------------------------------------------------------------------------

    async def _ensure_image(self, image: str, policy: str, sandbox: bool = False) -> None:
        await ensure_image(image, policy, self._image_present, self._pulls.pull, sandbox=sandbox)

    async def _image_present(self, image: str) -> bool:
        try:
            reply = await self._call(
                "ImageStatus",
                api.ImageStatusRequest(image=api.ImageSpec(image=image)),
                api.ImageStatusResponse,
                service="ImageService",
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot ask for the status of image {image}: {e}") from e
        return reply.HasField("image") and bool(reply.image.id)

    async def _do_pull(self, image: str) -> None:
        log.info("pulling image %s", image)
        try:
            await self._call(
                "PullImage",
                api.PullImageRequest(image=api.ImageSpec(image=image)),
                api.PullImageResponse,
                deadline=PULL_TIMEOUT,
                service="ImageService",
            )
        except TimeoutError:
            raise StartError(
                "ErrImagePull", f'failed to pull image "{image}": no result in {PULL_TIMEOUT:g}s'
            ) from None
        except CriError as e:
            raise StartError("ErrImagePull", f'failed to pull image "{image}": {e.details}') from e
        log.info("pulled image %s", image)

    # --- the cache ------------------------------------------------------------------------------

    async def _resync(self) -> set[str]:
        """List sandboxes and containers, ask the status of what changed, forget what is gone;
        the UIDs of the pods that changed. Callers arriving while one runs share it."""
        task = self._resync_task
        if task is None or task.done():
            task = asyncio.create_task(self._do_resync(), name="cri-resync")
            self._resync_task = task
        return await asyncio.shield(task)

    async def _do_resync(self) -> set[str]:
        seen_before = self._seq
        try:
            sandboxes, containers = await asyncio.gather(
                self._call(
                    "ListPodSandbox",
                    api.ListPodSandboxRequest(
                        filter=api.PodSandboxFilter(label_selector={LABEL_MANAGED: "true"})
                    ),
                    api.ListPodSandboxResponse,
                ),
                self._call(
                    "ListContainers",
                    api.ListContainersRequest(
                        filter=api.ContainerFilter(label_selector={LABEL_MANAGED: "true"})
                    ),
                    api.ListContainersResponse,
                ),
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot list the runtime's pods: {e}") from e
        uids: set[str] = set()
        sandbox_ids = {s.id: s for s in sandboxes.items if _ours(s.labels)}
        stale_sandboxes = [
            sid
            for sid, s in sandbox_ids.items()
            if sid not in self._sandboxes
            or self._sandboxes[sid].ready != (s.state == api.SANDBOX_READY)
        ]
        present = {
            c.id: _STATES.get(c.state, ContainerRunState.UNKNOWN)
            for c in containers.containers
            if _ours(c.labels)
        }
        stale = [
            cid
            for cid, state in present.items()
            if cid not in self._containers or self._containers[cid].state is not state
        ]
        limit = asyncio.Semaphore(REFRESH_CONCURRENCY)

        async def bounded(coro: Awaitable[T]) -> T:
            async with limit:
                return await coro

        refreshed_sandboxes = await asyncio.gather(
            *(bounded(self._refresh_sandbox(sid)) for sid in stale_sandboxes)
        )
        refreshed = await asyncio.gather(*(bounded(self._refresh_container(cid)) for cid in stale))
        uids |= {s.uid for s in refreshed_sandboxes if s is not None}
        uids |= {c.uid for c in refreshed if c is not None}
        for sid in [
            sid
            for sid, s in self._sandboxes.items()
            if sid not in sandbox_ids and s.seq <= seen_before
        ]:
            gone = self._sandboxes.pop(sid)
            self._host_network.discard(sid)
            uids.add(gone.uid)
        for cid in [
            cid
            for cid, c in self._containers.items()
            if cid not in present and c.seq <= seen_before
        ]:
            uids.add(self._containers.pop(cid).uid)
        return uids

    async def _refresh_sandbox(self, sid: str) -> _Sandbox | None:
        try:
            reply = await self._call(
                "PodSandboxStatus",
                api.PodSandboxStatusRequest(pod_sandbox_id=sid),
                api.PodSandboxStatusResponse,
            )
        except CriError as e:
            if e.not_found:
                self._sandboxes.pop(sid, None)
                return None
            raise RuntimeFailure(f"cannot get the status of sandbox {sid[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot get the status of sandbox {sid[:12]}: {e}") from e
        st = reply.status
        if not _ours(st.labels):
            return None
        host_network = sid in self._host_network or st.linux.namespaces.options.network == api.NODE
        if host_network:
            self._host_network.add(sid)
        ip = self.node_ip if host_network else (st.network.ip or None)
        entry = _Sandbox(
            id=sid,
            uid=st.labels[LABEL_POD_UID],
            name=st.labels.get(LABEL_POD_NAME, st.metadata.name),
            namespace=st.labels.get(LABEL_POD_NAMESPACE, st.metadata.namespace),
            attempt=int(st.metadata.attempt),
            ready=st.state == api.SANDBOX_READY,
            ip=ip,
            created_at=_time(st.created_at) or _now(),
        )
        self._seq += 1
        entry.seq = self._seq
        self._sandboxes[sid] = entry
        return entry

    async def _refresh_container(self, cid: str) -> _Container | None:
        try:
            reply = await self._call(
                "ContainerStatus",
                api.ContainerStatusRequest(container_id=cid, verbose=True),
                api.ContainerStatusResponse,
            )
        except CriError as e:
            if e.not_found:
                self._containers.pop(cid, None)
                return None
            raise RuntimeFailure(f"cannot get the status of container {cid[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot get the status of container {cid[:12]}: {e}") from e
        st = reply.status
        labels = dict(st.labels)
        if not _ours(labels):
            return None
        state = _STATES.get(st.state, ContainerRunState.UNKNOWN)
        info: dict[str, Any] = {}
        with contextlib.suppress(ValueError, TypeError):
            info = json.loads(reply.info.get("info", "{}")) or {}
        pid = info.get("pid") if isinstance(info, dict) else None
        try:
            attempt = int(labels.get(LABEL_ATTEMPT, st.metadata.attempt))
        except ValueError:
            attempt = int(st.metadata.attempt)
        sandbox_id = str(info.get("sandboxID", "")) if isinstance(info, dict) else ""
        old = self._containers.get(cid)
        if not sandbox_id and old is not None:
            sandbox_id = old.sandbox_id
        exited = state is ContainerRunState.EXITED
        self._seq += 1
        entry = _Container(
            id=cid,
            sandbox_id=sandbox_id,
            uid=labels[LABEL_POD_UID],
            pod_name=labels.get(LABEL_POD_NAME, ""),
            pod_namespace=labels.get(LABEL_POD_NAMESPACE, ""),
            name=labels.get(LABEL_CONTAINER_NAME, st.metadata.name),
            attempt=attempt,
            spec_hash=labels.get(LABEL_SPEC_HASH, ""),
            # The digest reference, what the kubelet reports as imageID.
            image=st.image_ref or st.image.image,
            state=state,
            created_at=_time(st.created_at) or _now(),
            started_at=_time(st.started_at),
            finished_at=_time(st.finished_at) if exited else None,
            exit_code=int(st.exit_code) if exited else None,
            reason=st.reason,
            message=st.message,
            log_path=st.log_path,
            pid=pid
            if isinstance(pid, int) and pid > 0 and state is ContainerRunState.RUNNING
            else None,
            seq=self._seq,
            labels=labels,
        )
        self._containers[cid] = entry
        return entry

    async def _drop_never_started(self) -> None:
        """Containers created but never started (an agent killed between the two): the sync
        would wait on them forever; their attempt is simply made again."""
        created = [c for c in self._containers.values() if c.state is ContainerRunState.CREATED]
        for c in created:
            log.info("removing %s of pod %s/%s: never started", c.name, c.pod_namespace, c.pod_name)
            with contextlib.suppress(RuntimeFailure):
                await self._remove_container_call(c.id)
            self._containers.pop(c.id, None)

    # --- views ----------------------------------------------------------------------------------

    def _pods(self, only: str | None = None) -> dict[str, RuntimePod]:
        pods: dict[str, RuntimePod] = {}
        uids = {s.uid for s in self._sandboxes.values()} | {
            c.uid for c in self._containers.values()
        }
        for uid in uids:
            if only is not None and uid != only:
                continue
            sandbox = self._sandbox_of(uid)
            members = sorted(
                (c for c in self._containers.values() if c.uid == uid),
                key=lambda c: (c.name, c.attempt, c.created_at),
            )
            if sandbox is not None:
                name, namespace = sandbox.name, sandbox.namespace
            else:
                name, namespace = members[-1].pod_name, members[-1].pod_namespace
            pods[uid] = RuntimePod(
                uid=uid,
                name=name,
                namespace=namespace,
                sandbox=None if sandbox is None else self._sandbox_view(sandbox),
                containers=[self._container_view(c) for c in members],
            )
        return pods

    def _sandbox_of(self, uid: str) -> _Sandbox | None:
        """The ready sandbox if there is one, else the latest attempt."""
        candidates = [s for s in self._sandboxes.values() if s.uid == uid]
        if not candidates:
            return None
        return max(candidates, key=lambda s: (s.ready, s.attempt, s.created_at))

    def _sandbox_view(self, s: _Sandbox) -> RuntimeSandbox:
        return RuntimeSandbox(
            id=s.id,
            pod_uid=s.uid,
            pod_name=s.name,
            pod_namespace=s.namespace,
            ready=s.ready,
            ip=s.ip,
            created_at=s.created_at,
        )

    def _container_view(self, c: _Container) -> RuntimeContainer:
        reason = message = None
        if c.state is ContainerRunState.EXITED:
            if c.reason == "OOMKilled":
                reason = "OOMKilled"
            elif c.exit_code == 0:
                reason = "Completed"
            else:
                reason = "Error"
            message = c.message or None
        return RuntimeContainer(
            id=c.id,
            runtime=NAME,
            pod_uid=c.uid,
            pod_name=c.pod_name,
            pod_namespace=c.pod_namespace,
            name=c.name,
            attempt=c.attempt,
            spec_hash=c.spec_hash,
            image=c.image,
            state=c.state,
            created_at=c.created_at,
            started_at=c.started_at,
            finished_at=c.finished_at,
            exit_code=c.exit_code,
            reason=reason,
            message=message,
            pid=c.pid,
        )

    # --- change notification --------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            await self._resync_and_notify()

    async def _resync_and_notify(self) -> None:
        try:
            changed = await self._resync()
        except RuntimeFailure as e:
            log.warning("relisting the runtime's pods failed: %s", e)
            return
        for uid in changed:
            self._notify(uid)

    async def _watch_events(self) -> None:
        """GetContainerEvents where the runtime has it: each event relists at once, and a broken
        stream is opened again (the poller covers the gap). containerd 1.6 answers
        UNIMPLEMENTED; then the poller alone tells of changes."""
        while True:
            client = self._client
            if client is None:
                return
            try:
                async for _event in client.stream(
                    "GetContainerEvents", api.GetEventsRequest(), api.ContainerEventResponse
                ):
                    await self._resync_and_notify()
                log.warning("the runtime ended its container events; reopening")
            except CriError as e:
                if e.unimplemented:
                    log.info(
                        "the runtime has no container events (%s): polling every %gs",
                        e.details,
                        self.poll_interval,
                    )
                    return
                log.warning("container events: %s; retrying in %gs", e, EVENTS_RETRY)
            except (RuntimeFailure, TimeoutError) as e:
                log.warning("container events: %s; retrying in %gs", e, EVENTS_RETRY)
            await asyncio.sleep(EVENTS_RETRY)

    # --- helpers --------------------------------------------------------------------------------

    async def _call(
        self,
        name: str,
        request: Any,
        response: type[T],
        deadline: float = CALL_TIMEOUT,
        service: str = "RuntimeService",
    ) -> T:
        if self._client is None:
            raise RuntimeFailure("the remote runtime is not started")
        return await self._client.call(name, request, response, deadline, service)

    def _notify(self, uid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(uid)
            except Exception:
                log.exception("runtime listener failed for pod %s", uid)

    def _pod_lock(self, uid: str) -> asyncio.Lock:
        return self._pod_locks.setdefault(uid, asyncio.Lock())


# --- resources ----------------------------------------------------------------------------------


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
    """The kubelet's per-QoS OOM score: Guaranteed pods are killed last, BestEffort first, a
    Burstable container by how much of the node's memory it requests."""
    specs = [*pod.spec.init_containers, *pod.spec.containers]
    if all(not c.resources.limits and not c.resources.requests for c in specs):
        return BESTEFFORT_OOM_SCORE_ADJ
    guaranteed = True
    for c in specs:
        limits, requests = c.resources.limits, c.resources.requests
        for name in ("cpu", "memory"):
            if name not in limits or str(requests.get(name, limits[name])) != str(limits[name]):
                guaranteed = False
    if guaranteed:
        return GUARANTEED_OOM_SCORE_ADJ
    request = config.requests.get("memory", config.limits.get("memory"))
    memory = to_bytes(request) if request is not None else 0
    if memory_capacity <= 0:
        return BESTEFFORT_OOM_SCORE_ADJ - 1
    score = 1000 - (1000 * memory) // memory_capacity
    # Burstable above any Guaranteed (which reach 3 at 100 % of memory), below BestEffort.
    if score < 1000 + GUARANTEED_OOM_SCORE_ADJ:
        return 1000 + GUARANTEED_OOM_SCORE_ADJ
    return min(score, BESTEFFORT_OOM_SCORE_ADJ - 1)


def _memory_capacity() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# --- log files (run in threads) -----------------------------------------------------------------


def _read_whole_records(path: Path, offset: int) -> tuple[bytes, int]:
    """From `offset`, the whole records (up to the last newline) and the offset after them."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return b"", offset
    end = data.rfind(b"\n") + 1
    return data[:end], offset + end


def _read_from(path: Path, offset: int) -> tuple[bytes, int]:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return b"", offset
    return data, offset + len(data)


def _read_log(path: Path, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    data, _ = _read_whole_records(path, 0)
    if tail_lines is not None:
        data = data[tail_start(data, tail_lines) :]
    out = decode_records(data)
    return out if limit_bytes is None else out[: max(limit_bytes, 0)]
