"""Probes and lifecycle hooks on the real agent: what `kubectl get pods` would show."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from tests.integration.agent import container_state, processes_with, wait_for, write_pod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def manifest(name: str, container: str, restart: str = "Always", grace: int = 5) -> str:
    body = "\n".join("    " + line for line in container.strip("\n").splitlines())
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: {restart}
  terminationGracePeriodSeconds: {grace}
  containers:
  - name: main
    image: busybox:test
{body}
"""


def test_exec_liveness_failure_restarts_the_container(
    start_agent, manifests: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "healthy"
    write_pod(
        manifests,
        "live",
        manifest(
            "live",
            f"""
command: ["/bin/sh", "-c", "touch {marker}; sleep 2; rm -f {marker}; sleep 600"]
livenessProbe:
  exec: {{command: ["cat", "{marker}"]}}
  periodSeconds: 1
  failureThreshold: 2
""",
        ),
    )
    agent = start_agent()
    st = wait_for(
        "restarted by liveness",
        lambda: (s := container_state(agent.pod("live"))) and s["restartCount"] >= 1 and s,
        timeout=30,
    )
    assert st["lastState"]["terminated"]["exitCode"] in (137, 143)
    messages = [e["message"] for e in agent.events()]
    assert any("failed liveness probe, will be restarted" in m for m in messages), messages
    assert any(m.startswith("Liveness probe failed: command ['cat'") for m in messages), messages


def test_http_readiness_flips_ready_and_condition(
    start_agent, manifests: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    flag = tmp_path / "serve"
    flag.touch()
    # Serves while the flag file exists; the readiness probe follows it.
    script = (
        f"import http.server, os\n"
        f"class H(http.server.BaseHTTPRequestHandler):\n"
        f"    def do_GET(self):\n"
        f"        ok = os.path.exists({str(flag)!r}) and self.headers.get('X-Probe') == 'yes'\n"
        f"        self.send_response(200 if ok else 503); self.end_headers()\n"
        f"    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('0.0.0.0', {port}), H).serve_forever()\n"
    )
    write_pod(
        manifests,
        "ready",
        manifest(
            "ready",
            f"""
command: ["python3", "-c", {script!r}]
ports: [{{name: web, containerPort: {port}}}]
readinessProbe:
  httpGet: {{path: /healthz, port: web, httpHeaders: [{{name: X-Probe, value: "yes"}}]}}
  periodSeconds: 1
  failureThreshold: 1
""",
        ),
    )
    agent = start_agent()

    def ready_state() -> tuple[bool, str]:
        pod = agent.pod("ready")
        assert pod is not None
        st = container_state(pod)
        assert "running" in st["state"]
        cond = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        return st["ready"], cond["Ready"]

    wait_for("ready", lambda: ready_state() == (True, "True"))
    flag.unlink()
    wait_for("not ready", lambda: ready_state() == (False, "False"))
    pod = agent.pod("ready")
    assert pod is not None and container_state(pod)["restartCount"] == 0  # readiness never kills
    flag.touch()
    wait_for("ready again", lambda: ready_state() == (True, "True"))


def test_tcp_startup_probe_gates_liveness(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    server = (
        "import socket, time\n"
        # The port bound at once, so that nothing else takes it meanwhile (a crash on
        # EADDRINUSE restarted the container); connections are refused until it listens.
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {port}))\n"
        "time.sleep(2)\n"
        "s.listen()\n"
        "while True: s.accept()[0].close()\n"
    )
    write_pod(
        manifests,
        "slow",
        manifest(
            "slow",
            f"""
command: ["python3", "-c", {server!r}]
startupProbe:
  tcpSocket: {{port: {port}}}
  periodSeconds: 1
  failureThreshold: 10
livenessProbe:
  tcpSocket: {{port: {port}}}
  periodSeconds: 1
  failureThreshold: 1
""",
        ),
    )
    agent = start_agent()
    early = wait_for(
        "running",
        lambda: (s := container_state(agent.pod("slow"))) and "running" in s["state"] and s,
    )
    assert early["started"] is False and early["ready"] is False
    later = wait_for(
        "started",
        lambda: (s := container_state(agent.pod("slow"))) and s["started"] and s,
        timeout=20,
    )
    assert later["ready"] is True
    time.sleep(2.5)
    # The liveness probe, not run before startup succeeded, never killed it.
    assert container_state(agent.pod("slow"))["restartCount"] == 0


def test_startup_probe_failure_kills(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(
        manifests,
        "never",
        manifest(
            "never",
            f"""
command: ["sleep", "600"]
startupProbe:
  tcpSocket: {{port: {free_port()}}}
  periodSeconds: 1
  failureThreshold: 2
""",
        ),
    )
    agent = start_agent()
    wait_for(
        "killed by startup probe",
        lambda: container_state(agent.pod("never"))["restartCount"] >= 1,
        timeout=30,
    )
    assert any("failed startup probe" in e["message"] for e in agent.events())


def test_post_start_and_pre_stop_hooks(start_agent, manifests: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "journal"
    write_pod(
        manifests,
        "hooks",
        manifest(
            "hooks",
            f"""
command: ["/bin/sh", "-c", "trap '' TERM; echo main >> {journal}; while true; do sleep 0.2; done"]
lifecycle:
  postStart:
    exec: {{command: ["/bin/sh", "-c", "echo post-start >> {journal}"]}}
  preStop:
    exec: {{command: ["/bin/sh", "-c", "echo pre-stop >> {journal}; sleep 1"]}}
""",
            grace=3,
        ),
    )
    agent = start_agent()
    wait_for("post-start ran", lambda: journal.exists() and "post-start" in journal.read_text())
    wait_for("running", lambda: "running" in container_state(agent.pod("hooks"))["state"])
    started = time.monotonic()
    (manifests / "hooks.yaml").unlink()
    wait_for("pre-stop ran", lambda: "pre-stop" in journal.read_text())
    # The container ignores SIGTERM: it is killed when the 3 s grace (preStop included) ends.
    wait_for("gone", lambda: agent.pod("hooks") is None)
    lines = journal.read_text().split()
    assert lines[-1] == "pre-stop" and set(lines) == {"main", "post-start", "pre-stop"}
    assert time.monotonic() - started < 15


def test_failing_post_start_hook_kills_and_restarts(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(
        manifests,
        "badhook",
        manifest(
            "badhook",
            """
command: ["sleep", "600"]
lifecycle:
  postStart:
    exec: {command: ["/bin/sh", "-c", "exit 7"]}
""",
        ),
    )
    agent = start_agent()
    wait_for(
        "restarted after the hook failed",
        lambda: container_state(agent.pod("badhook"))["restartCount"] >= 1,
        timeout=30,
    )
    messages = [e["message"] for e in agent.events() if e["reason"] == "FailedPostStartHook"]
    assert messages and "exited with 7" in messages[0]


GRPC_SERVER = """
import asyncio, sys, time
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

async def main():
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port("0.0.0.0:%d" % int(sys.argv[1]))
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await servicer.set("db", health_pb2.HealthCheckResponse.SERVING)
    await asyncio.sleep(3)
    await servicer.set("db", health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.wait_for_termination()

asyncio.run(main())
"""


def test_grpc_probes(start_agent, manifests: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import json
    import sys

    port = free_port()
    script = tmp_path / "health_server.py"
    script.write_text(GRPC_SERVER)
    command = json.dumps([sys.executable, str(script), str(port)])
    write_pod(
        manifests,
        "grpc",
        manifest(
            "grpc",
            f"""
command: {command}
readinessProbe:
  grpc: {{port: {port}}}
  periodSeconds: 1
livenessProbe:
  grpc: {{port: {port}, service: db}}
  initialDelaySeconds: 1
  periodSeconds: 1
  failureThreshold: 1
""",
        ),
    )
    agent = start_agent()
    wait_for("ready through grpc", lambda: container_state(agent.pod("grpc"))["ready"], timeout=20)
    # "db" turns NOT_SERVING after 3 s: the liveness probe restarts the container.
    wait_for(
        "restarted", lambda: container_state(agent.pod("grpc"))["restartCount"] >= 1, timeout=30
    )
    messages = [e["message"] for e in agent.events() if e["reason"] == "Unhealthy"]
    assert any('service unhealthy (responded with "NOT_SERVING")' in m for m in messages), messages


def test_deleting_a_pod_does_not_wait_for_a_hanging_post_start_hook(
    start_agent, manifests: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "hook-ran"
    tag = str(700_000 + os.getpid() % 100_000)  # a sleep of our own, to find its processes
    write_pod(
        manifests,
        "stuck",
        manifest(
            "stuck",
            f"""
command: ["sleep", "{tag}"]
lifecycle:
  postStart:
    exec: {{command: ["/bin/sh", "-c", "touch {marker}; exec sleep {tag}1"]}}
""",
            grace=30,
        ),
    )
    start_agent()
    wait_for("the hook hanging", marker.exists)
    assert len(processes_with(f"sleep {tag}")) == 2  # the container and its hook
    started = time.monotonic()
    (manifests / "stuck.yaml").unlink()
    # The kill cancels the sync that waits for the hook (it would wait the 30 s grace period),
    # the hook's process included; the container stops at once (sleep ends on SIGTERM).
    wait_for("both stopped", lambda: processes_with(f"sleep {tag}") == [], timeout=25)
    assert time.monotonic() - started < 10
