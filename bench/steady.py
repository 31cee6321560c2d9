"""Steady state: the agent's CPU and RSS with N running pods, and the /pods response time."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentiles
from bench.targets import Target, at_most
from tests.integration.agent import Agent

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(n: int, window: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pykubelet-steady-") as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        for i in range(n):
            doc = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"idle-{i}"},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}
                    ]
                },
            }
            (manifests / f"idle-{i}.json").write_text(json.dumps(doc))
        agent = Agent(
            manifests,
            base / "root",
            base / "agent.log",
            ["--max-pods", str(n + 10), "--file-check-frequency", "20s"],
        )
        agent.start()
        assert agent.proc is not None
        pid = agent.proc.pid
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                pods = agent.pods().values()
                running = sum(
                    1
                    for p in pods
                    for cs in p["status"].get("containerStatuses") or []
                    if "running" in cs["state"]
                )
                if running == n:
                    break
                time.sleep(0.2)
            time.sleep(3)  # let start-up work drain
            cpu_before, wall_before = _cpu_seconds(pid), time.monotonic()
            time.sleep(window)
            cpu = (_cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
            rss = _rss_mib(pid)
            timings = []
            for _ in range(20):
                started = time.perf_counter()
                agent.get("/pods")
                timings.append(time.perf_counter() - started)
        finally:
            agent.stop(signal.SIGTERM, timeout=300)
    return {
        "n": n,
        "window_seconds": window,
        "cpu_fraction_of_a_core": round(cpu, 4),
        "rss_mib": round(rss, 1),
        "pods_endpoint_seconds": percentiles(timings),
    }


# Issue 19: idle cost with 110 pods (the kubelet's default max) and with 1,000.
IDLE_TARGETS = {110: (0.3, 60.0), 1000: (1.5, 90.0)}


def targets(runs: list[dict[str, Any]]) -> list[Target]:
    rows = []
    for r in runs:
        if r["n"] not in IDLE_TARGETS:
            continue
        cpu, rss = IDLE_TARGETS[r["n"]]
        what = f"idle with {r['n']:,} pods"
        window = f"over {r['window_seconds']:.0f} s"
        rows.append(at_most(f"{what}: CPU", 100 * r["cpu_fraction_of_a_core"], cpu, "%", window))
        rows.append(at_most(f"{what}: RSS", r["rss_mib"], rss, "MiB"))
    return rows
