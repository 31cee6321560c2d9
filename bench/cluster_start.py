"""Cluster mode against the file source: P pods bound to one node through the fixture API server
(tests/fixtures/apiserver/), and how soon each one's status reaches the API server.

`run()` first times the file source (bench/latency.py: P manifests written at once, until all
run), then one agent in cluster mode: P pods created in the API server with spec.nodeName set
(as the scheduler binds), until every one is Running and ready there. Per pod, the status lag
is when the API server stored it running (its change listener, ApiServer.on_change, called as
the write is stored: no poll) minus the container's startedAt as the agent recorded it (its
/pods, to the microsecond; the API's startedAt has seconds only). Issue 19's targets: all
running within 2x the file source's time, and each status within 1 s of the change; measured
at the client's default rate limit (--kube-api-qps 50, the kubelet's) and again at a raised
one (RAISED_QPS, as the kubelet's own density tests raise it), which the table shows beside
it. The raised rate runs PAIRS times, each after a file source run of its own: the run of
median ratio is shown, and the status lag's p99 is the median of the runs'.

    python -m bench.cluster_start [pods]
"""

from __future__ import annotations

import signal
import statistics
import sys
import time
from typing import Any

from bench import latency, quietdisk
from bench.cluster_scale import _node_kubeconfig, _pod, _running, _unmount_under, _wait
from bench.stats import median_item, percentiles, runs_range
from bench.targets import Target, at_most
from bench.targets import table as target_table
from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent

NODE = "start-node"
WAIT_SECONDS = 0.05  # how often the bench looks whether every pod was seen running
DEFAULT_QPS = 50.0  # the kubelet's kubeAPIQPS (bursts of 100)
RAISED_QPS = 1000.0  # bursts of twice that


# File-source-then-cluster pairs at the raised rate: the run of median ratio is the one shown,
# the status lag's target the median of the pairs' p99s (one pair's ratio moved between 2.4x
# and 3.0x from run to run on this shared machine, its lag's p99 between 0.4 and 1.9 s).
PAIRS = 3
PAIR_FIGURES = (
    "file_source_all_running_seconds",
    "all_running_seconds",
    "ratio_to_file_source",
    "status_lag_seconds",
)


