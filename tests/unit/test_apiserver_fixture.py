"""The test API server itself, through the agent's client (KubeApi over kubernetes.aio): if it
were not faithful, the cluster tests would prove nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pykubelet.client.kubeapi import ApiError, KubeApi
from tests.fixtures.apiserver import (
    ApiServer,
    json_patch,
    labels_match,
    merge_patch,
    parse_label_selector,
    strategic_merge,
)

Obj = dict[str, Any]


def pod(name: str, node: str = "n1", **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:test"}]},
    }


async def collect(api: KubeApi, rv: str, seconds: int = 1, selector: str = "") -> list[Obj]:
    return [e async for e in api.watch_pods(selector, rv, seconds)]


async def test_discovery_and_auth(server: ApiServer, api: KubeApi, tmp_path: Path) -> None:
    assert (await api.get("/version"))["major"] == "1"
    assert (await api.get("/api/"))["versions"] == ["v1"]
    resources = {r["name"] for r in (await api.get("/api/v1"))["resources"]}
    assert {"pods", "pods/status", "nodes", "nodes/status", "events"} <= resources
    groups = {g["name"] for g in (await api.get("/apis"))["groups"]}
    assert "coordination.k8s.io" in groups
    assert (await api.get("/apis/coordination.k8s.io/v1"))["resources"][0]["name"] == "leases"
    server.token = server.server.token = "other"
    with pytest.raises(ApiError) as err:
        await api.get("/api/v1/pods")
    assert err.value.status == 401


async def test_create_assigns_identity_and_defaults(api: KubeApi) -> None:
    created = await api.create("/api/v1/namespaces/default/pods", pod("a"))
    meta, spec = created["metadata"], created["spec"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["resourceVersion"]
    assert meta["managedFields"][0]["manager"] == "pykubelet"
    assert (
        spec["preemptionPolicy"] == "PreemptLowerPriority" and spec["dnsPolicy"] == "ClusterFirst"
    )
    assert spec["volumes"][0]["name"].startswith("kube-api-access-")
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    with pytest.raises(ApiError) as err:
        await api.create("/api/v1/namespaces/default/pods", pod("a"))
    assert err.value.status == 409 and err.value.reason == "AlreadyExists"


async def test_list_selectors_and_paging(server: ApiServer, api: KubeApi) -> None:
    for i in range(5):
        server.create(
            "pods", pod(f"p{i}", "n1" if i % 2 == 0 else "n2", app="web" if i < 3 else "db")
        )
    mine = await api.list_pods("spec.nodeName=n1", 500, None)
    assert [p["metadata"]["name"] for p in mine["items"]] == ["p0", "p2", "p4"]
    assert "kind" not in mine["items"][0]  # as a real server's list items
    first = await api.list_pods("", 2, None)
    assert len(first["items"]) == 2 and first["metadata"]["continue"]
    server.create("pods", pod("late"))
    rest = await api.list_pods("", 2, first["metadata"]["continue"])
    rest2 = await api.list_pods("", 2, rest["metadata"]["continue"])
    # A consistent snapshot: the pod created meanwhile is not in the pages.
    names = [p["metadata"]["name"] for p in first["items"] + rest["items"] + rest2["items"]]
    assert names == ["p0", "p1", "p2", "p3", "p4"]
    answer = await api.request(
        "GET", "/api/v1/pods", query=[("labelSelector", "app in (web),!missing")]
    )
    assert [p["metadata"]["name"] for p in answer["items"]] == ["p0", "p1", "p2"]
    with pytest.raises(ApiError) as err:
        await api.list_pods("spec.bogus=x", 10, None)
    assert err.value.status == 400


async def test_watch_replays_from_a_version_and_bookmarks(server: ApiServer, api: KubeApi) -> None:
    listed = await api.list_pods("spec.nodeName=n1", 500, None)
    rv = listed["metadata"]["resourceVersion"]
    server.create("pods", pod("a"))
    server.create("pods", pod("b", node="n2"))
    server.patch("pods", "a", {"status": {"phase": "Running"}}, sub="status")
    server.delete("pods", "a", grace=0)
    events = await collect(api, rv, selector="spec.nodeName=n1")
    kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert kinds[:3] == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert {k for k, _ in kinds[3:]} == {"BOOKMARK"}  # and one before the timeout
    assert int(events[-1]["object"]["metadata"]["resourceVersion"]) == server.resource_version()
    # "0": the current state as synthetic ADDED events.
    server.create("pods", pod("c"))
    now = await collect(api, "0", selector="spec.nodeName=n1")
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in now][:1] == [("ADDED", "c")]


async def test_watch_sees_an_object_enter_and_leave_the_selector(
    server: ApiServer, api: KubeApi
) -> None:
    server.create("pods", pod("a", node=""))
    rv = str(server.resource_version())

    async def later() -> None:
        await asyncio.sleep(0.1)
        await asyncio.to_thread(server.patch, "pods", "a", {"spec": {"nodeName": "n1"}})
        await asyncio.to_thread(server.patch, "pods", "a", {"spec": {"nodeName": "n3"}})

    task = asyncio.create_task(later())
    events = await collect(api, rv, selector="spec.nodeName=n1")
    await task
    assert [e["type"] for e in events if e["type"] != "BOOKMARK"] == ["ADDED", "DELETED"]


async def test_a_compacted_version_is_410_in_the_stream_or_as_the_status(
    server: ApiServer, api: KubeApi
) -> None:
    rv = str(server.resource_version())
    server.create("pods", pod("a"))
    server.compact()
    with pytest.raises(ApiError) as err:
        await collect(api, rv)
    assert err.value.status == 410
    server.server.expired_as_http = True
    with pytest.raises(ApiError) as err:
        await collect(api, rv)
    assert err.value.status == 410
    # The current version is fine.
    assert await collect(api, str(server.resource_version())) is not None


async def test_patches_preconditions_and_subresources(server: ApiServer, api: KubeApi) -> None:
    created = server.create("pods", pod("a"))
    uid = created["metadata"]["uid"]
    path = "/api/v1/namespaces/default/pods/a/status"
    running = {
        "metadata": {"uid": uid},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "state": {"running": {}}, "ready": True}],
        },
    }
    answer = await api.patch(path, running)
    assert answer["status"]["phase"] == "Running" and answer["status"]["qosClass"] == "BestEffort"
    # Strategic merge: by key, null deletes.
    step = {
        "status": {
            "containerStatuses": [
                {"name": "c", "state": {"running": None, "terminated": {"exitCode": 0}}}
            ],
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
    }
    answer = await api.patch(path, step)
    assert answer["status"]["containerStatuses"] == [
        {"name": "c", "state": {"terminated": {"exitCode": 0}}, "ready": True}
    ]
    assert [c["type"] for c in answer["status"]["conditions"]] == ["Ready", "PodScheduled"]
    # The status subresource changes only status; the main resource never changes it.
    answer = await api.patch(path, {"spec": {"nodeName": "x"}, "status": {"phase": "Failed"}})
    assert answer["spec"]["nodeName"] == "n1" and answer["status"]["phase"] == "Failed"
    answer = await api.patch("/api/v1/namespaces/default/pods/a", {"status": {"phase": "Pending"}})
    assert answer["status"]["phase"] == "Failed"
    # A no-op patch makes no new version.
    before = server.resource_version()
    await api.patch(path, {"status": {"phase": "Failed"}})
    assert server.resource_version() == before
    with pytest.raises(ApiError) as err:
        await api.patch(path, {"metadata": {"uid": "someone-else"}, "status": {"phase": "Running"}})
    assert err.value.status == 409 and "UID in precondition" in err.value.message


async def test_change_listeners_see_each_stored_version_as_it_was(
    server: ApiServer, api: KubeApi
) -> None:
    seen: list[tuple[str, str, str]] = []  # (type, name, phase) of each pod change
    objects: list[Obj] = []
    stop = server.on_change(
        "pods",
        lambda kind, obj: (
            seen.append((kind, obj["metadata"]["name"], (obj.get("status") or {}).get("phase"))),
            objects.append(obj),
        ),
    )
    server.create("pods", pod("a"))
    server.create("configmaps", {"metadata": {"name": "not-a-pod"}, "data": {}})
    path = "/api/v1/namespaces/default/pods/a/status"
    await api.patch(path, {"status": {"phase": "Running"}})
    await api.patch(path, {"status": {"phase": "Succeeded"}})
    await asyncio.to_thread(server.delete, "pods", "a", "default", 0)
    stop()
    server.create("pods", pod("b"))
    assert seen == [
        ("ADDED", "a", "Pending"),
        ("MODIFIED", "a", "Running"),
        ("MODIFIED", "a", "Succeeded"),
        ("DELETED", "a", "Succeeded"),
    ]
    # A status write makes a new object: the versions before it are as they were stored.
    phases = [o["status"]["phase"] for o in objects]
    assert phases == ["Pending", "Running", "Succeeded", "Succeeded"]
    assert len({o["metadata"]["resourceVersion"] for o in objects}) == 4


async def test_replace_conflicts_on_a_stale_version(api: KubeApi) -> None:
    base = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    lease = await api.create(base, {"metadata": {"name": "n1"}, "spec": {"holderIdentity": "n1"}})
    fresh = await api.replace(
        f"{base}/n1", {**lease, "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}}
    )
    assert fresh["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as err:
        await api.replace(f"{base}/n1", lease)  # the old version
    assert err.value.status == 409


async def test_graceful_delete_of_a_bound_pod(server: ApiServer, api: KubeApi) -> None:
    created = server.create("pods", pod("a"))
    path = "/api/v1/namespaces/default/pods/a"
    answer = await api.delete(path, grace=20)
    assert answer["metadata"]["deletionGracePeriodSeconds"] == 20
    assert answer["metadata"]["deletionTimestamp"]
    again = await api.delete(path, grace=30)  # a longer grace period changes nothing
    assert again["metadata"]["deletionGracePeriodSeconds"] == 20
    with pytest.raises(ApiError) as err:
        await api.delete(path, grace=0, uid="not-its-uid")
    assert err.value.status == 409
    await api.delete(path, grace=0, uid=created["metadata"]["uid"])
    assert server.get("pods", "a") is None
    # Unbound or finished pods go at once.
    server.create("pods", pod("b", node=""))
    await api.delete("/api/v1/namespaces/default/pods/b")
    assert server.get("pods", "b") is None


async def test_outage_keeps_state_on_the_same_port(server: ApiServer, api: KubeApi) -> None:
    server.create("pods", pod("a"))
    port = server.server.port
    server.stop()
    with pytest.raises(ApiError) as err:
        await api.get("/version")
    assert err.value.unreachable
    server.create("pods", pod("b"))  # changes while it is away
    server.start()
    assert server.server.port == port
    names = [p["metadata"]["name"] for p in (await api.list_pods("", 500, None))["items"]]
    assert names == ["a", "b"]


def test_patch_algorithms() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {
        "a": {"c": 2},
        "l": [2],
    }
    merged = strategic_merge(
        {"conditions": [{"type": "A", "status": "False"}, {"type": "B", "status": "True"}]},
        {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "$patch": "delete"}]},
    )
    assert merged == {"conditions": [{"type": "A", "status": "True"}]}
    assert json_patch({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3}]) == {
        "a": [1, 2, 3]
    }
    terms = parse_label_selector("app=web,tier notin (db),!legacy,env")
    assert labels_match({"metadata": {"labels": {"app": "web", "env": "x"}}}, terms)
    assert not labels_match(
        {"metadata": {"labels": {"app": "web", "tier": "db", "env": "x"}}}, terms
    )
