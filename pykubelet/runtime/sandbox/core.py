"""The Runtime protocol for any engine that runs a pod as a sandbox plus containers joined to it
(engine.py): what the Docker and CRI backends share, written once, as the kubelet's kuberuntime
sits over the CRI.

What it promises, whatever the engine:
- A pod has at most one ready sandbox. `run_sandbox` returns it, or makes the next attempt; a
  sandbox that is no longer ready is retired first: as the kubelet does, the pod's containers
  still running are stopped (they lost their network with it) and are started again in the new
  one, and the old sandbox is released without losing its containers' history.
- One pod's sandbox and container operations are serialised (a lock per pod UID); a
  container's image is pulled before taking it, so a slow pull never holds up the pod's
  termination. One pull per image at a time, shared by everyone waiting for it (SharedPulls),
  as imagePullPolicy says (`ensure_image`, the one implementation).
- What never ran is not kept: a container (or sandbox) whose start fails is removed, so its
  attempt number is reused and the waiting reason tells what happened; at start, what an agent
  killed between create and start left is removed. A leftover holding the name of an attempt
  (an interrupted earlier try) is removed and the create tried once more.
- Reads come from the status cache (cache.py): `list_pods` relists (cheaply), `get_pod` does
  not; our own operations refresh what they touched before returning, and the engine's change
  stream refreshes the rest and tells the listeners at once. The stream's news of our own
  creates and starts is not inspected again: one inspect after the start tells it (an engine
  round trip per event saved, two per container).
- An exited container's reason is the kubelet's: OOMKilled, Completed or Error (views.py); its
  message is enriched with its termination message, read once per exit (messages.py). The file
  made for it (runtime/termination.py) goes with the container.
- The core is the engine's ChangeSink: `watching`, `relist` and `changed` are for the engine's
  change stream, not for the layers above.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

from pykubelet.api.model import Pod
from pykubelet.runtime import logrotation
from pykubelet.runtime.base import (
    NO_LOG_TIMES,
    ChangeListener,
    ContainerConfig,
    ContainerRunState,
    ContainerStorage,
    ExecResult,
    ExecStream,
    ImageService,
    LogRotationPolicy,
    LogTimes,
    RegistryAuth,
    RuntimeContainer,
    RuntimeFailure,
    RuntimeImage,
    RuntimePod,
    RuntimeSandbox,
    RuntimeVersion,
    SandboxConfig,
    SharedPulls,
    StartError,
    TerminalSize,
    dial_local_port,
    ensure_image,
)
from pykubelet.runtime.sandbox.cache import StatusCache
from pykubelet.runtime.sandbox.engine import (
    ContainerEntry,
    Engine,
    Kind,
    NameInUse,
    PullError,
    SandboxEntry,
)
from pykubelet.runtime.sandbox.messages import finish_exited
from pykubelet.runtime.sandbox.netns import socket_in
from pykubelet.runtime.sandbox.presence import ImagePresence
from pykubelet.runtime.sandbox.views import container_view, pick_sandbox, pods, sandbox_view
from pykubelet.runtime.termination import is_message_file, remove_message_file

log = logging.getLogger(__name__)

# At start, how long to wait for the engine's change stream before listing: listening first
# means nothing that happens while we list is missed; an engine without one is not waited for.
WATCH_CONNECT_WAIT = 5.0
PULL_TIMEOUT = 600.0

R = TypeVar("R")


class SandboxRuntime(Generic[R]):
    """The Runtime protocol over an Engine; a backend's runtime is this with its engine."""

    def __init__(self, engine: Engine[R], infra_image: str) -> None:
        self.name = engine.name
        self.infra_image = infra_image
        self._engine = engine
        self._cache = StatusCache(
            engine,
            engine.name,
            lambda entry, before: finish_exited(entry, before, self._log_tail),
        )
        self._pulls = SharedPulls(self._pull)
        self._presence = ImagePresence(engine.image_present)
        self._listeners: list[ChangeListener] = []
        self._pod_locks: dict[str, asyncio.Lock] = {}
        self._started = False
        self._watch_task: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()

    def image_service(self) -> ImageService:
        return self._engine.image_store()

    # --- lifecycle ------------------------------------------------------------------------------

    async def _pull(self, image: str, auth: RegistryAuth | None) -> None:
        if auth is None:
            log.info("pulling image %s", image)
        else:
            log.info("pulling image %s as %s", image, auth.username)
        try:
            async with asyncio.timeout(PULL_TIMEOUT):
                await self._engine.pull_image(image, auth)
        except TimeoutError:
            raise StartError(
                "ErrImagePull", f'failed to pull image "{image}": no result in {PULL_TIMEOUT:g}s'
            ) from None
        except PullError as e:
            raise StartError("ErrImagePull", f'failed to pull image "{image}": {e}') from e
        log.info("pulled image %s", image)

    async def start(self) -> None:
        if self._started:
            return
        await self._engine.connect()
        self._started = True
        try:
            self._watch_task = asyncio.create_task(
                self._engine.watch(self), name=f"{self.name}-watch"
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_CONNECT_WAIT):
                    await self._watching.wait()
            await self._cache.resync()
            await self._drop_never_started()
        except BaseException:
            await self.close()
            raise
        for s in self._cache.sandboxes():
            if s.ready:
                log.info(
                    "adopted the sandbox of pod %s/%s (%s)", s.pod_namespace, s.pod_name, s.id[:12]
                )
        for c in self._cache.containers():
            if c.state is ContainerRunState.RUNNING:
                log.info(
                    "adopted container %s of pod %s/%s (%s)",
                    c.name,
                    c.pod_namespace,
                    c.pod_name,
                    c.id[:12],
                )

    async def close(self) -> None:
        """Stop listening; the containers keep running and the next start() adopts them."""
        tasks = self._pulls.cancel()
        if self._watch_task is not None:
            self._watch_task.cancel()
            tasks.append(self._watch_task)
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watch_task = None
        self._watching.clear()
        # The engine first: it stops what it spawned (a relist after a reconnect), so no relist
        # starts after the cache's is cancelled.
        if self._started:
            self._started = False
            await self._engine.close()
        await self._cache.close()

    async def version(self) -> RuntimeVersion:
        return await self._engine.version()

    async def images(self) -> list[RuntimeImage]:
        return await self._engine.images()

    def add_listener(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    # --- queries --------------------------------------------------------------------------------

    async def list_pods(self) -> list[RuntimePod]:
        # Changes found here are not announced: whoever lists (the PLEG) sees them.
        await self._cache.resync()
        return [pod for _, pod in sorted(self._pods().items())]

    async def container_storage(
        self, containers: list[RuntimeContainer]
    ) -> dict[str, ContainerStorage]:
        entries = [e for c in containers if (e := self._cache.container(c.id)) is not None]
        return await self._engine.container_storage(entries) if entries else {}

    async def get_pod(self, uid: str) -> RuntimePod | None:
        # The cache: our own operations and the change stream keep it current, and the PLEG's
        # relist corrects it within a second if a change was missed.
        return self._pods([uid]).get(uid)

    def _pods(self, only: list[str] | None = None) -> dict[str, RuntimePod]:
        scheme = self._engine.id_scheme()
        return pods(self._cache.sandboxes(), self._cache.containers(), scheme, only)

    # --- sandboxes ------------------------------------------------------------------------------

    async def run_sandbox(self, pod: Pod, config: SandboxConfig | None = None) -> RuntimeSandbox:
        async with self._pod_lock(pod.uid):
            current = pick_sandbox(self._cache.sandboxes(pod.uid))
            if current is not None and current.ready:
                return sandbox_view(current)
            attempt = 0
            if current is not None:
                attempt = current.attempt + 1
                await self._retire_sandbox(pod, current)
            await ensure_image(
                self.infra_image,
                "IfNotPresent",
                self._presence.present,
                self._pulls.pull,
                sandbox=True,
            )
            try:
                sid = await self._replacing(
                    pod,
                    lambda: self._engine.create_sandbox(pod, attempt, config),
                    self._discard_sandbox,
                )
            except NameInUse as e:
                raise RuntimeFailure(f"cannot create the sandbox of pod {pod.key}: {e}") from e
            with self._cache.expect(sid):
                try:
                    await self._engine.start_sandbox(pod, sid)
                except StartError as e:
                    await self._discard_sandbox(sid)
                    raise RuntimeFailure(
                        f"cannot start the sandbox of pod {pod.key}: {e.message}"
                    ) from e
                entry = await self._cache.refresh_sandbox(sid)
            if entry is None or not entry.ready:
                raise RuntimeFailure(self._engine.unready_sandbox(pod, entry))
            log.info("pod %s: sandbox %s at %s", pod.key, sid[:12], entry.ip or "no IP")
            self._notify(pod.uid)
            return sandbox_view(entry)

    async def _retire_sandbox(self, pod: Pod, old: SandboxEntry) -> None:
        """The sandbox is not ready (its infra process died, the node rebooted): the pod's
        network went with it. As the kubelet does, the containers still running are stopped, to
        be started again in the new sandbox, and the old one is released."""
        running = [
            c for c in self._cache.containers(pod.uid) if c.state is not ContainerRunState.EXITED
        ]
        if running:
            log.info(
                "pod %s: its sandbox is not ready; stopping %d container(s)", pod.key, len(running)
            )
        grace = float(pod.spec.termination_grace_period_seconds)
        await asyncio.gather(*(self._stop(c.id, grace) for c in running))
        try:
            await self._engine.retire_sandbox(old.id)
            await self._cache.refresh_sandbox(old.id)  # removed, or still there, not ready
        except RuntimeFailure as e:
            log.info("pod %s: the old sandbox %s stays: %s", pod.key, old.id[:12], e)

    async def remove_pod(self, uid: str) -> None:
        async with self._pod_lock(uid):
            listed = await self._engine.listing(uid)
            containers = {*listed.containers, *(c.id for c in self._cache.containers(uid))}
            sandboxes = {*listed.sandboxes, *(s.id for s in self._cache.sandboxes(uid))}
            # Containers first: Podman refuses to remove an infra container before those that
            # joined it; for a CRI runtime the order makes no difference.
            await asyncio.gather(*(self._remove_container(id, force=True) for id in containers))
            await asyncio.gather(*(self._remove_sandbox(id) for id in sandboxes))
            await self._engine.remove_pod_files(uid)
        self._pod_locks.pop(uid, None)

    async def _remove_sandbox(self, id: str) -> None:
        await self._cache.remove(id, lambda: self._engine.remove_sandbox(id))

    async def _discard_sandbox(self, id: str) -> None:
        try:
            await self._remove_sandbox(id)
        except RuntimeFailure as e:
            log.warning("%s", e)

    # --- containers -----------------------------------------------------------------------------

    async def start_container(
        self, pod: Pod, sandbox: RuntimeSandbox, config: ContainerConfig
    ) -> RuntimeContainer:
        # Pulled before taking the pod's lock: a slow pull must not hold up its termination.
        await ensure_image(
            config.image,
            config.image_pull_policy,
            self._presence.present,
            self._pulls.pull,
            credentials=config.pull_credentials,
        )
        request = self._engine.container_request(pod, sandbox.id, config)
        async with self._pod_lock(pod.uid):
            current = self._cache.sandbox(sandbox.id)
            if current is None or current.pod_uid != pod.uid:
                raise RuntimeFailure(f"pod {pod.key} has no sandbox {sandbox.id[:12]}")
            if not current.ready:
                raise RuntimeFailure(f"the sandbox of pod {pod.key} is not ready")
            infra = current
            try:
                cid = await self._replacing(
                    pod,
                    lambda: self._engine.create_container(pod, infra, request),
                    self._discard_container,
                )
            except NameInUse as e:
                raise StartError("CreateContainerError", e.message) from e
            with self._cache.expect(cid):
                try:
                    await self._engine.start_container(cid, config)
                except StartError:
                    # What never ran is not kept: the next attempt reuses the number, as with
                    # the process runtime, and the waiting reason tells what happened.
                    await self._discard_container(cid)
                    raise
                entry = await self._cache.refresh_container(cid)
        if entry is None:
            raise RuntimeFailure(f"container {config.name} of pod {pod.key} vanished at start")
        self._notify(pod.uid)
        return container_view(entry, self._engine.id_scheme())

    async def stop_container(self, container: RuntimeContainer, grace_seconds: float) -> None:
        entry = self._cache.container(container.id)
        if entry is not None and entry.state is ContainerRunState.EXITED:
            return
        await self._stop(container.id, grace_seconds)
        self._notify(container.pod_uid)

    async def _stop(self, id: str, grace_seconds: float) -> None:
        await self._engine.stop_container(id, max(math.ceil(grace_seconds), 0))
        entry = await self._cache.refresh_container(id)
        if entry is not None and entry.state is ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {id[:12]} still runs after it was stopped")

    async def remove_container(self, container: RuntimeContainer) -> None:
        entry = self._cache.container(container.id)
        if entry is not None and entry.state is ContainerRunState.RUNNING:
            raise RuntimeFailure(
                f"container {entry.name} of pod {entry.pod_namespace}/{entry.pod_name} is "
                "running: stop it before removing it"
            )
        # Forced only when the cache vouches that it is not running (a created one, say).
        gone = await self._remove_container(container.id, force=entry is not None)
        if gone is not None and gone.log_path:
            # A runtime that leaves the log file to the kubelet: it goes with the container,
            # with its rotated files.
            await asyncio.to_thread(logrotation.remove_all, Path(gone.log_path))

    async def rotate_logs(self, policy: LogRotationPolicy) -> None:
        for pod in await self.list_pods():
            for c in pod.containers:
                if c.state is not ContainerRunState.RUNNING:
                    continue
                try:
                    await self._engine.rotate_log(c.id, self._cache.container(c.id), policy)
                except RuntimeFailure as e:
                    log.warning("failed to rotate the log of container %s: %s", c.id[:12], e)

    async def _remove_container(self, id: str, *, force: bool) -> ContainerEntry | None:
        gone = await self._cache.remove(id, lambda: self._engine.remove_container(id, force=force))
        if not isinstance(gone, ContainerEntry):
            return None
        # Its termination-log file, if it is the one made for it (not a volume's file).
        path = gone.termination_file
        if path and is_message_file(path, gone.pod_uid, gone.name):
            await asyncio.to_thread(remove_message_file, path)
        return gone

    async def _log_tail(self, entry: ContainerEntry, lines: int) -> bytes:
        return await self._engine.read_log(entry.id, entry, lines, None, NO_LOG_TIMES)

    async def _discard_container(self, id: str) -> None:
        try:
            await self._remove_container(id, force=True)
        except RuntimeFailure as e:
            log.warning("%s", e)

    async def _replacing(
        self,
        pod: Pod,
        create: Callable[[], Awaitable[str]],
        remove: Callable[[str], Awaitable[None]],
    ) -> str:
        """`create()`; if a leftover holds the attempt's name, it is removed and the create
        tried once more (a second NameInUse is the caller's to report)."""
        try:
            return await create()
        except NameInUse as e:
            log.info("pod %s: replacing leftover %s", pod.key, ", ".join(e.leftovers))
            for leftover in e.leftovers:
                await remove(leftover)
        return await create()

    async def _drop_never_started(self) -> None:
        """Containers and sandboxes created but never started (an agent killed between the
        two): the sync would wait on them forever; their attempt is simply made again.
        Containers go first: an infra container outlives those that joined it."""
        containers = [c for c in self._cache.containers() if c.state is ContainerRunState.CREATED]
        for c in containers:
            log.info("removing %s of pod %s/%s: never started", c.name, c.pod_namespace, c.pod_name)
        await asyncio.gather(
            *(self._remove_container(c.id, force=True) for c in containers),
            return_exceptions=True,
        )
        sandboxes = [s for s in self._cache.sandboxes() if s.state is ContainerRunState.CREATED]
        for s in sandboxes:
            log.info(
                "removing the sandbox of pod %s/%s: never started", s.pod_namespace, s.pod_name
            )
        await asyncio.gather(
            *(self._remove_sandbox(s.id) for s in sandboxes), return_exceptions=True
        )

    # --- exec and logs --------------------------------------------------------------------------

    async def exec_sync(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        timeout_seconds: float,
    ) -> ExecResult:
        """Through the engine, which gives the command the container's own environment (so
        `env` is not needed)."""
        self._check_running(container)
        return await self._engine.exec_sync(container.id, container.name, command, timeout_seconds)

    async def exec_stream(
        self,
        container: RuntimeContainer,
        command: list[str],
        env: list[tuple[str, str]],
        *,
        stdin: bool,
        tty: bool,
        size: TerminalSize | None = None,
    ) -> ExecStream:
        """Through the engine, as exec_sync (the container's own environment)."""
        self._check_running(container)
        return await self._engine.exec_stream(
            container.id, container.name, command, stdin=stdin, tty=tty, size=size
        )

    async def attach(self, container: RuntimeContainer, *, stdin: bool, tty: bool) -> ExecStream:
        """Through the engine's own attach."""
        self._check_running(container)
        return await self._engine.attach(container.id, container.name, stdin=stdin, tty=tty)

    async def port_forward(
        self, pod_uid: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """127.0.0.1:`port` in the network namespace of the pod's ready sandbox, as the
        kubelet's runtimes dial it (netns.py: the socket is made in the namespace, then
        connected from here)."""
        sandbox = pick_sandbox(self._cache.sandboxes(pod_uid))
        if sandbox is None or not sandbox.ready:
            raise RuntimeFailure(f"pod {pod_uid} has no ready sandbox")
        path = await self._engine.sandbox_netns(sandbox.id)
        try:
            sock = await socket_in(path)
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot enter the network namespace of sandbox {sandbox.id[:12]}: {exc}"
            ) from exc
        return await dial_local_port(port, sock)

    def _check_running(self, container: RuntimeContainer) -> None:
        entry = self._cache.container(container.id)
        if entry is None or entry.state is not ContainerRunState.RUNNING:
            raise RuntimeFailure(f"container {container.name} is not running")

    async def read_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> bytes:
        entry = self._cache.container(container.id)
        return await self._engine.read_log(container.id, entry, tail_lines, limit_bytes, times)

    async def follow_log(
        self,
        container: RuntimeContainer,
        tail_lines: int | None = None,
        times: LogTimes = NO_LOG_TIMES,
    ) -> AsyncGenerator[bytes, None]:
        entry = self._cache.container(container.id)
        chunks = self._engine.follow_log(
            container.id, entry, tail_lines, times, lambda: self._has_exited(container.id)
        )
        # Closed with ours: the engine's holds a stream or a file open.
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield chunk

    def _has_exited(self, id: str) -> bool:
        entry = self._cache.container(id)
        return entry is None or entry.state is ContainerRunState.EXITED

    # --- the engine's change stream (ChangeSink) ------------------------------------------------

    def watching(self) -> None:
        self._watching.set()

    async def relist(self) -> None:
        try:
            changed = await self._cache.resync()
        except RuntimeFailure as e:
            log.warning("relisting the runtime's pods failed: %s", e)
            return
        for uid in changed:
            self._notify(uid)

    async def changed(
        self,
        id: str,
        kind: Kind | None = None,
        *,
        announce: bool = False,
        ours_at_ns: int | None = None,
    ) -> None:
        if self._cache.pending(id):
            return  # being started here: the start's own refresh follows, and tells
        before = self._cache.get(id)
        if before is not None and ours_at_ns is not None and ours_at_ns < before.inspected_ns:
            return  # our own create or start, already seen by the inspect that followed it
        if before is not None:
            kind = before.kind
        elif kind is None:
            return  # not ours, or not yet: the relist will tell
        try:
            after = await self._cache.refresh(kind, id)
        except RuntimeFailure as e:
            log.debug("change of %s: %s", id[:12], e)
            return
        if after is None:
            if before is not None:
                self._notify(before.pod_uid)
        elif before is None or before.state is not after.state or announce:
            self._notify(after.pod_uid)

    # --- helpers --------------------------------------------------------------------------------

    def _notify(self, uid: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(uid)
            except Exception:
                log.exception("runtime listener failed for pod %s", uid)

    def _pod_lock(self, uid: str) -> asyncio.Lock:
        return self._pod_locks.setdefault(uid, asyncio.Lock())
