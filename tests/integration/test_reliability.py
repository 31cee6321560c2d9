"""Crash safety: SIGKILL the agent in the middle of churn; the next one converges."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import (
    NODE,
    Agent,
    container_state,
    pid_alive,
    processes_with,
    wait_for,
)

RUN = f"{os.getpid() % 1000:03d}"


def marker(index: int, version: int) -> str:
    # A distinct `sleep` argument per pod and version, to count processes in /proc.
    return f"9999.{RUN}{index:03d}{version:03d}"


def write(manifests: Path, index: int, version: int, launched: str = "") -> None:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"churn-{index}"},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {"name": "main", "image": "busybox", "command": ["sleep", marker(index, version)]}
            ],
        },
    }
    if launched == "forked":
        # Another group: the container starts through the launcher, forked by the launch
        # server, which dies with each SIGKILLed agent while its children run on.
        doc["spec"]["securityContext"] = {"supplementalGroups": [4321]}
    elif launched == "spawned":
        # A volume alone: the launch server spawns the container into a namespace it made.
        doc["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        doc["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/s"}]
    tmp = manifests / f".churn-{index}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, manifests / f"churn-{index}.json")


def sleeps() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for pid in processes_with(f"9999.{RUN}"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"sleep":
            found.setdefault(argv[1].decode(), []).append(pid)
    return found


@pytest.mark.parametrize(
    ("crashes", "launched"),
    [
        pytest.param(6, "", id="6"),
        pytest.param(4, "forked", id="4-launched"),
        pytest.param(4, "spawned", id="4-spawned"),
        pytest.param(60, "", marks=pytest.mark.soak, id="soak"),
        pytest.param(60, "forked", marks=pytest.mark.soak, id="soak-launched"),
    ],
)
def test_sigkill_during_churn_converges(
    start_agent, manifests: Path, crashes: int, launched: str
) -> None:  # type: ignore[no-untyped-def]
    seed = int(os.environ.get("CHURN_SEED", time.time()))
    rng = random.Random(seed)
    print(f"churn seed {seed} (CHURN_SEED={seed} repeats it)")
    desired: dict[int, int] = {}  # pod index -> version
    untouched = {0, 1}  # never edited nor deleted: they must survive every crash as they are
    for i in (0, 1):
        write(manifests, i, 0, launched)
        desired[i] = 0
    agent: Agent = start_agent()
    agents = [agent]
    first = wait_for("initial pods", lambda: len(_running(agent)) == 2 and _running(agent))
    first_ids = {name: container_state(pod)["containerID"] for name, pod in first.items()}
    if launched and agent.proc is not None:
        assert launch_servers({agent.proc.pid}), "the first pods were started by no launch server"

    for _ in range(crashes):
        for _ in range(rng.randint(2, 6)):
            i = rng.randint(2, 9)
            op = rng.choice(["write", "write", "delete"])
            if op == "write":
                desired[i] = desired.get(i, -1) + 1
                write(manifests, i, desired[i], launched)
            elif i in desired:
                (manifests / f"churn-{i}.json").unlink()
                del desired[i]
        time.sleep(rng.uniform(0.0, 0.6))
        agent.stop(signal.SIGKILL)
        agent = start_agent()
        agents.append(agent)

    expected = {marker(i, v) for i, v in desired.items()}

    state: dict[str, object] = {}

    def converged() -> bool:
        # What differs is kept for the failure message.
        running = set(_running(agent))
        wanted = {f"churn-{i}-{NODE}" for i in desired}
        counts = {k: len(v) for k, v in sleeps().items()}
        state.update(
            missing=wanted - running,
            unwanted=running - wanted,
            processes={k: n for k, n in counts.items() if n != 1 or k not in expected},
            not_running=expected - set(counts),
        )
        return running == wanted and counts == dict.fromkeys(expected, 1)

    try:
        wait_for("convergence: each desired pod runs exactly once", converged, timeout=40)
    except AssertionError as e:
        raise AssertionError(f"{e}; differences: {state}") from None
    final = _running(agent)
    for i in untouched:
        name = f"churn-{i}-{NODE}"
        state = container_state(final[name])
        assert state["restartCount"] == 0, state
        assert state["containerID"] == first_ids[name], "an untouched pod was restarted"
    time.sleep(2.5)  # a housekeeping pass later, still exactly once
    assert {k: len(v) for k, v in sleeps().items()} == dict.fromkeys(expected, 1)

    agent.stop(signal.SIGTERM)
    assert sleeps() == {}, "no process may outlive a clean stop"
    assert launch_servers({a.proc.pid for a in agents if a.proc is not None}) == [], (
        "a launch server outlived its agent"
    )


def launch_servers(agent_pids: set[int]) -> list[int]:
    """The launch servers (`launchserver_main.py FD AGENT_PID [PODS_DIR]`) of those agents still
    alive."""
    wanted = {str(pid) for pid in agent_pids}
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        args = [a.decode(errors="replace") for a in argv]
        i = next((i for i, a in enumerate(args) if a.endswith("/launchserver_main.py")), None)
        # The script, then its socket's fd, then the agent's pid.
        if i is not None and len(args) > i + 2 and args[i + 2] in wanted:
            found.append(int(entry))
    return found


def _running(agent: Agent) -> dict[str, dict]:  # type: ignore[type-arg]
    out = {}
    for name, pod in agent.pods().items():
        statuses = pod["status"].get("containerStatuses") or []
        if statuses and "running" in statuses[0]["state"]:
            out[name] = pod
    return out


def test_corrupt_state_file_is_reported_and_rebuilt(
    start_agent, manifests: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    write(manifests, 50, 0)
    agent = start_agent()
    wait_for("running", lambda: _running(agent))
    old = sleeps()[marker(50, 0)]
    agent.stop(signal.SIGKILL)
    states = [p for p in (tmp_path / "root").rglob("*.json") if p.name != "sandbox.json"]
    assert states
    for path in states:
        path.write_text("{not json")
    agent = start_agent()
    # The state is unreadable: the process it described is found by the ID in its
    # environment and killed, and the pod started again: it never runs twice.
    wait_for("running again", lambda: _running(agent), timeout=20)
    wait_for("the old process killed", lambda: not pid_alive(old[0]), timeout=10)
    time.sleep(2.5)
    running = sleeps()
    assert list(running) == [marker(50, 0)] and len(running[marker(50, 0)]) == 1, running
    assert "corrupt" in agent.log()


def test_second_signal_exits_at_once_and_pods_are_adopted(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stubborn"},
        "spec": {
            "terminationGracePeriodSeconds": 60,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    # Ignores SIGTERM: a clean stop would wait its whole minute.
                    "command": ["/bin/sh", "-c", f"trap '' TERM; sleep {marker(60, 0)}; : x"],
                }
            ],
        },
    }
    (manifests / "stubborn.json").write_text(json.dumps(doc))
    agent = start_agent()
    wait_for("running", lambda: _running(agent) and sleeps().get(marker(60, 0)))
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    started = time.monotonic()
    assert agent.stop(signal.SIGTERM, timeout=10) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5
    assert sleeps().get(marker(60, 0)), "the pod keeps running"
    again = start_agent()
    wait_for("adopted", lambda: _running(again))
    assert len(sleeps()[marker(60, 0)]) == 1
    again.stop(signal.SIGKILL)  # leave the minute-long stop to the cleanup below
    for pid in sleeps().get(marker(60, 0), []):
        os.kill(pid, signal.SIGKILL)
