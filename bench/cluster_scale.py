"""Many nodes, one API server: N agents (process runtime, cluster mode) against one fixture API
server (tests/fixtures/apiserver/), P pods bound to each node.

`run()` measures the time from the pods' creation (spec.nodeName set, as the scheduler binds)
until every pod of every node is Running and ready in the API server, then, over a quiet window
of W seconds, the requests each node sends, split by kind (watch opens, lists, pod status
patches, node status writes, lease renewals, other), beside the kubelet's published per-node
figures, and what 5,000 such nodes would send per second.

Each agent authenticates with a token of its own, so that the fixture's request log
(`ApiServer.requests()`) names the node behind every request.

    python -m bench.cluster_scale [nodes] [pods] [window]
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from bench.targets import Target, at_most
from bench.targets import table as target_table
from tests.fixtures.apiserver import ApiServer
from tests.fixtures.apiserver.http import Request
from tests.integration.agent import Agent

KINDS = ("watch", "list", "pod_status", "node_status", "lease", "other")
USER_PREFIX = "bench-node:"
PROJECTED_NODES = 5000

# The kubelet's defaults: the node status every 10 s (nodeStatusUpdateFrequency), the Lease
# renewed every 10 s (a quarter of its 40 s duration), one pod watch per node that stays open.
KUBELET_PER_NODE = {"node_status": 1 / 10, "lease": 1 / 10}
KUBELET_STEADY = sum(KUBELET_PER_NODE.values())  # 0.2 requests/s per node


def kind_of(r: Request) -> str:
    """The kind of one request, by verb and path (the kubelet's traffic, as an API server's
    audit log would group it)."""
    parts = [p for p in r.path.split("/") if p]
    if r.watch:
        return "watch"
    if r.method in ("PATCH", "PUT") and parts[-1:] == ["status"]:
        if "pods" in parts:
            return "pod_status"
        if "nodes" in parts:
            return "node_status"
    if "leases" in parts and r.method in ("PATCH", "PUT"):
        return "lease"
    if r.method == "GET" and _is_collection(parts):
        return "list"
    return "other"


def _is_collection(parts: list[str]) -> bool:
    # /api/v1/<res>, /api/v1/namespaces/<ns>/<res>, /apis/<g>/<v>/... likewise.
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else []
    return len(rest) == 1 or (len(rest) == 3 and rest[0] == "namespaces")


def _shape(r: Request, node: str) -> str:
    """The request with its node and pod names left out: "GET /api/v1/nodes/{node}"."""
    path = r.path.replace(node, "{node}")
    path = re.sub(r"/pods/[^/]+", "/pods/{pod}", path)
    return f"{r.method} {path}"


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "cluster-scale"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }


def _running(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    return (
        status.get("phase") == "Running"
        and bool(statuses)
        and all(cs.get("ready") and "running" in (cs.get("state") or {}) for cs in statuses)
    )


def _node_kubeconfig(server: ApiServer, path: Path, node: str) -> Path:
    """A kubeconfig with a token of the node's own (a cluster admin, so that only the traffic is
    measured, not the fixture's NodeRestriction)."""
    token = f"bench-token-{node}"
    server.add_token(token, USER_PREFIX + node, ("system:masters",))
    server.write_kubeconfig(path)
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    return path


def run(nodes: int = 10, pods: int = 110, window: float = 60.0) -> dict[str, Any]:
    names = [f"scale-node-{i}" for i in range(nodes)]
    agents: list[Agent] = []
    with tempfile.TemporaryDirectory(prefix="pykubelet-cluster-") as tmp, ApiServer() as server:
        base = Path(tmp)
        try:
            # The nodes first, registered and idle, so that the clock below times the pods only.
            for node in names:
                work = base / node
                (work / "manifests").mkdir(parents=True)
                kubeconfig = _node_kubeconfig(server, work / "kubeconfig", node)
                extra = ["--kubeconfig", str(kubeconfig), "--hostname-override", node]
                extra += ["--max-pods", str(max(pods, 110))]
                agent = Agent(work / "manifests", work / "root", work / "agent.log", extra)
                agents.append(agent.start(timeout=60))
            _wait("every node registered", lambda: all(server.get("nodes", n) for n in names), 60)

            started = time.monotonic()
            for node in names:
                for i in range(pods):
                    server.create("pods", _pod(f"{node}-p{i}", node))
            total = nodes * pods
            _wait(
                f"{total} pods running",
                lambda: sum(server.scan("pods", _running)) == total,
                timeout=60 + total * 0.5,
                interval=0.2,
            )
            all_running = time.monotonic() - started

            time.sleep(2.0)  # the last status patches land before the window opens
            opened = time.monotonic()
            time.sleep(window)
            closed = time.monotonic()
            log = server.requests()
        finally:
            for agent in agents:  # SIGTERM all first: they stop their pods in parallel
                if agent.proc is not None and agent.proc.poll() is None:
                    agent.proc.send_signal(signal.SIGTERM)
            for agent in agents:
                # Waited for, not signalled again: a second SIGTERM makes an agent exit at once,
                # leaving its pods running (the first node's 110 were, until this wait).
                if agent.proc is not None:
                    try:
                        agent.proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        agent.proc.kill()
                        agent.proc.wait()
            _unmount_under(base)
    return _summarise(log, names, pods, window, all_running, started, opened, closed)


