"""The two container runtimes end to end: the real agent against a real engine, `docker` (a
private Podman service, see scripts/podman-test-env) and `remote` (a private containerd, see
scripts/containerd-test-env), checked through the agent's HTTP API and the engine's own API.

Each test runs once per runtime; what can only be seen through one engine's API (the infra
container's HostConfig, the CRI's container status...) is behind the small per-engine checks
below."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import (
    LABEL_POD_NAME,
    LABEL_POD_UID,
    LABEL_TYPE,
    NODE,
    Agent,
    Backend,
    CriEngine,
    Engine,
    container_state,
    pod_yaml,
    wait_for,
    write_pod,
)

FOREVER = 'trap "exit 0" TERM; while :; do sleep 1 & wait; done'

DOCKER = pytest.param("docker", marks=pytest.mark.docker)
REMOTE = pytest.param("remote", marks=pytest.mark.cri)
# The conftest's `backend` fixture, for the two container runtimes only.
each_runtime = pytest.mark.parametrize("backend", [DOCKER, REMOTE], indirect=True)


class DockerChecks:
    """What the docker runtime did, as `docker inspect` shows it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def ids(self, pod_name: str) -> set[str]:
        """The pod's infra container and containers."""
        return {str(r["Id"]) for r in self.engine.pod_containers(pod_name)}

    def all_running(self, pod_name: str) -> bool:
        rows = self.engine.pod_containers(pod_name)
        return bool(rows) and all(r["State"] == "running" for r in rows)

    def by_uid(self, uid: str) -> tuple[list[Any], list[Any]]:
        """The pod's (infra containers, other containers)."""
        rows = self.engine.containers(**{LABEL_POD_UID: uid})
        infra = [r for r in rows if r["Labels"][LABEL_TYPE] == "podsandbox"]
        return infra, [r for r in rows if r not in infra]

    def check_network(self, pod: dict[str, Any]) -> None:
        """The infra container owns the network: it has the pod IP; the others join it."""
        rows = self.engine.pod_containers(pod["metadata"]["name"].removesuffix(f"-{NODE}"))
        infra = [r for r in rows if r["Labels"][LABEL_TYPE] == "podsandbox"]
        assert len(infra) == 1 and len(rows) == 3, rows
        infra_info = self.engine.inspect(infra[0]["Id"])
        assert infra_info is not None
        assert infra_info["NetworkSettings"]["IPAddress"] == pod["status"]["podIP"]
        for status in pod["status"]["containerStatuses"]:
            info = self.engine.inspect(status["containerID"])
            assert info is not None
            assert info["HostConfig"]["NetworkMode"] == f"container:{infra[0]['Id']}"

    def check_limits(self, container_id: str) -> None:
        """32Mi of memory (no swap on top), 250m of CPU."""
        info = self.engine.inspect(container_id)
        assert info is not None
        host = info["HostConfig"]
        assert host["Memory"] == 32 * 1024 * 1024 and host["MemorySwap"] == host["Memory"]
        assert host["CpuQuota"] == 25_000 and host["CpuPeriod"] == 100_000


class CriChecks:
    """What the remote runtime did, as `crictl inspect` shows it."""

    def __init__(self, engine: CriEngine) -> None:
        self.engine = engine

    def ids(self, pod_name: str) -> set[str]:
        """The pod's sandbox and containers."""
        return {str(r.id) for r in self.engine.pod_containers(pod_name)}

    def all_running(self, pod_name: str) -> bool:
        running = self.engine.api.CONTAINER_RUNNING
        containers = self.engine.containers(**{LABEL_POD_NAME: f"{pod_name}-{NODE}"})
        return bool(containers) and all(c.state == running for c in containers)

    def by_uid(self, uid: str) -> tuple[list[Any], list[Any]]:
        """The pod's (sandboxes, containers)."""
        labels = {LABEL_POD_UID: uid}
        return self.engine.sandboxes(**labels), self.engine.containers(**labels)

    def _info(self, container_id: str) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self.engine.container_status(container_id).info["info"])
        return info

    def check_network(self, pod: dict[str, Any]) -> None:
        """One sandbox holds the pod's network: it has the pod IP; the containers are in it."""
        [sandbox] = self.engine.sandboxes(**{LABEL_POD_UID: pod["metadata"]["uid"]})
        assert self.engine.sandbox_status(sandbox.id).status.network.ip == pod["status"]["podIP"]
        for status in pod["status"]["containerStatuses"]:
            assert status["containerID"].startswith("containerd://")
            assert status["image"] == "busybox:test"
            assert status["imageID"].startswith("sha256:"), status
            assert self._info(status["containerID"])["sandboxID"] == sandbox.id

    def check_limits(self, container_id: str) -> None:
        """32Mi of memory (no swap on top), 250m of CPU."""
        linux = self._info(container_id)["runtimeSpec"]["linux"]["resources"]
        assert linux["memory"]["limit"] == 32 * 1024 * 1024
        assert linux["memory"]["swap"] == 32 * 1024 * 1024
        assert (linux["cpu"]["quota"], linux["cpu"]["period"]) == (25_000, 100_000)
        assert linux["cpu"]["shares"] == 256


