"""Ephemeral containers (`kubectl debug`): the fixture API server's pods/ephemeralcontainers
subresource and its validation, the agent's decoding and validation of them, and one pod's sync
adding them to a running pod over the real process runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.decode import pod_from_object
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import Pod
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.config.apiserver import decode_api_pod
from pykubelet.pod.workers import UpdateType
from pykubelet.runtime.base import ContainerConfig, ContainerRunState
from pykubelet.runtime.cri import convert as cri_convert
from pykubelet.runtime.cri.proto import cri_api_pb2 as cri
from pykubelet.runtime.docker.convert import container_body
from tests.fixtures.apiserver import ApiServer
from tests.unit.test_pod_sync import Node, node

__all__ = ["node"]  # the fixture, shared with test_pod_sync

Obj = dict[str, Any]
PATH = "/api/v1/namespaces/default/pods/web/ephemeralcontainers"


def api_pod(**extra: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "u1", **extra},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "app", "image": "busybox:test", "command": ["sleep", "30"]}],
        },
    }


def debugger(name: str = "debugger-abcde", **fields: Any) -> Obj:
    """What kubectl debug's patch carries for one container."""
    return {
        "name": name,
        "image": "busybox:test",
        "command": ["sh", "-c", "echo from-debug"],
        "resources": {},
        "terminationMessagePolicy": "File",
        **fields,
    }


# --- the fixture API server ---------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[ApiServer]:
    srv = ApiServer(bookmark_interval=0.2)
    srv.start()
    yield srv
    srv.close()


@pytest.fixture
async def api(server: ApiServer, tmp_path: Path) -> AsyncIterator[KubeApi]:
    server.create("pods", api_pod())
    client = await KubeApi.connect(server.write_kubeconfig(tmp_path / "kc"), "n1")
    yield client
    await client.close()


async def test_kubectls_patch_adds_a_defaulted_container_and_nothing_else(
    server: ApiServer, api: KubeApi
) -> None:
    before = server.get("pods", "web")
    assert before is not None
    rv = before["metadata"]["resourceVersion"]

    async def first_change() -> Obj:
        async for event in api.watch_pods("metadata.name=web", rv, 2):
            if event["type"] != "BOOKMARK":
                return event
        raise AssertionError("no event")

    watch = asyncio.ensure_future(first_change())
    await asyncio.sleep(0.2)
    # A two-way merge patch as kubectl computes it, directives included; a change of another
    # field rides along and is dropped, as the API server drops it.
    patch = {
        "spec": {
            "$setElementOrder/ephemeralContainers": [{"name": "debugger-abcde"}],
            "ephemeralContainers": [debugger(targetContainerName="app")],
            "nodeName": "elsewhere",
        },
        "status": {"phase": "Failed"},
    }
    answer = await api.patch(PATH, patch)
    assert answer["kind"] == "Pod"
    assert answer["spec"]["nodeName"] == "n1" and answer["status"] == before["status"]
    assert answer["spec"]["containers"] == before["spec"]["containers"]
    (added,) = answer["spec"]["ephemeralContainers"]
    assert added == {
        **debugger(targetContainerName="app"),
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
    }
    assert int(answer["metadata"]["resourceVersion"]) > int(rv)
    event = await watch
    assert event["type"] == "MODIFIED"
    assert event["object"]["spec"]["ephemeralContainers"] == [added]
    assert (await api.get(PATH))["spec"]["ephemeralContainers"] == [added]

    # PUT of the whole pod with one more: the existing one unchanged, the new one added.
    body = {**answer}
    body["spec"] = {**answer["spec"], "ephemeralContainers": [added, debugger("second")]}
    answer = await api.replace(PATH, body)
    assert [c["name"] for c in answer["spec"]["ephemeralContainers"]] == [
        "debugger-abcde",
        "second",
    ]
    # A JSON patch is applied too.
    ops = [{"op": "add", "path": "/spec/ephemeralContainers/-", "value": debugger("third")}]
    answer = await api.request("PATCH", PATH, body=ops, content_type="application/json-patch+json")
    assert len(answer["spec"]["ephemeralContainers"]) == 3
    # Discovery lists the subresource.
    resources = {r["name"] for r in (await api.get("/api/v1"))["resources"]}
    assert "pods/ephemeralcontainers" in resources


