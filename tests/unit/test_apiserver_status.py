"""Pod status patches (status_sync) and the node's registration, Lease and status (node),
against the test API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import (
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStatus,
    PodCondition,
    PodStatus,
)
from pykubelet.client.kubeapi import KubeApi
from pykubelet.cluster.node import KUBELET_VERSION, NodeAgent, with_times
from pykubelet.common.machine import read_machine_facts
from pykubelet.status.patcher import StatusSync, Target, api_status, status_patch
from tests.fixtures.apiserver import ApiServer

Obj = dict[str, Any]
T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def status(state: ContainerState, phase: str = "Running", ready: bool = True) -> PodStatus:
    return PodStatus(
        phase=phase,  # type: ignore[arg-type]
        conditions=[PodCondition(type="Ready", status="True" if ready else "False")],
        start_time=T0,
        host_ip="10.0.0.1",
        container_statuses=[ContainerStatus(name="c", state=state, ready=ready, restart_count=0)],
    )


RUNNING = ContainerState(running=ContainerStateRunning(started_at=T0))
DONE = ContainerState(terminated=ContainerStateTerminated(exit_code=0, reason="Completed"))


def test_the_patch_holds_only_changes_and_nulls_what_went() -> None:
    base = api_status(status(RUNNING))
    assert base["startTime"] == "2026-01-02T03:04:05Z"  # second precision, as stored
    assert status_patch(base, base) is None
    patch = status_patch(base, api_status(status(DONE, phase="Succeeded", ready=False)))
    assert patch is not None
    assert patch["phase"] == "Succeeded"
    (container,) = patch["containerStatuses"]
    assert container["name"] == "c" and container["ready"] is False
    assert container["state"] == {
        "running": None,
        "terminated": {"exitCode": 0, "reason": "Completed"},
    }
    assert patch["conditions"] == [{"type": "Ready", "status": "False"}]
    assert "startTime" not in patch and "hostIP" not in patch
    # Conditions of others stay; a container that went is deleted by key; qosClass is immutable.
    with_theirs = {**base, "qosClass": "Burstable"}
    with_theirs["conditions"] = [
        *base["conditions"],
        {"type": "DisruptionTarget", "status": "True"},
    ]
    new = api_status(status(RUNNING))
    new["containerStatuses"] = []
    new["qosClass"] = "BestEffort"
    patch = status_patch(with_theirs, new)
    assert patch == {"containerStatuses": [{"name": "c", "$patch": "delete"}]}


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer()
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
async def api(server: ApiServer, tmp_path: Path) -> AsyncIterator[KubeApi]:
    client = await KubeApi.connect(server.write_kubeconfig(tmp_path / "kc"), "n1")
    yield client
    await client.close()


async def test_status_reaches_the_api_server_and_follows_changes(
    server: ApiServer, api: KubeApi
) -> None:
    created = await asyncio.to_thread(
        server.create,
        "pods",
        {
            "metadata": {"name": "p"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        },
    )
    uid = created["metadata"]["uid"]
    targets = {"local": Target("default", "p", uid, created["status"])}
    sync = StatusSync(targets.get, batch_delay=0.01)
    task = asyncio.create_task(sync.run(api))
    try:
        sync.on_status("local", status(RUNNING))
        assert await sync.flush(api, ["local"])
        api_pod = server.get("pods", "p")
        assert api_pod is not None
        assert api_pod["status"]["phase"] == "Running"
        assert api_pod["status"]["containerStatuses"][0]["state"] == {
            "running": {"startedAt": "2026-01-02T03:04:05Z"}
        }
        assert api_pod["status"]["qosClass"] == "BestEffort"  # the server's, kept
        sync.on_status("local", status(DONE, phase="Succeeded", ready=False))
        assert await sync.flush(api, ["local"])
        api_pod = server.get("pods", "p")
        assert api_pod is not None
        assert api_pod["status"]["containerStatuses"][0]["state"] == {
            "terminated": {"exitCode": 0, "reason": "Completed"}
        }
        assert sync.patches == 2
        # The same status again: no request.
        sync.on_status("local", status(DONE, phase="Succeeded", ready=False))
        assert await sync.flush(api, ["local"])
        assert sync.patches == 2
        # Recreated under the same name: the old pod's status does not land on the new one.
        await asyncio.to_thread(server.delete, "pods", "p", "default", 0)
        await asyncio.to_thread(
            server.create,
            "pods",
            {
                "metadata": {"name": "p"},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            },
        )
        sync.on_status("local", status(RUNNING))
        assert await sync.flush(api, ["local"])
        fresh = server.get("pods", "p")
        assert fresh is not None and fresh["status"]["phase"] == "Pending"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_failures_are_retried(server: ApiServer, api: KubeApi) -> None:
    created = await asyncio.to_thread(
        server.create,
        "pods",
        {
            "metadata": {"name": "p"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        },
    )
    target = Target("default", "p", created["metadata"]["uid"], created["status"])
    sync = StatusSync(lambda uid: target, batch_delay=0.01)
    server.fail_next(500, 503)
    task = asyncio.create_task(sync.run(api))
    try:
        sync.on_status("x", status(RUNNING))
        for _ in range(200):
            pod = server.get("pods", "p")
            if pod is not None and pod["status"]["phase"] == "Running":
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the status never arrived")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_status_waiting_out_a_back_off_does_not_hold_back_another(
    server: ApiServer, api: KubeApi
) -> None:
    """The senders wait for the back-off of a failed patch; a pod marked meanwhile, due
    sooner, still goes after its own batch delay, before the failed one is retried."""
    targets: dict[str, Target] = {}
    for name in ("p", "q"):
        created = await asyncio.to_thread(
            server.create,
            "pods",
            {
                "metadata": {"name": name},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            },
        )
        targets[name] = Target("default", name, created["metadata"]["uid"], created["status"])
    sync = StatusSync(targets.get, batch_delay=0.01)
    server.fail_next(500)
    task = asyncio.create_task(sync.run(api))

    def patched() -> list[str]:
        return [
            r.path.split("/")[-2]
            for r in server.requests()
            if r.method == "PATCH" and r.path.endswith("/status")
        ]

    async def arrived(name: str) -> None:
        for _ in range(200):
            pod = server.get("pods", name)
            if pod is not None and pod["status"]["phase"] == "Running":
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the status of {name} never arrived; patches: {patched()}")

    try:
        sync.on_status("p", status(RUNNING))
        for _ in range(200):
            if patched():
                break
            await asyncio.sleep(0.01)
        # p's patch failed: it is marked again after the back-off (0.5 s and more).
        sync.on_status("q", status(RUNNING))
        await arrived("q")
        await arrived("p")
        assert patched() == ["p", "q", "p"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def node_agent(tmp_path: Path, problems: list[str], **periods: float) -> NodeAgent:
    return NodeAgent(
        "n1",
        host_ip="10.1.2.3",
        max_pods=42,
        runtime_name="process",
        facts=read_machine_facts(tmp_path),
        health_problems=lambda: problems,
        **periods,
    )


async def renewals(agent: NodeAgent, count: int) -> None:
    for _ in range(200):
        if agent.lease_renewals >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{agent.lease_renewals} Lease renewals, not {count}")


async def test_node_registers_renews_its_lease_and_reports_changes(
    server: ApiServer, api: KubeApi, tmp_path: Path
) -> None:
    problems: list[str] = []
    agent = node_agent(tmp_path, problems, lease_period=0.2, status_period=0.1)
    task = asyncio.create_task(agent.run(api))
    try:
        await asyncio.wait_for(agent.registered.wait(), 10)
        node = server.get("nodes", "n1")
        assert node is not None
        st = node["status"]
        assert st["capacity"]["pods"] == "42" and st["allocatable"] == st["capacity"]
        assert st["nodeInfo"]["kubeletVersion"] == KUBELET_VERSION
        assert st["nodeInfo"]["containerRuntimeVersion"].startswith("process://")
        assert {"type": "InternalIP", "address": "10.1.2.3"} in st["addresses"]
        assert node["metadata"]["labels"]["kubernetes.io/os"] == "linux"
        ready = {c["type"]: c for c in st["conditions"]}["Ready"]
        assert ready["status"] == "True" and ready["reason"] == "KubeletReady"
        await renewals(agent, 3)
        lease = server.get("leases", "n1", "kube-node-lease")
        assert lease is not None
        renew = lease["spec"]["renewTime"]
        assert len(renew.split(".")[1]) == 7 and renew.endswith("Z")  # six digits and Z
        assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
        # A health problem makes the node NotReady at the next status check.
        problems.append("pleg: the runtime has not been relisted for too long")
        for _ in range(100):
            node = server.get("nodes", "n1")
            assert node is not None
            ready = {c["type"]: c for c in node["status"]["conditions"]}["Ready"]
            if ready["status"] == "False":
                break
            await asyncio.sleep(0.05)
        assert ready["status"] == "False" and "pleg" in ready["message"]
        # The Lease survives someone else's write (a conflict re-reads it).
        server.patch(
            "leases", "n1", {"metadata": {"labels": {"touched": "yes"}}}, "kube-node-lease"
        )
        await renewals(agent, agent.lease_renewals + 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_restarted_agent_updates_its_existing_node(
    server: ApiServer, api: KubeApi, tmp_path: Path
) -> None:
    await asyncio.to_thread(
        server.create, "nodes", {"metadata": {"name": "n1", "labels": {"kept": "yes"}}}
    )
    agent = node_agent(tmp_path, [])
    task = asyncio.create_task(agent.run(api))
    try:
        await asyncio.wait_for(agent.registered.wait(), 10)
        node = server.get("nodes", "n1")
        assert node is not None
        assert node["metadata"]["labels"]["kept"] == "yes"
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "n1"
        assert node["status"]["capacity"]["pods"] == "42"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_transition_times_change_only_with_the_status() -> None:
    cond = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""}
    first = with_times({"conditions": [cond]}, None, T0)
    later = with_times({"conditions": [cond]}, first, T0.replace(minute=9))
    assert (
        later["conditions"][0]["lastTransitionTime"] == first["conditions"][0]["lastTransitionTime"]
    )
    assert (
        later["conditions"][0]["lastHeartbeatTime"] != first["conditions"][0]["lastHeartbeatTime"]
    )
    flipped = with_times(
        {"conditions": [{**cond, "status": "False"}]}, later, T0.replace(minute=10)
    )
    assert flipped["conditions"][0]["lastTransitionTime"].startswith("2026-01-02T03:10")
