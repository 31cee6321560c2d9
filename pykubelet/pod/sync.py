"""What one sync of a pod does: drive the runtime towards the spec, then compute the status.

This is the kubelet's SyncPod / computePodActions, written against the runtime interface only,
so every backend gets the same restart policies, back-off, init-container order and termination.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from pykubelet.api.model import Container, Pod, PodStatus
from pykubelet.api.static import CONFIG_SOURCE
from pykubelet.common import metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.config.types import API_SOURCE
from pykubelet.pod.backoff import Backoff
from pykubelet.pod.dns import ClusterSettings, DnsError
from pykubelet.pod.envvars import (
    Allocatable,
    ApiObjects,
    EnvError,
    NoServices,
    ServiceEnv,
    ServicesNotSynced,
    container_env,
    expand,
    pod_service_env,
    skipped_env_names,
)
from pykubelet.pod.network import PodNetwork
from pykubelet.pod.policies import (
    MIN_GRACE_SECONDS,
    default_pull_policy,
    grace_seconds,
    should_restart,
    spec_hash,
)
from pykubelet.pod.pullsecrets import PullSecret, pull_credentials
from pykubelet.pod.security import SecurityError, security_fields
from pykubelet.pod.volumes import (
    NoApiServer,
    ObjectLookup,
    VolumeError,
    VolumeManager,
    fetch_objects,
)
from pykubelet.pod.workers import SyncResult, UpdateType
from pykubelet.probes.handlers import ActionRunner
from pykubelet.probes.prober import ProbeManager
from pykubelet.runtime.base import (
    ContainerConfig,
    ContainerRunState,
    Mount,
    Runtime,
    RuntimeContainer,
    RuntimeFailure,
    RuntimePod,
    RuntimeSandbox,
    StartError,
)
from pykubelet.runtime.termination import create_message_file, remove_message_file
from pykubelet.status.generate import TERMINAL_PHASES, Waiting, compute_pod_status
from pykubelet.status.manager import StatusManager

log = logging.getLogger(__name__)


def _pod_ref(pod: Pod, container: str | None = None) -> ObjectRef:
    ephemeral = {c.name for c in pod.ephemeral_containers()}
    kind = "ephemeralContainers" if container in ephemeral else "containers"
    field_path = f"spec.{kind}{{{container}}}" if container else ""
    return ObjectRef("Pod", pod.metadata.name, pod.metadata.namespace, pod.uid, field_path)


# How soon a pod whose sandbox could not be made (its hostname, its DNS) is tried again.
SANDBOX_RETRY_SECONDS = 10.0
# How soon a pod whose volumes could not be set up is tried again.
VOLUME_RETRY_SECONDS = 2.0
# How soon a container that waits for the Services to be listed is tried again (no back-off:
# the list usually answers within a moment of the pods').
SERVICES_RETRY_SECONDS = 1.0
# A kill that interrupted a sync looks this long for a container the sync was starting (the
# docker and CRI runtimes learn of a new container from the engine's events or a relist).
STRAGGLER_SECONDS = 3.0
STRAGGLER_POLL_SECONDS = 0.25
MAX_STOP_PASSES = 20
# How soon a pod whose sync met an operating-system or runtime error is tried again (the pod
# workers' back-off period).
SYNC_ERROR_RETRY_SECONDS = 10.0


class _Pass:
    """What one sync learns on its way: waiting reasons, the earliest back-off end, and the
    pod's API objects and volume paths (read once per sync)."""

    def __init__(self) -> None:
        self.waiting: dict[str, Waiting] = {}
        self.requeue: list[float] = []
        self.objects = ApiObjects()
        self.volume_paths: dict[str, str] = {}
        self.pull_secrets: list[PullSecret] = []


TerminatedListener = Callable[[str, Pod | None], Awaitable[None]]


# API pods synced at once; the others wait for their turn (their kills do not: a termination is
# not a sync). A thousand pods bound at once otherwise each hold a sync on the one event loop,
# where every step of each (its token request, its start, its status) waits behind the steps of
# all the others, and the statuses of the first pods queue behind the starts of the last.
# Measured, 1,000 API pods at once (four alternating runs): all running as soon (3.27 s both),
# the status lag's p99 0.54-1.03 -> 0.26-0.29 s. Static pods (files, a URL) are not limited:
# their syncs are short, and the same limit made a burst of 1,000 of them 13 % slower.
MAX_API_SYNCS = 128


