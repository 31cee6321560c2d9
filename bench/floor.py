"""The floor: the least any manifest-to-process agent does, timed as the agent is (issue 19).

A bare loop in its own process: every 5 ms it lists the manifest directory, parses each new
file with PyYAML's C loader (the bench manifests are JSON, which YAML reads) and spawns its
first container's command (os.posix_spawnp). No validation, no state, no status, no asyncio.
The manifests and their writer are bench/latency.py's, so the agent's start figures divided by
these are what pykubelet costs beyond the floor.

python -m bench.floor DIR   the loop itself (run() starts it): prints "ready", then per
                            spawned manifest "NAME PID WALLTIME"; SIGTERM kills and reaps
                            its processes, then it exits.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from bench import cpucost, quietdisk
from bench.latency import Scenario, write_manifests
from bench.stats import median_item, percentiles, runs_range
from bench.targets import Target, at_most

SCAN_SECONDS = 0.005
SUFFIXES = (".json", ".yaml", ".yml")


def loop(directory: Path) -> None:
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    devnull = os.open(os.devnull, os.O_RDWR)
    # The children must not hold the pipe to the bench open, nor read its terminal.
    quiet = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
    seen: set[str] = set()
    children: list[int] = []
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    while not stopping:
        lines = []
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if name in seen or name.startswith(".") or not name.endswith(SUFFIXES):
                    continue
                seen.add(name)
                with open(entry.path, "rb") as f:
                    doc = yaml.load(f.read(), Loader=yaml.CSafeLoader)
                command = doc["spec"]["containers"][0]["command"]
                pid = os.posix_spawnp(command[0], command, os.environ, file_actions=quiet)
                children.append(pid)
                lines.append(f"{name} {pid} {time.time():.6f}\n")
        if lines:
            out.write("".join(lines))
            out.flush()
        time.sleep(SCAN_SECONDS)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        os.waitpid(pid, 0)


def run(n: int, timeout: float = 60.0, keep: bool = False) -> dict[str, Any]:
    """n manifests written at once to a directory the floor loop scans: write → spawned.
    `keep`: its files stay until `quietdisk.remove_deferred()` (not deleted before the agent's
    burst that follows)."""
    with quietdisk.scratch("pykubelet-floor-", defer=keep) as tmp:
        manifests = tmp / "manifests"
        manifests.mkdir()
        # Not the agent's run id: its processes are never mistaken for the floor's.
        scenario = Scenario(n, str((os.getpid() + 500) % 1000).zfill(3))
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.floor", str(manifests)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its group: the cleanup's last resort kills them all
        )
        assert proc.stdout is not None
        spawned: dict[int, float] = {}
        all_spawned = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                name, _, at = line.split()
                spawned[int(name.removeprefix("bench-").removesuffix(".json"))] = float(at)
                if len(spawned) == n:
                    all_spawned.set()

        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the floor loop exited with {proc.wait()}")
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            with cpucost.window(proc.pid) as cpu:
                written = write_manifests(manifests, scenario, 1)
                if not all_spawned.wait(timeout):
                    raise RuntimeError(f"the floor spawned {len(spawned)} of {n} in {timeout}s")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    start = [spawned[i] - written[i] for i in range(n)]
    return {
        "n": n,
        "start": percentiles(start),
        "all_running_seconds": round(max(spawned.values()) - min(written.values()), 3),
        "cpu": cpu.until(max(spawned.values())),
    }


def ratios(agent: dict[str, Any], floor: dict[str, Any]) -> dict[str, float]:
    """The agent's start figures over the floor's, both by when the process started."""
    start = agent["start"]
    return {
        "p50_start": _ratio(start["agent_observed"]["p50"], floor["start"]["p50"]),
        "p99_start": _ratio(start["agent_observed"]["p99"], floor["start"]["p99"]),
        "all_running": _ratio(
            start["all_running_agent_observed_seconds"], floor["all_running_seconds"]
        ),
    }


def pair(agent: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """One floor run and the agent's run just after it: both start figures and their ratios."""
    return {"floor": floor, "start": agent["start"], "ratio_to_floor": ratios(agent, floor)}


def median_ratios(pairs: list[dict[str, Any]]) -> dict[str, float]:
    """Each ratio's median over the pairs (each pair's ratio taken within its own minutes)."""
    return {
        key: statistics.median(p["ratio_to_floor"][key] for p in pairs)
        for key in pairs[0]["ratio_to_floor"]
    }


def _median_pair(r: dict[str, Any], key: str) -> dict[str, Any]:
    """The pair whose `key` ratio is the median."""
    return median_item(r.get("pairs") or [r], lambda p: float(p["ratio_to_floor"][key]))


def _spread(r: dict[str, Any], key: str) -> str:
    spread = runs_range([p["ratio_to_floor"][key] for p in r.get("pairs") or []], "x")
    return f"; {spread}" if spread else ""


def _ratio(ours: float, floor: float) -> float:
    return round(ours / floor, 2) if floor > 0 else math.nan


def targets(latency_runs: list[dict[str, Any]]) -> list[Target]:
    """Issue 19's process-runtime start targets, from latency runs carrying their floor."""
    rows = []
    by_n = {r["n"]: r for r in latency_runs if "floor" in r}
    if 100 in by_n:
        r = by_n[100]
        m = _median_pair(r, "p99_start")
        rows.append(
            at_most(
                "process runtime, 100 manifests: p99 start / floor",
                r["ratio_to_floor"]["p99_start"],
                1.3,
                "x",
                f"{m['start']['agent_observed']['p99']:.3f} s / {m['floor']['start']['p99']:.3f} s"
                + _spread(r, "p99_start"),
            )
        )
    if 1000 in by_n:
        r = by_n[1000]
        m = _median_pair(r, "all_running")
        seconds: list[float] = [
            p["start"]["all_running_agent_observed_seconds"] for p in r.get("pairs") or [r]
        ]
        ours = statistics.median(seconds)
        rows.append(
            at_most(
                "process runtime, 1,000 manifests: all running",
                ours,
                1.5,
                "s",
                f"median of {len(seconds)}" if len(seconds) > 1 else "",
            )
        )
        mine = m["start"]["all_running_agent_observed_seconds"]
        rows.append(
            at_most(
                "process runtime, 1,000 manifests: all running / floor",
                r["ratio_to_floor"]["all_running"],
                1.3,
                "x",
                f"{mine:.3f} s / {m['floor']['all_running_seconds']:.3f} s"
                + _spread(r, "all_running"),
            )
        )
    return rows


if __name__ == "__main__":
    loop(Path(sys.argv[1]))
