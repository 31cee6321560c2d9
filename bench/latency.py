"""Manifest → running, edit → restarted, delete → gone: per-pod latencies with the real agent."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.stats import percentiles
from tests.integration.agent import Agent


@dataclass
class Scenario:
    n: int
    run_id: str
    image: str = "busybox"
    # In a container the command is PID 1, which ignores SIGTERM unless it handles it.
    handles_term: bool = False

    def marker(self, i: int) -> str:
        # GNU sleep takes a fraction: every pod gets its own command line to look for in /proc.
        return f"3600.{self.run_id}{i:05d}"

    def command(self, i: int) -> list[str]:
        if self.handles_term:
            return ["/bin/sh", "-c", f"trap 'exit 0' TERM; sleep {self.marker(i)} & wait"]
        return ["sleep", self.marker(i)]

    def manifest(self, i: int, version: int) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"bench-{i}"},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "main",
                            "image": self.image,
                            "command": self.command(i),
                            "env": [{"name": "VERSION", "value": str(version)}],
                        }
                    ],
                },
            }
        )


def _started_at(pod: dict[str, Any]) -> float | None:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        running = cs.get("state", {}).get("running")
        if running and running.get("startedAt"):
            return datetime.fromisoformat(running["startedAt"].replace("Z", "+00:00")).timestamp()
    return None


def _wait_running(
    agent: Agent, n: int, written: dict[int, float], uids_before: dict[str, str], timeout: float
) -> tuple[list[float], list[float], float]:
    """Per pod: (startedAt - write) as the agent recorded it, and first poll seeing it running."""
    agent_seen: dict[int, float] = {}
    polled: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(agent_seen) < n and time.monotonic() < deadline:
        pods = agent.pods()
        now = time.time()  # after the answer: what a client polling /pods would see, and when
        for name, pod in pods.items():
            i = int(name.split("-")[1])
            if i in agent_seen or uids_before.get(name) == pod["metadata"]["uid"]:
                continue
            started = _started_at(pod)
            if started is not None:
                agent_seen[i] = started - written[i]
                polled[i] = now - written[i]
        time.sleep(0.05)
    if len(agent_seen) < n:
        raise RuntimeError(f"only {len(agent_seen)} of {n} pods running after {timeout}s")
    total = max(written[i] + polled[i] for i in polled) - min(written.values())
    return list(agent_seen.values()), list(polled.values()), total


def _wait_running_one(
    agent: Agent, written: dict[int, float], uids_before: dict[str, str], timeout: float
) -> tuple[float, float, float]:
    deadline = time.monotonic() + timeout
    name = "bench-0-testnode"
    # The agent records when the container started; polling /pods of n pods hard would only
    # slow the agent down while it works.
    time.sleep(0.5)
    while time.monotonic() < deadline:
        pod = agent.pod("bench-0")
        if pod is not None and pod["metadata"]["uid"] != uids_before.get(name):
            started = _started_at(pod)
            if started is not None:
                return started - written[0], time.time() - written[0], 0.0
        time.sleep(0.2)
    raise RuntimeError(f"bench-0 did not restart within {timeout}s")


def _pids_by_marker(markers: dict[str, int]) -> dict[int, int]:
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if len(cmd) >= 2 and cmd[0] == b"sleep" and state != "Z":
            i = markers.get(cmd[1].decode(errors="replace"))
            if i is not None:
                found[i] = int(entry)
    return found


def run(
    n: int,
    extra: list[str] | None = None,
    timeout: float = 120.0,
    on_start: Callable[[Agent], None] | None = None,
    image: str = "busybox",
    handles_term: bool = False,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pykubelet-bench-") as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        scenario = Scenario(n, str(os.getpid() % 1000).zfill(3), image, handles_term)
        agent = Agent(
            manifests,
            base / "root",
            base / "agent.log",
            ["--max-pods", str(n + 10), *(extra or [])],
        )
        agent.start()
        if on_start is not None:
            on_start(agent)
        try:
            written: dict[int, float] = {}
            for i in range(n):
                path = manifests / f"bench-{i}.json"
                tmp_path = manifests / f".bench-{i}.tmp"
                tmp_path.write_text(scenario.manifest(i, 1))
                os.replace(tmp_path, path)
                written[i] = time.time()
            start_agent, start_poll, start_total = _wait_running(agent, n, written, {}, timeout)

            before = {name: p["metadata"]["uid"] for name, p in agent.pods().items()}
            edited: dict[int, float] = {}
            for i in range(n):
                tmp_path = manifests / f".bench-{i}.tmp"
                tmp_path.write_text(scenario.manifest(i, 2))
                os.replace(tmp_path, manifests / f"bench-{i}.json")
                edited[i] = time.time()
            edit_agent, edit_poll, edit_total = _wait_running(agent, n, edited, before, timeout)

            # One manifest of n changes: how soon does its pod run the new spec?
            before = {name: p["metadata"]["uid"] for name, p in agent.pods().items()}
            single: list[float] = []
            for version in (3, 4, 5):
                tmp_path = manifests / ".bench-0.tmp"
                tmp_path.write_text(scenario.manifest(0, version))
                os.replace(tmp_path, manifests / "bench-0.json")
                one = {0: time.time()}
                observed, _, _ = _wait_running_one(agent, one, before, timeout)
                single.append(observed)
                before = {name: p["metadata"]["uid"] for name, p in agent.pods().items()}

            markers = {scenario.marker(i): i for i in range(n)}
            alive = _pids_by_marker(markers)
            deleted: dict[int, float] = {}
            for i in range(n):
                (manifests / f"bench-{i}.json").unlink()
                deleted[i] = time.time()
            gone: dict[int, float] = {}
            deadline = time.monotonic() + timeout
            while len(gone) < len(alive) and time.monotonic() < deadline:
                now = time.time()
                still = _pids_by_marker(markers)
                for i in alive:
                    if i not in still and i not in gone:
                        gone[i] = now - deleted[i]
                time.sleep(0.02)
            delete_total = max(deleted[i] + gone[i] for i in gone) - min(deleted.values())
            histogram = _start_histogram(agent)
        finally:
            agent.stop(signal.SIGTERM, timeout=120)
    return {
        "n": n,
        "start": {
            "agent_observed": percentiles(start_agent),
            "external_poll": percentiles(start_poll),
            "all_running_seconds": round(start_total, 3),
        },
        "edit": {
            "agent_observed": percentiles(edit_agent),
            "external_poll": percentiles(edit_poll),
            "all_restarted_seconds": round(edit_total, 3),
        },
        "edit_one_of_n": percentiles(single),
        "delete": {
            "process_gone": percentiles(list(gone.values())),
            "all_gone_seconds": round(delete_total, 3),
        },
        "kubelet_pod_start_duration_seconds": histogram,
    }


def _start_histogram(agent: Agent) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    _, body = agent.get("/metrics")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "kubelet_pod_start_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith(("_count", "_sum")):
                    out[sample.name.rsplit("_", 1)[1]] = sample.value
    if out.get("count"):
        out["mean"] = round(out["sum"] / out["count"], 4)
    return out