def _checks(backend: Backend) -> DockerChecks | CriChecks:
    if isinstance(backend.engine, Engine):
        return DockerChecks(backend.engine)
    assert isinstance(backend.engine, CriEngine), backend
    return CriChecks(backend.engine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _statuses(agent: Agent, name: str) -> dict[str, dict[str, Any]]:
    pod = agent.pod(name)
    assert pod is not None, "pod not listed"
    return {s["name"]: s for s in pod["status"].get("containerStatuses") or []}


def _all_running(agent: Agent, name: str) -> dict[str, Any] | None:
    pod = agent.pod(name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    statuses = pod["status"].get("containerStatuses") or []
    return pod if statuses and all("running" in s["state"] for s in statuses) else None


def _pod_logs(tmp_path: Path, pod: dict[str, Any]) -> Path:
    """The directory of the pod's log files (the remote runtime's containers write there)."""
    return (
        tmp_path
        / "root"
        / "logs"
        / "pods"
        / f"default_{pod['metadata']['name']}_{pod['metadata']['uid']}"
    )


@each_runtime
def test_containers_of_a_pod_share_localhost_hostname_and_pod_ip(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    port = _free_port()
    server = "mkdir -p /www; hostname > /www/index.html; httpd -f -p 8080 -h /www & " + FOREVER
    client = (
        "until wget -q -O- http://127.0.0.1:8080/; do sleep 0.2; done; "
        "ip -4 -o addr show eth0; " + FOREVER
    )
    write_pod(
        manifests,
        "duo",
        f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: duo}}
        spec:
          containers:
          - name: server
            image: busybox:test
            ports: [{{containerPort: 8080, hostPort: {port}}}]
            command: ["/bin/sh", "-c", {json.dumps(server)}]
          - name: client
            image: busybox:test
            command: ["/bin/sh", "-c", {json.dumps(client)}]
        """,
    )
    agent = start_agent(*backend.flags)
    pod = wait_for("both running", lambda: _all_running(agent, "duo"))
    pod_ip = pod["status"]["podIP"]
    assert pod_ip and pod["status"]["podIPs"] == [{"ip": pod_ip}]

    # Both lines: the log may be read between wget's output and ip's.
    log = wait_for(
        "client reached the server and printed its address",
        lambda: (text := agent.logs("duo", "client")) and len(text.splitlines()) >= 2 and text,
    )
    # Over localhost, from a server whose hostname is the pod's (UTS namespace shared).
    assert log.splitlines()[0] == f"duo-{NODE}", log
    assert f"inet {pod_ip}/" in log, log

    # One infra container (sandbox) holds the network; the host port is published.
    _checks(backend).check_network(pod)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
        assert resp.read().decode().strip() == f"duo-{NODE}"


@each_runtime
def test_memory_limit_is_enforced_and_reported_as_oomkilled(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    # dd, as PID 1, allocates its 200 MB block at once: the kernel kills it, not some child.
    # A second first, as test_docs_pods' memory-demo-2 and Kubernetes' own OOM e2e test
    # (kubernetes#116082): containerd 1.6 drops an OOM that comes before StartContainer has
    # returned (containerd#8180), and the container stays an Error for good.
    write_pod(
        manifests,
        "hog",
        pod_yaml(
            "hog", "sleep 1; exec dd if=/dev/zero of=/dev/null bs=200M count=1", restart="Never"
        )
        + "    resources: {limits: {memory: 32Mi, cpu: 250m}}\n",
    )
    agent = start_agent(*backend.flags)
    pod = wait_for(
        "hog failed", lambda: (p := agent.pod("hog")) and p["status"]["phase"] == "Failed" and p
    )
    terminated = container_state(pod)["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled", terminated
    assert terminated["exitCode"] == 137
    _checks(backend).check_limits(container_state(pod)["containerID"])


@each_runtime
def test_missing_image_never_pulled_and_other_pods_run(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    write_pod(
        manifests,
        "never",
        pod_yaml("never", "true").replace("busybox:test", "localhost/absent:v1")
        + "    imagePullPolicy: Never\n",
    )
    # Not present, and its registry does not exist: the pull fails, then backs off.
    write_pod(
        manifests,
        "unpulled",
        pod_yaml("unpulled", "true").replace("busybox:test", "registry.invalid/absent:v1"),
    )
    write_pod(manifests, "fine", pod_yaml("fine", f"echo fine; {FOREVER}"))
    agent = start_agent(*backend.flags)
    wait_for("fine running", lambda: _all_running(agent, "fine"))
    waiting = wait_for(
        "ErrImageNeverPull",
        lambda: container_state(agent.pod("never"))["state"].get("waiting"),
    )
    assert waiting == {
        "reason": "ErrImageNeverPull",
        "message": 'Container image "localhost/absent:v1" is not present with pull policy of Never',
    }
    never = agent.pod("never")
    assert never is not None and never["status"]["phase"] == "Pending"
    # ErrImagePull, or ImagePullBackOff if a sync comes before the back-off ends.
    waiting = wait_for(
        "ErrImagePull",
        lambda: container_state(agent.pod("unpulled"))["state"].get("waiting"),
    )
    assert waiting["reason"] in ("ErrImagePull", "ImagePullBackOff"), waiting
    assert "registry.invalid/absent:v1" in waiting["message"], waiting
    pulls = [e["message"] for e in agent.events() if "failed to pull image" in e["message"]]
    assert any("registry.invalid/absent:v1" in m for m in pulls), pulls
    # A running container's output may not be in its log yet: containerd's shim copies it there.
    assert wait_for("fine's log", lambda: agent.logs("fine", "main") == "fine\n" or None)


@each_runtime
def test_sigkill_and_restart_adopts_containers_without_duplicates(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    checks = _checks(backend)
    body = pod_yaml("keep", f"echo one; {FOREVER}") + (
        f"  - name: second\n    image: busybox:test\n"
        f"    command: [/bin/sh, -c, {json.dumps('echo two; ' + FOREVER)}]\n"
    )
    write_pod(manifests, "keep", body)
    agent = start_agent(*backend.flags)
    before = wait_for("keep running", lambda: _all_running(agent, "keep"))
    ids = checks.ids("keep")
    assert len(ids) == 3  # infra (sandbox) + 2

    agent.stop(signal.SIGKILL)
    assert checks.all_running("keep")
    again = start_agent(*backend.flags)
    after = wait_for("keep adopted", lambda: _all_running(again, "keep"))
    time.sleep(2.5)  # a sync tick and a housekeeping pass: nothing may start twice
    assert checks.ids("keep") == ids
    assert checks.all_running("keep")
    old = {s["name"]: s["containerID"] for s in before["status"]["containerStatuses"]}
    new = {
        s["name"]: (s["containerID"], s["restartCount"]) for s in _statuses(again, "keep").values()
    }
    assert new == {name: (cid, 0) for name, cid in old.items()}
    assert after["status"]["podIP"] == before["status"]["podIP"]
    assert again.logs("keep", "second") == "two\n"


@each_runtime
def test_removing_the_manifest_removes_the_infra_the_containers_and_the_logs(
    start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path, backend: Backend
) -> None:
    checks = _checks(backend)
    write_pod(manifests, "short", pod_yaml("short", f"echo bye; {FOREVER}"))
    write_pod(manifests, "stays", pod_yaml("stays", FOREVER))
    agent = start_agent(*backend.flags)
    pod = wait_for("short running", lambda: _all_running(agent, "short"))
    wait_for("stays running", lambda: _all_running(agent, "stays"))
    uid = pod["metadata"]["uid"]
    infra, containers = checks.by_uid(uid)
    assert (len(infra), len(containers)) == (1, 1), (infra, containers)
    # The remote runtime's containers write their logs under the agent's root directory.
    logs = _pod_logs(tmp_path, pod)
    if backend.name == "remote":
        assert (logs / "main" / "0.log").exists()
    stays = checks.ids("stays")

    (manifests / "short.yaml").unlink()
    wait_for("gone from /pods", lambda: agent.pod("short") is None, timeout=10)
    wait_for("its infra and containers removed", lambda: checks.by_uid(uid) == ([], []))
    if backend.name == "remote":
        wait_for("its logs removed", lambda: not logs.exists())
    assert checks.ids("stays") == stays


# The last thing `talk` writes, and what its log ends with: a line without its newline through
# the engine; through the CRI, a line over 16 KiB (containerd splits it into partial records).
TALK_END = {
    "docker": ("printf three", "three"),
    "remote": ("head -c 20000 /dev/zero | tr '\\0' x; echo", "x" * 20000 + "\n"),
}


TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z"


def _since_and_timestamps(agent: Agent, backend: Backend, expected: str) -> None:
    """`timestamps` prefixes each record with its time (fixed nine digits; Podman 4.3 keeps
    whole seconds only), partial records too; `sinceTime`/`sinceSeconds` leave out the older
    records."""
    stamped = agent.logs("talk", "main", "?timestamps=true")
    lines = stamped.splitlines(keepends=True)
    assert all(re.match(TIMESTAMP + " ", line) for line in lines), stamped[:300]
    assert re.sub(TIMESTAMP + " ", "", stamped) == expected
    times = re.findall(TIMESTAMP, stamped)
    first = datetime.fromisoformat(times[0])
    assert abs((datetime.now(UTC) - first).total_seconds()) < 120, times
    if backend.name == "remote":
        # The records' own times, to the nanosecond: since that of "two" keeps it and what follows.
        assert agent.logs("talk", "main", f"?sinceTime={times[1]}") == expected[len("one\n") :]
    assert agent.logs("talk", "main", "?sinceSeconds=3600") == expected
    assert agent.logs("talk", "main", "?tailLines=1&timestamps=true") == lines[-1]
    # Once the last record is a few seconds old, a second's worth is nothing (tail or not).
    last = datetime.fromisoformat(times[-1])
    wait_for("the log a few seconds old", lambda: datetime.now(UTC) > last + timedelta(seconds=3))
    assert agent.logs("talk", "main", "?sinceSeconds=1") == ""
    assert agent.logs("talk", "main", "?sinceSeconds=1&tailLines=2") == ""
    status, body = agent.get(
        f"/containerLogs/default/talk-{NODE}/main?sinceSeconds=5&sinceTime={times[0]}"
    )
    assert status == 422, body
    assert b"at most one of `sinceTime` or `sinceSeconds` may be specified" in body


@each_runtime
def test_logs_come_from_the_runtime(
    start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path, backend: Backend
) -> None:
    last_command, last_output = TALK_END[backend.name]
    write_pod(
        manifests,
        "talk",
        # stdout and stderr are two pipes: only writes apart in time have an order.
        pod_yaml(
            "talk", f"echo one; sleep 0.2; echo two >&2; sleep 0.2; {last_command}; {FOREVER}"
        ),
    )
    write_pod(manifests, "brief", pod_yaml("brief", "echo a; sleep 1; echo b", restart="Never"))
    write_pod(manifests, "again", pod_yaml("again", "echo run; sleep 0.3; exit 1"))
    agent = start_agent(*backend.flags)
    pod = wait_for("talk running", lambda: _all_running(agent, "talk"))
    expected = "one\ntwo\n" + last_output
    assert wait_for("talk log", lambda: agent.logs("talk", "main") == expected or None)
    if backend.name == "remote":
        # The partial (P) records of the long line are joined.
        assert b" stdout P " in (_pod_logs(tmp_path, pod) / "main" / "0.log").read_bytes()
    assert agent.logs("talk", "main", "?tailLines=1") == last_output
    assert agent.logs("talk", "main", "?limitBytes=6") == "one\ntw"
    _since_and_timestamps(agent, backend, expected)

    # A followed log ends once the container has exited.
    wait_for("brief started", lambda: container_state(agent.pod("brief"))["containerID"])
    started = time.monotonic()
    status, body = agent.get(f"/containerLogs/default/brief-{NODE}/main?follow=true")
    assert status == 200 and body == b"a\nb\n", body
    assert time.monotonic() - started < 10
    status, body = agent.get(f"/containerLogs/default/brief-{NODE}/main?follow=true&tailLines=1")
    assert status == 200 and body == b"b\n", body

    wait_for("again restarted", lambda: container_state(agent.pod("again"))["restartCount"] >= 1)
    assert agent.logs("again", "main", "?previous=true") == "run\n"


@pytest.mark.parametrize(
    "runtime, message",
    [
        pytest.param(
            "docker", "cannot reach the container engine", marks=pytest.mark.docker, id="docker"
        ),
        pytest.param(
            "remote", "cannot reach the container runtime", marks=pytest.mark.cri, id="remote"
        ),
    ],
)
def test_unreachable_runtime_is_a_clear_error(tmp_path: Path, runtime: str, message: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pykubelet",
            "--root-dir",
            str(tmp_path / "root"),
            "--read-only-port",
            "0",
            "--container-runtime",
            runtime,
            "--container-runtime-endpoint",
            f"unix://{tmp_path}/no-runtime.sock",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@each_runtime
def test_exec_probes_and_hooks_run_inside_the_container(
    start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path, backend: Backend
) -> None:
    journal = backend.journal(tmp_path)
    # /tmp/healthy exists only in the container's own filesystem: a probe that sees it ran there.
    main = f"{journal.append('main')}; touch /tmp/healthy; (sleep 2; rm /tmp/healthy) & {FOREVER}"
    write_pod(
        manifests,
        "live",
        pod_yaml("live", main, grace=5)
        + f"""\
    livenessProbe:
      exec: {{command: [cat, /tmp/healthy]}}
      periodSeconds: 1
      failureThreshold: 2
    lifecycle:
      postStart:
        exec: {{command: [/bin/sh, -c, {json.dumps(journal.append("post-start"))}]}}
      preStop:
        exec: {{command: [/bin/sh, -c, {json.dumps(journal.append("pre-stop"))}]}}
""",
    )
    agent = start_agent(*backend.flags)
    wait_for(
        "restarted by liveness",
        lambda: container_state(agent.pod("live"))["restartCount"] >= 1,
        timeout=30,
    )
    messages = [e["message"] for e in agent.events()]
    assert any("failed liveness probe, will be restarted" in m for m in messages), messages
    assert any(m.startswith("Liveness probe failed: command ['cat'") for m in messages), messages
    lines = journal.lines()
    assert lines[:3] == ["main", "post-start", "pre-stop"] or lines[:3] == [
        "post-start",
        "main",
        "pre-stop",
    ], lines


@each_runtime
def test_http_readiness_probe_reaches_the_pod_ip(
    start_agent: Callable[..., Agent], manifests: Path, backend: Backend
) -> None:
    server = (
        "mkdir -p /www; echo ok > /www/healthz; httpd -f -p 8080 -h /www & "
        "(sleep 3; rm /www/healthz; sleep 3; echo ok > /www/healthz) & " + FOREVER
    )
    write_pod(
        manifests,
        "ready",
        pod_yaml("ready", server)
        + """\
    ports: [{name: web, containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /healthz, port: web}
      periodSeconds: 1
      failureThreshold: 1
""",
    )
    agent = start_agent(*backend.flags)

    def ready() -> bool:
        return bool(container_state(agent.pod("ready"))["ready"])

    wait_for("ready", ready)
    wait_for("not ready once /healthz is gone", lambda: not ready(), timeout=15)
    wait_for("ready again", ready, timeout=15)
    assert container_state(agent.pod("ready"))["restartCount"] == 0
