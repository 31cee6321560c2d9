"""Containers through the Docker Engine API (`--container-runtime=docker`): Docker, or Podman's
compatible service.

A pod is a sandbox, as in the kubelet's own Docker integration: an infra container
(`--pod-infra-container-image`, run with the image's own command) owns the pod's network, IPC and
UTS namespaces and publishes its host ports, and each container of the pod joins it
(`container:<infra id>`), so they share localhost, /dev/shm, the hostname and the pod IP.

Every container carries labels naming its pod (UID, name, namespace), its container name, attempt
and spec hash, so the engine alone says what runs: a restarted agent lists them and adopts them.
Names (`k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`) are unique per attempt, so an
interrupted start cannot leave a second instance of the same attempt behind.

Reads are served from a cache of inspect results. The engine's event stream refreshes the
entry of a container that was created, started, died or was removed, and tells the listeners
(the PLEG relists at once); `list_pods` itself lists the engine (one cheap call) and re-inspects
only containers whose state differs from the cache, so the PLEG's periodic relist is the safety
net for lost events. Our own operations refresh what they touched before returning.

Request bodies and the parsing of answers are in docker_engine.py; OOM kills that Podman does not
report (cgroup v1) are watched in oom.py. aiodocker (pinned) is the HTTP client: its container
and image helpers where they fit, its `_query` where raw streams are needed (logs, events, exec).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
)
from pathlib import Path
from typing import Any, TypeVar

import aiodocker
import aiohttp

from pykubelet.api.model import Pod
from pykubelet.runtime.base import (
    LABEL_POD_UID,
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
from pykubelet.runtime.docker.engine import (
    LABEL_TYPE,
    SANDBOX_NAME,
    TYPE_CONTAINER,
    TYPE_SANDBOX,
    EngineError,
    Entry,
    LogDemuxer,
    container_body,
    container_name,
    normalize_endpoint,
    parse_inspect,
    run_state,
    sandbox_body,
    tail_offset,
)
from pykubelet.runtime.docker.oom import OomWatcher, memory_v1_mount

log = logging.getLogger(__name__)

NAME = "docker"

API_TIMEOUT = 120.0  # one ordinary call; Podman serialises creates, so a busy engine is slow
CONNECT_TIMEOUT = 10.0
STOP_SLACK = 30.0  # beyond the grace period, for the engine to kill and reap
PULL_TIMEOUT = 600.0
EVENTS_RETRY = 1.0
FOLLOW_IDLE = 0.5  # seconds without log data after which a follower checks for an exit
EVENTS_CONNECT_WAIT = 5.0
REFRESH_CONCURRENCY = 8

# Event actions after which a container's inspect result may have changed.
_REFRESH_ACTIONS = frozenset(
    {"create", "start", "restart", "die", "died", "oom", "destroy", "remove"}
)
# For a container we do not know yet, only these can make it one we should track.
_DISCOVER_ACTIONS = frozenset({"start"})


T = TypeVar("T")


# --- the runtime --------------------------------------------------------------------------------


class DockerRuntime:
    """The Runtime protocol over the Docker Engine API."""

    name = NAME

    def __init__(
        self,
        endpoint: str,
        infra_image: str,
        root_dir: Path,
        node_ip: str = "127.0.0.1",
        pod_pids_limit: int = -1,
    ) -> None:
        self.pod_pids_limit = pod_pids_limit  # per container here: the engine has no pod cgroup
        self.endpoint = normalize_endpoint(endpoint)
        self.infra_image = infra_image
        self.root_dir = root_dir  # nothing is kept there: the engine's labels are the state
        self.node_ip = node_ip
        self.podman = False
        self._client: aiodocker.Docker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._entries: dict[str, Entry] = {}
        self._seq = 0
        self._id_locks: dict[str, asyncio.Lock] = {}
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._listeners: list[ChangeListener] = []
        self._pulls = SharedPulls(self._do_pull)
        self._resync_task: asyncio.Task[set[str]] | None = None
        self._events_task: asyncio.Task[None] | None = None
        self._events_connected = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._watchers: dict[str, OomWatcher] = {}
        self._watching: set[str] = set()  # a watcher is being set up or was tried
        self._oom_seen: set[str] = set()

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(memory_v1_mount)  # read once, off the loop; cached
        try:
            self._client = aiodocker.Docker(
                url=self.endpoint,
                timeout=aiohttp.ClientTimeout(total=API_TIMEOUT, connect=CONNECT_TIMEOUT),
            )
        except ValueError as e:
            raise RuntimeFailure(f"bad container runtime endpoint {self.endpoint!r}: {e}") from e
        try:
            headers = await self._ping()
        except EngineError as e:
            await self._close_client()
            raise RuntimeFailure(
                f"{self.endpoint} does not answer as a Docker Engine API: {e}"
            ) from e
        except RuntimeFailure:
            await self._close_client()
            raise
        # From /_ping, not /version: Podman answers /version in 0.36 s (it runs conmon and runc
        # to ask theirs), and aiodocker would ask it before the first call if not told.
        api = headers.get("Api-Version", "1.41")
        self._client.api_version = f"v{api}"
        self.podman = "Libpod-Api-Version" in headers
        log.info(
            "container engine at %s: %s (API %s)",
            self.endpoint,
            headers.get("Server") or ("Podman" if self.podman else "Docker"),
            api,
        )
        self._events_task = asyncio.create_task(self._watch_events(), name="docker-events")
        try:
            # Listening first, so that nothing that happens while we list is missed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._events_connected.wait(), EVENTS_CONNECT_WAIT)
            await self._resync()
            await self._drop_never_started()
        except BaseException:
            await self.close()
            raise
        adopted = [e for e in self._entries.values() if e.state is ContainerRunState.RUNNING]
        for entry in adopted:
            log.info(
                "adopted %s %s of pod %s/%s (%s)",
                "sandbox" if entry.kind == TYPE_SANDBOX else "container",
                entry.name,
                entry.pod_namespace,
                entry.pod_name,
                entry.id[:12],
            )
            self._watch_oom(entry)

    async def close(self) -> None:
        """Stop listening; the containers keep running and the next start() adopts them."""
        self._pulls.cancel()
        for task in [self._events_task, self._resync_task, *self._tasks]:
            if task is not None:
                task.cancel()
        pending = [t for t in [self._events_task, self._resync_task, *self._tasks] if t]
        await asyncio.gather(*pending, return_exceptions=True)
        for watcher in self._watchers.values():
            watcher.close()
        self._watchers.clear()
        self._watching.clear()
        self._tasks.clear()
        self._events_task = self._resync_task = None
        self._entries.clear()
        await self._close_client()

    async def _close_client(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # --- queries --------------------------------------------------------------------------------

    async def list_pods(self) -> list[RuntimePod]:
        # Changes found here are not announced: whoever lists (the PLEG) sees them.
        await self._resync()
        return [pod for _, pod in sorted(self._pods().items())]

    async def get_pod(self, uid: str) -> RuntimePod | None:
        # The cache: our own operations and the event stream keep it current, and the PLEG's
        # relist corrects it within a second if an event was lost.
        return self._pods([uid]).get(uid)

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> bytes:
        """The engine's log of that container: the last `tail_lines` lines, of which at most the
        first `limit_bytes` bytes (as the kubelet cuts them)."""
        if tail_lines is None:
            return await self._read_log(container.id, None, limit_bytes)
        if not self.podman:
            return await self._read_log(container.id, tail_lines, limit_bytes)
        # Podman 4.3's `tail` corrupts partial lines (it glues one to the record before it, on
        # the other stream): the whole log is read and cut here.
        data = await self._read_log(container.id, None, None)
        data = data[tail_offset(data, tail_lines) :]
        return data if limit_bytes is None else data[: max(limit_bytes, 0)]

    async def _read_log(self, cid: str, tail: int | None, limit_bytes: int | None) -> bytes:
        params = {"stdout": "1", "stderr": "1"}
        if tail is not None:
            params["tail"] = str(max(tail, 0))
        entry = self._entries.get(cid)
        demux = LogDemuxer(tty=entry.tty if entry else False)
        out = bytearray()
        try:
            async with self._stream("GET", f"containers/{cid}/logs", params) as resp:
                async for chunk in resp.content.iter_any():
                    out += demux.feed(chunk)
                    if limit_bytes is not None and len(out) >= limit_bytes:
                        break
        except EngineError as e:
            if e.not_found:
                return b""
            raise RuntimeFailure(f"cannot read the log of {cid[:12]}: {e}") from e
        return bytes(out) if limit_bytes is None else bytes(out[: max(limit_bytes, 0)])

    async def follow_log(
        self, container: RuntimeContainer, tail_lines: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The engine follows the log. It should end the stream when the container exits, but
        Podman 4.3 may keep one of two concurrent followers open forever: so once the container
        is known to have exited, a pause in the data ends it too."""
        params = {"stdout": "1", "stderr": "1", "follow": "1"}
        skip = 0
        if tail_lines is not None and self.podman:
            # Its `tail` is wrong (see read_log): follow from the start, and drop what precedes
            # the last lines of what is there now. The log only grows, so that is a prefix.
            head = await self._read_log(container.id, None, None)
            skip = tail_offset(head, tail_lines)
        elif tail_lines is not None:
            params["tail"] = str(max(tail_lines, 0))
        entry = self._entries.get(container.id)
        demux = LogDemuxer(tty=entry.tty if entry else False)
        try:
            async with self._stream(
                "GET", f"containers/{container.id}/logs", params, deadline=None
            ) as resp:
                while True:
                    try:
                        chunk = await asyncio.wait_for(resp.content.readany(), FOLLOW_IDLE)
                    except TimeoutError:
                        if self._has_exited(container.id):
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
            raise RuntimeFailure(f"cannot follow the log of {container.id[:12]}: {e}") from e

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        """Through the engine's exec, which gives the command the container's own environment
        (so `env` is not needed). At the timeout the command is killed: the engine cannot."""
        entry = self._entries.get(container.id)
        if entry is None or entry.state is not ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {container.name} is not running")
        what = f"{command[0]!r} in container {container.name}" if command else "nothing"
        try:
            created = await self._json(
                "POST",
                f"containers/{container.id}/exec",
                body={"AttachStdout": True, "AttachStderr": True, "Cmd": command},
            )
        except EngineError as e:
            raise RuntimeFailure(f"cannot run {what}: {e.message}") from e
        exec_id = str(created["Id"])
        output = bytearray()
        demux = LogDemuxer()
        try:
            async with asyncio.timeout(timeout_seconds):
                async with self._stream(
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
            info = await self._json("GET", f"exec/{exec_id}/json")
        except EngineError as e:
            raise RuntimeFailure(f"cannot learn how {what} ended: {e.message}") from e
        code = info.get("ExitCode")
        if code in (126, 127) and b"exec failed" in output:
            # The runtime's own complaint that the command could not start, not its output.
            text = output.decode(errors="replace").strip().splitlines()[0]
            raise RuntimeFailure(f"cannot run {what}: {text}")
        return ExecResult(int(code) if isinstance(code, int) else -1, bytes(output))

    async def _kill_exec(self, exec_id: str) -> None:
        try:
            info = await self._json("GET", f"exec/{exec_id}/json")
        except (EngineError, RuntimeFailure) as e:
            log.warning("cannot find the exec %s that timed out: %s", exec_id[:12], e)
            return
        pid = info.get("Pid")
        if info.get("Running") and isinstance(pid, int) and pid > 1:
            # The engine reports the host pid; nothing else reaps it between the check and here
            # but its container, and a recycled pid within that instant is a risk taken.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def _has_exited(self, cid: str) -> bool:
        entry = self._entries.get(cid)
        return entry is None or entry.state is ContainerRunState.EXITED

    # --- sandboxes ------------------------------------------------------------------------------

    async def run_sandbox(self, pod: Pod) -> RuntimeSandbox:
        async with self._pod_lock(pod.uid):
            current = self._sandbox_of(pod.uid)
            if current is not None and current.state is ContainerRunState.RUNNING:
                return self._sandbox_view(current)
            attempt = 0
            if current is not None:
                attempt = current.attempt + 1
                await self._retire_sandbox(pod, current)
            await self._ensure_image(self.infra_image, "IfNotPresent", sandbox=True)
            body = sandbox_body(pod, self.infra_image, attempt)
            name = container_name(SANDBOX_NAME, pod, attempt)
            try:
                cid = await self._create(name, body)
            except EngineError as e:
                raise RuntimeFailure(f"cannot create the sandbox of pod {pod.key}: {e}") from e
            try:
                await self._post(f"containers/{cid}/start")
            except EngineError as e:
                await self._force_remove(cid)
                raise RuntimeFailure(f"cannot start the sandbox of pod {pod.key}: {e}") from e
            entry = await self._refresh(cid)
            if entry is None or entry.state is not ContainerRunState.RUNNING:
                why = f"exit code {entry.exit_code}" if entry else "it vanished"
                raise RuntimeFailure(
                    f"the sandbox of pod {pod.key} ({self.infra_image}) does not keep running "
                    f"({why}); its image's command must wait until it is stopped"
                )
            log.info("pod %s: sandbox %s at %s", pod.key, cid[:12], entry.ip or "no IP")
            self._notify(pod.uid)
            return self._sandbox_view(entry)

    async def _retire_sandbox(self, pod: Pod, old: Entry) -> None:
        """The infra container stopped: the pod's network went with it. As the kubelet does, the
        containers still running in it are stopped, and restarted in the new sandbox."""
        running = [
            e
            for e in self._entries.values()
            if e.pod_uid == pod.uid
            and e.kind == TYPE_CONTAINER
            and e.state is not ContainerRunState.EXITED
        ]
        if running:
            log.info("pod %s: its sandbox exited; stopping %d container(s)", pod.key, len(running))
        grace = float(pod.spec.termination_grace_period_seconds)
        await asyncio.gather(*(self._stop(e.id, grace) for e in running))
        # Podman keeps an infra container while containers that joined it exist, even exited
        # ones; those keep their history (lastState, --previous), so it may have to stay.
        with contextlib.suppress(RuntimeFailure, EngineError):
            await self._remove(old.id, force=True)

    async def remove_pod(self, uid: str) -> None:
        async with self._pod_lock(uid):
            try:
                rows = await self._list({"label": [f"{LABEL_POD_UID}={uid}"]})
            except EngineError as e:
                raise RuntimeFailure(f"cannot list the containers of pod {uid}: {e}") from e
            kinds = {str(r["Id"]): (r.get("Labels") or {}).get(LABEL_TYPE) for r in rows}
            for entry in self._entries.values():
                if entry.pod_uid == uid:
                    kinds.setdefault(entry.id, entry.kind)
            # Podman refuses to remove an infra container before those that joined it.
            members = [cid for cid, kind in kinds.items() if kind != TYPE_SANDBOX]
            sandboxes = [cid for cid, kind in kinds.items() if kind == TYPE_SANDBOX]
            for group in (members, sandboxes):
                await asyncio.gather(*(self._remove(cid, force=True) for cid in group))
        self._pod_locks.pop(uid, None)

    # --- containers -----------------------------------------------------------------------------

    async def start_container(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig
    ) -> RuntimeContainer:
        # Pulled before taking the pod's lock: a slow pull must not hold up its termination.
        await self._ensure_image(config.image, config.image_pull_policy)
        body = container_body(
            pod, sandbox.id, config, podman=self.podman, pids_limit=self.pod_pids_limit
        )
        name = container_name(config.name, pod, config.attempt)
        async with self._pod_lock(pod.uid):
            infra = self._entries.get(sandbox.id)
            if infra is None or infra.pod_uid != pod.uid:
                raise RuntimeFailure(f"pod {pod.key} has no sandbox {sandbox.id[:12]}")
            if infra.state is not ContainerRunState.RUNNING:
                raise RuntimeFailure(f"the sandbox of pod {pod.key} is not running")
            try:
                cid = await self._create(name, body)
            except EngineError as e:  # an unreachable engine is a RuntimeFailure already
                raise StartError("CreateContainerError", e.message) from e
            try:
                if self._wants_early_oom_watch(config):
                    await self._init_and_watch(cid)
                await self._post(f"containers/{cid}/start")
            except EngineError as e:
                # What never ran is not kept: the next attempt reuses the number, as with the
                # process runtime, and the waiting reason tells what happened.
                await self._force_remove(cid)
                raise StartError("RunContainerError", e.message) from e
            entry = await self._refresh(cid)
        if entry is None:
            raise RuntimeFailure(f"container {config.name} of pod {pod.key} vanished at start")
        self._watch_oom(entry)
        self._notify(pod.uid)
        return self._container_view(entry)

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        entry = self._entries.get(container.id)
        if entry is not None and entry.state is ContainerRunState.EXITED:
            return
        await self._stop(container.id, grace_seconds)
        self._notify(container.pod_uid)

    async def _stop(self, cid: str, grace_seconds: float) -> None:
        seconds = max(math.ceil(grace_seconds), 0)
        try:
            await self._post(
                f"containers/{cid}/stop", {"t": str(seconds)}, deadline=seconds + STOP_SLACK
            )
        except EngineError as e:
            if not e.not_found and "not running" not in e.message:
                raise RuntimeFailure(f"cannot stop container {cid[:12]}: {e}") from e
        entry = await self._refresh(cid)
        if entry is not None and entry.state is ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {cid[:12]} still runs after it was stopped")

    async def remove_container(self, container: RuntimeContainer) -> None:
        entry = self._entries.get(container.id)
        if entry is not None and entry.state is ContainerRunState.RUNNING:
            raise RuntimeFailure(
                f"container {entry.name} of pod {entry.pod_namespace}/{entry.pod_name} is "
                "running: stop it before removing it"
            )
        # Forced only when the cache vouches that it is not running (a created one, say).
        await self._remove(container.id, force=entry is not None)

    # --- images ---------------------------------------------------------------------------------

    async def _ensure_image(self, image: str, policy: str, sandbox: bool = False) -> None:
        await ensure_image(image, policy, self._image_present, self._pulls.pull, sandbox=sandbox)

    async def _image_present(self, image: str) -> bool:
        try:
            await self._json("GET", f"images/{image}/json")
        except EngineError as e:
            if e.not_found:
                return False
            raise RuntimeFailure(f"cannot inspect image {image}: {e}") from e
        return True

    async def _do_pull(self, image: str) -> None:
        client = self._require_client()
        log.info("pulling image %s", image)
        try:
            async with asyncio.timeout(PULL_TIMEOUT):
                await client.images.pull(image, timeout=None)
        except TimeoutError:
            raise StartError(
                "ErrImagePull", f'failed to pull image "{image}": no result in {PULL_TIMEOUT:g}s'
            ) from None
        except aiodocker.DockerError as e:
            if e.status == 900:
                raise RuntimeFailure(f"cannot reach the container engine: {e.message}") from e
            raise StartError("ErrImagePull", f'failed to pull image "{image}": {e.message}') from e
        except aiohttp.ClientError as e:
            raise StartError("ErrImagePull", f'failed to pull image "{image}": {e}') from e
        log.info("pulled image %s", image)

    # --- the cache ------------------------------------------------------------------------------

    async def _refresh(self, cid: str) -> Entry | None:
        """Inspect one container into the cache (or out of it, if it is gone or not ours)."""
        entry = await self._refresh_locked(cid)
        if entry is None:
            self._forget_lock(cid)
        return entry

    async def _refresh_locked(self, cid: str) -> Entry | None:
        async with self._id_lock(cid):
            try:
                info = await self._json("GET", f"containers/{cid}/json")
            except EngineError as e:
                if e.not_found:
                    self._drop(cid)
                    return None
                raise RuntimeFailure(f"cannot inspect container {cid[:12]}: {e}") from e
            entry = parse_inspect(info, self.node_ip)
            if entry is None:  # not one of ours
                self._drop(cid)
                return None
            self._seq += 1
            entry.seq = self._seq
            self._entries[entry.id] = entry
            if entry.state is ContainerRunState.EXITED:
                watcher = self._watchers.pop(entry.id, None)
                if watcher is not None:
                    watcher.poll()  # a notification not read yet still counts
                    watcher.close()
            return entry

    def _drop(self, cid: str) -> Entry | None:
        entry = self._entries.pop(cid, None)
        watcher = self._watchers.pop(cid, None)
        if watcher is not None:
            watcher.close()
        self._watching.discard(cid)
        self._oom_seen.discard(cid)
        return entry

    def _forget_lock(self, cid: str) -> None:
        lock = self._id_locks.get(cid)
        if lock is not None and not lock.locked() and cid not in self._entries:
            del self._id_locks[cid]

    async def _resync(self) -> set[str]:
        """List the engine, re-inspect what changed, forget what is gone; the UIDs of the pods
        that changed. Callers arriving while one runs share it."""
        task = self._resync_task
        if task is None or task.done():
            task = asyncio.create_task(self._do_resync(), name="docker-resync")
            self._resync_task = task
        return await asyncio.shield(task)

    async def _do_resync(self) -> set[str]:
        seen_before = self._seq
        try:
            rows = await self._list({"label": [LABEL_TYPE]})
        except EngineError as e:
            raise RuntimeFailure(f"cannot list containers: {e}") from e
        present: dict[str, ContainerRunState] = {}
        for row in rows:
            present[str(row["Id"])] = run_state(str(row.get("State", "")))
        stale = [
            cid
            for cid, state in present.items()
            if cid not in self._entries or self._entries[cid].state is not state
        ]
        changed = await self._bounded(self._refresh(cid) for cid in stale)
        uids = {e.pod_uid for e in changed if e is not None}
        for cid in [
            c for c, e in self._entries.items() if c not in present and e.seq <= seen_before
        ]:
            gone = self._drop(cid)
            if gone is not None:
                uids.add(gone.pod_uid)
        return uids

    async def _bounded(self, coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
        limit = asyncio.Semaphore(REFRESH_CONCURRENCY)

        async def one(coro: Coroutine[Any, Any, T]) -> T:
            async with limit:
                return await coro

        return await asyncio.gather(*(one(c) for c in coros))

    async def _drop_never_started(self) -> None:
        """Containers created but never started (an agent killed between the two): the sync
        would wait on them forever; their attempt is simply made again."""
        created = [e for e in self._entries.values() if e.state is ContainerRunState.CREATED]
        for kind in (TYPE_CONTAINER, TYPE_SANDBOX):
            group = [e for e in created if e.kind == kind]
            for e in group:
                log.info(
                    "removing %s of pod %s/%s: never started", e.name, e.pod_namespace, e.pod_name
                )
            await asyncio.gather(
                *(self._remove(e.id, force=True) for e in group), return_exceptions=True
            )

    def _pods(self, only: Iterable[str] | None = None) -> dict[str, RuntimePod]:
        wanted = None if only is None else set(only)
        grouped: dict[str, list[Entry]] = {}
        for entry in self._entries.values():
            if wanted is None or entry.pod_uid in wanted:
                grouped.setdefault(entry.pod_uid, []).append(entry)
        pods: dict[str, RuntimePod] = {}
        for uid, entries in grouped.items():
            sandbox = _pick_sandbox([e for e in entries if e.kind == TYPE_SANDBOX])
            members = sorted(
                (e for e in entries if e.kind == TYPE_CONTAINER),
                key=lambda e: (e.name, e.attempt, e.created_at),
            )
            named = sandbox or (members[-1] if members else entries[0])
            pods[uid] = RuntimePod(
                uid=uid,
                name=named.pod_name,
                namespace=named.pod_namespace,
                sandbox=None if sandbox is None else self._sandbox_view(sandbox),
                containers=[self._container_view(e) for e in members],
            )
        return pods

    def _sandbox_of(self, uid: str) -> Entry | None:
        return _pick_sandbox(
            [e for e in self._entries.values() if e.pod_uid == uid and e.kind == TYPE_SANDBOX]
        )

    def _sandbox_view(self, entry: Entry) -> RuntimeSandbox:
        return RuntimeSandbox(
            id=entry.id,
            pod_uid=entry.pod_uid,
            pod_name=entry.pod_name,
            pod_namespace=entry.pod_namespace,
            ready=entry.state is ContainerRunState.RUNNING,
            ip=entry.ip,
            created_at=entry.created_at,
        )

    def _container_view(self, entry: Entry) -> RuntimeContainer:
        reason = message = None
        if entry.state is ContainerRunState.EXITED:
            code = entry.exit_code
            oom = entry.engine_oom or (entry.id in self._oom_seen and code != 0)
            if oom:
                reason = "OOMKilled"
            elif code == 0:
                reason = "Completed"
            else:
                reason = "Error"
            message = entry.error or None
        return RuntimeContainer(
            id=entry.id,
            runtime=NAME,
            pod_uid=entry.pod_uid,
            pod_name=entry.pod_name,
            pod_namespace=entry.pod_namespace,
            name=entry.name,
            attempt=entry.attempt,
            spec_hash=entry.spec_hash,
            image=entry.image,
            state=entry.state,
            created_at=entry.created_at,
            started_at=entry.started_at,
            finished_at=entry.finished_at,
            exit_code=entry.exit_code,
            reason=reason,
            message=message,
            pid=entry.pid,
        )

    # --- OOM kills the engine does not report ---------------------------------------------------

    def _wants_early_oom_watch(self, config: ContainerConfig) -> bool:
        # Podman on cgroup v1 is the engine that misses OOM kills. Its libpod API can create the
        # container's cgroup (init) before starting it, so that even an OOM in the first
        # milliseconds is seen.
        return self.podman and "memory" in config.limits and memory_v1_mount() is not None

    async def _init_and_watch(self, cid: str) -> None:
        await self._post(f"libpod/containers/{cid}/init")
        info = await self._json("GET", f"containers/{cid}/json")
        pid = (info.get("State") or {}).get("Pid")
        if isinstance(pid, int) and pid > 0:
            await self._open_watcher(cid, pid)

    def _watch_oom(self, entry: Entry) -> None:
        # Docker reports OOM kills itself (containerd watches the cgroup); Podman on v1 does not.
        if (
            not self.podman
            or entry.kind != TYPE_CONTAINER
            or entry.state is not ContainerRunState.RUNNING
            or entry.memory_limit <= 0
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
        assert self._loop is not None
        self._watchers[cid] = watcher
        watcher.attach(self._loop, lambda: self._oom_seen.add(cid))

    # --- events ---------------------------------------------------------------------------------

    async def _watch_events(self) -> None:
        first = True
        while True:
            try:
                async with self._stream(
                    "GET", "events", {"filters": json.dumps({"type": ["container"]})}, deadline=None
                ) as resp:
                    self._events_connected.set()
                    if not first:
                        # Whatever happened while disconnected is learnt by listing.
                        self._spawn(self._resync_quietly())
                    first = False
                    async for line in resp.content:
                        if line.strip():
                            await self._on_event_line(line)
                log.warning("the container engine closed its event stream; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("container engine events: %s; retrying in %gs", e, EVENTS_RETRY)
            self._events_connected.clear()
            await asyncio.sleep(EVENTS_RETRY)

    async def _resync_quietly(self) -> None:
        try:
            changed = await self._resync()
        except RuntimeFailure as e:
            log.warning("relisting containers failed: %s", e)
            return
        for uid in changed:
            self._notify(uid)

    async def _on_event_line(self, line: bytes) -> None:
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
        before = self._entries.get(cid)
        if before is None:
            attributes = actor.get("Attributes") or {}
            # Docker puts the labels in the event; Podman does not, so it is inspected.
            if action not in _DISCOVER_ACTIONS or (
                not self.podman and LABEL_TYPE not in attributes
            ):
                return
        try:
            after = await self._refresh(cid)
        except RuntimeFailure as e:
            log.debug("event %s for %s: %s", action, cid[:12], e)
            return
        if after is None:
            if before is not None:
                self._notify(before.pod_uid)
        elif before is None or before.state is not after.state or action == "oom":
            self._notify(after.pod_uid)

    # --- engine calls ---------------------------------------------------------------------------

    def _require_client(self) -> aiodocker.Docker:
        if self._client is None:
            raise RuntimeFailure("the docker runtime is not started")
        return self._client

    @contextlib.contextmanager
    def _engine_errors(self) -> Iterator[None]:
        """The client's errors as the runtime's: unreachable → RuntimeFailure, else EngineError."""
        try:
            yield
        except aiodocker.DockerError as e:
            if e.status == 900:
                raise RuntimeFailure(
                    f"cannot reach the container engine at {self.endpoint}: {e.message}"
                ) from e
            raise EngineError(e.status, e.message) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RuntimeFailure(f"container engine at {self.endpoint}: {e!r}") from e

    async def _call(self, call: Callable[[aiodocker.Docker], Awaitable[T]]) -> T:
        client = self._require_client()
        with self._engine_errors():
            return await call(client)

    async def _json(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        return await self._call(lambda c: c._query_json(path, method, params=params, data=body))

    async def _post(
        self, path: str, params: dict[str, str] | None = None, deadline: float | None = None
    ) -> None:
        async def call(c: aiodocker.Docker) -> None:
            async with c._query(
                path,
                "POST",
                params=params,
                timeout=_timeout(deadline if deadline is not None else API_TIMEOUT),
            ) as resp:
                await resp.read()

        await self._call(call)

    @contextlib.asynccontextmanager
    async def _stream(
        self,
        method: str,
        path: str,
        params: dict[str, str],
        deadline: float | None = API_TIMEOUT,
        body: dict[str, Any] | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        client = self._require_client()
        with self._engine_errors():
            # None: no deadline at all (a log followed, the event stream), but still one to
            # connect, so a dead engine is reported.
            limit = (
                aiohttp.ClientTimeout(connect=CONNECT_TIMEOUT)
                if deadline is None
                else _timeout(deadline)
            )
            async with client._query(
                path,
                method,
                params=params,
                timeout=limit,
                data=None if body is None else json.dumps(body),
                headers=None if body is None else {"Content-Type": "application/json"},
            ) as resp:
                yield resp

    async def _ping(self) -> dict[str, str]:
        async def call(c: aiodocker.Docker) -> dict[str, str]:
            async with c._query("_ping", versioned_api=False) as resp:
                await resp.read()
                return dict(resp.headers)

        return await self._call(call)

    async def _list(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        """Id, State and Labels of the containers that match. Podman's own listing gives the
        same fields in half the time of its compatible one (15 against 30 ms for 46
        containers), and the PLEG lists every second."""
        path = "libpod/containers/json" if self.podman else "containers/json"
        rows = await self._json("GET", path, {"all": "true", "filters": json.dumps(filters)})
        return list(rows or [])

    async def _create(self, name: str, body: dict[str, Any]) -> str:
        """Create `name`; a leftover of that name (an interrupted earlier try) is replaced."""
        for retry in (True, False):
            try:
                created = await self._json("POST", "containers/create", {"name": name}, body)
                return str(created["Id"])
            except EngineError as e:
                if not (retry and e.conflict):
                    raise
                log.info("replacing leftover container %s", name)
                await self._force_remove(name)
        raise AssertionError("unreachable")

    async def _remove(self, cid: str, force: bool) -> None:
        async with self._id_lock(cid):
            params = {"v": "1", "force": "1" if force else "0"}
            try:
                await self._call(lambda c: _delete(c, f"containers/{cid}", params))
            except EngineError as e:
                if not e.not_found:
                    raise RuntimeFailure(f"cannot remove container {cid[:12]}: {e}") from e
            self._drop(cid)
        self._forget_lock(cid)

    async def _force_remove(self, cid: str) -> None:
        try:
            await self._remove(cid, force=True)
        except RuntimeFailure as e:
            log.warning("%s", e)

    # --- helpers --------------------------------------------------------------------------------

    def _notify(self, uid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(uid)
            except Exception:
                log.exception("runtime listener failed for pod %s", uid)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _pod_lock(self, uid: str) -> asyncio.Lock:
        return self._pod_locks.setdefault(uid, asyncio.Lock())

    def _id_lock(self, cid: str) -> asyncio.Lock:
        return self._id_locks.setdefault(cid, asyncio.Lock())


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds, connect=CONNECT_TIMEOUT, sock_read=seconds)


async def _delete(client: aiodocker.Docker, path: str, params: dict[str, str]) -> None:
    async with client._query(path, "DELETE", params=params) as resp:
        await resp.read()


def _pick_sandbox(sandboxes: list[Entry]) -> Entry | None:
    """The running infra container if there is one, else the latest attempt."""
    if not sandboxes:
        return None
    return max(
        sandboxes,
        key=lambda e: (e.state is ContainerRunState.RUNNING, e.attempt, e.created_at),
    )