class PodSync:
    """Implements the pod workers' PodSyncer against a Runtime."""

    def __init__(
        self,
        runtime: Runtime,
        statuses: StatusManager,
        recorder: EventRecorder,
        host_ip: str,
        actions: ActionRunner,
        prober: ProbeManager,
        volumes: VolumeManager,
        node: Allocatable,
        objects: ObjectLookup | None = None,
        services: ServiceEnv | None = None,
        network: PodNetwork | None = None,
        max_api_syncs: int = MAX_API_SYNCS,
    ) -> None:
        self.runtime = runtime
        self._api_syncs = asyncio.Semaphore(max_api_syncs)
        self.volumes = volumes
        # Hostnames, DNS and /etc/hosts (the kubelet's defaults without a network given).
        self.network = network or PodNetwork(ClusterSettings(), recorder, "", volumes.pod_dir)
        self.node = node
        # ConfigMaps and Secrets: the API server's in cluster mode.
        self.objects: ObjectLookup = objects if objects is not None else NoApiServer()
        # The Services of the service variables: the API server's in cluster mode.
        self.services: ServiceEnv = services if services is not None else NoServices()
        self._last_volumes: dict[str, tuple[ApiObjects, dict[str, str]]] = {}  # uid -> last good
        self._volume_failures: dict[str, int] = {}  # uid -> failed set-ups in a row
        self._interrupted: set[str] = set()  # uids whose sync a kill cancelled
        self.statuses = statuses
        self.recorder = recorder
        self.host_ip = host_ip
        self.actions = actions
        self.prober = prober
        self.backoff = Backoff(time.time)
        self._start_failures: dict[str, tuple[float, Waiting]] = {}
        self._keys_of_pod: dict[str, set[str]] = {}  # uid -> its back-off keys, to forget them
        self._first_seen: dict[str, float] = {}  # uid -> monotonic time; dropped once running
        # uid -> each container's (id, state) as the pod's last finished sync saw them: what
        # its status already tells (`saw`).
        self._seen_states: dict[str, tuple[tuple[str, ContainerRunState], ...]] = {}
        # The pods whose running sync has yet to take its last look at the runtime, which will
        # see every container started so far (`saw`).
        self._will_look: set[str] = set()
        self._refused: set[str] = set()  # uid/name of ephemeral containers said to be refused
        # Called once a pod's containers are all stopped (e.g. for the API's final delete).
        self._terminated_listeners: list[Callable[[str, Pod | None], Awaitable[None]]] = []

    def add_terminated_listener(
        self, listener: Callable[[str, Pod | None], Awaitable[None]]
    ) -> None:
        self._terminated_listeners.append(listener)

    def note_seen(self, uid: str) -> None:
        """The sync loop saw the pod for the first time: its start latency counts from here."""
        self._first_seen.setdefault(uid, time.monotonic())

    def saw(self, uid: str, container_id: str, state: ContainerRunState) -> bool:
        """Whether the pod's status tells that the container is in this state: its last
        finished sync saw it so, or (for a running container) its sync is running and has yet
        to look at the runtime for the status, which will see it. A PLEG event that tells only
        that (the start a sync made) needs no sync of its own. (A sync started 1,000
        containers, and the PLEG's events for them synced each pod again, nothing changed,
        while later pods waited for their first start; the once-a-second relist still found
        about half of them started by a sync not yet finished.) A container that exited is
        never taken as seen so: the running sync may have decided about it before."""
        if state is ContainerRunState.RUNNING and uid in self._will_look:
            return True
        return (container_id, state) in self._seen_states.get(uid, ())

    # --- SyncPod ------------------------------------------------------------------------------

    async def sync_pod(self, update: UpdateType, pod: Pod) -> SyncResult:
        self._will_look.add(pod.uid)
        try:
            if pod.metadata.annotations.get(CONFIG_SOURCE) == API_SOURCE:
                async with self._api_syncs:
                    return await self._sync_pod(update, pod)
            return await self._sync_pod(update, pod)
        except (RuntimeFailure, OSError) as e:
            # An operating-system or runtime error in a step without its own event (the
            # runtime's view, stopping a container it no longer wants): as the kubelet's
            # "Error syncing pod", one line and a retry; a traceback is for our own bugs.
            log.error(
                "pod %s: sync failed: %s; retrying in %gs", pod.key, e, SYNC_ERROR_RETRY_SECONDS
            )
            return SyncResult(requeue_after=SYNC_ERROR_RETRY_SECONDS)
        except asyncio.CancelledError:
            # A kill cancelled this sync (pod workers): a container it was creating may reach
            # the runtime's view only after the termination looked. Termination looks longer.
            self._interrupted.add(pod.uid)
            raise
        finally:
            self._will_look.discard(pod.uid)

    async def _sync_pod(self, update: UpdateType, pod: Pod) -> SyncResult:
        uid = pod.uid
        previous = self.statuses.get(uid)
        if previous is not None and previous.phase in TERMINAL_PHASES:
            return SyncResult(terminal=True)
        runtime_pod = await self.runtime.get_pod(uid)
        sandbox = runtime_pod.sandbox if runtime_pod is not None else None
        if sandbox is None or not sandbox.ready:
            try:
                sandbox_config = await self.network.sandbox_config(pod)
            except DnsError as e:
                return self._sandbox_failed(pod, runtime_pod, previous, str(e))
            try:
                sandbox = await self.runtime.run_sandbox(pod, sandbox_config)
            except RuntimeFailure as e:
                # No space, no memory, the engine refusing: the kubelet's event and waiting
                # reason, tried again later, not a traceback.
                return self._sandbox_failed(pod, runtime_pod, previous, str(e))
            runtime_pod = await self.runtime.get_pod(uid)
        instances: dict[str, list[RuntimeContainer]] = defaultdict(list)
        for c in runtime_pod.containers if runtime_pod else []:
            instances[c.name].append(c)

        state = _Pass()
        await self._stop_unknown(pod, instances)
        mounted = await self._setup_volumes(pod, state)
        state.pull_secrets = await self._pull_secrets(pod)
        initialized, init_failed = False, False
        if mounted:
            # As the kubelet, before the init containers: a pod whose init containers fail can
            # still be debugged.
            await self._sync_ephemeral_containers(pod, sandbox, instances, state)
            initialized, init_failed = await self._sync_init_containers(
                pod, sandbox, instances, state
            )
        if initialized:
            for spec in pod.spec.containers:
                await self._sync_container(
                    pod, sandbox, spec, instances[spec.name], pod.spec.restart_policy, state
                )
        # From here, a container that starts is not in this look: its PLEG event syncs again.
        self._will_look.discard(uid)
        runtime_pod = await self.runtime.get_pod(uid)
        self.prober.sync(pod, runtime_pod)
        status = compute_pod_status(
            pod,
            runtime_pod,
            state.waiting,
            previous,
            self.host_ip,
            initialized,
            init_failed,
            probes=self.prober,
        )
        self.statuses.set(uid, status)
        self._seen_states[uid] = (
            tuple((c.id, c.state) for c in runtime_pod.containers) if runtime_pod else ()
        )
        if (
            uid in self._first_seen
            and status.container_statuses
            and all(c.state.running is not None for c in status.container_statuses)
        ):
            metrics.pod_start_duration.observe(time.monotonic() - self._first_seen.pop(uid))
        if status.phase in TERMINAL_PHASES:
            self._first_seen.pop(uid, None)
            return SyncResult(terminal=True)
        return SyncResult(requeue_after=min(state.requeue) if state.requeue else None)

    def _sandbox_failed(
        self, pod: Pod, runtime_pod: RuntimePod | None, previous: PodStatus | None, why: str
    ) -> SyncResult:
        """The sandbox cannot be made (its hostname or DNS): as the kubelet, an event and the
        containers waiting in ContainerCreating, tried again later."""
        message = f"Failed to create pod sandbox: {why}"
        self.recorder.record("Warning", "FailedCreatePodSandBox", message, _pod_ref(pod))
        log.warning(
            "pod %s: cannot create its sandbox: %s; retrying in %gs",
            pod.key,
            why,
            SANDBOX_RETRY_SECONDS,
        )
        waiting = {c.name: Waiting("ContainerCreating", message) for c in pod.all_containers()}
        status = compute_pod_status(
            pod, runtime_pod, waiting, previous, self.host_ip, False, probes=self.prober
        )
        self.statuses.set(pod.uid, status)
        return SyncResult(requeue_after=SANDBOX_RETRY_SECONDS)

    async def _pull_secrets(self, pod: Pod) -> list[PullSecret]:
        """The pod's image pull secrets, read at each sync (the kubelet's getPullSecretsForPod):
        one that cannot be read is left out with a warning event, and the pull is tried
        without it."""
        found: list[PullSecret] = []
        failed: list[str] = []
        for ref in pod.spec.image_pull_secrets or []:
            if not ref.name:
                continue  # the API server allowed empty names; the kubelet ignores them
            try:
                typed = await self.objects.typed_secret(pod.metadata.namespace, ref.name)
                if typed is None:
                    raise EnvError(f'secret "{ref.name}" not found')
            except EnvError as e:
                log.info(
                    "pod %s: unable to retrieve pull secret %s, the image pull may not succeed: %s",
                    pod.key,
                    ref.name,
                    e,
                )
                failed.append(ref.name)
                continue
            found.append(PullSecret(ref.name, typed[0], typed[1]))
        if failed:
            self.recorder.record(
                "Warning",
                "FailedToRetrieveImagePullSecret",
                f"Unable to retrieve some image pull secrets ({', '.join(failed)}); attempting "
                "to pull the image may not succeed.",
                _pod_ref(pod),
            )
        return found

    async def _setup_volumes(self, pod: Pod, state: _Pass) -> bool:
        """Read the pod's ConfigMaps and Secrets and prepare its volumes. False: containers
        cannot start yet (the kubelet's FailedMount; they wait in ContainerCreating).

        Once a pod's volumes were set up, a later failure (its ConfigMap deleted, the API
        server away) keeps what was mounted: the running pod carries on, as with the kubelet.
        """
        uid = pod.uid
        try:
            state.objects = await fetch_objects(pod, self.objects)
            state.volume_paths = await self.volumes.setup(pod, state.objects)
        except (EnvError, VolumeError) as e:
            message = str(e)
            if not isinstance(e, VolumeError):
                message = f"cannot read the pod's ConfigMaps and Secrets: {message}"
            self.recorder.record("Warning", "FailedMount", message, _pod_ref(pod))
            failures = self._volume_failures.get(uid, 0) + 1
            self._volume_failures[uid] = failures
            state.requeue.append(min(VOLUME_RETRY_SECONDS * 2 ** (failures - 1), 60.0))
            last = self._last_volumes.get(uid)
            if last is not None:
                state.objects, state.volume_paths = last
                return True
            for spec in pod.all_containers():
                state.waiting[spec.name] = Waiting("ContainerCreating", message)
            return False
        self._volume_failures.pop(uid, None)
        self._last_volumes[uid] = (state.objects, state.volume_paths)
        return True

    async def _stop_unknown(self, pod: Pod, instances: dict[str, list[RuntimeContainer]]) -> None:
        known = {c.name for c in pod.all_containers()}
        for name in [n for n in instances if n not in known]:
            for c in instances.pop(name):
                if c.state is ContainerRunState.RUNNING:
                    await self._stop(pod, None, c, grace_seconds(pod, None))
                await self.runtime.remove_container(c)

    async def _sync_init_containers(
        self,
        pod: Pod,
        sandbox: RuntimeSandbox,
        instances: dict[str, list[RuntimeContainer]],
        state: _Pass,
    ) -> tuple[bool, bool]:
        """Init containers one at a time, each to exit 0; sidecars count once started.

        Returns (initialized, failed): failed means the pod failed for good (policy Never).
        """
        for spec in pod.spec.init_containers:
            history = instances[spec.name]
            latest = history[-1] if history else None
            if spec.restart_policy == "Always":  # a sidecar: started is enough, keep it running
                await self._sync_container(pod, sandbox, spec, history, "Always", state)
                if latest is None and spec.name in state.waiting:
                    return False, False
                continue
            if latest is not None and latest.state is ContainerRunState.EXITED:
                if latest.exit_code == 0:
                    continue
                if pod.spec.restart_policy == "Never":
                    return False, True
                await self._sync_container(pod, sandbox, spec, history, "OnFailure", state)
                return False, False
            if latest is None:
                await self._sync_container(pod, sandbox, spec, history, "Never", state)
            return False, False  # running (or just started): wait for it to exit
        return True, False

    async def _sync_ephemeral_containers(
        self,
        pod: Pod,
        sandbox: RuntimeSandbox,
        instances: dict[str, list[RuntimeContainer]],
        state: _Pass,
    ) -> None:
        """Ephemeral containers start once and are never restarted (computePodActions): one
        with an instance, running or exited, is left alone; a start that failed is tried again
        after its back-off, as any failed start. With targetContainerName the container joins
        the process namespace of the target's latest instance."""
        for spec in pod.ephemeral_containers():
            if instances[spec.name]:
                continue
            refusal = spec.refusal()
            if refusal is not None:
                state.waiting[spec.name] = Waiting("CreateContainerConfigError", refusal)
                key = f"{pod.uid}/{spec.name}"
                if key not in self._refused:
                    self._refused.add(key)
                    self.recorder.record(
                        "Warning", "Failed", f"Error: {refusal}", _pod_ref(pod, spec.name)
                    )
                continue
            target_id: str | None = None
            if spec.target_container_name:
                targets = instances[spec.target_container_name]
                if not targets:
                    message = f"unable to find target container {spec.target_container_name}"
                    state.waiting[spec.name] = Waiting("CreateContainerConfigError", message)
                    state.requeue.append(1.0)
                    continue
                target_id = targets[-1].id
            await self._start(pod, sandbox, spec, 0, spec_hash(spec), state, target_id=target_id)

    async def _sync_container(
        self,
        pod: Pod,
        sandbox: RuntimeSandbox,
        spec: Container,
        history: list[RuntimeContainer],
        policy: str,
        state: _Pass,
    ) -> None:
        latest = history[-1] if history else None
        wanted_hash = spec_hash(spec)
        key = self._backoff_key(pod, spec.name, wanted_hash)
        if latest is None:
            await self._start(pod, sandbox, spec, 0, wanted_hash, state)
            return
        if latest.state in (ContainerRunState.RUNNING, ContainerRunState.CREATED):
            failed = self.prober.failed_probe(pod, spec, latest.id)
            if failed is not None:
                probe = spec.liveness_probe if failed == "liveness" else spec.startup_probe
                override = probe.termination_grace_period_seconds if probe else None
                self.recorder.record(
                    "Normal",
                    "Killing",
                    f"Container {spec.name} failed {failed} probe, will be restarted",
                    _pod_ref(pod, spec.name),
                )
                await self._stop(pod, spec, latest, grace_seconds(pod, override))
                return  # it exited: the restart policy decides at the next sync
            if latest.spec_hash != wanted_hash:
                self.recorder.record(
                    "Normal",
                    "Killing",
                    f"Container {spec.name} definition changed, will be restarted",
                    _pod_ref(pod, spec.name),
                )
                await self._stop(pod, spec, latest, grace_seconds(pod, None))
                await self._start(pod, sandbox, spec, latest.attempt + 1, wanted_hash, state)
            return
        if not should_restart(policy, latest.exit_code):
            return
        finished = latest.finished_at.timestamp() if latest.finished_at else time.time()
        remaining = self.backoff.remaining(key, finished)
        if remaining > 0:
            delay = self.backoff.delay_of(key)
            message = (
                f"back-off {delay:g}s restarting failed container={spec.name} "
                f"pod={pod.metadata.name}_{pod.metadata.namespace}({pod.uid})"
            )
            state.waiting[spec.name] = Waiting("CrashLoopBackOff", message)
            state.requeue.append(remaining)
            self.recorder.record(
                "Warning",
                "BackOff",
                "Back-off restarting failed container",
                _pod_ref(pod, spec.name),
            )
            return
        await self._start(pod, sandbox, spec, latest.attempt + 1, wanted_hash, state)

    async def _start(
        self,
        pod: Pod,
        sandbox: RuntimeSandbox,
        spec: Container,
        attempt: int,
        wanted_hash: str,
        state: _Pass,
        *,
        target_id: str | None = None,
    ) -> bool:
        key = self._backoff_key(pod, spec.name, wanted_hash)
        failure = self._start_failures.get(key)
        if failure is not None:
            remaining = self.backoff.remaining(key, failure[0])
            if remaining > 0:
                waiting = failure[1]
                if waiting.reason == "ErrImagePull":
                    # What Kubernetes shows between pull attempts.
                    waiting = Waiting("ImagePullBackOff", f'Back-off pulling image "{spec.image}"')
                state.waiting[spec.name] = waiting
                state.requeue.append(remaining)
                return False
        ref = _pod_ref(pod, spec.name)
        try:
            # As the kubelet: an API pod waits until the Services were listed once, a static
            # pod does not. Services that change later reach only containers started later.
            services = pod_service_env(
                pod, self.services, wait=pod.metadata.annotations.get(CONFIG_SOURCE) == API_SOURCE
            )
        except ServicesNotSynced as e:
            state.waiting[spec.name] = Waiting("CreateContainerConfigError", str(e))
            state.requeue.append(SERVICES_RETRY_SECONDS)
            self.recorder.record("Warning", "Failed", f"Error: {e}", ref)
            return False
        try:
            env = container_env(
                pod,
                spec,
                self.host_ip,
                sandbox.ip or self.host_ip,
                state.objects,
                self.node,
                services,
            )
            mounts = await self.volumes.container_mounts(pod, spec, state.volume_paths)
            etc_mounts, resolv_conf = await self.network.container_files(pod, sandbox.ip, mounts)
            security = security_fields(pod, spec)
            # The kubelet's makeMounts: a new file per start, bound last, read-write. A
            # manifest without the field (not defaulted by an API server) has none.
            message_path = spec.termination_message_path or ""
            message_file = None
            if message_path:
                message_file = await asyncio.to_thread(
                    create_message_file, self.volumes.pod_dir(pod.uid), spec.name
                )
                if message_file is not None:
                    etc_mounts = [*etc_mounts, Mount(message_file, message_path)]
        except (EnvError, VolumeError, SecurityError, DnsError) as e:
            waiting = Waiting("CreateContainerConfigError", str(e))
            state.waiting[spec.name] = waiting
            self.backoff.record_start(key)
            self._start_failures[key] = (time.time(), waiting)
            state.requeue.append(self.backoff.delay_of(key))
            self.recorder.record("Warning", "Failed", f"Error: {e}", ref)
            return False
        skipped = skipped_env_names(spec, state.objects)
        if skipped:
            self.recorder.record(
                "Warning",
                "InvalidEnvironmentVariableNames",
                "Keys [" + ", ".join(skipped) + "] from envFrom were skipped since they are "
                "considered invalid environment variable names.",
                ref,
            )
        values = dict(env)
        config = ContainerConfig(
            name=spec.name,
            image=spec.image,
            command=[expand(arg, values) for arg in spec.command],
            args=[expand(arg, values) for arg in spec.args],
            env=env,
            working_dir=spec.working_dir,
            attempt=attempt,
            spec_hash=wanted_hash,
            image_pull_policy=spec.image_pull_policy or default_pull_policy(spec.image),
            pull_credentials=pull_credentials(spec.image, state.pull_secrets),
            limits={k: str(v) for k, v in spec.resources.limits.items()},
            requests={k: str(v) for k, v in spec.resources.requests.items()},
            host_ports=[
                (p.host_port, p.container_port, p.protocol) for p in spec.ports if p.host_port
            ],
            mounts=[*mounts, *etc_mounts],
            resolv_conf=resolv_conf,
            termination_message_path=message_path,
            termination_message_policy=spec.termination_message_policy or "File",
            run_as_user=security.run_as_user,
            run_as_group=security.run_as_group,
            supplemental_groups=security.supplemental_groups,
            read_only_root_filesystem=security.read_only_root_filesystem,
            privileged=security.privileged,
            run_as_non_root=security.run_as_non_root,
            no_new_privileges=security.no_new_privileges,
            capabilities_add=security.capabilities_add,
            capabilities_drop=security.capabilities_drop,
            seccomp=security.seccomp,
            seccomp_localhost_profile=security.seccomp_localhost_profile,
            proc_mount_unmasked=security.proc_mount_unmasked,
            stdin=bool(spec.stdin),
            stdin_once=bool(spec.stdin and spec.stdin_once),
            tty=bool(spec.tty),
            target_container_id=target_id,
        )
        try:
            started = await self.runtime.start_container(pod, sandbox, config)
        except (StartError, RuntimeFailure) as failed:
            if message_file is not None:
                # No container holds it (a failed pull, say): each retry would leave one more.
                await asyncio.to_thread(remove_message_file, message_file)
            # A runtime failure at a start (no space for its files, the engine gone) is the
            # kubelet's CreateContainerError: shown on the container, retried under back-off.
            exc = (
                failed
                if isinstance(failed, StartError)
                else StartError("CreateContainerError", str(failed))
            )
            waiting = Waiting(exc.reason, exc.message)
            state.waiting[spec.name] = waiting
            self.backoff.record_start(key)
            self._start_failures[key] = (time.time(), waiting)
            state.requeue.append(self.backoff.delay_of(key))
            if exc.reason == "ErrImagePull":
                # As the kubelet's pod worker re-syncs a pod whose sync failed before the image
                # back-off ends: the pod shows ImagePullBackOff until the next pull.
                state.requeue.append(self.backoff.delay_of(key) / 2)
            self.recorder.record("Warning", "Failed", f"Error: {exc.message}", ref)
            log.warning(
                "pod %s: container %s: %s: %s; back-off %gs",
                pod.key,
                spec.name,
                exc.reason,
                exc.message,
                self.backoff.delay_of(key),
            )
            return False
        if attempt > 0 and failure is None:
            # A restart (not the first start, nor a retry after a failed start, which was
            # counted when it failed): the next crash waits longer.
            self.backoff.record_start(key)
        self._start_failures.pop(key, None)
        self.recorder.record("Normal", "Started", f"Started container {spec.name}", ref)
        hook = spec.lifecycle.post_start if spec.lifecycle else None
        action = hook.handler() if hook else None
        if action is not None:
            ok, message = await self.actions.run(
                action, pod, spec, started, sandbox.ip, grace_seconds(pod, None)
            )
            if not ok:
                # As the kubelet: a failed postStart hook kills the container.
                self.recorder.record(
                    "Warning", "FailedPostStartHook", f"PostStartHook failed: {message}", ref
                )
                await self.runtime.stop_container(started, grace_seconds(pod, None))
                state.waiting[spec.name] = Waiting("PostStartHookError", message)
                return False
        return True

    async def _stop(
        self, pod: Pod | None, spec: Container | None, c: RuntimeContainer, seconds: float
    ) -> None:
        """Run the preStop hook inside the grace period, then stop with what is left of it."""
        hook = spec.lifecycle.pre_stop if spec is not None and spec.lifecycle else None
        action = hook.handler() if hook else None
        if action is not None and pod is not None and spec is not None:
            started = time.monotonic()
            runtime_pod = await self.runtime.get_pod(pod.uid)
            pod_ip = runtime_pod.sandbox.ip if runtime_pod and runtime_pod.sandbox else None
            try:
                async with asyncio.timeout(seconds):
                    ok, message = await self.actions.run(action, pod, spec, c, pod_ip, seconds)
            except TimeoutError:
                ok, message = False, f"did not finish within the grace period ({seconds:g}s)"
            if not ok:
                self.recorder.record(
                    "Warning",
                    "FailedPreStopHook",
                    f"PreStopHook failed: {message}",
                    _pod_ref(pod, spec.name),
                )
            seconds = max(seconds - (time.monotonic() - started), MIN_GRACE_SECONDS)
        await self.runtime.stop_container(c, seconds)

    def _backoff_key(self, pod: Pod, container: str, wanted_hash: str) -> str:
        # As the kubelet's stable key: a changed spec (a fixed image) starts without back-off.
        key = f"{pod.uid}/{container}/{wanted_hash}"
        self._keys_of_pod.setdefault(pod.uid, set()).add(key)
        return key

    # --- termination --------------------------------------------------------------------------

    async def sync_terminating_pod(self, uid: str, pod: Pod | None, grace: float | None) -> None:
        self._seen_states.pop(uid, None)
        interrupted = uid in self._interrupted
        self._interrupted.discard(uid)
        # After an interrupted sync, watch a little for a container that was being started.
        deadline = time.monotonic() + (STRAGGLER_SECONDS if interrupted else 0.0)
        seconds = grace_seconds(pod, grace)
        specs = {c.name: c for c in pod.all_containers()} if pod is not None else {}
        self.prober.remove_pod(uid)
        runtime_pod = await self.runtime.get_pod(uid)
        for _ in range(MAX_STOP_PASSES):
            running = [
                c
                for c in (runtime_pod.containers if runtime_pod is not None else [])
                if c.state in (ContainerRunState.RUNNING, ContainerRunState.CREATED)
            ]
            if not running:
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(STRAGGLER_POLL_SECONDS)
                runtime_pod = await self.runtime.get_pod(uid)
                continue
            for c in running:
                if pod is not None:
                    self.recorder.record(
                        "Normal", "Killing", f"Stopping container {c.name}", _pod_ref(pod, c.name)
                    )
            results = await asyncio.gather(
                *(self._stop(pod, specs.get(c.name), c, seconds) for c in running),
                return_exceptions=True,
            )
            # Every stop runs to its end before a failure is raised: the retry must not stop
            # (and run preStop for) containers that are still stopping.
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            runtime_pod = await self.runtime.get_pod(uid)
        if pod is not None and runtime_pod is not None:
            self._refresh_status(pod, runtime_pod)
        for listener in self._terminated_listeners:
            await listener(uid, pod)

    async def sync_terminated_pod(self, uid: str, pod: Pod | None, removed: bool) -> None:
        if removed:
            self.prober.remove_pod(uid)
            await self.runtime.remove_pod(uid)
            await self.volumes.teardown(uid)
            self.network.forget(uid)
            self._last_volumes.pop(uid, None)
            self._volume_failures.pop(uid, None)
            self.statuses.forget(uid)
            self._first_seen.pop(uid, None)
            self._seen_states.pop(uid, None)
            self._refused = {k for k in self._refused if not k.startswith(f"{uid}/")}
            keys = self._keys_of_pod.pop(uid, set())
            self.backoff.forget(keys)
            for key in keys:
                self._start_failures.pop(key, None)

    def on_waiting_for_name(self, pod: Pod, holder_uid: str) -> None:
        log.info(
            "pod %s (uid %s) waits for the pod it replaces (uid %s) to terminate",
            pod.key,
            pod.uid,
            holder_uid,
        )

    def _refresh_status(self, pod: Pod, runtime_pod: RuntimePod | None) -> None:
        previous = self.statuses.get(pod.uid)
        if previous is None or runtime_pod is None:
            return
        initialized = any(
            c.type == "Initialized" and c.status == "True" for c in previous.conditions
        )
        status = compute_pod_status(pod, runtime_pod, {}, previous, self.host_ip, initialized)
        if (
            pod.metadata.deletion_timestamp is not None
            and pod.metadata.annotations.get(CONFIG_SOURCE) == API_SOURCE
            and status.phase not in TERMINAL_PHASES
        ):
            # As kubelets since 1.27: a deleted API pod whose containers are all stopped ends
            # in a terminal phase (Succeeded only if every container exited 0), and that is the
            # status the API server sees before the final delete.
            codes = [
                c.state.terminated.exit_code
                for c in status.container_statuses or []
                if c.state.terminated is not None
            ]
            done = bool(codes) and len(codes) == len(pod.spec.containers)
            status.phase = "Succeeded" if done and all(code == 0 for code in codes) else "Failed"
        self.statuses.set(pod.uid, status)
