"""Cluster mode end to end: the real agent (`--kubeconfig`) against the test API server
(tests/fixtures/apiserver/), or, for the test marked `realcluster`, against `$KUBECONFIG`.

The tests talk to the API server as any client would, over HTTP with the official (synchronous)
client; only what a client cannot do (an outage, a compaction) goes to the fixture directly.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, processes_with, wait_for, write_pod

Obj = dict[str, Any]

MIRROR = "kubernetes.io/config.mirror"


class KubeClient:
    """The few calls the tests make, through the official synchronous client, raw JSON."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import config

        self.api = config.new_client_from_config(config_file=str(kubeconfig), persist_config=False)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Any = (),
        content_type: str = "application/json",
    ) -> tuple[int, Obj]:
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*params, _request_timeout=10)
        data = resp.read()
        return resp.status, (json.loads(data) if data else {})

    def pod(self, name: str, ns: str = "default") -> Obj | None:
        status, body = self.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        if status == 404:
            return None
        assert status == 200, body
        return body

    def pods(self, ns: str = "default") -> list[Obj]:
        status, body = self.request("GET", f"/api/v1/namespaces/{ns}/pods")
        assert status == 200, body
        items: list[Obj] = body["items"]
        return items

    def create_pod(self, body: Obj, ns: str = "default") -> Obj:
        status, answer = self.request("POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert status == 201, answer
        return answer

    def delete_pod(self, name: str, ns: str = "default", grace: int | None = None) -> None:
        query = [("gracePeriodSeconds", grace)] if grace is not None else []
        status, body = self.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", query=query)
        assert status in (200, 202, 404), body

    def node(self, name: str) -> Obj | None:
        status, body = self.request("GET", f"/api/v1/nodes/{name}")
        return body if status == 200 else None

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}")

    def lease(self, name: str) -> Obj | None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        status, body = self.request("GET", path)
        return body if status == 200 else None

    def events(self, ns: str = "default") -> list[Obj]:
        status, body = self.request("GET", f"/api/v1/namespaces/{ns}/events")
        assert status == 200, body
        items: list[Obj] = body["items"]
        return items


def pod_body(name: str, node: str, script: str, *, grace: int = 30, restart: str = "Always") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"test": "pykubelet"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {"name": "main", "image": "busybox:test", "command": ["/bin/sh", "-c", script]}
            ],
        },
    }


def container(pod: Obj | None) -> Obj:
    assert pod is not None, "no such pod"
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    assert statuses, "no container status yet"
    return statuses[0]  # type: ignore[no-any-return]


def running_in_api(client: KubeClient, name: str) -> Obj | None:
    pod = client.pod(name)
    if pod is None or pod.get("status", {}).get("phase") != "Running":
        return None
    state = container(pod)
    return pod if state.get("ready") and "running" in state.get("state", {}) else None


def agent_pod(agent: Agent, name: str) -> Obj | None:
    return agent.pods().get(name)


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer(bookmark_interval=0.5)
    server.start()
    yield server
    server.close()


@pytest.fixture
def cluster(apiserver: ApiServer, tmp_path: Path) -> tuple[ApiServer, Path, KubeClient]:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    return apiserver, kubeconfig, KubeClient(kubeconfig)


# --- the scenario, against the fixture or a real cluster ----------------------------------------


