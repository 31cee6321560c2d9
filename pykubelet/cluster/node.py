"""The Node object of this agent: registration, the Lease heartbeat and the node status.

As the kubelet:
- registration creates the Node (`--node-name`) with its labels (the kubelet's own, then
  `--node-labels` over them), `--register-with-taints`, `--provider-id` and status; if it
  exists already (a restart), only the kubelet's own labels are reconciled and the status
  patched (the kubelet applies --node-labels and taints at creation only). With
  `--register-node=false` the Node is never created: its status is patched once someone has
  created it. Retried until it works.
- addresses: an InternalIP per node IP (primary first), then the Hostname (the node name, as
  the kubelet's --hostname-override); nodeInfo.containerRuntimeVersion is the runtime's own
  (`containerd://1.6.20`, `docker://<version>`, `process://<pykubelet version>`), status.images
  the images it holds, largest first, at most 50 with at most 5 names each (the kubelet's
  nodeStatusMaxImages and MaxNamesPerImageInNodeStatus).
- the heartbeat is the Lease `kube-node-lease/<node>` (coordination.k8s.io/v1), renewed every
  10 s with an optimistic update (a conflict re-reads it); the node controller marks the node
  NotReady when it is not renewed for its 40 s duration.
- the node status (capacity, allocatable, addresses, nodeInfo, conditions) is computed every
  10 s and patched when it changed, and at least every minute (the kubelet's
  nodeStatusReportFrequency is 5 minutes; a minute is the issue's choice). Ready is False while
  the agent reports a health problem (the PLEG or the sync loop stuck), with that problem as
  its message. MemoryPressure, DiskPressure and PIDPressure are the eviction manager's, in the
  kubelet's reasons and messages; while one is True its taint
  (`node.kubernetes.io/memory-pressure:NoSchedule`, ...) is on the Node's spec.taints, merged
  with the other taints (the node lifecycle controller's work in a cluster, done here; where
  NodeRestriction refuses a node its own taints, as kube-apiserver does for system:node:<name>,
  that is logged once and left to the controller).

Capacity: cpu is the CPUs this process may use, memory MemTotal, pods `--max-pods`,
ephemeral-storage the size of the file system of `--root-dir`. Allocatable is capacity less
--kube-reserved, --system-reserved and the hard eviction threshold (common/allocatable.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pykubelet import __version__
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.client.throttle import Failures, Retry
from pykubelet.common.allocatable import NodeResources, Reserved, node_resources
from pykubelet.common.machine import MachineFacts
from pykubelet.runtime.base import RuntimeImage, RuntimeVersion

log = logging.getLogger(__name__)

Obj = dict[str, Any]

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
LEASE_PERIOD = 10.0  # the kubelet renews at a quarter of the duration
STATUS_PERIOD = 10.0  # the kubelet's nodeStatusUpdateFrequency
STATUS_REPORT_PERIOD = 60.0
KUBELET_VERSION = f"v{__version__}-pykubelet"
MAX_IMAGES = 50  # nodeStatusMaxImages
MAX_NAMES_PER_IMAGE = 5  # MaxNamesPerImageInNodeStatus


@dataclass(frozen=True)
class Registration:
    """What the Node is created with besides its status (the registration flags)."""

    register_node: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Obj] = field(default_factory=list)
    provider_id: str = ""


class NodeRuntime(Protocol):
    """What the node status reports of the container runtime."""

    async def version(self) -> RuntimeVersion: ...

    async def images(self) -> list[RuntimeImage]: ...


def node_images(images: list[RuntimeImage]) -> list[Obj]:
    """status.images as the kubelet reports them."""
    named = sorted((i for i in images if i.names), key=lambda i: i.size_bytes, reverse=True)
    return [
        {"names": list(i.names[:MAX_NAMES_PER_IMAGE]), "sizeBytes": i.size_bytes}
        for i in named[:MAX_IMAGES]
    ]


def node_addresses(node_ips: list[str], hostname: str) -> list[Obj]:
    return [{"type": "InternalIP", "address": ip} for ip in node_ips] + [
        {"type": "Hostname", "address": hostname}
    ]


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_time(when: datetime) -> str:
    # A MicroTime needs exactly six fractional digits (Go's RFC3339Micro), or it is rejected.
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_labels(node_name: str, arch: str) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": arch,
    }


def _condition(type_: str, ok: bool, reason: str, message: str) -> Obj:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
    }


# The kubelet's pressure conditions (nodestatus/setters.go): reason and message when True, when
# False; and the taint the node lifecycle controller puts on a node with the condition True.
_PRESSURE = (
    ("MemoryPressure",
     ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
     ("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
     "node.kubernetes.io/memory-pressure"),
    ("DiskPressure",
     ("KubeletHasDiskPressure", "kubelet has disk pressure"),
     ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
     "node.kubernetes.io/disk-pressure"),
    ("PIDPressure",
     ("KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
     ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
     "node.kubernetes.io/pid-pressure"),
)  # fmt: skip
PRESSURE_TAINT_KEYS = frozenset(taint for *_, taint in _PRESSURE)


def pressure_conditions(pressure: frozenset[str]) -> list[Obj]:
    out = []
    for type_, true, false, _ in _PRESSURE:
        reason, message = true if type_ in pressure else false
        out.append(_condition(type_, type_ in pressure, reason, message))
    return out


def with_pressure_taints(taints: list[Obj], pressure: frozenset[str]) -> list[Obj]:
    """`taints` with the pressure taints (NoSchedule) of exactly the conditions in `pressure`;
    every other taint kept as it is."""
    out = [t for t in taints if t.get("key") not in PRESSURE_TAINT_KEYS]
    out += [
        {"key": taint, "effect": "NoSchedule"}
        for type_, *_, taint in _PRESSURE
        if type_ in pressure
    ]
    return out


def node_status(
    facts: MachineFacts,
    host_ip: str,
    max_pods: int,
    runtime: str,
    problems: list[str],
    kubelet_port: int = 0,
    resources: NodeResources | None = None,
    pressure: frozenset[str] = frozenset(),
    *,
    addresses: list[Obj] | None = None,
    runtime_version: str | None = None,
    images: list[Obj] | None = None,
) -> Obj:
    """The status without its times (those are added when it is reported)."""
    if resources is None:  # nothing reserved
        resources = node_resources(facts, max_pods, Reserved(), Reserved(), ())
    capacity = resources.node_quantities("capacity")
    ready = not problems
    conditions = [
        *pressure_conditions(pressure),
        _condition("Ready", ready, "KubeletReady" if ready else "KubeletNotReady",
                   "kubelet is posting ready status" if ready else "; ".join(problems)),
    ]  # fmt: skip
    status: Obj = {
        "capacity": capacity,
        "allocatable": resources.node_quantities("allocatable"),
        "addresses": addresses or node_addresses([host_ip], facts.hostname),
        "nodeInfo": {
            "machineID": facts.machine_id,
            "systemUUID": facts.system_uuid,
            "bootID": facts.boot_id,
            "kernelVersion": facts.kernel,
            "osImage": facts.os_image,
            "containerRuntimeVersion": runtime_version or f"{runtime}://{__version__}",
            "kubeletVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": facts.arch,
        },
        "conditions": conditions,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
    }
    if images:
        status["images"] = images
    return status


def with_times(status: Obj, previous: Obj | None, now: datetime) -> Obj:
    """Add heartbeat times to the conditions; a transition time changes only with the status."""
    before = {c["type"]: c for c in (previous or {}).get("conditions", [])}
    out = dict(status)
    conditions = []
    for cond in status["conditions"]:
        old = before.get(cond["type"])
        since = (
            old["lastTransitionTime"]
            if old is not None
            and old.get("status") == cond["status"]
            and old.get("lastTransitionTime")
            else _rfc3339(now)
        )
        conditions.append({**cond, "lastHeartbeatTime": _rfc3339(now), "lastTransitionTime": since})
    out["conditions"] = conditions
    return out


class NodeAgent:
    """Registers the node, then keeps its Lease and status fresh."""

    def __init__(
        self,
        node_name: str,
        *,
        host_ip: str,
        max_pods: int,
        runtime_name: str,
        facts: MachineFacts,
        health_problems: Callable[[], list[str]],
        resources: NodeResources | None = None,
        pressure: Callable[[], frozenset[str]] = frozenset,
        lease_period: float = LEASE_PERIOD,
        status_period: float = STATUS_PERIOD,
        report_period: float = STATUS_REPORT_PERIOD,
        node_ips: list[str] | None = None,
        registration: Registration | None = None,
        node_runtime: NodeRuntime | None = None,
    ) -> None:
        self.node_name = node_name
        self._host_ip = host_ip
        self._addresses = node_addresses(node_ips or [host_ip], node_name)
        self._registration = registration or Registration()
        self._node_runtime = node_runtime
        self._runtime_version: str | None = None
        self._images: list[Obj] = []
        self._max_pods = max_pods
        self._runtime_name = runtime_name
        self._facts = facts
        self._health_problems = health_problems
        self._resources = resources
        self._pressure = pressure
        self._tainted: frozenset[str] | None = None  # the pressure last put in spec.taints
        self._taints_refused = False  # NodeRestriction said no once: not logged again
        self._kubelet_port = 0
        self.lease_period = lease_period
        self.status_period = status_period
        self.report_period = report_period
        self.registered = asyncio.Event()
        self.node_uid = ""
        self._reported: Obj | None = None  # the status last reported, with times
        self._reported_at = 0.0
        self._lease: Obj | None = None
        self.lease_renewals = 0
        self._lease_failures = Failures(f"renewing the Lease {LEASE_NAMESPACE}/{self.node_name}")
        self._status_failures = Failures(f"updating the status of node {self.node_name}")

    def advertise_port(self, port: int) -> None:
        """The port of the kubelet API, reported as daemonEndpoints.kubeletEndpoint.Port."""
        self._kubelet_port = port

    @property
    def path(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    def _status(self) -> Obj:
        return node_status(
            self._facts,
            self._host_ip,
            self._max_pods,
            self._runtime_name,
            self._health_problems(),
            self._kubelet_port,
            self._resources,
            self._pressure(),
            addresses=self._addresses,
            runtime_version=self._runtime_version,
            images=self._images,
        )

    async def _read_runtime(self) -> None:
        """The runtime's version (once) and images (each time); kept as they were on failure."""
        if self._node_runtime is None:
            return
        try:
            if self._runtime_version is None:
                self._runtime_version = str(await self._node_runtime.version())
            self._images = node_images(await self._node_runtime.images())
        except Exception as exc:  # the runtime's trouble is reported by the PLEG, not here
            log.debug("reading the runtime's version and images for the node status: %s", exc)

    def _node(self, status: Obj) -> Obj:
        reg = self._registration
        spec: Obj = {}
        if reg.taints:
            spec["taints"] = [dict(t) for t in reg.taints]
        if reg.provider_id:
            spec["providerID"] = reg.provider_id
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                # --node-labels over the kubelet's own, as its initialNode.
                "labels": {**node_labels(self.node_name, self._facts.arch), **reg.labels},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
            "status": status,
        }

    async def run(self, api: KubeApi) -> None:
        await self._register(api)
        await asyncio.gather(self._lease_loop(api), self._status_loop(api))

    # --- registration ---

    async def _register(self, api: KubeApi) -> None:
        retry = Retry(0.1, 7.0)  # the kubelet's registration back-off
        failures = Failures(f"registering node {self.node_name}")
        while True:
            try:
                await self._register_once(api)
                failures.ok()
                return
            except ApiError as exc:
                failures.failed(exc, " (retrying)")
                await asyncio.sleep(retry.delay())
            except Exception:
                log.exception("registering node %s failed unexpectedly", self.node_name)
                await asyncio.sleep(retry.delay())

    async def _register_once(self, api: KubeApi) -> None:
        await self._read_runtime()
        if not self._registration.register_node:
            await self._adopt_unregistered(api)
            return
        status = with_times(self._status(), None, datetime.now(UTC))
        try:
            created = await api.create("/api/v1/nodes", self._node(status))
        except ApiError as exc:
            if exc.status != 409:
                raise
            existing = await api.get(self.path)
            self.node_uid = str(existing.get("metadata", {}).get("uid", ""))
            # Our labels win over stale ones (the kubelet reconciles them the same way).
            labels = node_labels(self.node_name, self._facts.arch)
            await api.patch(self.path, {"metadata": {"labels": labels}})
            status = with_times(self._status(), existing.get("status"), datetime.now(UTC))
            updated = await api.patch(f"{self.path}/status", {"status": status})
            self._reported = updated.get("status", status)
            log.info("node %s was registered already: status updated", self.node_name)
        else:
            self.node_uid = str(created.get("metadata", {}).get("uid", ""))
            self._reported = created.get("status", status)
            log.info("registered node %s with the API server at %s", self.node_name, api.host)
        self._reported_at = asyncio.get_running_loop().time()
        self.registered.set()

    async def _adopt_unregistered(self, api: KubeApi) -> None:
        """--register-node=false: the Node is someone else's to create; report its status."""
        try:
            existing = await api.get(self.path)
        except ApiError as exc:
            if exc.status == 404:
                raise ApiError(
                    404,
                    "NotFound",
                    f'error getting node "{self.node_name}": nodes "{self.node_name}" not '
                    "found (--register-node=false: the node is not created by this agent)",
                ) from None
            raise
        self.node_uid = str(existing.get("metadata", {}).get("uid", ""))
        status = with_times(self._status(), existing.get("status"), datetime.now(UTC))
        updated = await api.patch(f"{self.path}/status", {"status": status})
        self._reported = updated.get("status", status)
        self._reported_at = asyncio.get_running_loop().time()
        log.info("node %s exists: reporting its status (--register-node=false)", self.node_name)
        self.registered.set()

    # --- the Lease ---

    def _owner(self) -> Obj:
        return {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_uid}

    def _lease_body(self) -> Obj:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node_name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [self._owner()],
            },
            "spec": {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                "renewTime": _micro_time(datetime.now(UTC)),
            },
        }

    async def renew_lease(self, api: KubeApi) -> None:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        path = f"{base}/{self.node_name}"
        for _ in range(3):
            if self._lease is None:
                try:
                    self._lease = await api.get(path)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                    self._lease = await api.create(base, self._lease_body())
                    self.lease_renewals += 1
                    return
            lease = dict(self._lease)
            lease["spec"] = {
                **(lease.get("spec") or {}),
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                "renewTime": _micro_time(datetime.now(UTC)),
            }
            try:
                self._lease = await api.replace(path, lease)
                self.lease_renewals += 1
                return
            except ApiError as exc:
                self._lease = None  # re-read it: changed (409) or gone (404)
                if exc.status not in (404, 409):
                    raise
        raise ApiError(409, "Conflict", "the Lease kept changing under us")

    async def _lease_loop(self, api: KubeApi) -> None:
        retry = Retry(0.2, self.lease_period)
        while True:
            try:
                await self.renew_lease(api)
            except ApiError as exc:
                self._lease_failures.failed(exc, " (retrying)")
                await asyncio.sleep(retry.delay())
                continue
            self._lease_failures.ok()
            retry.reset()
            await asyncio.sleep(self.lease_period)

    # --- the status ---

    def _unchanged(self, status: Obj) -> bool:
        if self._reported is None:
            return False

        def strip(s: Obj) -> Obj:
            conditions = [
                {k: v for k, v in c.items() if k not in ("lastHeartbeatTime", "lastTransitionTime")}
                for c in s.get("conditions", [])
            ]
            keys = ("capacity", "allocatable", "addresses", "nodeInfo", "images")
            return {**{k: s.get(k) for k in keys}, "conditions": conditions}

        return strip(status) == strip(self._reported)

    async def sync_pressure_taints(self, api: KubeApi) -> None:
        """Put the pressure conditions' taints on the Node's spec.taints when they changed
        (read, merged with the other taints, patched)."""
        pressure = self._pressure()
        if pressure == self._tainted:
            return
        node = await api.get(self.path)
        taints = list((node.get("spec") or {}).get("taints") or [])
        wanted = with_pressure_taints(taints, pressure)
        if wanted != taints:
            try:
                await api.patch(self.path, {"spec": {"taints": wanted}}, kind="merge")
            except ApiError as exc:
                if exc.status != 403:
                    raise
                # NodeRestriction: a node's own identity may not modify its taints after
                # registration; in such a cluster the node lifecycle controller puts them there.
                if not self._taints_refused:
                    log.warning(
                        "the API server refuses node %s its own taints (%s): the pressure "
                        "taints are left to the node lifecycle controller",
                        self.node_name,
                        exc.message,
                    )
                self._taints_refused = True
        self._tainted = pressure

    async def update_status(self, api: KubeApi, force: bool = False) -> bool:
        """Patch the status if it changed or is due; True if it was sent."""
        loop = asyncio.get_running_loop()
        await self._read_runtime()
        status = self._status()
        due = loop.time() - self._reported_at >= self.report_period
        if not force and not due and self._unchanged(status):
            return False
        status = with_times(status, self._reported, datetime.now(UTC))
        try:
            updated = await api.patch(f"{self.path}/status", {"status": status})
        except ApiError as exc:
            if exc.status != 404:
                raise
            log.warning("node %s is gone from the API server: registering it again", self.node_name)
            self._lease = None
            await self._register_once(api)
            return True
        self._reported = updated.get("status", status)
        self._reported_at = loop.time()
        return True

    async def _status_loop(self, api: KubeApi) -> None:
        while True:
            await asyncio.sleep(self.status_period)
            try:
                await self.update_status(api)
                await self.sync_pressure_taints(api)
                self._status_failures.ok()
            except ApiError as exc:
                self._status_failures.failed(exc, " (retrying)")
