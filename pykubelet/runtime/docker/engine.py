"""The sandbox Engine (runtime/sandbox/engine.py) over the Docker Engine API: Docker, or Podman's
compatible service.

A pod's sandbox is an infra container, as in the kubelet's own Docker integration
(`--pod-infra-container-image`, run with the image's own command): it owns the pod's network,
IPC and UTS namespaces and publishes its host ports; each container of the pod joins it
(`container:<infra id>`). Every container carries labels naming its pod (UID, name, namespace),
its container name, attempt and spec hash, so the engine alone says what runs. Names
(`k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`) are unique per attempt, so an interrupted
start cannot leave a second instance of the same attempt behind.

Changes come from the engine's event stream: an event of a container created, started, died or
removed makes the core refresh it; a reconnect makes it relist. Podman on cgroup v1 does not
report OOM kills: they are watched in the container's memory cgroup (oom.py) and reported as the
container's `oom_killed`. Podman 4.3's log `tail` corrupts partial lines: logs are cut here.

An exec with its stdio attached (`kubectl exec`) is the engine's exec on a hijacked connection
(client.py's ExecSession); the engine lets the command run on when that connection closes, so
closing the stream kills it by the host pid the engine reports, and its end is polled, the API
having no wait for an exec. An attach (`kubectl attach`) is the engine's attach on such a
connection (`stream=1`: the container's output from then on); closing it detaches, and the
engine closes the container's stdin then if it was created with StdinOnce.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import signal
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pykubelet.api.model import Pod
from pykubelet.api.security import image_user, verify_run_as_non_root
from pykubelet.runtime.base import (
    LABEL_CONTAINER_NAME,
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
from pykubelet.runtime.docker import storage
from pykubelet.runtime.docker.client import DockerClient, EngineError
from pykubelet.runtime.docker.convert import (
    LABEL_TYPE,
    SANDBOX_NAME,
    LogDemuxer,
    container_body,
    container_name,
    docker_image_id,
    event_kind,
    event_time_ns,
    listing_rows,
    memory_limit,
    parse_inspect,
    sandbox_body,
    tail_offset,
)
from pykubelet.runtime.docker.images import DockerImages
from pykubelet.runtime.docker.oom import OomWatcher, memory_v1_mount
from pykubelet.runtime.docker.security import image_user_of, read_seccomp, seccomp_file
from pykubelet.runtime.docker.streams import DockerAttachStream, DockerExecStream
from pykubelet.runtime.sandbox.engine import (
    ChangeSink,
    ContainerEntry,
    Listing,
    NameInUse,
    PullError,
    SandboxEntry,
)

log = logging.getLogger(__name__)

NAME = "docker"

STOP_SLACK = 30.0  # beyond the grace period, for the engine to kill and reap
EVENTS_RETRY = 1.0
FOLLOW_IDLE = 0.5  # seconds without log data after which a follower checks for an exit
INSPECT_ATTEMPTS = 5  # an inspect that races a process exit (Podman: "no such process") is retried

# Event actions after which a container's inspect result may have changed.
_REFRESH_ACTIONS = frozenset(
    {"create", "start", "restart", "die", "died", "oom", "destroy", "remove"}
)
# For a container we do not know yet, only these can make it one we should track.
_DISCOVER_ACTIONS = frozenset({"start"})
# The core's own operations: it inspects after them, so their news may be old news.
_OWN_ACTIONS = frozenset({"create", "start"})


@dataclass(frozen=True)
class CreateRequest:
    name: str
    body: dict[str, Any]
    # Checked or read at the create, off the loop (docker/security.py): the image's user
    # against runAsNonRoot, a Localhost seccomp profile.
    verify_non_root: bool = False
    seccomp_file: Path | None = None


class DockerEngine:
    name = NAME

    def __init__(
        self,
        endpoint: str,
        infra_image: str,
        node_ip: str,
        pod_pids_limit: int,
        root_dir: Path | None = None,
    ) -> None:
        self._client = DockerClient(endpoint)
        self._root_dir = root_dir or Path("/var/lib/kubelet")  # Localhost seccomp profiles
        self._endpoint = endpoint
        self._infra_image = infra_image
        self._node_ip = node_ip
        self._pids_limit = pod_pids_limit  # per container here: the engine has no pod cgroup
        self._podman = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._watchers: dict[str, OomWatcher] = {}
        self._watching: set[str] = set()  # a watcher is being set up or was tried
        self._oom_seen: set[str] = set()
        self._repo_digests: dict[str, str | None] = {}  # by image ID

    # --- connection -----------------------------------------------------------------------------

    async def connect(self) -> None:
        await asyncio.to_thread(memory_v1_mount)  # read once, off the loop; cached
        headers = await self._client.open()
        self._podman = "Libpod-Api-Version" in headers
        log.info(
            "container engine at %s: %s (API %s)",
            self._endpoint,
            headers.get("Server") or ("Podman" if self._podman else "Docker"),
            headers.get("Api-Version", "1.41"),
        )

    def id_scheme(self) -> str:
        return NAME  # Podman's Docker API too: its containers are docker://<id>, as with dockershim

    async def version(self) -> RuntimeVersion:
        """docker://<Version of /version> (Podman: its Docker-compatible version)."""
        try:
            info = await self._client.json("GET", "version")
        except EngineError as e:
            raise RuntimeFailure(f"cannot ask {self._endpoint} for its version: {e}") from e
        return RuntimeVersion(NAME, str(info.get("Version") or "unknown"))

    async def images(self) -> list[RuntimeImage]:
        try:
            listing = await self._client.json("GET", "images/json")
        except EngineError as e:
            raise RuntimeFailure(f"cannot list the images of {self._endpoint}: {e}") from e
        out = []
        for image in listing or []:
            names = [
                n
                for n in [*(image.get("RepoDigests") or []), *(image.get("RepoTags") or [])]
                if n and not n.startswith("<none>")
            ]
            out.append(RuntimeImage(tuple(names), int(image.get("Size") or 0)))
        return out

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for watcher in self._watchers.values():
            watcher.close()
        self._watchers.clear()
        self._watching.clear()
        self._oom_seen.clear()
        await self._client.close()

    # --- what there is --------------------------------------------------------------------------

    async def listing(self, pod_uid: str | None = None) -> Listing:
        label = LABEL_TYPE if pod_uid is None else f"{LABEL_POD_UID}={pod_uid}"
        # Podman's own listing gives the same fields in half the time of its compatible one
        # (15 against 30 ms for 46 containers), and the PLEG lists every second.
        path = "libpod/containers/json" if self._podman else "containers/json"
        params = {"all": "true", "filters": json.dumps({"label": [label]})}
        try:
            rows = await self._client.json("GET", path, params)
        except EngineError as e:
            what = "containers" if pod_uid is None else f"the containers of pod {pod_uid}"
            raise RuntimeFailure(f"cannot list {what}: {e}") from e
        return listing_rows(list(rows or []))

    async def inspect_sandbox(self, id: str) -> SandboxEntry | None:
        entry = await self._inspect(id)
        return entry if isinstance(entry, SandboxEntry) else None

    async def inspect_container(self, id: str) -> ContainerEntry | None:
        entry = await self._inspect(id)
        return entry if isinstance(entry, ContainerEntry) else None

    async def _inspect(self, id: str) -> SandboxEntry | ContainerEntry | None:
        info: Any = None
        for attempt in range(INSPECT_ATTEMPTS):
            try:
                info = await self._client.json("GET", f"containers/{id}/json")
                break
            except EngineError as e:
                if e.not_found:
                    return None
                # Podman reads /proc/<pid>/cgroup of a container it still thinks is running;
                # a process that exits in between makes it answer 500 "no such process".
                # The next inspect sees the container exited.
                if "no such process" not in e.message or attempt == INSPECT_ATTEMPTS - 1:
                    raise RuntimeFailure(f"cannot inspect container {id[:12]}: {e}") from e
                await asyncio.sleep(0.01 * (attempt + 1))
        entry = parse_inspect(info, self._node_ip)
        if isinstance(entry, ContainerEntry):
            self._track_oom(entry, memory_limit(info))
            digest = await self._repo_digest(str(info.get("Image") or ""))
            if digest:
                entry = dataclasses.replace(
                    entry, image_id=docker_image_id(str(info.get("Image")), digest)
                )
        return entry

    async def _repo_digest(self, image_id: str) -> str | None:
        """The image's first repository digest, asked once per image."""
        if not image_id:
            return None
        if image_id not in self._repo_digests:
            try:
                image = await self._client.json("GET", f"images/{image_id}/json")
            except EngineError:
                return None  # gone, or not answering: the ID will do
            digests = (image or {}).get("RepoDigests") or []
            self._repo_digests[image_id] = str(digests[0]) if digests else None
        return self._repo_digests[image_id]

    def forget(self, id: str) -> None:
        watcher = self._watchers.pop(id, None)
        if watcher is not None:
            watcher.close()
        self._watching.discard(id)
        self._oom_seen.discard(id)

    # --- sandboxes ------------------------------------------------------------------------------

    async def create_sandbox(self, pod: Pod, attempt: int, config: SandboxConfig | None) -> str:
        name = container_name(SANDBOX_NAME, pod, attempt)
        try:
            return await self._create(name, sandbox_body(pod, self._infra_image, attempt, config))
        except EngineError as e:
            if e.conflict:
                raise NameInUse([name], e.message) from e
            raise RuntimeFailure(f"cannot create the sandbox of pod {pod.key}: {e}") from e

    async def start_sandbox(self, pod: Pod, id: str) -> None:
        try:
            await self._client.post(f"containers/{id}/start")
        except EngineError as e:
            raise StartError("RunContainerError", str(e)) from e

    def unready_sandbox(self, pod: Pod, entry: SandboxEntry | None) -> str:
        why = f"exit code {entry.exit_code}" if entry else "it vanished"
        return (
            f"the sandbox of pod {pod.key} ({self._infra_image}) does not keep running "
            f"({why}); its image's command must wait until it is stopped"
        )

    async def retire_sandbox(self, id: str) -> None:
        # Podman keeps an infra container while containers that joined it exist, even exited
        # ones; those keep their history (lastState, --previous), so it may have to stay.
        await self._remove(id, force=True)

    async def remove_sandbox(self, id: str) -> None:
        await self._remove(id, force=True)

    async def remove_pod_files(self, uid: str) -> None:
        """Nothing: the engine keeps the logs, and removes them with the containers."""

    # --- containers -----------------------------------------------------------------------------

    def container_request(
        self, pod: Pod, sandbox_id: str, config: ContainerConfig
    ) -> CreateRequest:
        body = container_body(
            pod, sandbox_id, config, podman=self._podman, pids_limit=self._pids_limit
        )
        return CreateRequest(
            container_name(config.name, pod, config.attempt),
            body,
            verify_non_root=config.run_as_non_root and config.run_as_user is None,
            seccomp_file=seccomp_file(config, self._root_dir),
        )

    async def create_container(
        self, pod: Pod, sandbox: SandboxEntry, request: CreateRequest
    ) -> str:
        if request.verify_non_root:
            await self._verify_non_root(pod, request)
        body = request.body
        if request.seccomp_file is not None:
            profile = await asyncio.to_thread(read_seccomp, request.seccomp_file, self._podman)
            host_config = dict(body["HostConfig"])
            host_config["SecurityOpt"] = [*host_config.get("SecurityOpt", []), profile]
            body = {**body, "HostConfig": host_config}
        try:
            return await self._create(request.name, body)
        except EngineError as e:  # an unreachable engine is a RuntimeFailure already
            if e.conflict:
                raise NameInUse([request.name], e.message) from e
            raise StartError("CreateContainerError", e.message) from e

    async def _verify_non_root(self, pod: Pod, request: CreateRequest) -> None:
        """As the kubelet before a create: the image's user must not be root."""
        image = str(request.body["Image"])
        try:
            inspect = await self._client.json("GET", f"images/{image}/json")
        except EngineError as e:
            raise RuntimeFailure(f"cannot inspect image {image}: {e}") from e
        uid, username = image_user(image_user_of(inspect))
        name = str(request.body["Labels"][LABEL_CONTAINER_NAME])
        why = verify_run_as_non_root(pod, name, uid, username)
        if why is not None:
            raise StartError("CreateContainerConfigError", why)

    async def start_container(self, id: str, config: ContainerConfig) -> None:
        try:
            if self._wants_early_oom_watch(config):
                await self._init_and_watch(id)
            await self._client.post(f"containers/{id}/start")
        except EngineError as e:
            raise StartError("RunContainerError", e.message) from e

    async def stop_container(self, id: str, seconds: int) -> None:
        try:
            await self._client.post(
                f"containers/{id}/stop", {"t": str(seconds)}, deadline=seconds + STOP_SLACK
            )
        except EngineError as e:
            if not e.not_found and "not running" not in e.message:
                raise RuntimeFailure(f"cannot stop container {id[:12]}: {e}") from e

    async def remove_container(self, id: str, *, force: bool) -> None:
        await self._remove(id, force)

    async def _create(self, name: str, body: dict[str, Any]) -> str:
        created = await self._client.json("POST", "containers/create", {"name": name}, body)
        return str(created["Id"])

    async def _remove(self, id: str, force: bool) -> None:
        params = {"v": "1", "force": "1" if force else "0"}
        try:
            await self._client.delete(f"containers/{id}", params)
        except EngineError as e:
            if not e.not_found:
                raise RuntimeFailure(f"cannot remove container {id[:12]}: {e}") from e

    # --- images ---------------------------------------------------------------------------------

    async def rotate_log(
        self, id: str, entry: ContainerEntry | None, policy: LogRotationPolicy
    ) -> bool:
        """The engine's log driver rotates its own files (its configuration, not the agent's):
        --container-log-max-size/--container-log-max-files do not apply here."""
        return False

    def image_store(self) -> DockerImages:
        return DockerImages(self._client, self._infra_image)

    async def container_storage(
        self, containers: list[ContainerEntry]
    ) -> dict[str, ContainerStorage]:
        return await storage.container_storage(self._client, [c.id for c in containers])

    async def image_present(self, image: str) -> bool:
        try:
            await self._client.json("GET", f"images/{image}/json")
        except EngineError as e:
            if e.not_found:
                return False
            raise RuntimeFailure(f"cannot inspect image {image}: {e}") from e
        return True

    async def pull_image(self, image: str, auth: RegistryAuth | None) -> None:
        header = None
        if auth is not None:
            body = {
                "username": auth.username,
                "password": auth.password,
                "serveraddress": auth.server_address,
            }
            header = base64.urlsafe_b64encode(json.dumps(body).encode()).decode()
        try:
            await self._client.pull(image, header)
        except EngineError as e:
            raise PullError(e.message) from e

    # --- exec -----------------------------------------------------------------------------------

    async def exec_sync(
        self, id: str, name: str, command: list[str], timeout_seconds: float
    ) -> ExecResult:
        """The engine's exec. At the timeout the command is killed here: the engine cannot."""
        what = f"{command[0]!r} in container {name}" if command else "nothing"
        try:
            created = await self._client.json(
                "POST",
                f"containers/{id}/exec",
                body={"AttachStdout": True, "AttachStderr": True, "Cmd": command},
            )
        except EngineError as e:
            raise RuntimeFailure(f"cannot run {what}: {e.message}") from e
        exec_id = str(created["Id"])
        output = bytearray()
        demux = LogDemuxer()
        try:
            async with asyncio.timeout(timeout_seconds):
                async with self._client.stream(
                    "POST",
                    f"exec/{exec_id}/start",
                    {},
                    deadline=None,
                    body={"Detach": False, "Tty": False},
                ) as resp:
                    async for chunk in resp.content.iter_any():
                        room = MAX_EXEC_OUTPUT - len(output)
                        if room > 0:
                            output += demux.feed(chunk)[:room]
        except TimeoutError:
            await self._kill_exec(exec_id)
            return ExecResult(None, bytes(output))
        except EngineError as e:
            raise RuntimeFailure(f"cannot run {what}: {e.message}") from e
        try:
            info = await self._client.json("GET", f"exec/{exec_id}/json")
        except EngineError as e:
            raise RuntimeFailure(f"cannot learn how {what} ended: {e.message}") from e
        code = info.get("ExitCode")
        if code in (126, 127) and b"exec failed" in output:
            # The runtime's own complaint that the command could not start, not its output.
            text = output.decode(errors="replace").strip().splitlines()[0]
            raise RuntimeFailure(f"cannot run {what}: {text}")
        return ExecResult(int(code) if isinstance(code, int) else -1, bytes(output))

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
        """The engine's exec with its stdio attached, on a hijacked connection; a terminal of
        `size` from its start (the create's and start's ConsoleSize, Docker's API 1.42, and the
        start's h and w, Podman's). A command the engine cannot start shows it on the
        command's output (runc's complaint) and exits 126 or 127, as `docker exec` shows it."""
        what = f"{command[0]!r} in container {name}" if command else "nothing"
        if not command:
            raise RuntimeFailure(f"no command to run in container {name}")
        body: dict[str, Any] = {
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": tty,
            "Cmd": command,
        }
        if tty and size is not None:
            body["ConsoleSize"] = [size.height, size.width]
        try:
            created = await self._client.json("POST", f"containers/{id}/exec", body=body)
            session = await self._client.exec_session(
                str(created["Id"]), tty, size if tty else None
            )
        except EngineError as e:
            raise RuntimeFailure(f"cannot run {what}: {e.message}") from e
        return DockerExecStream(session, what, stdin=stdin, tty=tty, kill=self._kill_exec)

    async def attach(self, id: str, name: str, *, stdin: bool, tty: bool) -> ExecStream:
        """The engine's attach (stream=1, stdout, stderr and, if asked, stdin), hijacked."""
        try:
            session = await self._client.attach_session(id, stdin)
        except EngineError as e:
            raise RuntimeFailure(f"cannot attach to container {name}: {e.message}") from e
        return DockerAttachStream(session, name, stdin=stdin, tty=tty)

    async def _kill_exec(self, exec_id: str) -> None:
        try:
            info = await self._client.json("GET", f"exec/{exec_id}/json")
        except (EngineError, RuntimeFailure) as e:
            log.warning("cannot find the exec %s to kill it: %s", exec_id[:12], e)
            return
        pid = info.get("Pid")
        if info.get("Running") and isinstance(pid, int) and pid > 1:
            # The engine reports the host pid; nothing else reaps it between the check and here
            # but its container, and a recycled pid within that instant is a risk taken.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    async def sandbox_netns(self, id: str) -> str:
        """The infra container's own: /proc/<State.Pid>/ns/net (the engine reports the host
        pid)."""
        try:
            info = await self._client.json("GET", f"containers/{id}/json")
        except EngineError as e:
            raise RuntimeFailure(f"cannot inspect sandbox {id[:12]}: {e.message}") from e
        state = info.get("State") or {}
        pid = state.get("Pid")
        if not state.get("Running") or not isinstance(pid, int) or pid <= 0:
            raise RuntimeFailure(f"sandbox {id[:12]} is not running")
        return f"/proc/{pid}/ns/net"

    # --- logs -----------------------------------------------------------------------------------

    async def read_log(
        self,
        id: str,
        entry: ContainerEntry | None,
        tail_lines: int | None,
        limit_bytes: int | None,
        times: LogTimes,
    ) -> bytes:
        """The engine's log of that container: the last `tail_lines` lines, of those what
        `times` keeps, of which at most the first `limit_bytes` bytes (as the kubelet cuts
        them). The engine leaves out what is older than `since` and prefixes the times."""
        tty = entry.tty if entry else False
        if tail_lines is None:
            return await self._read_log(id, tty, None, limit_bytes, times)
        if not self._podman:
            return await self._read_log(id, tty, tail_lines, limit_bytes, times)
        # Podman 4.3's `tail` corrupts partial lines (it glues one to the record before it, on
        # the other stream): the whole log is read and cut here.
        data = await self._read_log(id, tty, None, None, times)
        data = data[tail_offset(data, tail_lines) :]
        return data if limit_bytes is None else data[: max(limit_bytes, 0)]

    async def _read_log(
        self, id: str, tty: bool, tail: int | None, limit_bytes: int | None, times: LogTimes
    ) -> bytes:
        params = {"stdout": "1", "stderr": "1", **_time_params(times)}
        if tail is not None:
            params["tail"] = str(max(tail, 0))
        demux = LogDemuxer(tty=tty, retime=times.timestamps)
        out = bytearray()
        try:
            async with self._client.stream("GET", f"containers/{id}/logs", params) as resp:
                async for chunk in resp.content.iter_any():
                    out += demux.feed(chunk)
                    if limit_bytes is not None and len(out) >= limit_bytes:
                        break
        except EngineError as e:
            if e.not_found:
                return b""
            raise RuntimeFailure(f"cannot read the log of {id[:12]}: {e}") from e
        return bytes(out) if limit_bytes is None else bytes(out[: max(limit_bytes, 0)])

    async def follow_log(
        self,
        id: str,
        entry: ContainerEntry | None,
        tail_lines: int | None,
        times: LogTimes,
        exited: Callable[[], bool],
    ) -> AsyncGenerator[bytes, None]:
        """The engine follows the log. It should end the stream when the container exits, but
        Podman 4.3 may keep one of two concurrent followers open forever: so once the container
        is known to have exited, a pause in the data ends it too."""
        tty = entry.tty if entry else False
        params = {"stdout": "1", "stderr": "1", "follow": "1", **_time_params(times)}
        skip = 0
        if tail_lines is not None and self._podman:
            # Its `tail` is wrong (see read_log): follow from the start, and drop what precedes
            # the last lines of what is there now. The log only grows, so that is a prefix.
            head = await self._read_log(id, tty, None, None, times)
            skip = tail_offset(head, tail_lines)
        elif tail_lines is not None:
            params["tail"] = str(max(tail_lines, 0))
        demux = LogDemuxer(tty=tty, retime=times.timestamps)
        try:
            async with self._client.stream(
                "GET", f"containers/{id}/logs", params, deadline=None
            ) as resp:
                while True:
                    try:
                        async with asyncio.timeout(FOLLOW_IDLE):
                            chunk = await resp.content.readany()
                    except TimeoutError:
                        if exited():
                            return
                        continue
                    if not chunk:
                        return
                    data = demux.feed(chunk)
                    if skip:
                        cut = min(skip, len(data))
                        data, skip = data[cut:], skip - cut
                    if data:
                        yield data
        except EngineError as e:
            if e.not_found:
                return
            raise RuntimeFailure(f"cannot follow the log of {id[:12]}: {e}") from e

    # --- events ---------------------------------------------------------------------------------

    async def watch(self, sink: ChangeSink) -> None:
        first = True
        while True:
            try:
                async with self._client.stream(
                    "GET", "events", {"filters": json.dumps({"type": ["container"]})}, deadline=None
                ) as resp:
                    sink.watching()
                    if not first:
                        # Whatever happened while disconnected is learnt by listing.
                        self._spawn(sink.relist())
                    first = False
                    async for line in resp.content:
                        if line.strip():
                            await self._on_event_line(sink, line)
                log.warning("the container engine closed its event stream; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("container engine events: %s; retrying in %gs", e, EVENTS_RETRY)
            await asyncio.sleep(EVENTS_RETRY)

    async def _on_event_line(self, sink: ChangeSink, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict) or event.get("Type", "container") != "container":
            return
        action = str(event.get("Action") or event.get("status") or "").split(":", 1)[0]
        actor = event.get("Actor") or {}
        cid = str(event.get("id") or actor.get("ID") or "")
        if not cid or action not in _REFRESH_ACTIONS:
            return
        if action == "oom":
            self._oom_seen.add(cid)
        kind = None
        if action in _DISCOVER_ACTIONS:
            kind = event_kind(actor.get("Attributes") or {}, by_name=self._podman)
        at = event_time_ns(event) if action in _OWN_ACTIONS else None
        await sink.changed(cid, kind, announce=action == "oom", ours_at_ns=at)

    # --- OOM kills the engine does not report ---------------------------------------------------

    def _track_oom(self, entry: ContainerEntry, limit: int) -> None:
        if entry.state is ContainerRunState.RUNNING:
            self._watch_oom(entry, limit)
        elif entry.state is ContainerRunState.EXITED:
            watcher = self._watchers.pop(entry.id, None)
            if watcher is not None:
                watcher.poll()  # a notification not read yet still counts
                watcher.close()
            if entry.id in self._oom_seen and entry.exit_code != 0:
                entry.oom_killed = True

    def _wants_early_oom_watch(self, config: ContainerConfig) -> bool:
        # Podman on cgroup v1 is the engine that misses OOM kills. Its libpod API can create the
        # container's cgroup (init) before starting it, so that even an OOM in the first
        # milliseconds is seen.
        return self._podman and "memory" in config.limits and memory_v1_mount() is not None

    async def _init_and_watch(self, cid: str) -> None:
        await self._client.post(f"libpod/containers/{cid}/init")
        info = await self._client.json("GET", f"containers/{cid}/json")
        pid = (info.get("State") or {}).get("Pid")
        if isinstance(pid, int) and pid > 0:
            await self._open_watcher(cid, pid)

    def _watch_oom(self, entry: ContainerEntry, limit: int) -> None:
        # Docker reports OOM kills itself (containerd watches the cgroup); Podman on v1 does not.
        if (
            not self._podman
            or limit <= 0
            or entry.pid is None
            or entry.id in self._watching
            or memory_v1_mount() is None
        ):
            return
        self._spawn(self._open_watcher(entry.id, entry.pid))

    async def _open_watcher(self, cid: str, pid: int) -> None:
        if cid in self._watching:
            return
        self._watching.add(cid)
        watcher = await asyncio.to_thread(OomWatcher.open, pid)
        if watcher is None:
            return
        if cid not in self._watching:  # dropped meanwhile
            watcher.close()
            return
        self._watchers[cid] = watcher
        watcher.attach(asyncio.get_running_loop(), lambda: self._oom_seen.add(cid))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _time_params(times: LogTimes) -> dict[str, str]:
    """The engine's own `since` (seconds.nanoseconds, exact on Docker and Podman) and
    `timestamps` (each record's time, which the demuxer rewrites in the kubelet's format)."""
    params: dict[str, str] = {}
    if times.since_ns is not None:
        seconds, fraction = divmod(times.since_ns, 1_000_000_000)
        params["since"] = f"{seconds}.{fraction:09d}"
    if times.timestamps:
        params["timestamps"] = "1"
    return params
