"""The Kubelet: the sync loop over the desired pods.

It holds the desired pods (`PodStore`), admits new ones (`admission.py`), runs the PLEG and the
periodic housekeeping, and hands each pod to its worker (`pod/workers.py`). The sync loop selects
over config updates, runtime events, probe results, a 1 s sync tick and 2 s housekeeping.

It knows nothing of where pods come from (the composition root, `app.py`, starts the sources
that feed `pod_config`) nor of an API server (the cluster layer reads it through its public
methods and `add_terminated_listener`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, TypeVar

from pykubelet.api.model import Container, Pod, PodStatus
from pykubelet.api.qos import qos_class
from pykubelet.common import metrics
from pykubelet.common.allocatable import NodeResources, node_resources
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.common.machine import MachineFacts
from pykubelet.common.options import Options
from pykubelet.config.pod_config import PodConfig
from pykubelet.config.types import Op, PodUpdate
from pykubelet.kubelet.admission import (
    AdmitHandler,
    NodeFeatures,
    NodeUsage,
    ResourceFit,
    admit,
    pod_requests,
)
from pykubelet.kubelet.container_gc import ContainerGC, ContainerGCPolicy
from pykubelet.kubelet.container_gc import run_periodically as run_container_gc
from pykubelet.kubelet.eviction import EvictionAdmit, EvictionManager, Sampler
from pykubelet.kubelet.eviction_policy import rules
from pykubelet.kubelet.housekeeping import Housekeeping
from pykubelet.kubelet.image_gc import ImageGC, ImageGCPolicy
from pykubelet.kubelet.image_gc import run_periodically as run_image_gc
from pykubelet.kubelet.log_rotation import run_periodically as run_log_rotation
from pykubelet.kubelet.pleg import PLEG, EventType, PodLifecycleEvent
from pykubelet.kubelet.pod_store import PodStore, PodView
from pykubelet.kubelet.sysctls import SysctlAllowlist
from pykubelet.pod.dns import ClusterSettings
from pykubelet.pod.envvars import (
    Allocatable,
    NoServices,
    ServiceEnv,
    container_env,
    pod_service_env,
)
from pykubelet.pod.network import PodNetwork
from pykubelet.pod.sync import PodSync, TerminatedListener
from pykubelet.pod.tokens import TokenManager
from pykubelet.pod.volumes import ObjectLookup, ObjectRegistry, VolumeManager
from pykubelet.pod.workers import PodWorkers, UpdateType, WorkerState
from pykubelet.probes.handlers import ActionRunner
from pykubelet.probes.prober import ProbeManager
from pykubelet.runtime.base import (
    ContainerRunState,
    LogRotationPolicy,
    Runtime,
    RuntimeContainer,
)
from pykubelet.status.generate import TERMINAL_PHASES
from pykubelet.status.manager import StatusManager

log = logging.getLogger(__name__)

SYNC_TICK = 1.0
HOUSEKEEPING_PERIOD = 2.0
ERROR_BACKOFF_MIN, ERROR_BACKOFF_MAX = 0.1, 5.0
T = TypeVar("T")


def _creation_key(pod: Pod) -> datetime:
    return pod.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC)


class Kubelet:
    def __init__(
        self,
        options: Options,
        runtime: Runtime,
        host_ip: str,
        *,
        pod_config: PodConfig,
        recorder: EventRecorder,
        statuses: StatusManager,
        objects: ObjectLookup,
        facts: MachineFacts,
        registry: ObjectRegistry | None = None,
        services: ServiceEnv | None = None,
        on_sync_loop: Callable[[], None] | None = None,
        stats: Sampler | None = None,
    ) -> None:
        """`on_sync_loop` is called at each turn of the sync loop (the service manager's
        watchdog: a loop that stops turning gets the agent restarted); `registry` hears of the
        desired pods (the ConfigMaps and Secrets `objects` will be asked for)."""
        self.options = options
        self._on_sync_loop = on_sync_loop
        self.node_name = options.node_name
        self.runtime = runtime
        self.host_ip = host_ip
        self.recorder = recorder
        self.pod_config = pod_config
        self.statuses = statuses
        self._probe_results: asyncio.Queue[str] = asyncio.Queue()  # uids whose probes changed
        self._services: ServiceEnv = services if services is not None else NoServices()
        actions = ActionRunner(runtime, host_ip, self._exec_env)
        self._prober = ProbeManager(actions, recorder, self._probe_results.put_nowait)
        self._resources = node_resources(
            facts,
            options.max_pods,
            options.kube_reserved,
            options.system_reserved,
            options.eviction_hard,
        )
        allocatable = self._resources.allocatable
        # What an unset limit shows in the downward API: the node's allocatable.
        node = Allocatable(
            cpu=Fraction(allocatable["cpu"], 1000),
            memory=allocatable["memory"],
            ephemeral_storage=allocatable["ephemeral-storage"],
        )
        volumes = VolumeManager(
            options.root_dir, node, options.allowed_host_paths, TokenManager(objects)
        )
        network = PodNetwork(
            ClusterSettings(
                tuple(options.cluster_dns),
                options.cluster_domain,
                options.resolv_conf,
                host_ip,
            ),
            recorder,
            options.node_name,
            volumes.pod_dir,
            # Process pods all share the node's network: its DNS rules for such pods apply.
            all_host_network=options.container_runtime == "process",
        )
        self._syncer = PodSync(
            runtime,
            statuses,
            recorder,
            host_ip,
            actions,
            self._prober,
            volumes,
            node,
            objects,
            services=self._services,
            network=network,
        )
        self._pods = PodStore(registry)
        self._workers = PodWorkers(self._syncer, options.sync_frequency, clock=time.monotonic)
        self._eviction = EvictionManager(
            rules(
                options.eviction_hard,
                options.eviction_soft,
                options.eviction_soft_grace_period,
                options.eviction_minimum_reclaim,
            ),
            node_name=options.node_name,
            root_dir=options.root_dir,
            memory_capacity=self._resources.capacity["memory"],
            sampler=stats,
            runtime=runtime,
            pods=self._pods,
            is_active=self._uses_capacity,
            killer=self._workers,
            statuses=statuses,
            recorder=recorder,
            volumes=volumes,
            max_pod_grace_period=options.eviction_max_pod_grace_period,
            transition_period=options.eviction_pressure_transition_period,
            interval=options.eviction_monitoring_interval,
        )
        self._syncer.add_terminated_listener(self._eviction.on_terminated)
        self._admission: list[AdmitHandler] = [
            EvictionAdmit(self._eviction),
            NodeFeatures(options.allow_privileged, options.allowed_host_paths),
            SysctlAllowlist(options.allowed_unsafe_sysctls),
            ResourceFit(options.max_pods, allocatable),
        ]
        # What the pods using capacity take of the node, kept up to date: the additions and
        # removals change it, and the pods whose worker terminated or whose status changed
        # since (`_changed`) are looked at again. A whole count per batch made one edit among
        # 1,000 pods wait 3-6 ms for admission.
        self._usage = NodeUsage()
        self._counted: dict[str, dict[str, int]] | None = None  # uid -> its requests in _usage
        self._changed: set[str] = set()
        self._workers.add_terminated_listener(self._worker_or_status_changed)
        statuses.add_listener(self._worker_or_status_changed)
        statuses.add_forget_listener(self._worker_or_status_changed)
        self._requests: dict[str, dict[str, int]] = {}  # uid -> what it asks of the node
        self._rejected: set[str] = set()  # pods admission turned away (phase Failed)
        self._pleg = PLEG(runtime)
        self._housekeeping = Housekeeping(
            runtime,
            self._pods,
            self._workers,
            volumes,
            statuses,
            recorder,
            is_rejected=self._rejected.__contains__,
            # The kubelet's local-storage eviction runs in each of its eviction manager's
            # synchronizations: every monitoring interval.
            eviction_period=options.eviction_monitoring_interval,
            stats=stats,
        )
        self._container_gc = ContainerGC(
            runtime,
            ContainerGCPolicy(
                min_age=options.minimum_container_ttl_duration,
                max_per_pod_container=options.maximum_dead_containers_per_container,
                max_containers=options.maximum_dead_containers,
            ),
            is_wanted=lambda uid: uid in self._pods or self._workers.is_known(uid),
        )
        self._image_gc = ImageGC(
            runtime.image_service(),
            ImageGCPolicy(
                high_threshold_percent=options.image_gc_high_threshold,
                low_threshold_percent=options.image_gc_low_threshold,
                min_age=options.image_minimum_gc_age,
            ),
            recorder,
            ObjectRef.node(options.node_name),
        )
        self._pleg_task: asyncio.Task[None] | None = None
        self._background: list[asyncio.Task[None]] = []
        self._last_loop_at = 0.0

    # --- what others read ---------------------------------------------------------------------

    @property
    def pods(self) -> PodView:
        return self._pods

    def worker_state(self, uid: str) -> WorkerState | None:
        return self._workers.state_of(uid)

    def add_terminated_listener(self, listener: TerminatedListener) -> None:
        """`listener(uid, pod)` once a pod's containers are all stopped."""
        self._syncer.add_terminated_listener(listener)

    def pods_with_status(self) -> list[tuple[Pod, PodStatus | None]]:
        return [(pod, self.statuses.get(pod.uid)) for pod in self._pods]

    def find_pod(self, namespace: str, name: str) -> Pod | None:
        return self._pods.find(namespace, name)

    async def running_container(
        self, namespace: str, name: str, container: str, uid: str | None = None
    ) -> tuple[RuntimeContainer, list[tuple[str, str]]]:
        """The running instance of a pod's container and its environment (what exec runs
        with); LookupError saying which part is missing."""
        pod = self._pods.find(namespace, name)
        if pod is None or (uid and pod.uid != uid):
            raise LookupError(f'pod "{namespace}/{name}" not found')
        spec = next((c for c in pod.all_containers() if c.name == container), None)
        if spec is None:
            raise LookupError(f'container "{container}" not found in pod "{namespace}/{name}"')
        runtime_pod = await self.runtime.get_pod(pod.uid)
        running = [
            c
            for c in (runtime_pod.containers if runtime_pod else [])
            if c.name == container and c.state is ContainerRunState.RUNNING
        ]
        if not running:
            raise LookupError(f'container "{container}" in pod "{namespace}/{name}" is not running')
        sandbox = runtime_pod.sandbox if runtime_pod else None
        pod_ip = sandbox.ip if sandbox is not None and sandbox.ip else ""
        return running[-1], self._exec_env(pod, spec, pod_ip)

    def _exec_env(self, pod: Pod, spec: Container, pod_ip: str) -> list[tuple[str, str]]:
        """The environment of a command run in a container (exec, exec probes and hooks), for
        the runtimes that do not keep the container's own: its variables, with the service
        variables of the Services known now."""
        services = pod_service_env(pod, self._services, wait=False)
        return container_env(pod, spec, self.host_ip, pod_ip, services=services)

    def node_resources(self) -> NodeResources:
        """Capacity, reservations and allocatable, as admission counts them."""
        return self._resources

    def pressure_conditions(self) -> frozenset[str]:
        """The node's pressure conditions that are True (the eviction manager's)."""
        return self._eviction.pressure_conditions()

    def health_problems(self) -> list[str]:
        problems = []
        if not self._pleg.healthy():
            problems.append("pleg: the runtime has not been relisted for too long")
        if self._last_loop_at and time.monotonic() - self._last_loop_at > 30:
            problems.append("syncloop: no iteration in 30s")
        return problems

    # --- run ----------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """The PLEG and the sync loop, until `stop` is set; then `shutdown()` stops the pods."""
        self._pleg_task = asyncio.create_task(self._pleg.run(), name="pleg")
        ready = self.pod_config.all_sources_ready
        self._background = [
            asyncio.create_task(self._eviction.run(), name="eviction"),
            asyncio.create_task(
                run_container_gc(self._container_gc, self.options.container_gc_period, ready, stop),
                name="container-gc",
            ),
            asyncio.create_task(
                run_image_gc(self._image_gc, self.options.image_gc_period, stop), name="image-gc"
            ),
            asyncio.create_task(
                run_log_rotation(
                    self.runtime,
                    LogRotationPolicy(
                        self.options.container_log_max_size, self.options.container_log_max_files
                    ),
                    self.options.container_log_monitor_interval,
                    stop,
                ),
                name="log-rotation",
            ),
        ]
        await self._sync_loop(stop)

    async def shutdown(self) -> None:
        tasks = [self._pleg_task] if self._pleg_task is not None else []
        tasks += self._background
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._housekeeping.close()
        kill = not self.options.keep_pods_on_exit
        if kill:
            log.info("stopping %d pods", len(self._pods))
        await self._workers.shutdown(kill=kill)
        await self._prober.close()

    # --- the sync loop ------------------------------------------------------------------------

    async def _sync_loop(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        updates, events, probes = self.pod_config.updates, self._pleg.events, self._probe_results
        # One wake-up for the loop: each source's pending get wakes it when it completes, and
        # a timer at the next tick. (asyncio.wait over the four added and removed four
        # callbacks and built two sets at each of the idle loop's 90 wake-ups a minute.)
        wake: asyncio.Future[None] = loop.create_future()

        def woken(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        def watched(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
            task = asyncio.create_task(coro)
            task.add_done_callback(woken)
            return task

        config_get = watched(updates.get())
        pleg_get = watched(events.get())
        probe_get = watched(probes.get())
        stopped = watched(stop.wait())
        next_sync = loop.time() + SYNC_TICK
        next_housekeeping = loop.time() + HOUSEKEEPING_PERIOD
        error_backoff = ERROR_BACKOFF_MIN
        try:
            while True:
                self._last_loop_at = time.monotonic()
                if self._on_sync_loop is not None:
                    self._on_sync_loop()
                if not (config_get.done() or pleg_get.done() or probe_get.done() or stopped.done()):
                    wake = loop.create_future()
                    timer = loop.call_at(min(next_sync, next_housekeeping), woken)
                    try:
                        await wake
                    finally:
                        timer.cancel()
                if stopped.done():
                    return
                if config_get.done():
                    self._safely(self._handle_config, config_get.result())
                    while not updates.empty():
                        self._safely(self._handle_config, updates.get_nowait())
                    config_get = watched(updates.get())
                if pleg_get.done():
                    self._safely(self._handle_pleg, pleg_get.result())
                    while not events.empty():
                        self._safely(self._handle_pleg, events.get_nowait())
                    pleg_get = watched(events.get())
                if probe_get.done():
                    # A probe result changed: readiness shows in the status, a failed liveness
                    # probe makes the sync kill the container.
                    uids = {probe_get.result()}
                    while not probes.empty():
                        uids.add(probes.get_nowait())
                    self._sync(uids)
                    probe_get = watched(probes.get())
                now = loop.time()
                if now >= next_sync:
                    self._sync(self._workers.due_pods())
                    next_sync = now + SYNC_TICK
                if now >= next_housekeeping:
                    delay = HOUSEKEEPING_PERIOD
                    if self.pod_config.all_sources_ready():
                        try:
                            await self._housekeeping.run_once()
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

    def _sync(self, uids: set[str] | list[str]) -> None:
        for uid in uids:
            if (pod := self._pods.get(uid)) is not None:
                self._workers.update_pod(UpdateType.SYNC, pod)

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
                self._pods.replace(pod)
                # The kubelet's HandlePodReconcile: a readiness gate's condition changed in
                # the API server, so the pod's Ready condition is computed again.
                if pod.spec.readiness_gates and pod.uid not in self._rejected:
                    self._workers.update_pod(UpdateType.SYNC, pod)

    def _handle_additions(self, pods: list[Pod]) -> None:
        counted = self._counted_usage()
        for pod in pods:  # a pod added again is admitted again, as a whole count would do
            self._uncount(pod.uid)
        for pod in sorted(pods, key=_creation_key):
            self._pods.put(pod)
            if pod.metadata.deletion_timestamp is not None:
                # Already being deleted (an API pod promoted once a name conflict ended): stop
                # whatever runs of it, never start it. It takes capacity until it terminated.
                counted[pod.uid] = requests = self._requests_of(pod)
                self._usage.add(requests)
                self._kill(pod)
                continue
            requests = self._requests_of(pod)
            result = admit(self._admission, pod, requests, self._usage)
            if not result.admit:
                self._reject(pod, result.reason, result.message)
                continue
            counted[pod.uid] = requests
            self._usage.add(requests)
            self._syncer.note_seen(pod.uid)
            self._workers.update_pod(UpdateType.CREATE, pod)

    def _counted_usage(self) -> dict[str, dict[str, int]]:
        """The pods counted in `_usage`, as a count over every known pod would find them:
        made once, then the pods whose worker or status changed since are looked at again."""
        changed, self._changed = self._changed, set()
        if self._counted is None:
            self._usage = NodeUsage()
            self._counted = {}
            changed = {pod.uid for pod in self._pods}
        for uid in changed:
            known = self._pods.get(uid)
            uses = known is not None and self._uses_capacity(uid)
            if uses and uid not in self._counted:
                assert known is not None
                self._counted[uid] = requests = self._requests_of(known)
                self._usage.add(requests)
            elif not uses:
                self._uncount(uid)
        return self._counted

    def _worker_or_status_changed(self, uid: str, *_: object) -> None:
        self._changed.add(uid)

    def _uncount(self, uid: str) -> None:
        requests = None if self._counted is None else self._counted.pop(uid, None)
        if requests is not None:
            self._usage.remove(requests)

    def _uses_capacity(self, uid: str) -> bool:
        # The kubelet's filterOutInactivePods: rejected, known terminated (a pod that came
        # already being deleted and was never started) or in a terminal phase.
        if uid in self._rejected or self._workers.state_of(uid) is WorkerState.TERMINATED:
            return False
        status = self.statuses.get(uid)
        return status is None or status.phase not in TERMINAL_PHASES

    def _requests_of(self, pod: Pod) -> dict[str, int]:
        """The pod's requests, computed once per UID (a UID's spec does not change them)."""
        found = self._requests.get(pod.uid)
        if found is None:
            found = self._requests[pod.uid] = pod_requests(pod)
        return found

    def _reject(self, pod: Pod, reason: str, message: str) -> None:
        self._rejected.add(pod.uid)
        # The kubelet's rejectPod: the event says why, the status says it was a rejection.
        self.statuses.set(
            pod.uid,
            PodStatus(
                phase="Failed",
                reason=reason,
                message=f"Pod was rejected: {message}",
                qos_class=qos_class(pod),
            ),
        )
        self.recorder.record(
            "Warning",
            reason,
            message,
            ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, pod.uid),
        )

    def _kill(self, pod: Pod) -> None:
        grace = pod.metadata.deletion_grace_period_seconds
        self._workers.update_pod(
            UpdateType.KILL, pod, grace=float(grace) if grace is not None else None
        )

    def _handle_updates(self, pods: list[Pod], op: Op) -> None:
        for pod in pods:
            if pod.uid not in self._pods:
                self._counted = None  # not from the merger; the next additions count again
            self._pods.put(pod)
            if pod.uid in self._rejected:
                continue
            if op is Op.DELETE:
                self._kill(pod)
            else:
                self._workers.update_pod(UpdateType.UPDATE, pod)

    def _handle_removals(self, pods: list[Pod]) -> None:
        for pod in pods:
            known = self._pods.remove(pod.uid)
            self._uncount(pod.uid)
            self._requests.pop(pod.uid, None)
            if pod.uid in self._rejected:
                self._rejected.discard(pod.uid)
                self.statuses.forget(pod.uid)
                continue
            self._workers.update_pod(UpdateType.KILL, known or pod, removed=True)

    def _handle_pleg(self, event: PodLifecycleEvent) -> None:
        if event.type is EventType.CONTAINER_REMOVED:
            return
        if event.type is EventType.CONTAINER_STARTED and self._syncer.saw(
            event.pod_uid, event.container_id, ContainerRunState.RUNNING
        ):
            return  # the sync that started it saw it running: its status says so already
        pod = self._pods.get(event.pod_uid)
        if pod is not None:
            self._workers.update_pod(UpdateType.SYNC, pod)