async def invalid(api: KubeApi, patch: Obj, kind: str = "strategic") -> str:
    with pytest.raises(ApiError) as err:
        await api.patch(PATH, patch, kind)
    assert err.value.status == 422, err.value.message
    return err.value.message


async def test_the_api_servers_validation(server: ApiServer, api: KubeApi) -> None:
    def containers(*items: Obj) -> Obj:
        return {"spec": {"ephemeralContainers": list(items)}}

    message = await invalid(api, containers(debugger("app")))
    assert message == (
        'Pod "web" is invalid: spec.ephemeralContainers[0].name: Duplicate value: "app"'
    )
    message = await invalid(api, containers(debugger(targetContainerName="nope")))
    assert 'spec.ephemeralContainers[0].targetContainerName: Not found: "nope"' in message
    forbidden = debugger(
        ports=[{"containerPort": 80}],
        readinessProbe={"exec": {"command": ["true"]}},
        lifecycle={"preStop": {"exec": {"command": ["true"]}}},
        resources={"limits": {"cpu": "1"}},
    )
    message = await invalid(api, containers(forbidden))
    for field in ("ports", "readinessProbe", "lifecycle", "resources"):
        assert (
            f"spec.ephemeralContainers[0].{field}: Forbidden: cannot be set for an Ephemeral "
            "Container" in message
        ), message
    message = await invalid(api, containers(debugger("Bad_Name", image="")))
    assert 'spec.ephemeralContainers[0].name: Invalid value: "Bad_Name"' in message
    assert "spec.ephemeralContainers[0].image: Required value" in message

    await api.patch(PATH, containers(debugger()))
    # Existing ones may not change, nor be removed (a merge patch replaces the list).
    changed = debugger(command=["sh", "-c", "echo other"])
    message = await invalid(api, containers(changed))
    assert 'existing ephemeral containers "debugger-abcde" may not be changed' in message
    message = await invalid(api, containers(debugger("other")), kind="merge")
    assert 'existing ephemeral containers "debugger-abcde" may not be removed' in message
    # Nor does an update of the pod itself change them.
    with pytest.raises(ApiError) as err:
        await api.patch("/api/v1/namespaces/default/pods/web", containers(debugger("sneaky")))
    assert err.value.status == 422
    assert 'Pod "web" is invalid: spec: Forbidden: pod updates may not change' in err.value.message
    # A refused update changes nothing.
    pod = server.get("pods", "web")
    assert pod is not None and len(pod["spec"]["ephemeralContainers"]) == 1


async def test_no_ephemeral_containers_on_create_nor_on_a_mirror_pod(
    server: ApiServer, api: KubeApi
) -> None:
    body = api_pod()
    body["metadata"]["name"] = "created"
    body["spec"]["ephemeralContainers"] = [debugger()]
    with pytest.raises(ApiError) as err:
        await api.create("/api/v1/namespaces/default/pods", body)
    assert err.value.status == 422
    assert "spec.ephemeralContainers: Forbidden: cannot be set on create" in err.value.message
    mirror = api_pod(annotations={"kubernetes.io/config.mirror": "abc"})
    mirror["metadata"]["name"] = "static-n1"
    server.create("pods", mirror)
    with pytest.raises(ApiError) as err:
        await api.patch(
            "/api/v1/namespaces/default/pods/static-n1/ephemeralcontainers",
            {"spec": {"ephemeralContainers": [debugger()]}},
        )
    assert err.value.status == 422
    assert "static pods do not support ephemeral containers" in err.value.message
    # Not a subresource of anything else.
    with pytest.raises(ApiError) as err:
        await api.get("/api/v1/namespaces/default/configmaps/x/ephemeralcontainers")
    assert err.value.status == 404