def node_runs_pods_scenario(
    client: KubeClient, start: Callable[..., Agent], kubeconfig: Path, node: str, work: Path
) -> None:
    """Register, run a pod and report its status, ignore another node's pod, delete gracefully,
    renew the Lease."""
    crashed_once = work / f"crashed-{uuid.uuid4().hex[:6]}"
    terminated = work / "terminated"
    web = f"web-{uuid.uuid4().hex[:6]}"
    other = f"other-{uuid.uuid4().hex[:6]}"
    client.create_pod(
        pod_body(
            web,
            node,
            # Crash once (restartCount 1), then run until SIGTERM, which it records.
            f"trap 'echo TERM > {terminated}; exit 0' TERM; "
            f"if [ ! -e {crashed_once} ]; then touch {crashed_once}; exit 1; fi; "
            "echo up; while true; do sleep 0.2; done",
            grace=10,
        )
    )
    client.create_pod(pod_body(other, f"{node}-elsewhere", "sleep 600"))
    agent = start("--kubeconfig", str(kubeconfig), "--node-name", node)

    # The node registers, with its capacity, version and Ready.
    node_obj = wait_for("the node", lambda: client.node(node))
    status = node_obj["status"]
    assert status["capacity"]["pods"] == "110"
    assert int(status["capacity"]["cpu"]) >= 1 and status["capacity"]["memory"].endswith("Ki")
    assert status["nodeInfo"]["kubeletVersion"].startswith("v0.")
    assert node_obj["metadata"]["labels"]["kubernetes.io/hostname"] == node
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "True", ready
    assert any(a["type"] == "InternalIP" for a in status["addresses"])
    lease = wait_for("the lease", lambda: client.lease(node))
    first_renew = lease["spec"]["renewTime"]
    assert lease["spec"]["holderIdentity"] == node
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node_obj["metadata"]["uid"]

    # The pod runs; its status (Running, ready, restartCount) shows in the API server.
    pod = wait_for(
        "the pod running and ready in the API server, after one crash",
        lambda: (p := running_in_api(client, web)) and container(p)["restartCount"] >= 1 and p,
        timeout=30,
    )
    state = container(pod)
    assert state["restartCount"] == 1
    assert "terminated" in state["lastState"], state
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["ContainersReady"] == "True"
    assert pod["status"]["startTime"] and pod["status"]["hostIP"]
    assert pod["status"]["podIP"]

    # The other node's pod is not run, nor touched.
    assert agent_pod(agent, other) is None
    elsewhere = client.pod(other)
    assert elsewhere is not None and elsewhere["status"].get("phase") == "Pending"

    # The agent's events reach the API server.
    wait_for(
        "a Started event for the pod",
        lambda: [
            e for e in client.events()
            if e["reason"] == "Started" and e["involvedObject"].get("name") == web
        ],
    )  # fmt: skip

    # A graceful delete: SIGTERM, the pod ends, and the agent deletes it for good.
    client.delete_pod(web)
    wait_for("the pod to be gone from the API server", lambda: client.pod(web) is None, timeout=15)
    assert terminated.read_text().strip() == "TERM"
    wait_for("the pod to be gone from the agent", lambda: agent_pod(agent, web) is None)

    # The Lease renews (every 10 s).
    wait_for(
        "a Lease renewal",
        lambda: (lease := client.lease(node)) and lease["spec"]["renewTime"] != first_renew,
        timeout=15,
    )
    client.delete_pod(other, grace=0)


