"""The sandbox Engine (runtime/sandbox/engine.py) over the CRI: containerd, CRI-O, any runtime
that serves Kubernetes' runtime.v1 RuntimeService and ImageService over gRPC.

A pod's sandbox is a CRI pod sandbox (RunPodSandbox: the runtime's pause container holds the
network, IPC and UTS namespaces, CNI gives it its IP and host ports); each container is created
in it. The CRI reserves the name of each sandbox attempt and each (container name, attempt) in a
sandbox, so an interrupted start cannot leave a second instance of the same attempt.

Changes: containerd 1.6 does not implement GetContainerEvents, so the core is told to relist
every poll interval; where a runtime streams container events, each one relists at once too.

Logs are files the runtime writes under --root-dir/logs/pods/<namespace>_<name>_<uid>/
<container>/<attempt>.log in the CRI log format (cri/log.py); they are read from there, in a
thread, and removed with the container (the runtime leaves them to the kubelet) or the pod.

Exec probes and hooks are ExecSync calls. `kubectl exec` and `kubectl attach` are the CRI's Exec
and Attach, whose answers are URLs of the runtime's own streaming server: streamclient.py is the
client of those sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pykubelet.api.model import Pod
from pykubelet.api.security import verify_run_as_non_root
from pykubelet.common.machine import read_machine_facts
from pykubelet.runtime import logfiles, logrotation
from pykubelet.runtime.base import (
    LABEL_POD_UID,
    MAX_EXEC_OUTPUT,
    ContainerConfig,
    ContainerRunState,
    ContainerStorage,
    ExecResult,
    ExecStream,
    LogRotationPolicy,
    LogTimes,
    RegistryAuth,
    RuntimeFailure,
    RuntimeImage,
    RuntimeVersion,
    SandboxConfig,
    StartError,
    TerminalSize,
)
from pykubelet.runtime.cri import oomreason, stats
from pykubelet.runtime.cri.client import CALL_TIMEOUT, CriClient, CriError, unix_socket_path
from pykubelet.runtime.cri.convert import (
    LABEL_MANAGED,
    container_config,
    container_entry,
    container_state,
    host_network_of,
    listed,
    ours,
    sandbox_config,
    sandbox_entry,
    sandbox_netns_path,
    sandbox_state,
)
from pykubelet.runtime.cri.images import CriImages
from pykubelet.runtime.cri.log import follow_cri_log
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.cri.security import (
    apply_container_security,
    apply_sandbox_security,
    image_user,
)
from pykubelet.runtime.cri.streamclient import Streams, open_stream
from pykubelet.runtime.sandbox.engine import (
    ChangeSink,
    ContainerEntry,
    Kind,
    Listing,
    NameInUse,
    PullError,
    SandboxEntry,
)

log = logging.getLogger(__name__)

NAME = "remote"

CONNECT_TIMEOUT = 10.0
STOP_SLACK = 30.0  # beyond the grace period, for the runtime to kill and reap
EXEC_SLACK = 10.0
# An attach's end is its container's exit; the runtime's status may lag the end of its output.
ATTACH_EXIT_WAIT = 5.0
ATTACH_EXIT_POLL = 0.1
# Past the core's own timeout (sandbox/core.py), so that one says why.
PULL_DEADLINE = 610.0
POLL_INTERVAL = 1.0
EVENTS_RETRY = 5.0

T = TypeVar("T")


@dataclass(frozen=True)
class CreateRequest:
    """A CreateContainer's config, and whether the image's user must be checked first
    (runAsNonRoot without runAsUser)."""

    config: Any
    verify_non_root: bool = False


class CriEngine:
    name = NAME

    def __init__(
        self,
        endpoint: str,
        infra_image: str,
        root_dir: Path,
        node_ip: str,
        poll_interval: float = POLL_INTERVAL,
        oom_reason_wait: float = oomreason.WAIT_SECONDS,
    ) -> None:
        self._endpoint = endpoint
        self._oom_reason_wait = oom_reason_wait
        self._infra_image = infra_image
        self._root_dir = root_dir
        self._node_ip = node_ip
        self._poll_interval = poll_interval
        self._client: CriClient | None = None
        self._host_network: set[str] = set()  # sandbox ids in the node's network namespace
        # The SandboxConfig each sandbox was run with, for the CreateContainer requests in it
        # (the runtime takes the container's HOSTNAME from them); unknown after a restart.
        self._sandbox_configs: dict[str, SandboxConfig] = {}
        self._memory_capacity = 0  # bytes, for the OOM score of burstable containers
        self._version: RuntimeVersion | None = None  # the runtime's, once connected
        # Containers the kubelet stopped (their SIGKILL is its own) and exits whose OOM reason
        # was waited for already: neither is waited for again; the exits being waited for, and
        # where to tell once they are (oomreason.py).
        self._stopped: set[str] = set()
        self._settled: set[str] = set()
        self._settling: dict[str, asyncio.Task[None]] = {}
        self._sink: ChangeSink | None = None

    # --- connection -----------------------------------------------------------------------------

    async def connect(self) -> None:
        try:
            client = self._client = CriClient(self._endpoint)
        except ValueError as e:
            raise RuntimeFailure(f"bad container runtime endpoint {self._endpoint!r}: {e}") from e
        try:
            facts = await asyncio.to_thread(read_machine_facts, self._root_dir)
            self._memory_capacity = facts.memory_kib * 1024
            socket = unix_socket_path(self._endpoint)
            if socket is not None and not await asyncio.to_thread(os.path.exists, socket):
                # grpc would retry to connect until CONNECT_TIMEOUT: say it at once.
                raise RuntimeFailure(
                    f"cannot reach the container runtime at {self._endpoint}: {socket} does not "
                    "exist (is the runtime running?)"
                )
            await client.wait_ready(CONNECT_TIMEOUT)
            version = await self._call(
                "Version", api.VersionRequest(version="v1"), api.VersionResponse
            )
            self._version = RuntimeVersion(version.runtime_name, version.runtime_version)
            log.info(
                "container runtime at %s: %s %s (CRI %s)",
                self._endpoint,
                version.runtime_name,
                version.runtime_version,
                version.runtime_api_version,
            )
            await self._check_status()
        except CriError as e:
            await self.close()
            raise RuntimeFailure(
                f"{self._endpoint} does not answer as a CRI v1 runtime: {e}"
            ) from e
        except BaseException:
            await self.close()
            raise

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
            if configured and configured != self._infra_image:
                log.warning(
                    "the runtime's sandbox image is %s, not --pod-infra-container-image %s",
                    configured,
                    self._infra_image,
                )

    async def close(self) -> None:
        settling, self._settling = list(self._settling.values()), {}
        for task in settling:
            task.cancel()
        await asyncio.gather(*settling, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None

    # --- what there is --------------------------------------------------------------------------

    async def listing(self, pod_uid: str | None = None) -> Listing:
        selector = {LABEL_MANAGED: "true"}
        if pod_uid is not None:
            selector[LABEL_POD_UID] = pod_uid
        try:
            sandboxes, containers = await asyncio.gather(
                self._call(
                    "ListPodSandbox",
                    api.ListPodSandboxRequest(filter=api.PodSandboxFilter(label_selector=selector)),
                    api.ListPodSandboxResponse,
                ),
                self._call(
                    "ListContainers",
                    api.ListContainersRequest(filter=api.ContainerFilter(label_selector=selector)),
                    api.ListContainersResponse,
                ),
            )
        except (CriError, TimeoutError) as e:
            what = "the runtime's pods" if pod_uid is None else f"the sandboxes of pod {pod_uid}"
            raise RuntimeFailure(f"cannot list {what}: {e}") from e
        return Listing(
            sandboxes=listed(sandboxes.items, sandbox_state),
            containers=listed(containers.containers, container_state),
        )

    async def inspect_sandbox(self, id: str) -> SandboxEntry | None:
        try:
            reply = await self._call(
                "PodSandboxStatus",
                api.PodSandboxStatusRequest(pod_sandbox_id=id),
                api.PodSandboxStatusResponse,
            )
        except CriError as e:
            if e.not_found:
                return None
            raise RuntimeFailure(f"cannot get the status of sandbox {id[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot get the status of sandbox {id[:12]}: {e}") from e
        st = reply.status
        if not ours(st.labels):
            return None
        # Known from the sandbox's namespace options after a restart too; remembered from our
        # own RunPodSandbox for a runtime that does not report them.
        if id in self._host_network or host_network_of(st):
            self._host_network.add(id)
            return sandbox_entry(id, st, self._node_ip)
        return sandbox_entry(id, st, st.network.ip or None)

    async def inspect_container(self, id: str) -> ContainerEntry | None:
        entry = await self._container_status(id)
        if entry is None or id in self._stopped or id in self._settled or self._sink is None:
            return entry
        if id in self._settling or oomreason.may_trail(entry, wait=self._oom_reason_wait):
            # Its reason may still become OOMKilled (oomreason.py): told as running until it is
            # settled, in a task of its own, so that no relist and no other pod waits for it.
            if id not in self._settling and entry.finished_at is not None:
                self._settling[id] = asyncio.create_task(
                    self._settle(id, self._sink, entry.finished_at),
                    name=f"cri-oom-reason-{id[:12]}",
                )
            return oomreason.unfinished(entry)
        return entry

    async def _settle(self, id: str, sink: ChangeSink, finished_at: datetime) -> None:
        try:
            await oomreason.settle(
                lambda: self._container_status(id), finished_at, self._oom_reason_wait
            )
        except RuntimeFailure as e:
            log.debug("the exit of container %s: %s", id[:12], e)
        self._settled.add(id)
        self._settling.pop(id, None)
        # Looked at again, now as it is, and its pod told.
        await sink.changed(id, Kind.CONTAINER, announce=True)

    async def _container_status(self, id: str) -> ContainerEntry | None:
        try:
            reply = await self._call(
                "ContainerStatus",
                api.ContainerStatusRequest(container_id=id, verbose=True),
                api.ContainerStatusResponse,
            )
        except CriError as e:
            if e.not_found:
                return None
            raise RuntimeFailure(f"cannot get the status of container {id[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot get the status of container {id[:12]}: {e}") from e
        return container_entry(id, reply)

    def forget(self, id: str) -> None:
        self._host_network.discard(id)
        self._sandbox_configs.pop(id, None)
        self._stopped.discard(id)
        self._settled.discard(id)
        settling = self._settling.pop(id, None)
        if settling is not None:
            settling.cancel()

    # --- sandboxes ------------------------------------------------------------------------------

    def _log_dir(self, pod: Pod) -> Path:
        # The kubelet's /var/log/pods layout, under the root dir: not in <root>/pods, which
        # holds the pods' volumes by UID.
        meta = pod.metadata
        return self._logs_root() / f"{meta.namespace}_{meta.name}_{pod.uid}"

    def _logs_root(self) -> Path:
        return self._root_dir / "logs" / "pods"

    async def create_sandbox(self, pod: Pod, attempt: int, wanted: SandboxConfig | None) -> str:
        log_dir = self._log_dir(pod)
        config = self._sandbox_config(pod, attempt, str(log_dir), wanted)
        await asyncio.to_thread(os.makedirs, log_dir, mode=0o755, exist_ok=True)
        try:
            reply = await self._call(
                "RunPodSandbox", api.RunPodSandboxRequest(config=config), api.RunPodSandboxResponse
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot run the sandbox of pod {pod.key}: {e}") from e
        sid = str(reply.pod_sandbox_id)
        if pod.spec.host_network:
            self._host_network.add(sid)
        if wanted is not None:
            self._sandbox_configs[sid] = wanted
        return sid

    async def start_sandbox(self, pod: Pod, id: str) -> None:
        """Nothing: RunPodSandbox started it."""

    def unready_sandbox(self, pod: Pod, entry: SandboxEntry | None) -> str:
        return f"the sandbox of pod {pod.key} is not ready after its start"

    async def retire_sandbox(self, id: str) -> None:
        # Stopped, not removed: removing it would remove its containers, and with them the
        # exited ones' history. It goes with the pod.
        try:
            await self._call(
                "StopPodSandbox",
                api.StopPodSandboxRequest(pod_sandbox_id=id),
                api.StopPodSandboxResponse,
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot stop the sandbox {id[:12]}: {e}") from e

    async def remove_sandbox(self, id: str) -> None:
        for call, request, response in (
            ("StopPodSandbox", api.StopPodSandboxRequest, api.StopPodSandboxResponse),
            ("RemovePodSandbox", api.RemovePodSandboxRequest, api.RemovePodSandboxResponse),
        ):
            try:
                await self._call(call, request(pod_sandbox_id=id), response)
            except CriError as e:
                if not e.not_found:
                    raise RuntimeFailure(f"cannot remove the sandbox {id[:12]}: {e}") from e
            except TimeoutError as e:
                raise RuntimeFailure(f"{e} (sandbox {id[:12]})") from e

    async def remove_pod_files(self, uid: str) -> None:
        await asyncio.to_thread(_remove_log_dirs, self._logs_root(), uid)

    # --- containers -----------------------------------------------------------------------------

    def container_request(
        self, pod: Pod, sandbox_id: str, config: ContainerConfig
    ) -> CreateRequest:
        request = container_config(pod, config, self._memory_capacity)
        apply_container_security(request.linux.security_context, config, self._root_dir)
        return CreateRequest(request, config.run_as_non_root and config.run_as_user is None)

    async def create_container(self, pod: Pod, sandbox: SandboxEntry, create: CreateRequest) -> str:
        request = create.config
        if create.verify_non_root:
            await self._verify_non_root(pod, request)
        config = self._sandbox_config(
            pod, sandbox.attempt, str(self._log_dir(pod)), self._sandbox_configs.get(sandbox.id)
        )
        await asyncio.to_thread(
            os.makedirs,
            Path(config.log_directory) / request.metadata.name,
            mode=0o755,
            exist_ok=True,
        )
        try:
            reply = await self._call(
                "CreateContainer",
                api.CreateContainerRequest(
                    pod_sandbox_id=sandbox.id, config=request, sandbox_config=config
                ),
                api.CreateContainerResponse,
            )
        except TimeoutError as e:
            raise StartError("CreateContainerError", str(e)) from e
        except CriError as e:
            if "reserved" in e.details:
                leftovers = await self._leftovers(
                    sandbox.id, request.metadata.name, request.metadata.attempt
                )
                if leftovers:
                    raise NameInUse(leftovers, e.details) from e
            raise StartError("CreateContainerError", e.details) from e
        return str(reply.container_id)

    async def _verify_non_root(self, pod: Pod, request: Any) -> None:
        """As the kubelet before a create: the image's user (ImageStatus) must not be root."""
        image = str(request.image.image)
        reply = await self._image_status(image)
        uid, username = image_user(reply.image)
        why = verify_run_as_non_root(pod, str(request.metadata.name), uid, username)
        if why is not None:
            raise StartError("CreateContainerConfigError", why)

    def _sandbox_config(
        self, pod: Pod, attempt: int, log_directory: str, wanted: SandboxConfig | None
    ) -> Any:
        config = sandbox_config(pod, attempt, log_directory, wanted)
        apply_sandbox_security(config.linux, pod, self._root_dir)
        return config

    async def _leftovers(self, sandbox_id: str, name: str, attempt: int) -> list[str]:
        """Our containers of the sandbox that hold the name of (name, attempt)."""
        try:
            reply = await self._call(
                "ListContainers",
                api.ListContainersRequest(
                    filter=api.ContainerFilter(
                        pod_sandbox_id=sandbox_id, label_selector={LABEL_MANAGED: "true"}
                    )
                ),
                api.ListContainersResponse,
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot list the containers of {sandbox_id[:12]}: {e}") from e
        return [
            c.id
            for c in reply.containers
            if c.metadata.name == name and c.metadata.attempt == attempt
        ]

    async def start_container(self, id: str, config: ContainerConfig) -> None:
        try:
            await self._call(
                "StartContainer",
                api.StartContainerRequest(container_id=id),
                api.StartContainerResponse,
            )
        except (CriError, TimeoutError) as e:
            message = e.details if isinstance(e, CriError) else str(e)
            raise StartError("RunContainerError", message) from e

    async def stop_container(self, id: str, seconds: int) -> None:
        self._stopped.add(id)
        try:
            await self._call(
                "StopContainer",
                api.StopContainerRequest(container_id=id, timeout=seconds),
                api.StopContainerResponse,
                deadline=seconds + STOP_SLACK,
            )
        except CriError as e:
            if not e.not_found:
                raise RuntimeFailure(f"cannot stop container {id[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot stop container {id[:12]}: {e}") from e

    async def remove_container(self, id: str, *, force: bool) -> None:
        # RemoveContainer always forces: a running container is killed first.
        try:
            await self._call(
                "RemoveContainer",
                api.RemoveContainerRequest(container_id=id),
                api.RemoveContainerResponse,
            )
        except CriError as e:
            if not e.not_found:
                raise RuntimeFailure(f"cannot remove container {id[:12]}: {e}") from e
        except TimeoutError as e:
            raise RuntimeFailure(f"cannot remove container {id[:12]}: {e}") from e

    def id_scheme(self) -> str:
        # The kubelet's containerID is <runtime name>://<id>: containerd://, cri-o://.
        return self._version.name if self._version is not None else NAME

    async def version(self) -> RuntimeVersion:
        if self._version is None:
            raise RuntimeFailure(f"the container runtime at {self._endpoint} is not connected")
        return self._version

    # --- images ---------------------------------------------------------------------------------

    async def images(self) -> list[RuntimeImage]:
        try:
            reply = await self._call(
                "ListImages",
                api.ListImagesRequest(),
                api.ListImagesResponse,
                service="ImageService",
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot list the images of {self._endpoint}: {e}") from e
        return [RuntimeImage((*i.repo_digests, *i.repo_tags), int(i.size)) for i in reply.images]

    async def rotate_log(
        self, id: str, entry: ContainerEntry | None, policy: LogRotationPolicy
    ) -> bool:
        """The kubelet's rotateLog: tidy the rotated files, rename the current one aside and
        have the runtime reopen it (ReopenContainerLog); if it cannot, the rename is undone."""
        if entry is None or not entry.log_path:
            return False
        path = Path(entry.log_path)
        target = await asyncio.to_thread(logrotation.prepare, path, policy)
        if target is None:
            return False
        await asyncio.to_thread(os.rename, path, target)
        try:
            await self._call(
                "ReopenContainerLog",
                api.ReopenContainerLogRequest(container_id=id),
                api.ReopenContainerLogResponse,
            )
        except (CriError, TimeoutError) as e:
            await asyncio.to_thread(os.rename, target, path)
            raise RuntimeFailure(f"failed to reopen container log {id[:12]}: {e}") from e
        log.info("rotated the log of container %s to %s", id[:12], target.name)
        return True

    def image_store(self) -> CriImages:
        return CriImages(self._call, self._infra_image)

    async def container_storage(
        self, containers: list[ContainerEntry]
    ) -> dict[str, ContainerStorage]:
        return await stats.container_storage(self._call, containers)

    async def image_present(self, image: str) -> bool:
        reply = await self._image_status(image)
        return reply.HasField("image") and bool(reply.image.id)

    async def _image_status(self, image: str) -> Any:
        try:
            return await self._call(
                "ImageStatus",
                api.ImageStatusRequest(image=api.ImageSpec(image=image)),
                api.ImageStatusResponse,
                service="ImageService",
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot ask for the status of image {image}: {e}") from e

    async def pull_image(self, image: str, auth: RegistryAuth | None) -> None:
        request = api.PullImageRequest(image=api.ImageSpec(image=image))
        if auth is not None:
            # server_address stays empty, as the kubelet sends a pull secret's credentials:
            # containerd then uses them for the image's registry (a non-empty one must parse as
            # the host it dials, or they are dropped).
            request.auth.username = auth.username
            request.auth.password = auth.password
        try:
            await self._call(
                "PullImage",
                request,
                api.PullImageResponse,
                deadline=PULL_DEADLINE,
                service="ImageService",
            )
        except CriError as e:
            raise PullError(e.details) from e

    # --- exec and logs --------------------------------------------------------------------------

    async def exec_sync(
        self, id: str, name: str, command: list[str], timeout_seconds: float
    ) -> ExecResult:
        """ExecSync: the runtime runs the command and kills it at the timeout."""
        what = f"{command[0]!r} in container {name}" if command else "nothing"
        seconds = max(math.ceil(timeout_seconds), 1)
        try:
            reply = await self._call(
                "ExecSync",
                api.ExecSyncRequest(container_id=id, cmd=command, timeout=seconds),
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

    async def exec_stream(
        self,
        id: str,
        name: str,
        command: list[str],
        *,
        stdin: bool,
        tty: bool,
        size: TerminalSize | None = None,
    ) -> ExecStream:
        """The CRI's Exec, whose answer is a URL of the runtime's own streaming server: the
        session is ours there (streamclient.py), its output streamed as it is written, its
        outcome from the session's Status. The CRI's ExecRequest has no terminal size: `size`
        is the first message on the resize stream (containerd applies it once the command
        has started)."""
        if not command:
            raise RuntimeFailure(f"no command to run in container {name}")
        what = f"exec of {command[0]!r} in container {name}"
        request = api.ExecRequest(
            container_id=id, cmd=command, tty=tty, stdin=stdin, stdout=True, stderr=not tty
        )
        try:
            reply = await self._call("Exec", request, api.ExecResponse)
        except (CriError, TimeoutError) as e:
            message = e.details if isinstance(e, CriError) else str(e)
            raise RuntimeFailure(f"cannot run {command[0]!r} in container {name}: {message}") from e
        streams = Streams(stdin=stdin, stdout=True, stderr=not tty, tty=tty)
        stream = await open_stream(reply.url, streams, what)
        if tty and size is not None:
            await stream.resize(size.width, size.height)
        return stream

    async def attach(self, id: str, name: str, *, stdin: bool, tty: bool) -> ExecStream:
        """The CRI's Attach, whose answer is a URL of the runtime's own streaming server (as
        exec_stream). Its end is the container's: wait() asks the runtime how it exited."""
        request = api.AttachRequest(
            container_id=id, stdin=stdin, tty=tty, stdout=True, stderr=not tty
        )
        try:
            reply = await self._call("Attach", request, api.AttachResponse)
        except (CriError, TimeoutError) as e:
            message = e.details if isinstance(e, CriError) else str(e)
            raise RuntimeFailure(f"cannot attach to container {name}: {message}") from e
        streams = Streams(stdin=stdin, stdout=True, stderr=not tty, tty=tty)

        async def ended() -> int | None:
            return await self._exit_code(id)

        return await open_stream(
            reply.url, streams, f"attach to container {name}", drop_input=True, ended=ended
        )

    async def _exit_code(self, id: str) -> int | None:
        """The container's exit code once the runtime reports it exited (None: it runs on
        past ATTACH_EXIT_WAIT, or is gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ATTACH_EXIT_WAIT
        while True:
            entry = await self._container_status(id)  # the exit code alone: no reason awaited
            if entry is None:
                return None
            if entry.state is ContainerRunState.EXITED:
                return entry.exit_code
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(ATTACH_EXIT_POLL)

    async def sandbox_netns(self, id: str) -> str:
        """From the verbose PodSandboxStatus: the network namespace its runtime spec names
        (containerd's /var/run/netns/cni-...), else /proc/<its pid>/ns/net."""
        what = f"the network namespace of sandbox {id[:12]}"
        try:
            reply = await self._call(
                "PodSandboxStatus",
                api.PodSandboxStatusRequest(pod_sandbox_id=id, verbose=True),
                api.PodSandboxStatusResponse,
            )
        except (CriError, TimeoutError) as e:
            raise RuntimeFailure(f"cannot find {what}: {e}") from e
        if reply.status.state != api.SANDBOX_READY:
            raise RuntimeFailure(f"sandbox {id[:12]} is not ready")
        try:
            info = json.loads(reply.info.get("info") or "{}")
        except ValueError:
            info = {}
        path = sandbox_netns_path(info)
        if path is None:
            raise RuntimeFailure(f"cannot find {what}: the runtime does not report it")
        return path

    async def read_log(
        self,
        id: str,
        entry: ContainerEntry | None,
        tail_lines: int | None,
        limit_bytes: int | None,
        times: LogTimes,
    ) -> bytes:
        if entry is None or not entry.log_path:
            return b""
        return await asyncio.to_thread(
            logfiles.read_cri_log, Path(entry.log_path), tail_lines, limit_bytes, times
        )

    async def follow_log(
        self,
        id: str,
        entry: ContainerEntry | None,
        tail_lines: int | None,
        times: LogTimes,
        exited: Callable[[], bool],
    ) -> AsyncGenerator[bytes, None]:
        """The file so far, then what is appended, until the container has exited and the
        file was read to its end after that (cri/log.py)."""
        if entry is None or not entry.log_path:
            return
        async for out in follow_cri_log(Path(entry.log_path), tail_lines, times, exited):
            yield out

    # --- changes --------------------------------------------------------------------------------

    async def watch(self, sink: ChangeSink) -> None:
        self._sink = sink
        sink.watching()  # nothing to wait for: the poller covers what happens meanwhile
        # The poller goes on whatever becomes of the event stream.
        events = asyncio.create_task(self._events(sink), name="cri-events")
        try:
            await self._poll(sink)
        finally:
            events.cancel()
            await asyncio.gather(events, return_exceptions=True)

    async def _poll(self, sink: ChangeSink) -> None:
        while True:
            await asyncio.sleep(self._poll_interval)
            await sink.relist()

    async def _events(self, sink: ChangeSink) -> None:
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
                    await sink.relist()
                log.warning("the runtime ended its container events; reopening")
            except CriError as e:
                if e.unimplemented:
                    log.info(
                        "the runtime has no container events (%s): polling every %gs",
                        e.details,
                        self._poll_interval,
                    )
                    return
                log.warning("container events: %s; retrying in %gs", e, EVENTS_RETRY)
            except (RuntimeFailure, TimeoutError) as e:
                log.warning("container events: %s; retrying in %gs", e, EVENTS_RETRY)
            await asyncio.sleep(EVENTS_RETRY)

    async def _call(
        self,
        name: str,
        request: Any,
        response: type[T],
        deadline: float | None = CALL_TIMEOUT,
        service: str = "RuntimeService",
    ) -> T:
        if self._client is None:
            raise RuntimeFailure("the remote runtime is not started")
        return await self._client.call(name, request, response, deadline, service)


# --- files (run in threads) ---------------------------------------------------------------------


def _remove_log_dirs(root: Path, uid: str) -> None:
    """The pod's log directories (<namespace>_<name>_<uid>: one per name it had)."""
    try:
        dirs = [d for d in root.iterdir() if d.name.endswith(f"_{uid}")]
    except FileNotFoundError:
        return
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