# --- the agent's decoding -----------------------------------------------------------------------


def test_an_api_pod_decodes_its_ephemeral_containers() -> None:
    body = api_pod()
    body["spec"]["ephemeralContainers"] = [
        {**debugger(targetContainerName="app"), "stdin": True, "tty": True}
    ]
    pod = decode_api_pod(body)
    (ec,) = pod.ephemeral_containers()
    assert ec.target_container_name == "app" and ec.stdin and ec.tty
    assert [c.name for c in pod.all_containers()] == ["app", "debugger-abcde"]


def test_the_agent_checks_ephemeral_containers_as_the_api_server() -> None:
    """A container it cannot run waits with the reason; the rest of the pod is the pod."""
    body = api_pod()
    body["spec"]["ephemeralContainers"] = [
        debugger(ports=[{"containerPort": 80}], targetContainerName="nope"),
        # What kubectl debug --profile=general adds: a field pykubelet does not support.
        debugger("traced", securityContext={"appArmorProfile": {"type": "RuntimeDefault"}}),
        debugger("fine"),
    ]
    pod = decode_api_pod(body)
    first, traced, fine = pod.ephemeral_containers()
    refusal = first.refusal() or ""
    assert refusal.startswith("pykubelet cannot run this ephemeral container: ")
    assert "spec.ephemeralContainers[0].ports: cannot be set for an Ephemeral Container" in refusal
    assert "spec.ephemeralContainers[0].targetContainerName: not found: 'nope'" in refusal
    assert "spec.ephemeralContainers[1].securityContext.appArmorProfile: not supported by " in (
        traced.refusal() or ""
    )
    assert fine.refusal() is None and fine.command == ["sh", "-c", "echo from-debug"]
    # A name that is taken cannot be set aside: the pod as a whole is refused (its last good
    # version runs on), as it is for any other wrong field.
    body["spec"]["ephemeralContainers"] = [debugger("app")]
    with pytest.raises(ManifestError) as err:
        decode_api_pod(body)
    assert "spec.ephemeralContainers[0].name: duplicate name 'app'" in str(err.value)


def test_a_manifest_may_not_carry_ephemeral_containers() -> None:
    body = api_pod()
    body["spec"]["ephemeralContainers"] = [debugger()]
    with pytest.raises(ManifestError) as err:
        pod_from_object(json.loads(json.dumps(body)), "/etc/pods/web.yaml")
    assert "spec.ephemeralContainers: cannot be set on create" in str(err.value)


# --- the runtimes' requests ---------------------------------------------------------------------


def config(target: str | None) -> ContainerConfig:
    return ContainerConfig(
        name="debugger",
        image="busybox:test",
        command=["sh"],
        args=[],
        env=[],
        working_dir=None,
        attempt=0,
        spec_hash="h",
        image_pull_policy="IfNotPresent",
        target_container_id=target,
    )


def test_a_target_is_the_pid_namespace_of_that_container() -> None:
    pod = Pod.model_validate(api_pod())
    request = cri_convert.container_config(pod, config("abc123"), 1 << 30)
    options = request.linux.security_context.namespace_options
    assert (options.pid, options.target_id, options.network) == (cri.TARGET, "abc123", cri.POD)
    plain = cri_convert.container_config(pod, config(None), 1 << 30)
    assert plain.linux.security_context.namespace_options.pid == cri.CONTAINER
    body = container_body(pod, "sandbox1", config("abc123"), podman=True)
    assert body["HostConfig"]["PidMode"] == "container:abc123"
    assert body["HostConfig"]["NetworkMode"] == "container:sandbox1"
    assert "PidMode" not in container_body(pod, "sandbox1", config(None), podman=True)["HostConfig"]


# --- one pod's sync over the process runtime ----------------------------------------------------


