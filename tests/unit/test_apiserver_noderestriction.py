"""The fixture API server's Node authorizer and NodeRestriction, through the agent's own client
as `system:node:n1` (group system:nodes): what kube-apiserver refuses a node, and what it lets
it do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.cluster.node import NodeAgent
from pykubelet.common.machine import read_machine_facts
from tests.fixtures.apiserver import ApiServer

Obj = dict[str, Any]
NODE = "n1"
USER = f"system:node:{NODE}"


@pytest.fixture
async def node_api(server: ApiServer, tmp_path: Path) -> AsyncIterator[KubeApi]:
    """The agent's client of `server` with a token of system:node:n1 in system:nodes."""
    server.add_token("node-n1-token", USER, ("system:nodes",))
    path = server.write_kubeconfig(tmp_path / "node-kc")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {"token": "node-n1-token"}
    path.write_text(yaml.safe_dump(config))
    client = await KubeApi.connect(path, NODE)
    yield client
    await client.close()


def pod(name: str, node: str | None, **spec: Any) -> Obj:
    body: Obj = {"containers": [{"name": "c", "image": "i"}], **spec}
    if node is not None:
        body["nodeName"] = node
    return {"metadata": {"name": name}, "spec": body}


def mirror(name: str, node: str, **spec: Any) -> Obj:
    obj = pod(name, node, **spec)
    obj["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    return obj


async def forbidden(call: Any) -> str:
    with pytest.raises(ApiError) as info:
        await call
    assert info.value.status == 403, info.value
    return info.value.message


async def test_a_node_registers_itself_and_keeps_its_lease(node_api: KubeApi) -> None:
    labels = {
        "kubernetes.io/hostname": NODE,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/exclude-from-external-load-balancers": "",
        "kubelet.kubernetes.io/role": "worker",
        "example.com/team": "a",
    }
    node = await node_api.create("/api/v1/nodes", {"metadata": {"name": NODE, "labels": labels}})
    assert node["metadata"]["labels"] == labels
    await node_api.patch(f"/api/v1/nodes/{NODE}/status", {"status": {"capacity": {"cpu": "2"}}})
    await node_api.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"example.com/x": "y"}}})
    lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    await node_api.create(lease, {"metadata": {"name": NODE}, "spec": {"holderIdentity": NODE}})
    await node_api.get(f"{lease}/{NODE}")
    listed = await node_api.list_pods(f"spec.nodeName={NODE}", 0, None)
    assert listed["items"] == []


async def test_a_node_may_not_touch_another_node_or_its_lease(
    server: ApiServer, node_api: KubeApi
) -> None:
    server.create("nodes", {"metadata": {"name": "n2"}})
    message = await forbidden(
        node_api.patch("/api/v1/nodes/n2", {"metadata": {"labels": {"a": "b"}}})
    )
    assert message == 'nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2"'
    await forbidden(node_api.delete("/api/v1/nodes/n2"))
    await forbidden(node_api.create("/api/v1/nodes", {"metadata": {"name": "n3"}}))
    lease = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    server.create("leases", {"metadata": {"name": "n2"}}, namespace="kube-node-lease")
    message = await forbidden(node_api.get(f"{lease}/n2"))
    assert message == (
        'leases "n2" is forbidden: User "system:node:n1" cannot get resource "leases" in API '
        'group "coordination.k8s.io" in the namespace "kube-node-lease": can only access node '
        "lease with the same name as the requesting node"
    )
    await forbidden(node_api.create(lease, {"metadata": {"name": "n2-other"}}))


async def test_a_node_may_not_give_itself_a_control_plane_label(
    node_api: KubeApi, api: KubeApi
) -> None:
    refused = {"metadata": {"name": NODE, "labels": {"node-role.kubernetes.io/control-plane": ""}}}
    message = await forbidden(node_api.create("/api/v1/nodes", refused))
    assert message == (
        'nodes "n1" is forbidden: node "n1" is not allowed to set the following labels: '
        "node-role.kubernetes.io/control-plane"
    )
    await node_api.create("/api/v1/nodes", {"metadata": {"name": NODE}})
    patch = {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
    message = await forbidden(node_api.patch(f"/api/v1/nodes/{NODE}", patch))
    assert message == (
        'nodes "n1" is forbidden: is not allowed to modify labels: '
        "node-role.kubernetes.io/control-plane"
    )
    # Nor remove one the admin set; the admin (not a node) may set it.
    await api.patch(f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"k8s.io/pool": "gpu"}}})
    remove = {"metadata": {"labels": {"k8s.io/pool": None}}}
    message = await forbidden(node_api.patch(f"/api/v1/nodes/{NODE}", remove))
    assert message.endswith("is not allowed to modify labels: k8s.io/pool")


