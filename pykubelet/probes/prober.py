"""Liveness, readiness and startup probes: one task per probe of each running container.

A worker follows one container instance: when the container restarts, the pod sync hands the
new instance over and the old worker stops. Results change the pod's status (ready, started)
and, for a failed liveness or startup probe, make the pod sync kill the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from pykubelet.api.model import Container, Pod, Probe
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.probes.handlers import ActionRunner
from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod

log = logging.getLogger(__name__)


class Result(Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"


# What a probe reports before its first run, as in the kubelet.
INITIAL = {"liveness": Result.SUCCESS, "readiness": Result.FAILURE, "startup": Result.UNKNOWN}


def first_probe_after(kind: str, probe: Probe) -> float:
    """Seconds from the container's start to its first probe of `kind`, as the kubelet's worker
    (prober/worker.go) runs them: on a ticker of periodSeconds started with the container, the
    ticks before initialDelaySeconds skipped; only a readiness probe is also run at once when
    the container starts (the status manager's manual trigger), so a liveness or startup probe
    never hits a server in the instant before it listens."""
    delay = float(probe.initial_delay_seconds)
    if kind == "readiness":
        return delay
    period = float(max(probe.period_seconds, 1))
    return period * max(1, math.ceil(delay / period))


@dataclass
class _Worker:
    uid: str
    container: str
    kind: str
    container_id: str
    result: Result
    task: asyncio.Task[None] | None = None
    last_message: str = field(default="")


class ProbeManager:
    def __init__(
        self,
        runner: ActionRunner,
        recorder: EventRecorder,
        on_change: Callable[[str], None],
    ) -> None:
        self._runner = runner
        self._recorder = recorder
        self._on_change = on_change
        self._workers: dict[tuple[str, str, str], _Worker] = {}
        self._by_pod: dict[str, set[tuple[str, str, str]]] = {}  # a pod's keys: no full scans

    # --- what the pod sync asks --------------------------------------------------------------

    def result(self, uid: str, container: str, kind: str, container_id: str) -> Result | None:
        """None: the container has no such probe."""
        worker = self._workers.get((uid, container, kind))
        if worker is None or worker.container_id != container_id:
            return None if worker is None else INITIAL[kind]
        return worker.result

    def is_ready(self, pod: Pod, spec: Container, container_id: str) -> bool:
        if spec.startup_probe is not None and not self.is_started(pod, spec, container_id):
            return False
        if spec.readiness_probe is None:
            return True
        return self.result(pod.uid, spec.name, "readiness", container_id) is Result.SUCCESS

    def is_started(self, pod: Pod, spec: Container, container_id: str) -> bool:
        if spec.startup_probe is None:
            return True
        return self.result(pod.uid, spec.name, "startup", container_id) is Result.SUCCESS

    def failed_probe(self, pod: Pod, spec: Container, container_id: str) -> str | None:
        """ "liveness" or "startup" if that probe failed for this instance: kill it."""
        for kind in ("startup", "liveness"):
            if self.result(pod.uid, spec.name, kind, container_id) is Result.FAILURE:
                return kind
        return None

    # --- keeping workers in step with the containers -------------------------------------------

    def sync(self, pod: Pod, runtime_pod: RuntimePod | None) -> None:
        running: dict[str, RuntimeContainer] = {}
        for c in runtime_pod.containers if runtime_pod else []:
            if c.state is ContainerRunState.RUNNING:
                running[c.name] = c
        sandbox = runtime_pod.sandbox if runtime_pod else None
        pod_ip = sandbox.ip if sandbox else None
        wanted: set[tuple[str, str, str]] = set()
        for spec in pod.all_containers():
            instance = running.get(spec.name)
            if instance is None:
                continue
            for kind, probe in spec.probes().items():
                key = (pod.uid, spec.name, kind)
                wanted.add(key)
                worker = self._workers.get(key)
                if worker is not None and worker.container_id == instance.id:
                    continue
                if worker is not None and worker.task is not None:
                    worker.task.cancel()
                worker = _Worker(pod.uid, spec.name, kind, instance.id, INITIAL[kind])
                worker.task = asyncio.create_task(
                    self._run(worker, pod, spec, probe, instance, pod_ip),
                    name=f"probe-{kind}-{spec.name}-{pod.uid[:8]}",
                )
                self._workers[key] = worker
                self._by_pod.setdefault(pod.uid, set()).add(key)
        for key in self._by_pod.get(pod.uid, set()) - wanted:
            self._stop(key)

    def remove_pod(self, uid: str) -> None:
        for key in list(self._by_pod.get(uid, ())):
            self._stop(key)

    def _stop(self, key: tuple[str, str, str]) -> None:
        worker = self._workers.pop(key)
        keys = self._by_pod.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_pod[key[0]]
        if worker.task is not None:
            worker.task.cancel()

    async def close(self) -> None:
        tasks = [w.task for w in self._workers.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._workers.clear()
        self._by_pod.clear()
        await self._runner.close()

    # --- one probe -----------------------------------------------------------------------------

    async def _run(
        self,
        worker: _Worker,
        pod: Pod,
        spec: Container,
        probe: Probe,
        instance: RuntimeContainer,
        pod_ip: str | None,
    ) -> None:
        action = probe.handler()
        if action is None:
            return
        started = instance.started_at.timestamp() if instance.started_at else time.time()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(
                max(0.0, started + first_probe_after(worker.kind, probe) - time.time())
            )
            successes = failures = 0
            ref = ObjectRef(
                "Pod",
                pod.metadata.name,
                pod.metadata.namespace,
                pod.uid,
                f"spec.containers{{{spec.name}}}",
            )
            while True:
                if worker.kind != "startup" and not self.is_started(pod, spec, instance.id):
                    # The startup probe gates the others.
                    await asyncio.sleep(probe.period_seconds)
                    continue
                try:
                    ok, message = await self._runner.run(
                        action, pod, spec, instance, pod_ip, probe.timeout_seconds
                    )
                except Exception as exc:  # a probe must fail, not end, on a surprise
                    ok, message = False, f"{type(exc).__name__}: {exc}"
                if ok:
                    successes, failures = successes + 1, 0
                else:
                    successes, failures = 0, failures + 1
                    self._recorder.record(
                        "Warning",
                        "Unhealthy",
                        f"{worker.kind.title()} probe failed: {message}",
                        ref,
                    )
                new = worker.result
                threshold = probe.success_threshold if worker.kind == "readiness" else 1
                if ok and successes >= threshold:
                    new = Result.SUCCESS
                elif not ok and failures >= probe.failure_threshold:
                    new = Result.FAILURE
                if new is not worker.result:
                    worker.result = new
                    worker.last_message = message
                    self._on_change(pod.uid)
                if worker.kind == "startup" and new is Result.SUCCESS:
                    return  # started: the other probes take over
                if worker.kind in ("liveness", "startup") and new is Result.FAILURE:
                    return  # the container is killed; its next instance gets a new worker
                await asyncio.sleep(probe.period_seconds)
