"""The Services behind the service variables: the fixture API server's Services (as
kube-apiserver makes them), the agent's watch of them (`cluster/services.py` over
`client/reflector.py`), and a pod sync that waits for that watch as the kubelet waits for its
informer."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Iterable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import Pod
from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.cluster.services import ServiceWatch
from pykubelet.common.events import EventRecorder
from pykubelet.pod.envvars import Allocatable, Service, ServicePort, container_env
from pykubelet.pod.sync import PodSync
from pykubelet.pod.volumes import VolumeManager
from pykubelet.pod.workers import UpdateType
from pykubelet.probes.handlers import ActionRunner
from pykubelet.probes.prober import ProbeManager
from pykubelet.runtime.process.runtime import ProcessRuntime
from pykubelet.status.manager import StatusManager
from tests.fixtures.apiserver import ApiServer, wait_until

Obj = dict[str, Any]


def service(name: str, *ports: Obj, cluster_ip: str | None = None) -> Obj:
    spec: Obj = {"ports": list(ports), "selector": {"app": name}}
    if cluster_ip is not None:
        spec["clusterIP"] = cluster_ip
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec}


# --- the fixture's Services ---------------------------------------------------------------------


async def test_the_fixture_serves_services_as_kube_apiserver(
    server: ApiServer, api: KubeApi
) -> None:
    master = await api.get("/api/v1/namespaces/default/services/kubernetes")
    assert master["spec"]["clusterIP"] == "10.96.0.1"
    assert master["spec"]["ports"] == [
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": server.server.port}
    ]
    web = await api.create(
        "/api/v1/namespaces/shop/services",
        service("web", {"name": "http", "port": 80}, {"name": "x", "port": 81}),
    )
    spec = web["spec"]
    assert spec["type"] == "ClusterIP" and spec["sessionAffinity"] == "None"
    assert spec["clusterIPs"] == [spec["clusterIP"]] and spec["ipFamilies"] == ["IPv4"]
    ip = ipaddress.ip_address(spec["clusterIP"])
    assert ip in ipaddress.ip_network("10.96.0.0/12") and str(ip) != "10.96.0.1"
    assert spec["ports"][0] == {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}
    headless = await api.create(
        "/api/v1/namespaces/shop/services", service("db", {"port": 5432}, cluster_ip="None")
    )
    assert headless["spec"]["clusterIP"] == "None"
    fixed = await api.create(
        "/api/v1/namespaces/shop/services", service("dns", {"port": 53}, cluster_ip="10.96.0.10")
    )
    assert fixed["spec"]["clusterIP"] == "10.96.0.10"
    listed = await api.list_services(100, None)
    assert {i["metadata"]["name"] for i in listed["items"]} == {"kubernetes", "web", "db", "dns"}

    for body, message in (
        (service("two", {"port": 1}, {"port": 2}), "spec.ports[0].name: Required value"),
        (service("none"), "spec.ports: Required value"),
        (service("udpx", {"port": 1, "protocol": "QUIC"}), 'Unsupported value: "QUIC"'),
        (
            service("taken", {"port": 1}, cluster_ip="10.96.0.10"),
            "provided IP is already allocated",
        ),
        (
            service("far", {"port": 1}, cluster_ip="192.168.0.1"),
            "provided IP is not in the valid range",
        ),
    ):
        with pytest.raises(ApiError) as err:
            await api.create("/api/v1/namespaces/shop/services", body)
        assert err.value.status == 422 and message in err.value.message, err.value


# --- the agent's watch --------------------------------------------------------------------------


def names(watch: ServiceWatch) -> set[tuple[str, str]]:
    return {(s.namespace, s.name) for s in watch.services()}


async def eventually(what: str, check: Any) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_watch_syncs_then_follows_changes(server: ApiServer, api: KubeApi) -> None:
    server.create("services", service("before", {"port": 80}), namespace="shop")
    watch = ServiceWatch()
    assert watch.not_synced() == "not connected to the API server yet"
    task = asyncio.create_task(watch.run(api))
    try:
        await eventually("the first list", lambda: watch.not_synced() is None)
        assert names(watch) == {("default", "kubernetes"), ("shop", "before")}
        master = next(s for s in watch.services() if s.name == "kubernetes")
        assert master == Service("default", "kubernetes", "10.96.0.1", (ServicePort(443, "https"),))

        server.create("services", service("after", {"port": 81, "protocol": "UDP"}), "other")
        await eventually("the added Service", lambda: ("other", "after") in names(watch))
        server.delete("services", "before", namespace="shop")
        await eventually("the deleted Service", lambda: ("shop", "before") not in names(watch))
        # A broken watch resumes, a compacted one re-lists: nothing lost.
        server.drop_watches()
        server.compact()
        server.create("services", service("third", {"port": 82}), namespace="shop")
        await eventually("the Service made meanwhile", lambda: ("shop", "third") in names(watch))
        assert names(watch) == {("default", "kubernetes"), ("other", "after"), ("shop", "third")}
        assert watch.reflector.lists >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_list_that_fails_says_why(server: ApiServer, api: KubeApi) -> None:
    server.fail_next(403)
    watch = ServiceWatch()
    task = asyncio.create_task(watch.run(api))
    try:
        await eventually("the failure", lambda: "403" in (watch.not_synced() or ""))
        assert watch.not_synced() == "the services list failed: 403 Injected: injected failure"
        await eventually("the list once the server answers", lambda: watch.not_synced() is None)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- a pod sync waits for them ------------------------------------------------------------------


class Services:
    """The ServiceEnv seen by the pod sync: a list that a test syncs."""

    def __init__(self) -> None:
        self.items: list[Service] = []
        self.problem: str | None = "the services have not been listed yet"

    def services(self) -> Iterable[Service]:
        return self.items

    def not_synced(self) -> str | None:
        return self.problem


def api_pod(out: Path, static: bool = False) -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "namespace": "shop",
                "uid": "uid-svc",
                "annotations": {"kubernetes.io/config.source": "file" if static else "api"},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "c",
                        "image": "i",
                        "command": ["/bin/sh", "-c", f"env > {out}; echo $(WEB_SERVICE_HOST)"],
                    }
                ],
            },
        }
    )


@pytest.fixture
async def sync_of(tmp_path: Path) -> AsyncIterator[tuple[PodSync, Services, StatusManager]]:
    runtime = ProcessRuntime(tmp_path)
    await runtime.start()
    recorder = EventRecorder()
    actions = ActionRunner(runtime, "127.0.0.1", lambda p, s, ip: container_env(p, s, "h", ip))
    statuses = StatusManager()
    node = Allocatable(cpu=Fraction(2), memory=1 << 30, ephemeral_storage=1 << 34)
    services = Services()
    sync = PodSync(
        runtime,
        statuses,
        recorder,
        "127.0.0.1",
        actions,
        ProbeManager(actions, recorder, print),
        VolumeManager(tmp_path, node),
        node,
        services=services,
    )
    yield sync, services, statuses
    for runtime_pod in await runtime.list_pods():
        await runtime.remove_pod(runtime_pod.uid)
    await runtime.close()
    await actions.close()


def read_env(path: Path) -> dict[str, str]:
    text = wait_until(f"{path}", lambda: path.exists() and path.read_text())
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def test_an_api_pod_waits_for_the_services_then_sees_them(
    sync_of: tuple[PodSync, Services, StatusManager], tmp_path: Path
) -> None:
    sync, services, statuses = sync_of
    out = tmp_path / "env"
    pod = api_pod(out)
    result = await sync.sync_pod(UpdateType.CREATE, pod)
    status = statuses.get(pod.uid)
    assert status is not None and status.container_statuses
    waiting = status.container_statuses[0].state.waiting
    assert waiting is not None and waiting.reason == "CreateContainerConfigError"
    assert waiting.message == (
        "services have not yet been read at least once, cannot construct envvars "
        "(the services have not been listed yet)"
    )
    assert result.requeue_after == 1.0  # soon, without a back-off
    assert not out.exists()

    services.items = [
        Service("default", "kubernetes", "10.96.0.1", (ServicePort(443, "https"),)),
        Service("shop", "web", "10.96.0.20", (ServicePort(80),)),
    ]
    services.problem = None
    await sync.sync_pod(UpdateType.SYNC, pod)
    env = await asyncio.to_thread(read_env, out)
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    assert env["KUBERNETES_PORT_443_TCP"] == "tcp://10.96.0.1:443"
    assert env["WEB_PORT"] == "tcp://10.96.0.20:80"


async def test_a_static_pod_does_not_wait(
    sync_of: tuple[PodSync, Services, StatusManager], tmp_path: Path
) -> None:
    sync, _, _ = sync_of
    out = tmp_path / "env"
    await sync.sync_pod(UpdateType.CREATE, api_pod(out, static=True))
    env = await asyncio.to_thread(read_env, out)
    assert "KUBERNETES_SERVICE_HOST" not in env and "HOSTNAME" in env