def test_node_registers_runs_pods_and_reports_status(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    server, kubeconfig, client = cluster
    node_runs_pods_scenario(client, start_agent, kubeconfig, "testnode", tmp_path)
    # It went through the client library as a real cluster would see it: a list, then watches
    # with bookmarks, status patches; nothing but the node's own pods was asked for.
    agent_requests = [r for r in server.requests() if r.user_agent.startswith("pykubelet/")]
    pod_reads = [r for r in agent_requests if r.path == "/api/v1/pods"]
    assert pod_reads and all(
        r.query["fieldSelector"] == "spec.nodeName=testnode" for r in pod_reads
    )
    watches = [r for r in pod_reads if r.watch]
    assert watches and all(r.query.get("allowWatchBookmarks") == "true" for r in watches)
    assert any(r.method == "PATCH" and r.path.endswith("/status") for r in agent_requests)


@pytest.mark.realcluster
def test_against_a_real_cluster(start_agent: Callable[..., Agent], tmp_path: Path) -> None:
    path = os.environ.get("KUBECONFIG")
    if not path:
        pytest.skip("set KUBECONFIG to run the cluster scenario against a real cluster")
    kubeconfig = Path(path.split(os.pathsep)[0])
    if not kubeconfig.is_file():
        pytest.skip(f"KUBECONFIG={path}: no such file")
    client = KubeClient(kubeconfig)
    node = f"pykubelet-test-{uuid.uuid4().hex[:6]}"
    try:
        node_runs_pods_scenario(client, start_agent, kubeconfig, node, tmp_path)
    finally:
        for pod in client.pods():
            if pod["spec"].get("nodeName") in (node, f"{node}-elsewhere"):
                client.delete_pod(pod["metadata"]["name"], grace=0)
        client.delete_node(node)


# --- fixture-only: what a client cannot do ------------------------------------------------------


def test_outage_loses_no_pod_and_duplicates_none_and_410_relists(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent]
) -> None:
    server, kubeconfig, client = cluster
    node = "testnode"
    tag = uuid.uuid4().hex[:6]
    for name in ("keep", "gone"):
        client.create_pod(
            pod_body(name, node, f": {name}-{tag}; while true; do sleep 0.2; done", grace=3)
        )
    agent = start_agent("--kubeconfig", str(kubeconfig))
    for name in ("keep", "gone"):
        wait_for(f"{name} running in the API server", lambda n=name: running_in_api(client, n))
    (keep_pid,) = processes_with(f"keep-{tag}")

    def lists() -> int:
        return sum(
            1
            for r in server.requests()
            if r.path == "/api/v1/pods" and not r.watch and r.user_agent.startswith("pykubelet/")
        )

    listed = lists()
    assert listed == 1

    # 1. The API server goes away; meanwhile a pod is created and another one deleted.
    server.stop()
    server.create("pods", pod_body("new", node, f": new-{tag}; while true; do sleep 0.2; done"))
    server.delete("pods", "gone", grace=3)
    time.sleep(5)
    # The pods kept running while it was away.
    assert processes_with(f"keep-{tag}") == [keep_pid]
    assert len(processes_with(f"gone-{tag}")) == 1
    assert agent_pod(agent, "keep") is not None
    back_at = time.monotonic()
    server.start()

    wait_for("the new pod running", lambda: running_in_api(client, "new"), timeout=25)
    wait_for("the deleted pod gone from the API server", lambda: client.pod("gone") is None)
    wait_for("its process gone", lambda: not processes_with(f"gone-{tag}"))
    assert processes_with(f"keep-{tag}") == [keep_pid], "the running pod was restarted"
    assert len(processes_with(f"new-{tag}")) == 1
    assert sorted(agent.pods()) == ["keep", "new"]
    # The watch resumed from where it was: no re-list.
    assert lists() == listed
    resumed = [
        r for r in server.requests() if r.watch and r.path == "/api/v1/pods" and r.at > back_at
    ]
    assert resumed and all(r.query.get("resourceVersion") not in (None, "", "0") for r in resumed)

    # 2. Away again; a pod is removed for good and the events before now are compacted away:
    # resuming gets 410 Gone, and the agent re-lists.
    server.stop()
    server.delete("pods", "new", grace=0)
    server.create("pods", pod_body("late", node, f": late-{tag}; while true; do sleep 0.2; done"))
    server.compact()
    time.sleep(1)
    server.start()
    wait_for("the late pod running", lambda: running_in_api(client, "late"), timeout=25)
    wait_for("the removed pod's process gone", lambda: not processes_with(f"new-{tag}"))
    assert lists() == listed + 1
    assert processes_with(f"keep-{tag}") == [keep_pid]
    assert sorted(agent.pods()) == ["keep", "late"]
    assert "410 Gone" in agent.log()


