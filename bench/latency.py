"""Manifest → running, edit → restarted, delete → gone: per-pod latencies with the real agent."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import cpucost, fscost, quietdisk
from bench.stats import percentiles
from bench.targets import Target, at_most
from tests.integration.agent import Agent

# How often a burst's /pods is read. The start figures come from the startedAt each container
# got, not from when a poll saw it; a read of 1,000 pods' JSON is work for the agent that the
# floor, which reports its own spawns, never has (at 20 reads a second, 8 % of the agent's
# Python in a 1,000-pod burst).
POLL_SECONDS = 0.25


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


def write_manifest(directory: Path, scenario: Scenario, i: int, version: int) -> float:
    """Write pod i's manifest as an editor would (a temporary file renamed over it); when."""
    tmp_path = directory / f".bench-{i}.tmp"
    tmp_path.write_text(scenario.manifest(i, version))
    os.replace(tmp_path, directory / f"bench-{i}.json")
    return time.time()


def write_manifests(directory: Path, scenario: Scenario, version: int) -> dict[int, float]:
    """All n manifests at once, in order: pod index -> when its file was in place."""
    return {i: write_manifest(directory, scenario, i, version) for i in range(scenario.n)}


def _started_at(pod: dict[str, Any]) -> float | None:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        running = cs.get("state", {}).get("running")
        if running and running.get("startedAt"):
            return datetime.fromisoformat(running["startedAt"].replace("Z", "+00:00")).timestamp()
    return None


def _wait_running(
    agent: Agent, n: int, written: dict[int, float], uids_before: dict[str, str], timeout: float
) -> tuple[list[float], list[float], float, float]:
    """Per pod: (startedAt - write) as the agent recorded it, and first poll seeing it running;
    from the first write to the last pod running, by the agent's startedAt and by the polls."""
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
        time.sleep(POLL_SECONDS)
    if len(agent_seen) < n:
        raise RuntimeError(f"only {len(agent_seen)} of {n} pods running after {timeout}s")
    first = min(written.values())
    total = max(written[i] + polled[i] for i in polled) - first
    agent_total = max(written[i] + agent_seen[i] for i in agent_seen) - first
    return list(agent_seen.values()), list(polled.values()), agent_total, total


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


def _gone_at(pid: int, deadline: float) -> float:
    """When process pid is gone (or a zombie: it has exited, only not yet been reaped)."""
    stat = f"/proc/{pid}/stat"
    while time.monotonic() < deadline:
        try:
            with open(stat) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return time.time()
        if state == "Z":
            return time.time()
        time.sleep(0.001)
    raise RuntimeError(f"process {pid} still running after its manifest was deleted")


# The log lines a worker writes when an edit of bench-0 reaches it: the new pod's worker waits
# for the old pod to stop, the old pod's worker stops its container (pod/sync.py, events).
_LOG_TIME = r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z "
_REACHED_NEW = re.compile(_LOG_TIME + r".* default/bench-0-testnode \(uid \S+\) waits for", re.M)
_REACHED_OLD = re.compile(_LOG_TIME + r".* pod default/bench-0-testnode Killing: ", re.M)


def _log_since(path: Path, offset: int) -> tuple[str, int]:
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    return data.decode(errors="replace"), offset + len(data)


def _reached_worker(text: str) -> float | None:
    """When (wall clock, ms) the agent's log shows bench-0's edit at its pod worker."""
    match = _REACHED_NEW.search(text) or _REACHED_OLD.search(text)
    if match is None:
        return None
    return datetime.fromisoformat(match.group(1) + "+00:00").timestamp()