def run(pods: int = 1000, raised_qps: float = RAISED_QPS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = []
    for i in range(PAIRS):
        file_seconds = latency.run(pods, start_only=True)["start"]["all_running_seconds"]
        if i == 0:  # at the default rate the client's limit bounds it: once is enough
            out = run_cluster(pods, DEFAULT_QPS, file_seconds)
        pairs.append(run_cluster(pods, raised_qps, file_seconds))
    out["raised"] = {
        **median_item(pairs, lambda p: float(p["ratio_to_file_source"])),
        "pairs": [{k: p[k] for k in PAIR_FIGURES} for p in pairs],
    }
    return out


def _seen(run: dict[str, Any]) -> str:
    """How the API server's side of the lag was timed (results before session 15 polled)."""
    if run.get("poll_seconds"):
        return f"polled every {run['poll_seconds']} s"
    return "as the API server stored it"


def _lag_p99(run: dict[str, Any]) -> tuple[float, str]:
    """The status lag's p99 and how it was had: over pairs, the median of theirs."""
    polled = _seen(run)
    p99s = [p["status_lag_seconds"]["p99"] for p in run.get("pairs") or []]
    spread = runs_range(p99s, " s")
    if not spread:
        lag = run["status_lag_seconds"]
        return lag["p99"], f"max {lag['max']:.2f} s, {polled}"
    return statistics.median(p99s), f"{spread}, {polled}"


def _spread(run: dict[str, Any]) -> str:
    spread = runs_range([p["ratio_to_file_source"] for p in run.get("pairs") or []], "x")
    return f"; {spread}" if spread else ""


def run_cluster(pods: int, qps: float, file_source_seconds: float) -> dict[str, Any]:
    """One agent in cluster mode at `qps`: its figures, the ratio taken to the file source's
    `file_source_seconds` measured before it (bench/ab.py runs it alone)."""
    with (
        quietdisk.scratch("pykubelet-cluster-start-") as work,
        ApiServer() as server,
    ):
        (work / "manifests").mkdir()
        kubeconfig = _node_kubeconfig(server, work / "kubeconfig", NODE)
        extra = ["--kubeconfig", str(kubeconfig), "--hostname-override", NODE]
        extra += ["--max-pods", str(pods + 10)]
        extra += ["--kube-api-qps", f"{qps:g}", "--kube-api-burst", str(int(2 * qps))]
        agent = Agent(work / "manifests", work / "root", work / "agent.log", extra).start(60)
        try:
            _wait("the node registered", lambda: server.get("nodes", NODE) is not None, 60)
            seen: dict[str, float] = {}  # pod name -> when the API server stored it running

            def note(change: str, pod: dict[str, Any]) -> None:
                if change != "DELETED" and _running(pod):
                    seen.setdefault(pod["metadata"]["name"], time.time())

            stop_noting = server.on_change("pods", note)
            created = time.time()
            created_mono = time.monotonic()
            for i in range(pods):
                server.create("pods", _pod(f"{NODE}-p{i}", NODE))
            deadline = time.monotonic() + 60 + pods * 0.5
            while len(seen) < pods and time.monotonic() < deadline:
                time.sleep(WAIT_SECONDS)
            stop_noting()
            if len(seen) < pods:
                raise AssertionError(f"only {len(seen)} of {pods} pods running in the API server")
            started = {p["metadata"]["name"]: latency._started_at(p) for p in agent.pods().values()}
            sent = _requests_after(server, created_mono)
        finally:
            agent.stop(signal.SIGTERM, timeout=120)
            _unmount_under(work)
    lags = [seen[name] - at for name, at in started.items() if name in seen and at is not None]
    all_running = max(seen.values()) - created
    return {
        "pods": pods,
        "kube_api_qps": qps,
        "file_source_all_running_seconds": file_source_seconds,
        "all_running_seconds": round(all_running, 3),
        "ratio_to_file_source": round(all_running / file_source_seconds, 2),
        "status_lag_seconds": percentiles(lags),
        "requests_per_pod": round(sent / pods, 2),
    }


def _requests_after(server: ApiServer, since: float) -> int:
    """The agent's requests from the pods' creation (monotonic) until all ran, watches and
    lists included."""
    return sum(
        1 for r in server.requests() if r.at >= since and r.user_agent.startswith("pykubelet/")
    )


def table(r: dict[str, Any]) -> list[str]:
    lines = []
    for run in (r, r["raised"]) if "raised" in r else (r,):
        lag = run["status_lag_seconds"]
        lines.append(
            f"cluster start n={run['pods']} --kube-api-qps {run['kube_api_qps']:g}: all running "
            f"in the API server {run['all_running_seconds']:.2f}s after creation, the file "
            f"source {run['file_source_all_running_seconds']:.2f}s (ratio "
            f"{run['ratio_to_file_source']}x); {run['requests_per_pod']} requests per pod; "
            f"status lag (API server running - startedAt, {_seen(run)}) "
            f"p50 {lag['p50']:.3f}s p99 {lag['p99']:.3f}s max {lag['max']:.3f}s"
        )
        if len(run.get("pairs") or []) > 1:
            lines.append(
                f"  the {len(run['pairs'])} pairs at --kube-api-qps {run['kube_api_qps']:g} "
                "(file source / cluster, ratio, status lag p99): "
                + "; ".join(
                    f"{p['file_source_all_running_seconds']:.2f} / "
                    f"{p['all_running_seconds']:.2f} s, {p['ratio_to_file_source']}x, "
                    f"{p['status_lag_seconds']['p99']:.2f} s"
                    for p in run["pairs"]
                )
            )
    return lines


def targets(r: dict[str, Any]) -> list[Target]:
    n = f"{r['pods']:,}"
    out = []
    for run in (r, r["raised"]) if "raised" in r else (r,):
        qps = f"--kube-api-qps {run['kube_api_qps']:g}"
        lag_p99, lag_detail = _lag_p99(run)
        out += [
            at_most(
                f"cluster mode, {n} pods through the API ({qps}): all running, ratio to the file "
                "source",
                run["ratio_to_file_source"],
                2.0,
                "x",
                f"{run['all_running_seconds']:.2f} s vs "
                f"{run['file_source_all_running_seconds']:.2f} s" + _spread(run),
            ),
            at_most(
                f"cluster mode, {n} pods ({qps}): each status in the API server after the change, "
                "p99",
                lag_p99,
                1.0,
                "s",
                lag_detail,
            ),
        ]
    return out


def main(argv: list[str]) -> int:
    r = run(int(argv[0]) if argv else 1000)
    for line in table(r) + target_table(targets(r)):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
