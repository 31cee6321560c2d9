"""Resource limits through the real agent, per runtime: a memory hog is OOMKilled, and a fork
loop stops at --pod-max-pids while the agent and the other pods carry on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration.agent import (
    Backend,
    container_state,
    pod_yaml,
    processes_with,
    wait_for,
    write_pod,
)

RUN = f"{os.getpid() % 1000:03d}"
# The agent is our child: its cpu cgroup (v1, on these machines) is ours.
_OWN_CPU = next(
    line.split(":", 2)[2]
    for line in Path("/proc/self/cgroup").read_text().splitlines()
    if "cpu" in line.split(":")[1].split(",") or line.startswith("0::")
)
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu") / _OWN_CPU.lstrip("/") / "pykubelet"


def _terminated(agent, name: str) -> dict | None:  # type: ignore[no-untyped-def,type-arg]
    pod = agent.pod(name)
    if pod is None or not pod["status"].get("containerStatuses"):
        return None
    return container_state(pod)["state"].get("terminated")  # type: ignore[no-any-return]


def test_memory_limit_is_enforced_and_reported_as_oomkilled(
    start_agent, manifests: Path, backend: Backend
) -> None:  # type: ignore[no-untyped-def]
    # dd allocates its 200 MB block at once and fills it: the kernel kills it at the limit. A
    # second's sleep first: containerd 1.6 drops an OOM that comes before StartContainer
    # returned (containerd#8180), and the container stays an Error for good.
    write_pod(
        manifests,
        "hog",
        pod_yaml(
            "hog", "sleep 1; exec dd if=/dev/zero of=/dev/null bs=200M count=1", restart="Never"
        )
        + "    resources: {limits: {memory: 32Mi, cpu: 500m}}\n",
    )
    write_pod(manifests, "calm", pod_yaml("calm", backend.forever()))
    agent = start_agent(*backend.flags)
    terminated = wait_for("hog to be OOM-killed", lambda: _terminated(agent, "hog"), timeout=60)
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137), terminated
    pod = agent.pod("hog")
    assert pod is not None and pod["status"]["phase"] == "Failed"
    # The neighbour runs: started beside the hog, not necessarily before the hog was killed.
    wait_for(
        "the calm pod running",
        lambda: (p := agent.pod("calm")) is not None and "running" in container_state(p)["state"],
    )
    assert agent.get("/healthz") == (200, b"ok")


def test_pod_max_pids_bounds_a_fork_bomb(start_agent, manifests: Path, backend: Backend) -> None:  # type: ignore[no-untyped-def]
    marker = f"90.{RUN}4242"  # a distinct `sleep` argument, to count the bomb's processes
    # Bounded even if the limit did not hold: at most 200 sleeps, each over within 90 s.
    bomb = (
        f"i=0; while [ $i -lt 200 ]; do i=$((i+1)); sleep {marker} & done; "
        "echo all-200-started; wait"
    )
    write_pod(manifests, "bomb", pod_yaml("bomb", bomb, restart="Never", grace=2))
    write_pod(
        manifests,
        "calm",
        pod_yaml("calm", backend.forever()) + "    resources: {requests: {cpu: 100m}}\n",
    )
    if backend.name == "remote":
        # The CRI has no pids limit: the agent says so instead of running the bomb unbounded.
        with pytest.raises(AssertionError, match="--pod-max-pids: not supported with"):
            start_agent(*backend.flags, "--pod-max-pids", "20")
        return
    agent = start_agent(*backend.flags, "--pod-max-pids", "20")
    seen = 0
    deadline = time.monotonic() + 60
    while _terminated(agent, "bomb") is None:
        seen = max(seen, len(processes_with(marker)))
        assert time.monotonic() < deadline, "the bomb never ended"
        time.sleep(0.05)
    terminated = _terminated(agent, "bomb")
    assert terminated is not None and terminated["exitCode"] != 0, terminated
    log = agent.logs("bomb", "main")
    assert "all-200-started" not in log and "fork" in log.lower(), log
    # The bomb's shell and its children (a forked shell until it execs sleep) all carry the
    # marker: 20 of them at once is the limit reached, not passed.
    assert seen <= 20, f"{seen} of the bomb's processes ran at once under a limit of 20 pids"
    wait_for("the bomb's sleeps to be gone", lambda: not processes_with(marker))
    # The neighbour runs: started beside the bomb, not necessarily before the bomb ended.
    calm = wait_for(
        "the calm pod running",
        lambda: (
            (p := agent.pod("calm")) is not None and "running" in container_state(p)["state"] and p
        ),
    )
    assert agent.get("/healthz") == (200, b"ok")
    if backend.engine is None:  # the request reached the container's cgroup (kubelet's shares)
        cid = container_state(calm)["containerID"].removeprefix("process://")
        # A cpu request alone: Burstable, below kubepods/burstable as the kubelet lays it out.
        pod_dir = CPU_CGROUPS / "kubepods" / "burstable" / f"pod{calm['metadata']['uid']}"
        shares = pod_dir / cid / "cpu.shares"
        assert shares.read_text().strip() == "102"
