"""The remote (CRI) runtime end to end: the real agent against a real containerd (a private one,
see scripts/containerd-test-env), checked through the agent's HTTP API and the CRI."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import (
    LABEL_POD_UID,
    NODE,
    Backend,
    container_state,
    pod_yaml,
    wait_for,
    write_pod,
)

pytestmark = pytest.mark.cri

FOREVER = 'trap "exit 0" TERM; while :; do sleep 1 & wait; done'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _all_running(agent: Any, name: str) -> dict[str, Any] | None:
    pod = agent.pod(name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    statuses = pod["status"].get("containerStatuses") or []
    return pod if statuses and all("running" in s["state"] for s in statuses) else None


def _ids(rows: list[Any]) -> set[str]:
    return {str(r.id) for r in rows}


def test_containers_of_a_pod_share_localhost_hostname_and_pod_ip(
    start_agent, manifests: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    engine = cri_backend.engine
    assert engine is not None
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
    agent = start_agent(*cri_backend.flags)
    pod = wait_for("both running", lambda: _all_running(agent, "duo"))
    pod_ip = pod["status"]["podIP"]
    assert pod_ip and pod["status"]["podIPs"] == [{"ip": pod_ip}]

    log = wait_for("client reached the server", lambda: agent.logs("duo", "client"))
    # Over localhost, from a server whose hostname is the pod's (UTS namespace shared).
    assert log.splitlines()[0] == f"duo-{NODE}", log
    assert f"inet {pod_ip}/" in log, log

    # One sandbox holds the pod's network: it has the pod IP, and the host port is mapped.
    [sandbox] = engine.sandboxes(**{LABEL_POD_UID: pod["metadata"]["uid"]})
    assert engine.sandbox_status(sandbox.id).status.network.ip == pod_ip
    for status in pod["status"]["containerStatuses"]:
        assert status["containerID"].startswith("remote://")
        assert status["image"] == "busybox:test"
        assert status["imageID"].startswith("sha256:"), status
        info = json.loads(engine.container_status(status["containerID"]).info["info"])
        assert info["sandboxID"] == sandbox.id
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
        assert resp.read().decode().strip() == f"duo-{NODE}"


def test_memory_limit_is_enforced_and_reported_as_oomkilled(
    start_agent, manifests: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    engine = cri_backend.engine
    assert engine is not None
    # dd, as PID 1, allocates its 200 MB block at once: the kernel kills it, not some child.
    write_pod(
        manifests,
        "hog",
        pod_yaml("hog", "exec dd if=/dev/zero of=/dev/null bs=200M count=1", restart="Never")
        + "    resources: {limits: {memory: 32Mi, cpu: 250m}}\n",
    )
    agent = start_agent(*cri_backend.flags)
    pod = wait_for(
        "hog failed", lambda: (p := agent.pod("hog")) and p["status"]["phase"] == "Failed" and p
    )
    terminated = container_state(pod)["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled", terminated
    assert terminated["exitCode"] == 137
    info = json.loads(engine.container_status(container_state(pod)["containerID"]).info["info"])
    linux = info["runtimeSpec"]["linux"]["resources"]
    assert linux["memory"]["limit"] == 32 * 1024 * 1024
    assert linux["memory"]["swap"] == 32 * 1024 * 1024
    assert (linux["cpu"]["quota"], linux["cpu"]["period"]) == (25_000, 100_000)
    assert linux["cpu"]["shares"] == 256


def test_missing_image_never_pulled_and_other_pods_run(
    start_agent, manifests: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
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
    agent = start_agent(*cri_backend.flags)
    wait_for("fine running", lambda: _all_running(agent, "fine"))
    waiting = wait_for(
        "ErrImageNeverPull",
        lambda: container_state(agent.pod("never"))["state"].get("waiting"),
    )
    assert waiting == {
        "reason": "ErrImageNeverPull",
        "message": 'Container image "localhost/absent:v1" is not present with pull policy of Never',
    }
    assert agent.pod("never")["status"]["phase"] == "Pending"
    waiting = wait_for(
        "ErrImagePull",
        lambda: container_state(agent.pod("unpulled"))["state"].get("waiting"),
    )
    assert waiting["reason"] in ("ErrImagePull", "ImagePullBackOff"), waiting
    assert "registry.invalid/absent:v1" in waiting["message"], waiting
    assert agent.logs("fine", "main") == "fine\n"


def test_sigkill_and_restart_adopts_containers_without_duplicates(
    start_agent, manifests: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    engine = cri_backend.engine
    assert engine is not None
    body = pod_yaml("keep", f"echo one; {FOREVER}") + (
        f"  - name: second\n    image: busybox:test\n"
        f"    command: [/bin/sh, -c, {json.dumps('echo two; ' + FOREVER)}]\n"
    )
    write_pod(manifests, "keep", body)
    agent = start_agent(*cri_backend.flags)
    before = wait_for("keep running", lambda: _all_running(agent, "keep"))
    ids = _ids(engine.pod_containers("keep"))
    assert len(ids) == 3  # sandbox + 2

    agent.stop(signal.SIGKILL)
    assert all(c.state == engine.api.CONTAINER_RUNNING for c in engine.containers())
    again = start_agent(*cri_backend.flags)
    after = wait_for("keep adopted", lambda: _all_running(again, "keep"))
    time.sleep(2.5)  # a sync tick and a housekeeping pass: nothing may start twice
    assert _ids(engine.pod_containers("keep")) == ids
    assert all(c.state == engine.api.CONTAINER_RUNNING for c in engine.containers())
    old = {s["name"]: s["containerID"] for s in before["status"]["containerStatuses"]}
    new = {
        s["name"]: (s["containerID"], s["restartCount"])
        for s in after["status"]["containerStatuses"]
    }
    assert new == {name: (cid, 0) for name, cid in old.items()}
    assert after["status"]["podIP"] == before["status"]["podIP"]
    assert again.logs("keep", "second") == "two\n"


def test_removing_the_manifest_removes_the_sandbox_and_the_logs(
    start_agent, manifests: Path, tmp_path: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    engine = cri_backend.engine
    assert engine is not None
    write_pod(manifests, "short", pod_yaml("short", f"echo bye; {FOREVER}"))
    write_pod(manifests, "stays", pod_yaml("stays", FOREVER))
    agent = start_agent(*cri_backend.flags)
    pod = wait_for("short running", lambda: _all_running(agent, "short"))
    wait_for("stays running", lambda: _all_running(agent, "stays"))
    uid = pod["metadata"]["uid"]
    assert len(engine.sandboxes(**{LABEL_POD_UID: uid})) == 1
    assert len(engine.containers(**{LABEL_POD_UID: uid})) == 1
    logs = tmp_path / "root" / "logs" / "pods" / f"default_short-{NODE}_{uid}"
    assert (logs / "main" / "0.log").exists()
    stays = _ids(engine.pod_containers("stays"))

    (manifests / "short.yaml").unlink()
    wait_for("gone from /pods", lambda: agent.pod("short") is None, timeout=10)
    wait_for(
        "its sandbox removed",
        lambda: (
            not engine.sandboxes(**{LABEL_POD_UID: uid})
            and not engine.containers(**{LABEL_POD_UID: uid})
        ),
    )
    wait_for("its logs removed", lambda: not logs.exists())
    assert _ids(engine.pod_containers("stays")) == stays


def test_logs_come_from_the_runtime_log_files(
    start_agent, manifests: Path, tmp_path: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    long_line = "head -c 20000 /dev/zero | tr '\\0' x; echo"
    write_pod(
        manifests,
        "talk",
        # stdout and stderr are two pipes: only writes apart in time have an order.
        pod_yaml("talk", f"echo one; sleep 0.2; echo two >&2; sleep 0.2; {long_line}; {FOREVER}"),
    )
    write_pod(manifests, "brief", pod_yaml("brief", "echo a; sleep 1; echo b", restart="Never"))
    write_pod(manifests, "again", pod_yaml("again", "echo run; sleep 0.3; exit 1"))
    agent = start_agent(*cri_backend.flags)
    pod = wait_for("talk running", lambda: _all_running(agent, "talk"))
    expected = "one\ntwo\n" + "x" * 20000 + "\n"
    assert wait_for("talk log", lambda: agent.logs("talk", "main") == expected or None)
    # containerd splits a line longer than 16 KiB into partial (P) records: they are joined.
    path = tmp_path / "root" / "logs" / "pods" / f"default_talk-{NODE}_{pod['metadata']['uid']}"
    assert b" stdout P " in (path / "main" / "0.log").read_bytes()
    assert agent.logs("talk", "main", "?tailLines=1") == "x" * 20000 + "\n"
    assert agent.logs("talk", "main", "?limitBytes=6") == "one\ntw"

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


def test_exec_probes_and_hooks_run_inside_the_container(
    start_agent, manifests: Path, tmp_path: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    journal = cri_backend.journal(tmp_path)
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
    agent = start_agent(*cri_backend.flags)
    wait_for(
        "restarted by liveness",
        lambda: container_state(agent.pod("live"))["restartCount"] >= 1,
        timeout=30,
    )
    messages = [e["message"] for e in agent.events()]
    assert any("failed liveness probe, will be restarted" in m for m in messages), messages
    lines = journal.lines()
    assert lines[:3] == ["main", "post-start", "pre-stop"] or lines[:3] == [
        "post-start",
        "main",
        "pre-stop",
    ], lines


def test_http_readiness_probe_reaches_the_pod_ip(
    start_agent, manifests: Path, cri_backend: Backend
) -> None:  # type: ignore[no-untyped-def]
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
    agent = start_agent(*cri_backend.flags)

    def ready() -> bool:
        return bool(container_state(agent.pod("ready"))["ready"])

    wait_for("ready", ready)
    wait_for("not ready once /healthz is gone", lambda: not ready(), timeout=15)
    wait_for("ready again", ready, timeout=15)
    assert container_state(agent.pod("ready"))["restartCount"] == 0


def test_unreachable_runtime_is_a_clear_error(tmp_path: Path) -> None:
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
            "remote",
            "--container-runtime-endpoint",
            f"unix://{tmp_path}/no-runtime.sock",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "cannot reach the container runtime" in proc.stderr, proc.stderr
