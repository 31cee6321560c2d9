"""The API server pod source against the test API server: what goes into its SETs, resuming,
re-listing, and what it does with pods it cannot run."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pykubelet.api.errors import ManifestError
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.common.events import EventRecorder
from pykubelet.config.apiserver import ApiSource, decode_api_pod, prepare_api_pod
from pykubelet.config.types import API_SOURCE, Op, PodUpdate
from tests.fixtures.apiserver import ApiServer, Store, resource

Obj = dict[str, Any]
NODE = "n1"


def pod(name: str, node: str = NODE, **extra: Any) -> Obj:
    spec: Obj = {
        "nodeName": node,
        "containers": [{"name": "c", "image": "busybox:test", "command": ["sleep", "9"]}],
    }
    spec.update(extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


class Recorder:
    def __init__(self) -> None:
        self.updates: list[PodUpdate] = []

    def __call__(self, update: PodUpdate) -> None:
        self.updates.append(update)

    def names(self) -> list[str]:
        assert self.updates, "nothing pushed"
        last = self.updates[-1]
        assert last.op is Op.SET and last.source == API_SOURCE
        return sorted(p.metadata.name for p in last.pods)


async def eventually(what: str, check: Callable[[], Any], within: float = 10.0) -> Any:
    deadline = asyncio.get_running_loop().time() + within
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture
async def running(
    api: KubeApi,
) -> AsyncIterator[tuple[ApiSource, Recorder, EventRecorder, list[tuple[Obj, str]]]]:
    pushed = Recorder()
    recorder = EventRecorder()
    rejected: list[tuple[Obj, str]] = []
    source = ApiSource(
        NODE, pushed, recorder, rejected=lambda o, m: rejected.append((o, m)), watch_timeout=(2, 3)
    )
    task = asyncio.create_task(source.run(api))
    await asyncio.wait_for(source.synced.wait(), 10)
    yield source, pushed, recorder, rejected
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def create(server: ApiServer, obj: Obj) -> Obj:
    return await asyncio.to_thread(server.create, "pods", obj)


async def test_sets_hold_this_nodes_pods_only(server: ApiServer, running: Any) -> None:
    source, pushed, _, _ = running
    assert pushed.names() == []  # the first SET: ready, no pods
    await create(server, pod("a"))
    await create(server, pod("elsewhere", node="n2"))
    await create(server, pod("b"))
    await eventually("a and b", lambda: pushed.names() == ["a", "b"])
    a = next(p for p in pushed.updates[-1].pods if p.metadata.name == "a")
    assert a.metadata.uid and a.spec.node_name == NODE
    assert a.status.phase is None  # the API's status is not ours
    # A status-only change sends nothing new.
    count = len(pushed.updates)
    await asyncio.to_thread(
        server.patch, "pods", "a", {"status": {"phase": "Running"}}, "default", "status"
    )
    await asyncio.sleep(0.3)
    assert len(pushed.updates) == count
    await asyncio.to_thread(server.delete, "pods", "a", "default", 0)
    await eventually("a gone", lambda: pushed.names() == ["b"])
    assert source.lists == 1


async def test_mirror_pods_are_not_run_but_known(server: ApiServer, running: Any) -> None:
    source, pushed, _, _ = running
    mirror = pod("static-n1")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    await create(server, mirror)
    await create(server, pod("real"))
    await eventually("real", lambda: pushed.names() == ["real"])
    assert list(source.mirror_pods()) == [("default", "static-n1")]
    assert source.has_pod(("default", "real")) and not source.has_pod(("default", "static-n1"))


async def test_deletion_is_passed_on_and_never_run_pods_are_held_back(
    server: ApiServer, api: KubeApi
) -> None:
    created = await create(server, pod("doomed"))
    await asyncio.to_thread(server.delete, "pods", "doomed", "default", 30)
    pushed = Recorder()
    source = ApiSource(NODE, pushed, EventRecorder(), watch_timeout=(2, 3))
    task = asyncio.create_task(source.run(api))
    try:
        await asyncio.wait_for(source.synced.wait(), 10)
        # First seen while being deleted: nothing to run, only the final delete is left.
        assert pushed.names() == []
        doomed = created["metadata"]["uid"]
        assert list(source.deleting()) == [doomed]
        assert source.deleting_object(doomed) == source.deleting()[doomed]
        # A pod that was pushed gets its deletionTimestamp through (the merger makes a DELETE).
        live = (await create(server, pod("live")))["metadata"]["uid"]
        await eventually("live", lambda: pushed.names() == ["live"])
        assert source.deleting_object(live) is None  # not being deleted
        await asyncio.to_thread(server.delete, "pods", "live", "default", 5)
        last = await eventually(
            "live being deleted",
            lambda: (p := pushed.updates[-1].pods) and p[0].metadata.deletion_timestamp and p,
        )
        assert last[0].metadata.deletion_grace_period_seconds == 5
        assert source.deleting_object(live) == source.deleting()[live]
        assert source.deleting_object("no-such-uid") is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_dropped_watch_resumes_without_relisting(server: ApiServer, running: Any) -> None:
    source, pushed, _, _ = running
    await create(server, pod("a"))
    await eventually("a", lambda: pushed.names() == ["a"])
    for _ in range(3):
        server.drop_watches()
        await asyncio.sleep(0.05)
    await create(server, pod("b"))
    await eventually("b", lambda: pushed.names() == ["a", "b"])
    assert source.lists == 1 and source.watches >= 2
    watches = [r for r in server.requests() if r.watch]
    assert all(r.query["resourceVersion"] not in ("", "0") for r in watches)


async def test_an_outage_changes_nothing_and_410_relists(server: ApiServer, running: Any) -> None:
    source, pushed, _, _ = running
    await create(server, pod("a"))
    await create(server, pod("b"))
    await eventually("a and b", lambda: pushed.names() == ["a", "b"])
    count = len(pushed.updates)
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(1.5)
    assert len(pushed.updates) == count  # no pod dropped for the API server being away
    await asyncio.to_thread(server.delete, "pods", "a", "default", 0)
    await asyncio.to_thread(server.compact)
    await asyncio.to_thread(server.start)
    await eventually("a removed after the re-list", lambda: pushed.names() == ["b"], within=15)
    assert source.lists == 2


async def test_a_pod_that_cannot_run_is_reported_and_rejected_once(
    server: ApiServer, running: Any
) -> None:
    _, pushed, recorder, rejected = running
    await create(server, pod("shared", shareProcessNamespace=True))
    await create(server, pod("ok"))
    await eventually("ok", lambda: pushed.names() == ["ok"])
    await eventually("the rejection", lambda: rejected)
    await asyncio.to_thread(
        server.patch, "pods", "shared", {"metadata": {"labels": {"x": "y"}}}, "default"
    )
    await asyncio.sleep(0.3)
    assert len(rejected) == 1 and "shareProcessNamespace" in rejected[0][1]
    events = [e for e in recorder.events() if e.reason == "FailedValidation"]
    assert len(events) == 1
    assert events[0].involved.kind == "Pod" and events[0].involved.name == "shared"
    assert events[0].message.startswith("api pod default/shared: spec.shareProcessNamespace")


def test_what_a_real_server_adds_decodes() -> None:
    """A pod as a real API server returns it: defaults, managed fields, the injected
    service-account volume, status."""
    store = Store()
    obj = store.create(resource("pods"), "default", pod("web"), "kubectl")
    obj = copy.deepcopy(obj)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u",
         "controller": True, "blockOwnerDeletion": True}
    ]  # fmt: skip
    obj["spec"]["affinity"] = {"nodeAffinity": {}}
    decoded = decode_api_pod(obj)
    assert decoded.metadata.name == "web" and decoded.spec.containers[0].command == ["sleep", "9"]
    prepared = prepare_api_pod(obj)
    # The scheduler's fields are kept as served (and ignored); the status is the kubelet's.
    assert prepared["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert decoded.spec.affinity == {"nodeAffinity": {}} and "status" not in prepared
    # The injected service-account volume is the pod's like any other: a projected volume
    # (its token from TokenRequest, its CA from the kube-root-ca.crt ConfigMap).
    (token_volume,) = decoded.spec.volumes or []
    assert token_volume.name.startswith("kube-api-access-") and token_volume.projected is not None
    assert [m.mount_path for m in decoded.spec.containers[0].volume_mounts or []] == [
        "/var/run/secrets/kubernetes.io/serviceaccount"
    ]
    obj["spec"]["volumes"].append({"name": "data", "emptyDir": {}})
    assert [v.name for v in decode_api_pod(obj).spec.volumes or []] == [token_volume.name, "data"]
    obj["spec"]["volumes"].append({"name": "claim", "persistentVolumeClaim": {"claimName": "c"}})
    with pytest.raises(ManifestError, match=r"persistentVolumeClaim: not supported"):
        decode_api_pod(obj)


async def test_an_event_over_the_clients_line_buffer_relists(
    server: ApiServer, running: Any
) -> None:
    source, pushed, _, _ = running
    big = pod("big")
    # Past the client's line buffer (annotations could not be: the API server, and pykubelet,
    # refuse more than 256 KiB of them).
    big["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": "x" * (5 * 1024 * 1024)}]
    await create(server, big)
    await eventually("the big pod, through a re-list", lambda: pushed.names() == ["big"])
    assert source.lists == 2
    await create(server, pod("after"))
    await eventually("the watch going on", lambda: pushed.names() == ["after", "big"])


async def test_a_silent_watch_is_taken_for_dead(server: ApiServer, api: KubeApi) -> None:
    server.server.bookmark_interval = 30
    rv = str(server.resource_version())
    with pytest.raises(ApiError) as err:
        async for _ in api.watch_pods("", rv, 20, idle_timeout=0.3):
            pass
    assert err.value.unreachable and err.value.reason == "Idle"


async def test_a_watch_left_early_ends_at_the_server_and_the_next_may_start(
    server: ApiServer, api: KubeApi
) -> None:
    await create(server, pod("first"))
    for _ in range(2):  # a second watch of pods is allowed once the first was left
        events = api.watch_pods(f"spec.nodeName={NODE}", "0", 30)
        async for event in events:
            assert event["type"] in ("ADDED", "BOOKMARK")
            break
        await events.aclose()  # as `async with aclosing(...)` or a cancelled reader does
    # The connection closed at once (not when the generator is collected): the server's
    # watch ends at its next write, a bookmark within 0.2 s.
    await eventually("no watch left at the server", lambda: not server.store.watchers)