def running_pod(*ephemeral: Obj) -> Pod:
    body = api_pod()
    body["metadata"]["uid"] = "uid-sync"
    body["metadata"]["annotations"] = {"kubernetes.io/config.source": "api"}
    if ephemeral:
        body["spec"]["ephemeralContainers"] = list(ephemeral)
    return decode_api_pod(body)


async def settled(node: Node, name: str) -> None:
    for _ in range(250):
        rp = await node.runtime.get_pod("uid-sync")
        if rp and any(
            c.name == name and c.state is ContainerRunState.EXITED for c in rp.containers
        ):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{name} did not exit")


async def test_an_added_ephemeral_container_runs_once_and_restarts_nothing(node: Node) -> None:
    sync, runtime, statuses = node.sync, node.runtime, node.statuses
    await sync.sync_pod(UpdateType.CREATE, running_pod())
    before = await runtime.get_pod("uid-sync")
    assert before is not None
    (app,) = before.containers

    with_debugger = running_pod(debugger(targetContainerName="app"))
    await sync.sync_pod(UpdateType.UPDATE, with_debugger)
    await settled(node, "debugger-abcde")
    for _ in range(3):  # later syncs never start it again
        await sync.sync_pod(UpdateType.SYNC, with_debugger)
    after = await runtime.get_pod("uid-sync")
    assert after is not None
    by_name = {c.name: c for c in after.containers}
    assert [c.name for c in after.containers].count("debugger-abcde") == 1
    assert by_name["app"].id == app.id and by_name["app"].state is ContainerRunState.RUNNING
    log = await runtime.read_log(by_name["debugger-abcde"])
    assert log == b"from-debug\n"

    status = statuses.get("uid-sync")
    assert status is not None and status.phase == "Running"
    assert [c.name for c in status.container_statuses or []] == ["app"]
    (ec,) = status.ephemeral_container_statuses or []
    assert ec.name == "debugger-abcde" and ec.ready is False and ec.started is None
    assert ec.restart_count == 0
    assert ec.state.terminated is not None and ec.state.terminated.reason == "Completed"
    ready = {c.type: c.status for c in status.conditions}["Ready"]
    assert ready == "True"  # an ephemeral container does not count for readiness


async def test_an_ephemeral_container_that_cannot_start_waits_with_the_reason(
    node: Node,
) -> None:
    """The process runtime runs an ephemeral container as any other (a host process, the image
    recorded); without a command there is nothing to run, and its status says so."""
    sync, statuses = node.sync, node.statuses
    pod = running_pod(debugger(command=[]))
    await sync.sync_pod(UpdateType.CREATE, pod)
    status = statuses.get("uid-sync")
    assert status is not None
    (ec,) = status.ephemeral_container_statuses or []
    assert ec.state.waiting is not None
    assert ec.state.waiting.reason == "CreateContainerConfigError"
    assert "needs command or args" in (ec.state.waiting.message or "")
    assert status.phase == "Running"  # the pod's own containers run on


async def test_an_ephemeral_container_pykubelet_cannot_run_says_why(node: Node) -> None:
    sync, statuses = node.sync, node.statuses
    traced = debugger(securityContext={"appArmorProfile": {"type": "RuntimeDefault"}})
    await sync.sync_pod(UpdateType.CREATE, running_pod(traced))
    await sync.sync_pod(UpdateType.SYNC, running_pod(traced))
    status = statuses.get("uid-sync")
    assert status is not None and status.phase == "Running"
    (ec,) = status.ephemeral_container_statuses or []
    waiting = ec.state.waiting
    assert waiting is not None and waiting.reason == "CreateContainerConfigError"
    message = waiting.message or ""
    assert "securityContext.appArmorProfile: not supported by pykubelet yet" in message
    rp = await node.runtime.get_pod("uid-sync")
    assert rp is not None and [c.name for c in rp.containers] == ["app"]
    failed = [e for e in node.sync.recorder.events() if e.reason == "Failed"]
    assert len(failed) == 1 and failed[0].count == 1, failed  # said once, not at every sync
    assert failed[0].involved.field_path == "spec.ephemeralContainers{debugger-abcde}"