def test_static_pods_show_as_mirror_pods(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent], manifests: Path
) -> None:
    _, kubeconfig, client = cluster
    write_pod(
        manifests,
        "static",
        """\
        apiVersion: v1
        kind: Pod
        metadata: {name: static, labels: {tier: node}}
        spec:
          containers:
          - {name: main, image: busybox:test, command: ["/bin/sh", "-c", "sleep 600"]}
        """,
    )
    agent = start_agent("--kubeconfig", str(kubeconfig))
    static = wait_for("the static pod running", lambda: agent_pod(agent, "static-testnode"))
    mirror = wait_for(
        "its mirror pod Running in the API server",
        lambda: (
            (p := client.pod("static-testnode")) and p["status"].get("phase") == "Running" and p
        ),
    )
    meta = mirror["metadata"]
    assert (
        meta["annotations"][MIRROR]
        == static["metadata"]["annotations"]["kubernetes.io/config.hash"]
    )
    assert meta["labels"] == {"tier": "node"}
    assert meta["ownerReferences"][0]["kind"] == "Node"
    assert container(mirror)["ready"] is True
    # The agent does not run the mirror as a pod of its own.
    assert list(agent.pods()) == ["static-testnode"]

    # Deleted by someone: recreated (a new UID).
    client.delete_pod("static-testnode", grace=0)
    again = wait_for(
        "the mirror pod recreated",
        lambda: (p := client.pod("static-testnode")) and p["metadata"]["uid"] != meta["uid"] and p,
    )
    assert again["metadata"]["annotations"][MIRROR] == meta["annotations"][MIRROR]
    wait_for(
        "the recreated mirror's status",
        lambda: (p := client.pod("static-testnode")) and p["status"].get("phase") == "Running",
    )

    # The manifest goes: so does the mirror.
    (manifests / "static.yaml").unlink()
    wait_for("the mirror pod deleted", lambda: client.pod("static-testnode") is None, timeout=20)
    assert agent_pod(agent, "static-testnode") is None


def test_a_pod_that_cannot_run_is_reported_not_run(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent]
) -> None:
    _, kubeconfig, client = cluster
    bad = pod_body("probed", "testnode", "sleep 600")
    bad["spec"]["shareProcessNamespace"] = True
    client.create_pod(bad)
    client.create_pod(pod_body("fine", "testnode", "sleep 600"))
    agent = start_agent("--kubeconfig", str(kubeconfig))
    wait_for("the good pod running", lambda: running_in_api(client, "fine"))
    failed = wait_for(
        "the bad pod Failed in the API server",
        lambda: (p := client.pod("probed")) and p["status"].get("phase") == "Failed" and p,
    )
    assert "shareProcessNamespace" in failed["status"]["message"]
    assert agent_pod(agent, "probed") is None
    events = wait_for(
        "a FailedValidation event on the pod",
        lambda: [
            e for e in client.events()
            if e["reason"] == "FailedValidation" and e["involvedObject"].get("name") == "probed"
        ],
    )  # fmt: skip
    assert "spec.shareProcessNamespace: not supported" in events[0]["message"]


def test_config_maps_and_secrets_reach_env_and_stay_out_of_the_api(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent]
) -> None:
    _, kubeconfig, client = cluster
    secret_value = f"s3cr3t-{uuid.uuid4().hex[:8]}"
    status, body = client.request(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        {"metadata": {"name": "settings"}, "data": {"LEVEL": "debug", "color": "blue"}},
    )
    assert status == 201, body
    encoded = base64.b64encode(secret_value.encode()).decode()
    status, body = client.request(
        "POST",
        "/api/v1/namespaces/default/secrets",
        {"metadata": {"name": "db"}, "data": {"password": encoded}},
    )
    assert status == 201, body
    app = pod_body("app", "testnode", 'echo "$LEVEL $COLOR $DB_PASSWORD_LEN"; sleep 600')
    app["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    app["spec"]["containers"][0]["env"] = [
        {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "color"}}},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
        {"name": "DB_PASSWORD_LEN", "value": "len=$(DB_PASSWORD)"},
    ]
    client.create_pod(app)
    # A pod whose ConfigMap does not exist waits with the kubelet's reason, and says which.
    missing = pod_body("missing", "testnode", "sleep 600")
    missing["spec"]["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x"}}}
    ]
    client.create_pod(missing)
    agent = start_agent("--kubeconfig", str(kubeconfig))
    wait_for("the app running", lambda: running_in_api(client, "app"))
    line = wait_for(
        "the app's output", lambda: agent.get("/containerLogs/default/app/main")[1].decode().strip()
    )
    assert line == f"debug blue len={secret_value}"
    waiting = wait_for(
        "the missing ConfigMap reported",
        lambda: (p := client.pod("missing")) and container(p)["state"].get("waiting"),
    )
    assert waiting["reason"] == "CreateContainerConfigError"
    assert waiting["message"] == 'configmap "nope" not found'
    # The Secret's value is in the container's environment only: never in what the agent
    # serves or sends, nor in its log.
    for path in ("/pods", "/events", "/"):
        assert secret_value not in agent.get(path)[1].decode()
    assert secret_value not in json.dumps(client.pods())
    assert secret_value not in agent.log()