async def test_a_node_registers_with_taints_but_may_not_modify_them(
    node_api: KubeApi, api: KubeApi
) -> None:
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    node = {"metadata": {"name": NODE}, "spec": {"taints": [taint]}}
    created = await node_api.create("/api/v1/nodes", node)  # --register-with-taints
    assert created["spec"]["taints"] == [taint]
    path = f"/api/v1/nodes/{NODE}"
    for taints in ([], [taint, {"key": "mine", "effect": "NoExecute"}], None):
        message = await forbidden(node_api.patch(path, {"spec": {"taints": taints}}, "merge"))
        assert message == 'nodes "n1" is forbidden: node "n1" is not allowed to modify taints'
    # A write that leaves them as they are, its status and labels of its own still go through.
    await node_api.patch(path, {"metadata": {"labels": {"team": "a"}}})
    await node_api.patch(f"{path}/status", {"status": {"phase": "Running"}})
    whole = await node_api.get(path)
    assert (await node_api.replace(path, whole))["spec"]["taints"] == [taint]
    # The admin (a controller, kubectl taint) still may.
    await api.patch(path, {"spec": {"taints": None}}, "merge")
    assert "taints" not in (await node_api.get(path))["spec"]


async def test_pressure_taints_refused_to_a_node_are_left_to_the_controller(
    node_api: KubeApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's own pressure taints: refused by NodeRestriction, warned about once, while
    the Lease and the status (with the condition) carry on."""
    agent = NodeAgent(
        NODE,
        host_ip="10.1.2.3",
        max_pods=10,
        runtime_name="process",
        facts=read_machine_facts(tmp_path),
        health_problems=list,
        pressure=lambda: frozenset({"MemoryPressure"}),
        lease_period=0.1,
        status_period=0.1,
        report_period=0.1,
    )
    task = asyncio.create_task(agent.run(node_api))
    try:
        await asyncio.wait_for(agent.registered.wait(), 10)
        for _ in range(100):
            if agent.lease_renewals >= 5:
                break
            await asyncio.sleep(0.05)
        node = await node_api.get(f"/api/v1/nodes/{NODE}")
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["MemoryPressure"] == "True" and agent.lease_renewals >= 5
        assert not node["spec"].get("taints")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    warned = [r for r in caplog.records if "refuses node n1 its own taints" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "not allowed to modify taints" in warned[0].getMessage()


async def test_pods_a_node_may_write_are_its_own(server: ApiServer, node_api: KubeApi) -> None:
    server.create("pods", pod("mine", NODE))
    server.create("pods", pod("theirs", "n2"))
    await node_api.patch(
        "/api/v1/namespaces/default/pods/mine/status", {"status": {"phase": "Running"}}
    )
    message = await forbidden(
        node_api.patch(
            "/api/v1/namespaces/default/pods/theirs/status", {"status": {"phase": "Running"}}
        )
    )
    assert message == (
        'pods "theirs" is forbidden: node "n1" can only update pod status for pods with '
        "spec.nodeName set to itself"
    )
    message = await forbidden(node_api.delete("/api/v1/namespaces/default/pods/theirs", grace=0))
    assert "can only delete pods with spec.nodeName set to itself" in message
    await node_api.delete("/api/v1/namespaces/default/pods/mine", grace=0)
    message = await forbidden(
        node_api.patch("/api/v1/namespaces/default/pods/theirs", {"metadata": {"labels": {}}})
    )
    assert message.startswith(
        'pods "theirs" is forbidden: User "system:node:n1" cannot patch resource "pods" in API '
        'group "" in the namespace "default"'
    )
    # Every pod can be read (the kubelet lists its own by spec.nodeName).
    assert (await node_api.get("/api/v1/namespaces/default/pods/theirs"))["spec"][
        "nodeName"
    ] == "n2"


async def test_a_node_creates_only_its_own_mirror_pods(node_api: KubeApi) -> None:
    pods = "/api/v1/namespaces/default/pods"
    created = await node_api.create(pods, mirror("static-n1", NODE))
    assert created["spec"]["nodeName"] == NODE
    message = await forbidden(node_api.create(pods, pod("plain", NODE)))
    assert message == (
        'pods "plain" is forbidden: pod does not have "kubernetes.io/config.mirror" annotation, '
        'node "n1" can only create mirror pods'
    )
    message = await forbidden(node_api.create(pods, mirror("elsewhere", "n2")))
    assert message.endswith('node "n1" can only create pods with spec.nodeName set to itself')
    secret_volume = [{"name": "s", "secret": {"secretName": "db"}}]
    message = await forbidden(node_api.create(pods, mirror("s", NODE, volumes=secret_volume)))
    assert message.endswith('node "n1" can not create pods that reference secrets')
    message = await forbidden(node_api.create(pods, mirror("a", NODE, serviceAccountName="x")))
    assert message.endswith('node "n1" can not create pods that reference a service account')


async def test_a_node_reads_only_the_secrets_its_pods_reference(
    server: ApiServer, node_api: KubeApi
) -> None:
    for name in ("db", "other"):
        server.create("secrets", {"metadata": {"name": name}, "data": {}})
        server.create("configmaps", {"metadata": {"name": name}, "data": {}})
    volumes = [{"name": "s", "secret": {"secretName": "db"}}]
    env = [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "db", "key": "k"}}}]
    spec = pod("app", NODE, volumes=volumes)
    spec["spec"]["containers"][0]["env"] = env
    server.create("pods", spec)
    server.create(
        "pods", pod("far", "n2", volumes=[{"name": "s", "secret": {"secretName": "other"}}])
    )
    await node_api.get("/api/v1/namespaces/default/secrets/db")
    await node_api.get("/api/v1/namespaces/default/configmaps/db")
    message = await forbidden(node_api.get("/api/v1/namespaces/default/secrets/other"))
    assert message == (
        'secrets "other" is forbidden: User "system:node:n1" cannot get resource "secrets" in API '
        'group "" in the namespace "default": no relationship found between node \'n1\' and '
        "this object"
    )
    await forbidden(node_api.get("/api/v1/namespaces/default/configmaps/other"))
    await forbidden(node_api.get("/api/v1/namespaces/default/secrets"))
    # The root CA every pod's projected token volume names.
    await node_api.get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
    # One object by name, listed and watched (the kubelet's watch of each): the same rule.
    listed = await node_api.list_namespaced("secrets", "default", "metadata.name=db", 10, None)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["db"]
    message = await forbidden(
        node_api.list_namespaced("secrets", "default", "metadata.name=other", 10, None)
    )
    assert message.startswith('secrets "other" is forbidden') and "cannot list" in message
    async for event in node_api.watch_namespaced(
        "configmaps", "default", "metadata.name=db", "0", 1
    ):
        assert event["object"]["metadata"]["name"] == "db"
        break


async def test_a_node_requests_tokens_only_for_its_pods(
    server: ApiServer, node_api: KubeApi
) -> None:
    mine = server.create("pods", pod("mine", NODE))
    theirs = server.create("pods", pod("theirs", "n2"))

    def token_request(p: Obj) -> Obj:
        ref = {"apiVersion": "v1", "kind": "Pod", "name": p["metadata"]["name"],
               "uid": p["metadata"]["uid"]}  # fmt: skip
        return {"kind": "TokenRequest", "spec": {"audiences": [], "boundObjectRef": ref}}

    path = "/api/v1/namespaces/default/serviceaccounts/default/token"
    assert (await node_api.create(path, token_request(mine)))["status"]["token"]
    message = await forbidden(node_api.create(path, token_request(theirs)))
    assert message == (
        'serviceaccounts "default" is forbidden: node requested token bound to a pod scheduled '
        "on a different node"
    )


async def test_what_no_node_may_do_and_others_still_may(
    server: ApiServer, node_api: KubeApi, api: KubeApi
) -> None:
    message = await forbidden(node_api.create("/api/v1/namespaces", {"metadata": {"name": "x"}}))
    assert message == (
        'namespaces is forbidden: User "system:node:n1" cannot create resource "namespaces" in '
        'API group "" at the cluster scope'
    )
    await forbidden(node_api.delete("/api/v1/namespaces/default/services/kubernetes"))
    # The fixture's admin (system:masters) is not a node: nothing changes for it.
    await api.create("/api/v1/namespaces", {"metadata": {"name": "x"}})
    labels = {"node-role.kubernetes.io/control-plane": ""}
    await api.create("/api/v1/nodes", {"metadata": {"name": "n9", "labels": labels}})
