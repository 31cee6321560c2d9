"""Cluster mode (`--kubeconfig`): the agent as a node of a Kubernetes cluster.

Built by the composition root (`app.py`) only, never imported by the kubelet. `Cluster` ties
the parts together and gives the root its tasks:
- connect: `connection.py` loads the kubeconfig and builds the client, retried while it fails;
- pods: the API server source (`config/apiserver.py`), the third producer of the merger;
- node: registration, the Lease heartbeat, the node status (`node.py`);
- status: pod status patches (`status/patcher.py`), for API pods and, through their mirror
  pods, for static pods;
- mirrors: mirror pods of the static pods (`mirror.py`);
- events: the recorder's events posted to the API server (`event_sink.py`);
- finalizer: the kubelet's final delete (`finalizer.py`);
- services: the Services of the pods' service variables (`services.py`), built by the root
  before the kubelet, which reads them through `ServiceEnv`.

It reads the kubelet through `KubeletView` and hears of it through the listeners it registers
(statuses, events, terminated pods). At shutdown the root stops the pods first, then calls
`close()`, which sends the statuses still pending (at most 2 s) and closes the client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from pykubelet.api.model import Pod
from pykubelet.client.kubeapi import KubeApi
from pykubelet.cluster.connection import ApiConnection
from pykubelet.cluster.event_sink import EventSink
from pykubelet.cluster.finalizer import FinalDeletes, RuntimePods
from pykubelet.cluster.mirror import MirrorPods
from pykubelet.cluster.node import NodeAgent, NodeRuntime, Registration
from pykubelet.cluster.services import ServiceWatch
from pykubelet.common.allocatable import NodeResources
from pykubelet.common.events import EventRecorder
from pykubelet.common.machine import MachineFacts
from pykubelet.common.options import Options
from pykubelet.config.apiserver import ApiSource
from pykubelet.config.types import PodUpdate
from pykubelet.kubelet.pod_store import PodView
from pykubelet.pod.workers import WorkerState
from pykubelet.status.manager import StatusManager
from pykubelet.status.patcher import StatusSync, Target

log = logging.getLogger(__name__)

Obj = dict[str, Any]

SHUTDOWN_FLUSH_SECONDS = 2.0


class KubeletView(Protocol):
    """What the cluster layer reads of the kubelet."""

    @property
    def pods(self) -> PodView: ...

    def worker_state(self, uid: str) -> WorkerState | None: ...

    def health_problems(self) -> list[str]: ...

    def node_resources(self) -> NodeResources: ...

    def pressure_conditions(self) -> frozenset[str]: ...

    def add_terminated_listener(
        self, listener: Callable[[str, Pod | None], Awaitable[None]]
    ) -> None: ...


class Cluster:
    def __init__(
        self,
        opts: Options,
        connection: ApiConnection,
        kubelet: KubeletView,
        runtime: RuntimePods,
        *,
        runtime_name: str,
        host_ip: str,
        facts: MachineFacts,
        recorder: EventRecorder,
        statuses: StatusManager,
        push: Callable[[PodUpdate], None],
        services: ServiceWatch | None = None,
        node_ips: list[str] | None = None,
        node_runtime: NodeRuntime | None = None,
    ) -> None:
        self.connection = connection
        self.services = services
        self._kubelet = kubelet
        self.status = StatusSync(self._target)
        self.source = ApiSource(opts.node_name, push, recorder, rejected=self._rejected)
        self.node = NodeAgent(
            opts.node_name,
            host_ip=host_ip,
            max_pods=opts.max_pods,
            runtime_name=runtime_name,
            facts=facts,
            health_problems=kubelet.health_problems,
            resources=kubelet.node_resources(),
            node_ips=node_ips,
            registration=Registration(
                register_node=opts.register_node,
                labels=dict(opts.node_labels),
                taints=[t.as_api() for t in opts.register_with_taints],
                provider_id=opts.provider_id,
            ),
            node_runtime=node_runtime,
            pressure=kubelet.pressure_conditions,
        )
        self.mirrors = MirrorPods(kubelet.pods, self.source, self.node, opts.node_name)
        self.events = EventSink(opts.node_name, opts.event_qps, opts.event_burst)
        self.finalizer = FinalDeletes(connection, self.source, self.status, kubelet, runtime)
        self.source.add_listener(lambda: self.status.retarget(self.mirrors.static_uids()))
        statuses.add_listener(self.status.on_status)
        recorder.add_listener(self.events.on_event)
        kubelet.add_terminated_listener(self.finalizer.on_terminated)

    def tasks(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        tasks = [
            ("cluster-connect", self.connection.run()),
            ("cluster-pods", self._with_api(self.source.run)),
            ("cluster-node", self._with_api(self.node.run)),
            ("cluster-status", self._with_api(self.status.run)),
            ("cluster-mirrors", self._with_api(self.mirrors.run)),
            ("cluster-events", self._with_api(self.events.run)),
            ("cluster-finalizer", self._with_api(self.finalizer.run)),
        ]
        if self.services is not None:
            tasks.append(("cluster-services", self._with_api(self.services.run)))
        return tasks

    async def _with_api(self, run: Callable[[KubeApi], Awaitable[None]]) -> None:
        await self.connection.with_api(run)

    async def close(self) -> None:
        await self.finalizer.close()
        api = self.connection.api
        if api is not None and not await self.status.flush(api, within=SHUTDOWN_FLUSH_SECONDS):
            log.info("some pod statuses were not sent before the agent stopped")
        await self.connection.close()

    # --- status ---

    def _target(self, uid: str) -> Target | None:
        obj = self.source.api_object(uid)
        if obj is None:
            obj = self.mirrors.mirror_of(uid)
        if obj is None:
            return None
        meta = obj.get("metadata") or {}
        return Target(
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            obj.get("status") or {},
        )

    def _rejected(self, obj: Obj, message: str) -> None:
        """A pod we cannot run: Failed in the API server, as the kubelet's admission does."""
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        if uid and uid not in self._kubelet.pods:
            self.status.set(
                uid,
                {
                    "phase": "Failed",
                    "reason": "FailedValidation",
                    "message": f"pykubelet: {message}",
                },
            )