def test_config_map_and_secret_volumes_follow_their_objects(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent]
) -> None:
    _, kubeconfig, client = cluster
    configmaps = "/api/v1/namespaces/default/configmaps"
    status, body = client.request(
        "POST", configmaps, {"metadata": {"name": "web"}, "data": {"color": "blue"}}
    )
    assert status == 201, body
    status, body = client.request(
        "POST",
        "/api/v1/namespaces/default/secrets",
        {"metadata": {"name": "tls"}, "data": {"key": base64.b64encode(b"k3y").decode()}},
    )
    assert status == 201, body
    app = pod_body(
        "web",
        "testnode",
        "cat /media/tls.key; echo; while :; do cat /mnt/color; echo; "
        "touch /mnt/x 2>/dev/null && echo writable; sleep 0.3; done",
    )
    app["spec"]["volumes"] = [
        {"name": "conf", "configMap": {"name": "web"}},
        {
            "name": "certs",
            "secret": {"secretName": "tls", "items": [{"key": "key", "path": "tls.key"}]},
        },
    ]
    app["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "conf", "mountPath": "/mnt"},
        {"name": "certs", "mountPath": "/media"},
    ]
    client.create_pod(app)
    agent = start_agent("--kubeconfig", str(kubeconfig), "--sync-frequency", "2s")
    logs = "/containerLogs/default/web/main"

    def output() -> list[str]:
        status, body = agent.get(logs)
        return body.decode().split("\n") if status == 200 else []

    first = wait_for("the files", lambda: len(output()) > 2 and output())
    assert first[:2] == ["k3y", "blue"]
    status, body = client.request(
        "PATCH",
        f"{configmaps}/web",
        {"data": {"color": "green"}},
        content_type="application/merge-patch+json",
    )
    assert status == 200, body
    wait_for(
        "the edited ConfigMap in the volume",
        lambda: output()[-2:] == ["green", ""],
        timeout=20,
    )
    assert "writable" not in agent.get(logs)[1].decode()  # always mounted read-only
    # The ConfigMap goes: the running pod keeps what it has (reported, not stopped).
    status, body = client.request("DELETE", f"{configmaps}/web")
    assert status == 200, body
    wait_for(
        "a FailedMount event",
        lambda: [
            e for e in client.events()
            if e["reason"] == "FailedMount" and e["involvedObject"].get("name") == "web"
        ],
        timeout=20,
    )  # fmt: skip
    pod = running_in_api(client, "web")
    assert pod is not None and container(pod)["restartCount"] == 0


def test_watches_cut_every_two_seconds_lose_no_change(
    cluster: tuple[ApiServer, Path, KubeClient], start_agent: Callable[..., Agent]
) -> None:
    server, kubeconfig, client = cluster
    agent = start_agent("--kubeconfig", str(kubeconfig))
    stop = threading.Event()
    # Cutting starts once the agent watches (a slow start would otherwise see fewer cuts).
    wait_for(
        "the agent's pod watch",
        lambda: any(r.watch and r.path == "/api/v1/pods" for r in server.requests()),
    )

    def cut() -> None:
        while not stop.wait(2.0):
            server.drop_watches()

    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    try:
        for i in range(6):
            client.create_pod(pod_body(f"w{i}", "testnode", "sleep 600", grace=2))
            time.sleep(0.7)
        for i in range(0, 6, 2):
            client.delete_pod(f"w{i}")
        wanted = {f"w{i}" for i in range(1, 6, 2)}
        wait_for(
            "the odd pods running, the even ones gone, in the API server and the agent",
            lambda: (
                all(running_in_api(client, n) for n in wanted)
                and {p["metadata"]["name"] for p in client.pods()} == wanted
                and {p["metadata"]["name"] for p in agent.pods().values()} == wanted
            ),
            timeout=60,
        )
    finally:
        stop.set()
        cutter.join()
    watches = [r for r in server.requests() if r.watch and r.path == "/api/v1/pods"]
    assert len(watches) >= 3  # it was cut, and resumed, at least twice