def _unmount_under(base: Path) -> None:
    """Unmount what the agents left mounted below `base`: a stopped agent leaves its pods'
    volumes (service-account token tmpfs, as root) for its next start, and the temporary
    directory could not be deleted."""
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(f"{base}/")), reverse=True):
        with contextlib.suppress(OSError):
            subprocess.run(["umount", point], check=False, capture_output=True)


def _wait(what: str, check: Any, timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _summarise(
    log: list[Request],
    names: list[str],
    pods: int,
    window: float,
    all_running: float,
    started: float,
    opened: float,
    closed: float,
) -> dict[str, Any]:
    seconds = closed - opened
    per_node: dict[str, dict[str, float]] = {}
    startup: Counter[str] = Counter()
    others: Counter[str] = Counter()
    startup_others: Counter[str] = Counter()
    for node in names:
        mine = [r for r in log if r.user == USER_PREFIX + node]
        inside = [r for r in mine if opened <= r.at < closed]
        counts = Counter(kind_of(r) for r in inside)
        per_node[node] = {k: counts[k] / seconds for k in KINDS}
        per_node[node]["total"] = len(inside) / seconds
        before = [r for r in mine if started <= r.at < opened]
        startup.update(kind_of(r) for r in before)
        startup_others.update(_shape(r, node) for r in before if kind_of(r) == "other")
        others.update(_shape(r, node) for r in inside if kind_of(r) == "other")
    mean = {k: sum(n[k] for n in per_node.values()) / len(names) for k in (*KINDS, "total")}
    return {
        "nodes": len(names),
        "pods_per_node": pods,
        "window_seconds": round(seconds, 2),
        "all_running_seconds": round(all_running, 3),
        "requests_per_node_per_second": {k: round(v, 4) for k, v in mean.items()},
        "max_node_total_per_second": round(max(n["total"] for n in per_node.values()), 4),
        "startup_requests_per_node": round(sum(startup.values()) / len(names), 1),
        "startup_requests_per_node_by_kind": {k: round(startup[k] / len(names), 1) for k in KINDS},
        "other_requests_in_window": dict(others.most_common(8)),
        "other_requests_until_running": dict(startup_others.most_common(8)),
        "kubelet_per_node_per_second": round(KUBELET_STEADY, 4),
        f"projected_{PROJECTED_NODES}_nodes_per_second": {
            k: round(v * PROJECTED_NODES, 1) for k, v in mean.items()
        },
        "kubelet_projected_per_second": round(KUBELET_STEADY * PROJECTED_NODES, 1),
    }


def table(r: dict[str, Any]) -> list[str]:
    n, p = r["nodes"], r["pods_per_node"]
    rate = r["requests_per_node_per_second"]
    proj = r[f"projected_{PROJECTED_NODES}_nodes_per_second"]
    split = ", ".join(f"{k} {rate[k]:.3f}" for k in KINDS)
    lines = [
        f"cluster {n}x{p}: all {n * p} pods running {r['all_running_seconds']:.2f}s after "
        f"creation; per node until then {r['startup_requests_per_node']:.0f} requests ("
        + ", ".join(f"{k} {v:g}" for k, v in r["startup_requests_per_node_by_kind"].items())
        + ")",
        f"cluster {n}x{p}: per node over {r['window_seconds']:.0f}s: {rate['total']:.3f} "
        f"requests/s (max node {r['max_node_total_per_second']:.3f}) = {split}",
        f"cluster {n}x{p}: the kubelet's defaults per node: {r['kubelet_per_node_per_second']} "
        "requests/s (node status every 10 s + lease every 10 s, one pod watch kept open)",
        f"cluster {n}x{p}: projected for {PROJECTED_NODES:,} nodes: {proj['total']:,.0f} "
        f"requests/s (node status {proj['node_status']:,.0f}, lease {proj['lease']:,.0f}, "
        f"watch opens {proj['watch']:,.0f}, pod status {proj['pod_status']:,.0f}, other "
        f"{proj['other']:,.0f}); the kubelet's defaults: {r['kubelet_projected_per_second']:,.0f}",
    ]
    if r["other_requests_in_window"]:
        shown = ", ".join(f"{k} x{v}" for k, v in r["other_requests_in_window"].items())
        lines.append(f"cluster {n}x{p}: other requests in the window, all nodes: {shown}")
    if r["other_requests_until_running"]:
        shown = ", ".join(f"{k} x{v}" for k, v in r["other_requests_until_running"].items())
        lines.append(f"cluster {n}x{p}: other requests until running, all nodes: {shown}")
    return lines


def targets(r: dict[str, Any]) -> list[Target]:
    what = f"cluster {r['nodes']}x{r['pods_per_node']}: steady requests/s per node"
    detail = f"over {r['window_seconds']:.0f} s; the kubelet: {KUBELET_STEADY:g}"
    total = r["requests_per_node_per_second"]["total"]
    return [at_most(what, total, KUBELET_STEADY, "req/s", detail)]


def main(argv: list[str]) -> int:
    nodes = int(argv[0]) if argv else 10
    pods = int(argv[1]) if len(argv) > 1 else 110
    window = float(argv[2]) if len(argv) > 2 else 60.0
    r = run(nodes, pods, window)
    for line in table(r) + target_table(targets(r)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