def run(
    n: int,
    extra: list[str] | None = None,
    timeout: float = 120.0,
    on_start: Callable[[Agent], None] | None = None,
    image: str = "busybox",
    handles_term: bool = False,
    edits_one: int = 3,
    deletes_one: int = 0,
    during_start: Callable[[Agent], AbstractContextManager[object]] | None = None,
    start_only: bool = False,
) -> dict[str, Any]:
    """The scenario on a fresh agent: n manifests written at once, all edited, `edits_one`
    edits of one of them, `deletes_one` single deletes (of up to half the pods), then the
    rest deleted at once. `during_start` wraps the first burst (e.g. a profiler); with
    `start_only` the agent stops after it."""
    with quietdisk.scratch("pykubelet-bench-") as base:
        # What a new file costs where this agent's root dir is, just before its burst.
        file_system = fscost.measure(base / "fscost")
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
            assert agent.proc is not None
            with (
                during_start(agent) if during_start is not None else nullcontext(),
                cpucost.window(agent.proc.pid) as cpu,
            ):
                written = write_manifests(manifests, scenario, 1)
                start_agent, start_poll, start_agent_total, start_total = _wait_running(
                    agent, n, written, {}, timeout
                )
            start = {
                "agent_observed": percentiles(start_agent),
                "external_poll": percentiles(start_poll),
                "all_running_agent_observed_seconds": round(start_agent_total, 3),
                "all_running_seconds": round(start_total, 3),
                "cpu": cpu.until(min(written.values()) + start_agent_total),
            }
            if start_only:
                return {"n": n, "start": start, "file_system": file_system}

            before = {name: p["metadata"]["uid"] for name, p in agent.pods().items()}
            edited = write_manifests(manifests, scenario, 2)
            edit_agent, edit_poll, _, edit_total = _wait_running(agent, n, edited, before, timeout)

            # One manifest of n changes: how soon does its pod run the new spec, and how soon
            # does the change reach the pod's worker (the agent's log, ms)?
            before = {name: p["metadata"]["uid"] for name, p in agent.pods().items()}
            single: list[float] = []
            to_worker: list[float] = []
            log_offset = agent.log_path.stat().st_size
            for version in range(3, 3 + edits_one):
                one = {0: write_manifest(manifests, scenario, 0, version)}
                observed, _, _ = _wait_running_one(agent, one, before, timeout)
                single.append(observed)
                text, log_offset = _log_since(agent.log_path, log_offset)
                reached = _reached_worker(text)
                if reached is not None:
                    to_worker.append(max(0.0, reached - one[0]))
                before = {name: p["metadata"]["uid"] for name, p in agent.pods().items()}

            markers = {scenario.marker(i): i for i in range(n)}
            alive = _pids_by_marker(markers)
            # One manifest of n deleted, the others running: how soon is its process gone?
            delete_one: list[float] = []
            deadline = time.monotonic() + timeout
            for i in range(n - 1, n - 1 - min(deletes_one, n // 2), -1):
                pid = alive.pop(i)
                (manifests / f"bench-{i}.json").unlink()
                deleted_at = time.time()
                delete_one.append(_gone_at(pid, deadline) - deleted_at)
            deleted: dict[int, float] = {}
            for i in sorted(alive):
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
        "start": start,
        "file_system": file_system,
        "edit": {
            "agent_observed": percentiles(edit_agent),
            "external_poll": percentiles(edit_poll),
            "all_restarted_seconds": round(edit_total, 3),
        },
        "edit_one_of_n": percentiles(single),
        "edit_one_of_n_to_worker": percentiles(to_worker),
        "delete_one_of_n": percentiles(delete_one),
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


def targets(runs: list[dict[str, Any]]) -> list[Target]:
    """Issue 19's single-edit and single-delete targets, from the 1,000-pod run."""
    r = next((r for r in runs if r["n"] == 1000), None)
    if r is None:
        return []
    rows = []
    worker = r.get("edit_one_of_n_to_worker", {})
    if worker.get("count"):
        rows.append(
            at_most(
                f"one edit among 1,000: reaches its worker, p99 of {worker['count']}",
                1000 * worker["p99"],
                15,
                "ms",
                f"p50 {1000 * worker['p50']:.1f} ms",
            )
        )
    gone = r.get("delete_one_of_n", {})
    if gone.get("count"):
        rows.append(
            at_most(
                f"one delete among 1,000: process gone, p99 of {gone['count']} (grace ~0)",
                1000 * gone["p99"],
                50,
                "ms",
                f"p50 {1000 * gone['p50']:.1f} ms",
            )
        )
    return rows
