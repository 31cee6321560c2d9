"""Metrics, events, the CLI and the config file, against the real agent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.agent import NODE, Agent, container_state, pod_yaml, wait_for, write_pod


def scrape(agent: Agent) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = agent.get("/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def ctl(agent: Agent, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pykubelet", *args, "--server", agent.url],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_metrics_move_as_pods_start_crash_and_stop(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    agent = start_agent()
    before = scrape(agent)
    assert value(before, "kubelet_running_pods") == 0
    write_pod(manifests, "steady", pod_yaml("steady", "sleep 600"))
    write_pod(manifests, "crashy", pod_yaml("crashy", "exit 1"))

    def started() -> dict | None:  # type: ignore[type-arg]
        s = scrape(agent)
        return s if value(s, "kubelet_running_pods") == 1 else None

    samples = wait_for("one running pod", started)
    assert value(samples, "kubelet_running_containers", container_state="running") == 1
    assert value(samples, "kubelet_pod_start_duration_seconds_count") >= 1
    assert value(samples, "kubelet_runtime_operations_total", operation_type="start_container") >= 2
    assert value(samples, "pykubelet_source_updates_total", source="file") >= 2
    assert value(samples, "pykubelet_config_operations_total", op="ADD") >= 2
    assert value(samples, "kubelet_pleg_relist_duration_seconds_count") >= 1
    assert (
        value(
            samples,
            "kubelet_http_requests_total",
            method="GET",
            path="/metrics",
            server_type="readonly",
            code="200",
        )
        >= 1
    )
    assert value(samples, "kubelet_pod_worker_duration_seconds_count", operation_type="create") >= 2

    (manifests / "steady.yaml").unlink()
    (manifests / "crashy.yaml").unlink()
    after = wait_for(
        "no running pod",
        lambda: (s := scrape(agent)) and value(s, "kubelet_running_pods") == 0 and s,
    )
    assert value(after, "kubelet_pod_worker_duration_seconds_count", operation_type="kill") >= 2
    assert value(after, "pykubelet_config_operations_total", op="REMOVE") >= 2


def test_cli_get_describe_logs(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "web", pod_yaml("web", "echo line1; echo line2; sleep 600"))
    write_pod(manifests, "crash", pod_yaml("crash", "exit 2"))
    agent = start_agent()
    wait_for("web running", lambda: "running" in container_state(agent.pod("web"))["state"])
    wait_for("crash backing off", lambda: container_state(agent.pod("crash"))["restartCount"] >= 1)

    out = ctl(agent, "get", "pods")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[f"web-{NODE}"][1:3] == ["1/1", "Running"]
    assert rows[f"crash-{NODE}"][1] == "0/1"
    assert rows[f"crash-{NODE}"][2] in {"CrashLoopBackOff", "Error", "Running"}

    wide = ctl(agent, "get", "pods", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-2:] == ["IP", "NODE"] and wide[1].split()[-1] == NODE
    doc = json.loads(ctl(agent, "get", "pods", "-o", "json").stdout)
    assert doc["kind"] == "List" and len(doc["items"]) == 2
    assert "apiVersion: v1" in ctl(agent, "get", "pod", "web", "-o", "yaml").stdout

    described = ctl(agent, "describe", "pod", "web")  # the manifest's name works too
    assert described.returncode == 0, described.stderr
    text = described.stdout
    assert f"Name:         web-{NODE}" in text and "State:         Running" in text
    assert "Started container main" in text  # its events

    logs = ctl(agent, "logs", "web")
    assert logs.stdout == "line1\nline2\n"
    assert ctl(agent, "logs", f"web-{NODE}", "-c", "main", "--tail", "1").stdout == "line2\n"
    # The process runtime's log has no time per line: --since keeps all of it or none of it.
    assert ctl(agent, "logs", "web", "--since", "1h").stdout == "line1\nline2\n"
    long_ago = ctl(agent, "logs", "web", "--since-time", "2000-01-01T00:00:00Z")
    assert long_ago.stdout == "line1\nline2\n", long_ago.stderr
    stamped = ctl(agent, "logs", "web", "--timestamps")
    assert stamped.returncode == 1 and "timestamps: this runtime's log" in stamped.stderr
    both = ctl(agent, "logs", "web", "--since", "1h", "--since-time", "2000-01-01T00:00:00Z")
    assert both.returncode == 1 and "at most one of `sinceTime` or `sinceSeconds`" in both.stderr

    missing = ctl(agent, "logs", "nope")
    assert missing.returncode == 1 and 'pod "nope" not found' in missing.stderr


def test_cli_logs_follow_streams_until_exit(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(
        manifests,
        "ticker",
        pod_yaml("ticker", "for i in 1 2 3 4; do echo tick $$i; sleep 0.5; done", restart="Never"),
    )
    agent = start_agent()
    wait_for("ticker listed", lambda: agent.pod("ticker") and container_state(agent.pod("ticker")))
    started = time.monotonic()
    out = ctl(agent, "logs", "ticker", "-f")
    assert out.stdout.split("\n")[:4] == ["tick 1", "tick 2", "tick 3", "tick 4"], out
    assert time.monotonic() - started < 15


def test_cli_cannot_reach_agent() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pykubelet", "get", "pods", "--server", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert "cannot reach the agent at http://127.0.0.1:9" in proc.stderr


def test_config_file_and_flags_override(start_agent, manifests: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    other = tmp_path / "from-config"
    other.mkdir()
    write_pod(other, "configured", pod_yaml("configured", "sleep 600"))
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"
        f"staticPodPath: {other}\nreadOnlyPort: 1\nmaxPods: 1\n"
        "logging: {format: json}\n"
    )
    # --pod-manifest-path and --read-only-port from the harness win over the file.
    write_pod(manifests, "first", pod_yaml("first", "sleep 600"))
    write_pod(manifests, "second", pod_yaml("second", "sleep 600"))
    agent = start_agent("--config", str(config))
    pods = wait_for("both listed", lambda: len(agent.pods()) == 2 and agent.pods())
    assert set(pods) == {f"first-{NODE}", f"second-{NODE}"}
    # maxPods: 1 from the file: the second is rejected, as the kubelet's admission does.
    rejected = wait_for(
        "one rejected",
        lambda: [p for p in agent.pods().values() if p["status"].get("reason") == "OutOfpods"],
    )
    assert len(rejected) == 1 and rejected[0]["status"]["phase"] == "Failed"
    assert "capacity: 1" in rejected[0]["status"]["message"]
    # The JSON log format from the file: every line is a JSON object.
    log_lines = [line for line in agent.log().splitlines() if line.strip()]
    assert log_lines and all(json.loads(line)["msg"] for line in log_lines)
    event_lines = [json.loads(line) for line in log_lines if "OutOfpods" in line]
    assert event_lines and event_lines[0]["reason"] == "OutOfpods"


def test_bad_config_file_names_field(tmp_path: Path) -> None:
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"
        "staticPodPaht: /etc/pods\nsyncFrequency: soon\nserializeImagePulls: false\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pykubelet", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.count("\n") == 0
    assert f"{config}: staticPodPaht: unknown field" in err
    assert f"{config}: syncFrequency: invalid duration 'soon'" in err
    assert f"{config}: serializeImagePulls: not supported by pykubelet yet" in err


def test_relative_paths_as_make_run_passes_them(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    write_pod(tmp_path / "m", "rel", pod_yaml("rel", "echo in $$(pwd); sleep 600"))
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pykubelet",
                "--pod-manifest-path",
                "m",
                "--root-dir",
                "r",
                "--read-only-port",
                "0",
                "--node-name",
                NODE,
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=out,
        )
    try:
        agent = Agent(tmp_path / "m", tmp_path / "r", log, [])
        agent.proc = proc
        match = wait_for(
            "URL", lambda: re.search(r"read-only API at (http://\S+)", log.read_text())
        )
        agent.url = match.group(1)
        wait_for("running", lambda: "running" in container_state(agent.pod("rel"))["state"])
        assert agent.logs("rel", "main").startswith(f"in {tmp_path}/r/")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
