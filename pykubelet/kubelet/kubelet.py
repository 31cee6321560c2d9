"""The Kubelet: starts the sources, the PLEG and the server, and runs the sync loop.

The sync loop selects over config updates, runtime events, a 1 s sync tick and 2 s
housekeeping, and hands each pod to its worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from typing import TYPE_CHECKING, TypeVar

from pykubelet.api.model import Pod, PodStatus
from pykubelet.common import metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.common.machine import read_machine_facts
from pykubelet.common.options import Options
from pykubelet.config.file import FileSource
from pykubelet.config.pod_config import PodConfig
from pykubelet.config.types import (
    API_SOURCE,
    FILE_SOURCE,
    HTTP_SOURCE,
    NotificationMode,
    Op,
    PodUpdate,
)
from pykubelet.kubelet.admission import RESOURCES, pod_requests
from pykubelet.kubelet.pleg import PLEG, EventType, PodLifecycleEvent
from pykubelet.pod.envvars import Allocatable
from pykubelet.pod.sync import PodSync
from pykubelet.pod.volumes import VolumeManager, host_path_allowed
from pykubelet.pod.workers import PodWorkers, UpdateType
from pykubelet.probes.handlers import ActionRunner
from pykubelet.probes.prober import ProbeManager
from pykubelet.runtime.base import Runtime
from pykubelet.runtime.instrumented import InstrumentedRuntime
from pykubelet.server.endpoints import ReadOnlyServer, build_app
from pykubelet.status.generate import TERMINAL_PHASES
from pykubelet.status.manager import StatusManager

if TYPE_CHECKING:
    from pykubelet.cluster.cluster import Cluster

log = logging.getLogger(__name__)

SYNC_TICK = 1.0
HOUSEKEEPING_PERIOD = 2.0
# How often emptyDir usage is measured against sizeLimit (a walk of each limited volume).
EVICTION_PERIOD = 10.0
ERROR_BACKOFF_MIN, ERROR_BACKOFF_MAX = 0.1, 5.0
T = TypeVar("T")


def _count_request(method: str, path: str, code: int) -> None:
    # The first segment only, as the kubelet does: pod names must not become label values.
    first = "/" + path.lstrip("/").split("/", 1)[0]
    metrics.http_requests.labels(method, first, "readonly", str(code)).inc()


def _creation_key(pod: Pod) -> datetime:
    return pod.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)


class Kubelet:
    def __init__(self, options: Options, runtime: Runtime, host_ip: str) -> None:
        self.options = options
        self.node_name = options.node_name
        self.runtime: Runtime = InstrumentedRuntime(runtime)
        self.host_ip = host_ip
        self.recorder = EventRecorder()
        self.pod_config = PodConfig(NotificationMode.INCREMENTAL, recorder=self._merger_event)
        self.statuses = StatusManager()
        self.probe_results: asyncio.Queue[str] = asyncio.Queue()  # uids whose probes changed
        actions = ActionRunner(self.runtime, host_ip)
        self.prober = ProbeManager(actions, self.recorder, self.probe_results.put_nowait)
        facts = read_machine_facts(options.root_dir)
        node = Allocatable(
            cpu=Fraction(facts.cpus),
            memory=facts.memory_kib * 1024,
            ephemeral_storage=facts.storage_bytes,
        )
        self.volumes = VolumeManager(options.root_dir, node, options.allowed_host_paths)
        # What admission counts requests against (the kubelet's allocatable: nothing reserved).
        self._allocatable = {
            "cpu": facts.cpus * 1000,
            "memory": facts.memory_kib * 1024,
            "ephemeral-storage": facts.storage_bytes,
        }
        self.syncer = PodSync(
            self.runtime,
            self.statuses,
            self.recorder,
            host_ip,
            actions,
            self.prober,
            self.volumes,
            node,
        )
        self._next_eviction_check = 0.0
        self._volume_housekeeping: asyncio.Task[None] | None = None
        self.pleg = PLEG(self.runtime)
        self.pods: dict[str, Pod] = {}  # the desired pods (the kubelet's pod manager), by UID
        self._by_name: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self._rejected: set[str] = set()  # pods admission turned away (phase Failed)
        self._capacity_used = 0  # during one batch of additions
        self._resources_used = dict.fromkeys(RESOURCES, 0)  # likewise: cpu (m), bytes
        self._requests: dict[str, dict[str, int]] = {}  # uid -> what it asks of the node
        self._workers: PodWorkers | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.server: ReadOnlyServer | None = None
        self.cluster: Cluster | None = None
        self.sync_loop_iterations = 0
        self._last_loop_at = 0.0

    @property
    def workers(self) -> PodWorkers:
        assert self._workers is not None, "the kubelet is not running"
        return self._workers

    def _merger_event(self, reason: str, subject: str, message: str) -> None:
        self.recorder.record("Warning", reason, message, ObjectRef.node(self.node_name))

    # --- run ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._workers = PodWorkers(self.syncer, self.options.sync_frequency)
        await self.runtime.start()
        self.server = ReadOnlyServer(
            build_app(self, on_request=_count_request),
            self.options.address,
            self.options.read_only_port,
        )
        url = await self.server.start()
        log.info("read-only API at %s (pods at %s/pods)", url, url)
        self._start_sources()
        self._tasks.append(asyncio.create_task(self.pleg.run(), name="pleg"))
        try:
            await self._sync_loop(stop)
        finally:
            await self._shutdown()

    def _start_sources(self) -> None:
        opts = self.options
        if opts.pod_manifest_path is not None:
            source = FileSource(
                opts.pod_manifest_path,
                self.node_name,
                opts.file_check_frequency,
                self.pod_config.channel(FILE_SOURCE),
                self.recorder,
            )
            self._tasks.append(asyncio.create_task(source.run(), name="source-file"))
            log.info(
                "watching %s for pod manifests (re-listed every %gs)",
                opts.pod_manifest_path,
                opts.file_check_frequency,
            )
        if opts.manifest_url is not None:
            from pykubelet.config.http import HttpSource

            http = HttpSource(
                url=opts.manifest_url,
                headers=opts.manifest_url_headers,
                period=opts.http_check_frequency,
                push=self.pod_config.channel(HTTP_SOURCE),
                recorder=self.recorder,
                node_name=self.node_name,
                max_bytes=opts.manifest_url_max_bytes,
                ca_file=opts.manifest_url_ca_file,
            )
            self._tasks.append(asyncio.create_task(http.run(), name="source-http"))
            log.info(
                "fetching pod manifests from %s every %gs",
                opts.manifest_url,
                opts.http_check_frequency,
            )
        if opts.kubeconfig is not None:
            from pykubelet.cluster.cluster import Cluster

            self.cluster = Cluster(opts, self, self.pod_config.channel(API_SOURCE))
            self._tasks.extend(
                asyncio.create_task(coro, name=name) for name, coro in self.cluster.tasks()
            )
            log.info("joining the cluster of %s as node %s", opts.kubeconfig, self.node_name)
        if not self._tasks:
            log.warning(
                "no pod source configured (--pod-manifest-path, --manifest-url, --kubeconfig): "
                "no pods will run"
            )

    async def _shutdown(self) -> None:
        tasks = [*self._tasks, *([self._volume_housekeeping] if self._volume_housekeeping else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        kill = not self.options.keep_pods_on_exit
        if kill:
            log.info("stopping %d pods", len(self.pods))
        await self.workers.shutdown(kill=kill)
        await self.prober.close()
        if self.cluster is not None:
            await self.cluster.close()
        await self.runtime.close()
        if self.server is not None:
            await self.server.stop()

    # --- the sync loop ------------------------------------------------------------------------

    async def _sync_loop(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        config_get = asyncio.create_task(self.pod_config.updates.get())
        pleg_get = asyncio.create_task(self.pleg.events.get())
        probe_get = asyncio.create_task(self.probe_results.get())
        stopped = asyncio.create_task(stop.wait())
        next_sync = loop.time() + SYNC_TICK
        next_housekeeping = loop.time() + HOUSEKEEPING_PERIOD
        error_backoff = ERROR_BACKOFF_MIN
        try:
            while True:
                self._last_loop_at = time.monotonic()
                timeout = max(0.0, min(next_sync, next_housekeeping) - loop.time())
                done, _ = await asyncio.wait(
                    {config_get, pleg_get, probe_get, stopped},
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                self.sync_loop_iterations += 1
                if stopped in done:
                    return
                if config_get in done:
                    self._safely(self._handle_config, config_get.result())
                    while not self.pod_config.updates.empty():
                        self._safely(self._handle_config, self.pod_config.updates.get_nowait())
                    config_get = asyncio.create_task(self.pod_config.updates.get())
                if pleg_get in done:
                    self._safely(self._handle_pleg, pleg_get.result())
                    while not self.pleg.events.empty():
                        self._safely(self._handle_pleg, self.pleg.events.get_nowait())
                    pleg_get = asyncio.create_task(self.pleg.events.get())
                if probe_get in done:
                    # A probe result changed: readiness shows in the status, a failed liveness
                    # probe makes the sync kill the container.
                    uids = {probe_get.result()}
                    while not self.probe_results.empty():
                        uids.add(self.probe_results.get_nowait())
                    for uid in uids:
                        if (pod := self.pods.get(uid)) is not None:
                            self.workers.update_pod(UpdateType.SYNC, pod)
                    probe_get = asyncio.create_task(self.probe_results.get())
                now = loop.time()
                if now >= next_sync:
                    for uid in self.workers.due_pods():
                        if (pod := self.pods.get(uid)) is not None:
                            self.workers.update_pod(UpdateType.SYNC, pod)
                    next_sync = now + SYNC_TICK
                if now >= next_housekeeping:
                    delay = HOUSEKEEPING_PERIOD
                    if self.pod_config.all_sources_ready():
                        try:
                            await self._housekeeping()
                            error_backoff = ERROR_BACKOFF_MIN
                        except Exception:
                            # A runtime that fails (an engine that went away) must not end the
                            # loop, and with it every pod: back off, as the kubelet does.
                            log.exception("housekeeping failed; retrying in %.1fs", error_backoff)
                            delay = error_backoff
                            error_backoff = min(error_backoff * 2, ERROR_BACKOFF_MAX)
                    next_housekeeping = loop.time() + delay
        finally:
            for task in (config_get, pleg_get, probe_get, stopped):
                task.cancel()

    def _safely(self, handler: Callable[[T], None], item: T) -> None:
        try:
            handler(item)
        except Exception:
            log.exception("handling %r failed; the sync loop goes on", item)

    def _handle_config(self, update: PodUpdate) -> None:
        metrics.config_ops.labels(update.op.value).inc(len(update.pods))
        if update.op is Op.ADD:
            self._handle_additions(update.pods)
        elif update.op in (Op.UPDATE, Op.DELETE):
            self._handle_updates(update.pods, update.op)
        elif update.op is Op.REMOVE:
            self._handle_removals(update.pods)
        elif update.op is Op.RECONCILE:
            for pod in update.pods:
                if pod.uid in self.pods:
                    self.pods[pod.uid] = pod

    def _handle_additions(self, pods: list[Pod]) -> None:
        # Counted once per batch, then kept up to date: 1,000 additions stay linear.
        new = {pod.uid for pod in pods}
        admitted = [uid for uid in self.pods if uid not in new and self._uses_capacity(uid)]
        self._capacity_used = len(admitted)
        self._resources_used = dict.fromkeys(RESOURCES, 0)
        for uid in admitted:
            for name, value in self._requests_of(uid).items():
                self._resources_used[name] += value
        for pod in sorted(pods, key=_creation_key):
            self._remember(pod)
            if pod.metadata.deletion_timestamp is not None:
                # Already being deleted (an API pod promoted once a name conflict ended): stop
                # whatever runs of it, never start it.
                grace = pod.metadata.deletion_grace_period_seconds
                self.workers.update_pod(
                    UpdateType.KILL, pod, grace=float(grace) if grace is not None else None
                )
                continue
            if not self._admit(pod):
                continue
            self.syncer.note_seen(pod.uid)
            self.workers.update_pod(UpdateType.CREATE, pod)

    def _uses_capacity(self, uid: str) -> bool:
        if uid in self._rejected:
            return False
        status = self.statuses.get(uid)
        return status is None or status.phase not in TERMINAL_PHASES

    def _admit(self, pod: Pod) -> bool:
        """The kubelet's pod admission: what the node allows (privileged containers, hostPath
        volumes), then at most --max-pods non-terminal pods."""
        refusal = self._forbidden(pod)
        if refusal is not None:
            self._reject(pod, *refusal)
            return False
        used = self._capacity_used
        capacity = self.options.max_pods
        if used >= capacity:
            message = (
                "Pod was rejected: Node didn't have enough resource: pods, "
                f"requested: 1, used: {used}, capacity: {capacity}"
            )
            self._reject(pod, "OutOfpods", message)
            return False
        asked = self._requests_of(pod.uid, pod)
        for name in RESOURCES:
            allocatable = self._allocatable[name]
            if asked[name] and self._resources_used[name] + asked[name] > allocatable:
                message = (
                    f"Pod was rejected: Node didn't have enough resource: {name}, "
                    f"requested: {asked[name]}, used: {self._resources_used[name]}, "
                    f"capacity: {allocatable}"
                )
                self._reject(pod, f"OutOf{name}", message)
                return False
        self._capacity_used += 1
        for name in RESOURCES:
            self._resources_used[name] += asked[name]
        return True

    def _requests_of(self, uid: str, pod: Pod | None = None) -> dict[str, int]:
        """The pod's requests, computed once per UID (a UID's spec does not change them)."""
        found = self._requests.get(uid)
        if found is None:
            known = pod or self.pods.get(uid)
            found = pod_requests(known) if known is not None else dict.fromkeys(RESOURCES, 0)
            self._requests[uid] = found
        return found
        return False

    def _forbidden(self, pod: Pod) -> tuple[str, str] | None:
        for kind, containers in (
            ("initContainers", pod.spec.init_containers),
            ("containers", pod.spec.containers),
        ):
            for i, container in enumerate(containers):
                ctx = container.security_context
                if ctx is not None and ctx.privileged and not self.options.allow_privileged:
                    return (
                        "PrivilegedNotAllowed",
                        f"Pod was rejected: spec.{kind}[{i}].securityContext.privileged: "
                        "privileged containers are not allowed on this node "
                        "(pykubelet --allow-privileged)",
                    )
        allowed = self.options.allowed_host_paths
        for i, volume in enumerate(pod.spec.volumes or []):
            if volume.host_path is not None and not host_path_allowed(
                volume.host_path.path, allowed
            ):
                where = ", ".join(allowed) if allowed else "none are allowed"
                return (
                    "HostPathNotAllowed",
                    f"Pod was rejected: spec.volumes[{i}].hostPath.path: "
                    f"{volume.host_path.path} is not below --allowed-host-paths ({where})",
                )
        return None

    def _reject(self, pod: Pod, reason: str, message: str) -> None:
        self._rejected.add(pod.uid)
        self.statuses.set(pod.uid, PodStatus(phase="Failed", reason=reason, message=message))
        self.recorder.record(
            "Warning",
            reason,
            message,
            ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, pod.uid),
        )

    def _handle_updates(self, pods: list[Pod], op: Op) -> None:
        for pod in pods:
            self._remember(pod)
            if pod.uid in self._rejected:
                continue
            if op is Op.DELETE:
                grace = pod.metadata.deletion_grace_period_seconds
                self.workers.update_pod(
                    UpdateType.KILL, pod, grace=float(grace) if grace is not None else None
                )
            else:
                self.workers.update_pod(UpdateType.UPDATE, pod)

    def _handle_removals(self, pods: list[Pod]) -> None:
        for pod in pods:
            known = self.pods.pop(pod.uid, None)
            self._requests.pop(pod.uid, None)
            if pod.uid in self._rejected:
                self._rejected.discard(pod.uid)
                self.statuses.forget(pod.uid)
                self._forget_name(known)
                continue
            self._forget_name(known)
            self.workers.update_pod(UpdateType.KILL, known or pod, removed=True)

    def _forget_name(self, pod: Pod | None) -> None:
        if pod is not None:
            key = (pod.metadata.namespace, pod.metadata.name)
            if self._by_name.get(key) == pod.uid:
                del self._by_name[key]

    def _remember(self, pod: Pod) -> None:
        self.pods[pod.uid] = pod
        self._by_name[(pod.metadata.namespace, pod.metadata.name)] = pod.uid

    def _handle_pleg(self, event: PodLifecycleEvent) -> None:
        if event.type is EventType.CONTAINER_REMOVED:
            return
        pod = self.pods.get(event.pod_uid)
        if pod is not None:
            self.workers.update_pod(UpdateType.SYNC, pod)

    async def _housekeeping(self) -> None:
        """Kill what the runtime runs that no source wants; forget finished workers."""
        for runtime_pod in await self.runtime.list_pods():
            uid = runtime_pod.uid
            if uid in self.pods or self.workers.is_known(uid):
                continue
            log.info(
                "removing pod %s/%s (uid %s): no source has it",
                runtime_pod.namespace,
                runtime_pod.name,
                uid,
            )
            self.workers.update_pod(UpdateType.KILL, None, uid, removed=True)
        self.workers.forget_finished(set(self.pods))
        # Walking volumes can take long (a big emptyDir): in the background, one at a time, so
        # that config updates, runtime events and probes are never held up by it.
        if self._volume_housekeeping is None or self._volume_housekeeping.done():
            self._volume_housekeeping = asyncio.create_task(
                self._volume_housekeeping_pass(), name="volume-housekeeping"
            )

    async def _volume_housekeeping_pass(self) -> None:
        try:
            # Volumes of pods that ended while no agent ran (or whose removal failed half-way).
            for uid in await self.volumes.pod_uids():
                if uid not in self.pods and not self.workers.is_known(uid):
                    log.info("removing the volumes of pod %s: no source has it", uid)
                    await self.volumes.teardown(uid)
            if time.monotonic() >= self._next_eviction_check:
                self._next_eviction_check = time.monotonic() + EVICTION_PERIOD
                await self._evict_over_limit()
        except Exception:
            log.exception("volume housekeeping failed; retrying at the next housekeeping")

    async def _evict_over_limit(self) -> None:
        """The kubelet's local-storage eviction: an emptyDir past its sizeLimit fails the pod."""
        for uid, pod in list(self.pods.items()):
            if uid in self._rejected or not any(
                v.empty_dir is not None and v.empty_dir.size_limit is not None
                for v in pod.spec.volumes or []
            ):
                continue
            status = self.statuses.get(uid)
            if status is None or status.phase in TERMINAL_PHASES:
                continue
            exceeded = await self.volumes.over_limit(pod)
            if not exceeded:
                continue
            first = exceeded[0]
            message = (
                f'Usage of EmptyDir volume "{first.volume}" exceeds the limit "{first.limit}".'
            )
            log.warning("evicting pod %s: %s", pod.key, message)
            self.recorder.record(
                "Warning",
                "Evicted",
                message,
                ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, uid),
            )
            self.statuses.set(
                uid,
                status.model_copy(
                    update={"phase": "Failed", "reason": "Evicted", "message": message}
                ),
            )
            self.workers.update_pod(UpdateType.KILL, pod)

    # --- what the server reads ----------------------------------------------------------------

    def pods_with_status(self) -> list[tuple[Pod, PodStatus | None]]:
        return [(pod, self.statuses.get(uid)) for uid, pod in self.pods.items()]

    def find_pod(self, namespace: str, name: str) -> Pod | None:
        uid = self._by_name.get((namespace, name))
        return self.pods.get(uid) if uid else None

    def health_problems(self) -> list[str]:
        problems = []
        if not self.pleg.healthy():
            problems.append("pleg: the runtime has not been relisted for too long")
        if self._last_loop_at and time.monotonic() - self._last_loop_at > 30:
            problems.append("syncloop: no iteration in 30s")
        return problems
