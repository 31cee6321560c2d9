"""Static pods from a manifest directory, end to end: the real agent, real processes or real
containers, real HTTP. Each test that runs pods runs once per runtime (`backend`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.agent import (
    NODE,
    Backend,
    container_state,
    pid_alive,
    pod_yaml,
    processes_with,
    wait_for,
    write_pod,
)


def running(agent, name):  # type: ignore[no-untyped-def]
    pod = agent.pod(name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    state = container_state(pod)
    return pod if "running" in state["state"] else None


def test_pods_start_and_serve_status_and_logs(
    start_agent, manifests: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    write_pod(
        manifests,
        "hello",
        pod_yaml("hello", f"echo hello from $(POD); {backend.forever(False)}").replace(
            "    command:",
            "    env:\n    - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}\n"
            "    command:",
        ),
    )
    write_pod(manifests, "second", pod_yaml("second", f"echo second; {backend.forever(False)}"))
    agent = start_agent(*backend.flags)

    pod = wait_for("hello running", lambda: running(agent, "hello"))
    wait_for("second running", lambda: running(agent, "second"))
    meta = pod["metadata"]
    assert meta["namespace"] == "default"
    assert meta["annotations"]["kubernetes.io/config.source"] == "file"
    assert meta["annotations"]["kubernetes.io/config.hash"] == meta["uid"]
    assert "kubernetes.io/config.seen" in meta["annotations"]
    assert pod["spec"]["nodeName"] == NODE
    state = container_state(pod)
    assert state["name"] == "main" and state["ready"] is True and state["restartCount"] == 0
    assert state["containerID"].startswith(backend.scheme)
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True" and conditions["PodScheduled"] == "True"
    text = wait_for("log", lambda: agent.logs("hello", "main"))
    assert text == f"hello from hello-{NODE}\n"
    assert agent.get("/healthz") == (200, b"ok")
    status, body = agent.get(f"/containerLogs/default/hello-{NODE}/nope")
    assert status == 404 and b"nope" in body


def test_edit_restarts_with_new_spec_and_delete_stops(
    start_agent, manifests: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "app", pod_yaml("app", f"echo v1 $$$$; {backend.forever()}"))
    agent = start_agent(*backend.flags)
    first = wait_for("app running", lambda: running(agent, "app"))
    pid1 = backend.pid_of(agent, "app", 1)
    assert pid_alive(pid1)

    write_pod(manifests, "app", pod_yaml("app", f"echo v2 $$$$; {backend.forever()}"))
    second = wait_for(
        "new pod running",
        lambda: (
            (p := running(agent, "app")) and p["metadata"]["uid"] != first["metadata"]["uid"] and p
        ),
    )
    log = wait_for("v2 log", lambda: agent.logs("app", "main"))
    assert log.startswith("v2 ")
    wait_for("old process gone", lambda: not pid_alive(pid1), timeout=10)
    assert second["status"]["containerStatuses"][0]["restartCount"] == 0

    pid2 = backend.pid_of(agent, "app", 1)
    started = time.monotonic()
    (manifests / "app.yaml").unlink()
    wait_for("pod gone from /pods", lambda: agent.pod("app") is None, timeout=10)
    wait_for("process gone", lambda: not pid_alive(pid2), timeout=10)
    assert time.monotonic() - started < 10


def test_restart_policies(start_agent, manifests: Path, tmp_path: Path, backend: Backend) -> None:  # type: ignore[no-untyped-def]
    marker = backend.scratch(tmp_path) / "failed-once"
    write_pod(
        manifests,
        "onfailure",
        pod_yaml(
            "onfailure",
            f"if [ -e {marker} ]; then echo ok; exit 0; fi; touch {marker}; exit 3",
            restart="OnFailure",
        ),
    )
    write_pod(manifests, "never", pod_yaml("never", "exit 4", restart="Never"))
    write_pod(manifests, "always", pod_yaml("always", "sleep 0.2; exit 0", restart="Always"))
    write_pod(manifests, "farewell", FAREWELL)
    agent = start_agent(*backend.flags)

    done = wait_for(
        "onfailure succeeded",
        lambda: (p := agent.pod("onfailure")) and p["status"]["phase"] == "Succeeded" and p,
    )
    st = container_state(done)
    assert st["restartCount"] == 1
    assert st["state"]["terminated"]["exitCode"] == 0
    assert st["state"]["terminated"]["reason"] == "Completed"
    assert st["lastState"]["terminated"]["exitCode"] == 3

    failed = wait_for(
        "never failed", lambda: (p := agent.pod("never")) and p["status"]["phase"] == "Failed" and p
    )
    st = container_state(failed)
    assert st["restartCount"] == 0
    assert st["state"]["terminated"]["exitCode"] == 4
    assert st["state"]["terminated"]["reason"] == "Error"
    _check_termination_messages(agent, tmp_path, backend)

    # Always restarts even a clean exit (the first restart is immediate, then back-off).
    always = wait_for(
        "always restarted",
        lambda: (p := agent.pod("always")) and container_state(p)["restartCount"] >= 1 and p,
    )
    assert always["status"]["phase"] == "Running"
    time.sleep(1.5)
    assert agent.pod("onfailure")["status"]["phase"] == "Succeeded"  # not restarted again
    assert container_state(agent.pod("never"))["restartCount"] == 0


# terminationMessagePath (what an API server gives every container) and its policy: the file
# the container writes becomes the message; FallbackToLogsOnError without one, the log's tail.
FAREWELL = """\
apiVersion: v1
kind: Pod
metadata: {name: farewell}
spec:
  restartPolicy: Never
  containers:
  - name: bye
    image: busybox:test
    terminationMessagePath: /dev/termination-log
    command: ["/bin/sh", "-c", "printf bye > /dev/termination-log; exit 3"]
  - name: tail
    image: busybox:test
    terminationMessagePath: /dev/termination-log
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["/bin/sh", "-c", "for i in $(seq 100); do echo line $i; done; exit 1"]
"""


def _check_termination_messages(agent, tmp_path: Path, backend: Backend) -> None:  # type: ignore[no-untyped-def]
    def terminated(p: dict[str, Any] | None) -> dict[str, Any] | None:
        if not p or p["status"]["phase"] != "Failed":
            return None
        states = {s["name"]: s["state"]["terminated"] for s in p["status"]["containerStatuses"]}
        # The message is read from the file (or the log) after the exit: the status that shows
        # the exit may come a moment before the one with its message.
        return states if all("message" in st for st in states.values()) else None

    pod = wait_for("farewell failed", lambda: (p := agent.pod("farewell")) and terminated(p) and p)
    states = terminated(pod)
    assert states is not None
    assert states["bye"]["exitCode"] == 3 and states["bye"]["message"] == "bye", states
    # The last 80 lines of the log (at most 2048 bytes).
    tail = "".join(f"line {i}\n" for i in range(21, 101))
    assert states["tail"]["exitCode"] == 1 and states["tail"]["message"] == tail, states
    # Written in the file made for that start, in the kubelet's place.
    files = list((tmp_path / "root" / "pods" / pod["metadata"]["uid"] / "containers").glob("*/*"))
    assert sorted(f.read_bytes() for f in files) == [b"", b"bye"], files
    if backend.name == "process":
        # Its own mount namespace: the node's /dev was not written (at most an empty mount point).
        node = Path("/dev/termination-log")
        assert not node.exists() or node.stat().st_size == 0


def test_crashing_container_backs_off(start_agent, manifests: Path, backend: Backend) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "crash", pod_yaml("crash", "echo boom; exit 1"))
    agent = start_agent(*backend.flags)
    st = wait_for(
        "CrashLoopBackOff",
        lambda: (
            (s := container_state(agent.pod("crash")))
            and s["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff"
            and s
        ),
    )
    assert "back-off 10s" in st["state"]["waiting"]["message"]
    assert st["lastState"]["terminated"]["exitCode"] == 1
    count = st["restartCount"]
    assert count == 1  # first restart immediate, then it waits 10 s
    time.sleep(4)
    assert container_state(agent.pod("crash"))["restartCount"] == count
    wait_for(
        "restart after the back-off",
        lambda: container_state(agent.pod("crash"))["restartCount"] == 2,
        timeout=15,
    )
    reasons = {e["reason"] for e in agent.events()}
    assert "BackOff" in reasons


def test_bad_manifest_reported_others_keep_running(
    start_agent, manifests: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "good", pod_yaml("good", f"echo $$$$; {backend.forever()}"))
    (manifests / "broken.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken}\nspec:\n"
        "  containers:\n  - image: busybox\n    command: [sleep, '1']\n"
    )
    (manifests / "notes.txt").write_text("not a manifest")
    (manifests / "good.yaml~").write_text(pod_yaml("backup", "sleep 600"))
    (manifests / ".hidden.yaml").write_text(pod_yaml("hidden", "sleep 600"))
    agent = start_agent(*backend.flags)
    wait_for("good running", lambda: running(agent, "good"))

    def broken_reported() -> list[str]:
        return [
            e["message"]
            for e in agent.events()
            if e["reason"] == "FailedValidation" and "broken.yaml" in e["message"]
        ]

    messages = wait_for("bad file reported", broken_reported)
    assert any("spec.containers[0].name: required" in m for m in messages), messages
    assert set(agent.pods()) == {f"good-{NODE}"}

    # A good manifest that turns bad keeps its running pod (the kubelet would kill it).
    pid = backend.pid_of(agent, "good")
    container_id = container_state(agent.pod("good"))["containerID"]
    (manifests / "good.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: good\n")
    wait_for(
        "turned-bad reported",
        lambda: any(
            "good.yaml" in e["message"] and "keeps running" in e["message"] for e in agent.events()
        ),
    )
    time.sleep(0.5)
    assert running(agent, "good") and pid_alive(pid)
    assert backend.pid_of(agent, "good") == pid
    assert container_state(agent.pod("good"))["containerID"] == container_id


def test_agent_sigkill_then_restart_adopts_running_pods(
    start_agent, manifests: Path, tmp_path: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    marker = f"adopt-marker-{os.getpid()}"
    # No exec: the shell, whose command line carries the marker, is the container's process
    # (a container's processes are host processes too, seen from here).
    write_pod(
        manifests, "keep", pod_yaml("keep", f"echo $$$$; {backend.forever(False)}; : {marker}")
    )
    agent = start_agent(*backend.flags)
    pod = wait_for("keep running", lambda: running(agent, "keep"))
    pid = backend.pid_of(agent, "keep")
    # An engine reports the container running while its process may still be the runtime's
    # init, a moment before it execs the shell that carries the marker.
    wait_for("the container's shell", lambda: processes_with(marker) == [pid], timeout=10)

    agent.stop(signal.SIGKILL)
    assert pid_alive(pid), "pods keep running when the agent dies"
    again = start_agent(*backend.flags)
    adopted = wait_for("pod adopted", lambda: running(again, "keep"))
    assert adopted["metadata"]["uid"] == pod["metadata"]["uid"]
    st = container_state(adopted)
    assert st["restartCount"] == 0
    assert st["containerID"] == container_state(pod)["containerID"]
    time.sleep(2.5)  # a sync tick and a housekeeping pass: nothing may start twice
    assert processes_with(marker) == [pid]

    again.stop(signal.SIGTERM)
    wait_for("pod stopped with the agent", lambda: not pid_alive(pid), timeout=10)


def test_removed_while_agent_down_is_cleaned_up(
    start_agent, manifests: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "gone", pod_yaml("gone", f"echo $$$$; {backend.forever()}"))
    agent = start_agent(*backend.flags)
    wait_for("running", lambda: running(agent, "gone"))
    pid = backend.pid_of(agent, "gone")
    agent.stop(signal.SIGKILL)
    (manifests / "gone.yaml").unlink()
    start_agent(*backend.flags)
    wait_for("orphan killed by housekeeping", lambda: not pid_alive(pid), timeout=15)
    if backend.engine is not None:
        engine = backend.engine
        wait_for("orphan removed, infra too", lambda: not engine.pod_containers("gone"))


def test_only_one_pod_per_name_runs_at_a_time(
    start_agent, manifests: Path, tmp_path: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    journal = backend.journal(tmp_path)
    slow_stop = (
        f'trap "{journal.append("stop-$(V)")}; sleep 1; {journal.append("stopped-$(V)")}; '
        'exit 0" TERM; '
        f"{journal.append('start-$(V)')}; while true; do sleep 0.1; done"
    )
    spec = pod_yaml("one", slow_stop, grace=10).replace(
        "    command:", "    env: [{name: V, value: '%s'}]\n    command:"
    )
    write_pod(manifests, "one", spec % "1")
    agent = start_agent(*backend.flags)
    wait_for("v1 running", lambda: "start-1" in journal.lines())
    write_pod(manifests, "one", spec % "2")
    wait_for("v2 started", lambda: "start-2" in journal.lines(), timeout=15)
    lines = journal.lines()
    assert lines == ["start-1", "stop-1", "stopped-1", "start-2"], lines
    wait_for("v2 running", lambda: running(agent, "one"))


def test_sigterm_stops_pods_and_exits_zero(start_agent, manifests: Path, backend: Backend) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "svc", pod_yaml("svc", f"echo $$$$; {backend.forever()}"))
    agent = start_agent(*backend.flags)
    wait_for("running", lambda: running(agent, "svc"))
    pid = backend.pid_of(agent, "svc")
    assert agent.stop(signal.SIGTERM, timeout=30) == 0
    assert not pid_alive(pid)


def test_bad_flag_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, needle in (
        (["--file-check-frequency", "soon"], "invalid duration 'soon'"),
        (["--read-only-port", "70000"], "invalid port"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "pykubelet", *args], capture_output=True, text=True, timeout=30
        )
        assert proc.returncode == 2, proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_pods_endpoint_is_a_pod_list(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    agent = start_agent()
    status, body = agent.get("/pods")
    assert status == 200
    doc = json.loads(body)
    assert doc["kind"] == "PodList" and doc["apiVersion"] == "v1" and doc["items"] == []
