"""Node resources, measured: the usage collector's own cost, and how soon a crossed eviction
threshold ends in an eviction.

- Collector: the real `StatsCollector` and `CgroupFs` sampling N real processes (one `sleep` per
  pod, as the process runtime runs them without limits), in this process: CPU seconds and wall
  time of one sample, the share of a core that is at the collector's 10 s period, and the memory
  it keeps once every pod's history is full (tracemalloc, a separate pass: tracing slows it).
- Eviction: the real agent in cluster mode (the fixture API server) on a small tmpfs
  --root-dir; a pod fills its emptyDir past `nodefs.available`; the time from the moment the
  file system's free space crossed the threshold (polled here with statvfs) to the pod being
  `Failed`/`Evicted` on the API server, at the kubelet's default --eviction-monitoring-interval
  (10s) and at 1s. Needs root (tmpfs); skipped otherwise.

python -m bench --only node_resources, or run() from here.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod, RuntimeSandbox
from pykubelet.stats.collector import DEFAULT_PERIOD, HISTORY_SAMPLES, StatsCollector

MIB = 1 << 20


class _Pods:
    """The collector's PodLister: one running container per real process."""

    def __init__(self, pids: list[int]) -> None:
        now = datetime.now(UTC)
        self._pods = []
        for i, pid in enumerate(pids):
            uid = uuid.uuid4().hex
            name = f"bench-{i}"
            sandbox = RuntimeSandbox(uid, uid, name, "default", True, None, now)
            container = RuntimeContainer(
                id=uuid.uuid4().hex,
                runtime="process",
                pod_uid=uid,
                pod_name=name,
                pod_namespace="default",
                name="main",
                attempt=0,
                spec_hash="",
                image="busybox",
                state=ContainerRunState.RUNNING,
                created_at=now,
                started_at=now,
                pid=pid,
            )
            self._pods.append(RuntimePod(uid, name, "default", sandbox, [container]))

    async def list_pods(self) -> list[RuntimePod]:
        return list(self._pods)


async def _passes(collector: StatsCollector, count: int) -> tuple[list[float], list[float]]:
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(count):
        c0, w0 = time.process_time(), time.perf_counter()  # process_time counts its thread too
        stats = await collector.sample()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        assert not stats.errors, stats.errors
    return cpu, wall


def collector_cost(n: int, passes: int = HISTORY_SAMPLES + 2) -> dict[str, Any]:
    procs = [
        subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(n)
    ]
    try:
        pods = _Pods([p.pid for p in procs])
        timed = StatsCollector(pods, "bench")
        cpu, wall = asyncio.run(_passes(timed, passes))
        sampled = len((timed.latest() or _fail()).pods)
        assert sampled == n, f"sampled {sampled} of {n} pods"
        # The first pass has no earlier reading (no rates) and warms the caches: left out.
        cpu, wall = sorted(cpu[1:]), sorted(wall[1:])
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        kept = StatsCollector(pods, "bench")
        asyncio.run(_passes(kept, HISTORY_SAMPLES + 1))
        retained = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del kept
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    median_cpu = cpu[len(cpu) // 2]
    return {
        "pods": n,
        "sample_cpu_seconds_p50": round(median_cpu, 5),
        "sample_cpu_seconds_max": round(cpu[-1], 5),
        "sample_wall_seconds_p50": round(wall[len(wall) // 2], 5),
        "period_seconds": DEFAULT_PERIOD,
        "cpu_fraction_of_a_core": round(median_cpu / DEFAULT_PERIOD, 6),
        "retained_mib_full_history": round(retained / MIB, 2),
        "history_samples": HISTORY_SAMPLES,
    }


def _fail() -> Any:
    raise AssertionError("the collector kept no sample")


def eviction_latency(interval: str) -> dict[str, Any]:
    """One filling pod evicted under --eviction-hard=nodefs.available<24Mi on a 64 MiB tmpfs."""
    from tests.fixtures.apiserver import ApiServer
    from tests.integration.agent import Agent
    from tests.integration.test_cluster import KubeClient

    threshold = 24 * MIB
    with tempfile.TemporaryDirectory(prefix="pykubelet-evict-") as tmp:
        base = Path(tmp)
        root, manifests = base / "root", base / "manifests"
        root.mkdir()
        manifests.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(root)], check=True)
        server = ApiServer(bookmark_interval=0.5)
        server.start()
        agent: Agent | None = None
        try:
            client = KubeClient(server.write_kubeconfig(base / "kubeconfig"))
            node = "bench-node"
            agent = Agent(
                manifests,
                root,
                base / "agent.log",
                [
                    "--kubeconfig",
                    str(base / "kubeconfig"),
                    "--node-name",
                    node,
                    "--eviction-hard=nodefs.available<24Mi",
                    f"--eviction-monitoring-interval={interval}",
                ],
            )
            agent.start()
            # Waits for the go-ahead file, so the crossing is timed from a known start.
            go = base / "go"
            fill = (
                f"while [ ! -e {go} ]; do sleep 0.05; done; "
                "dd if=/dev/zero of=/data/fill bs=1M count=44 2>/dev/null; sleep 600"
            )
            client.create_pod(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "filler"},
                    "spec": {
                        "nodeName": node,
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 5,
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "command": ["/bin/sh", "-c", fill],
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            }
                        ],
                        "volumes": [{"name": "data", "emptyDir": {}}],
                    },
                }
            )
            deadline = time.monotonic() + 60
            while _phase(client) != "Running":
                if time.monotonic() > deadline:
                    raise AssertionError(f"filler not running:\n{agent.log()[-3000:]}")
                time.sleep(0.05)
            time.sleep(2.0)  # a sample or two of the quiet node first
            go.touch()
            crossed = None
            deadline = time.monotonic() + 120
            while True:
                now = time.monotonic()
                if now > deadline:
                    raise AssertionError(f"no eviction:\n{agent.log()[-3000:]}")
                if crossed is None:
                    st = os.statvfs(root)
                    if st.f_bavail * st.f_frsize < threshold:
                        crossed = now
                    time.sleep(0.005)
                    continue
                status = (client.pod("filler") or {}).get("status") or {}
                if status.get("reason") == "Evicted":
                    evicted = now
                    break
                time.sleep(0.02)
        finally:
            if agent is not None and agent.proc is not None:
                agent.stop()
            server.close()
            subprocess.run(["umount", "-l", str(root)], check=False)
    return {
        "eviction_monitoring_interval": interval,
        "threshold": "nodefs.available<24Mi",
        "crossed_to_evicted_seconds": round(evicted - crossed, 3),
    }


def _phase(client: Any) -> str:
    return str(((client.pod("filler") or {}).get("status") or {}).get("phase", ""))


def run(quick: bool = False) -> dict[str, Any]:
    sizes = (110,) if quick else (110, 1000)
    results: dict[str, Any] = {"collector": [collector_cost(n) for n in sizes]}
    if os.geteuid() == 0:
        intervals = ("1s",) if quick else ("10s", "1s")
        results["eviction"] = [eviction_latency(i) for i in intervals]
    else:
        results["eviction"] = "skipped: needs root (tmpfs --root-dir)"
    return results


def table(results: dict[str, Any]) -> list[str]:
    lines = []
    for r in results["collector"]:
        lines.append(
            f"collector n={r['pods']:>4}: {1000 * r['sample_cpu_seconds_p50']:.1f} ms CPU per "
            f"sample (wall {1000 * r['sample_wall_seconds_p50']:.1f} ms), "
            f"{100 * r['cpu_fraction_of_a_core']:.3f}% of a core at {r['period_seconds']:g}s, "
            f"{r['retained_mib_full_history']:.2f} MiB kept"
        )
    if isinstance(results["eviction"], str):
        lines.append(f"eviction: {results['eviction']}")
    else:
        for r in results["eviction"]:
            lines.append(
                f"eviction at --eviction-monitoring-interval={r['eviction_monitoring_interval']}: "
                f"{r['crossed_to_evicted_seconds']:.2f}s from {r['threshold']} crossed to Evicted"
            )
    return lines


if __name__ == "__main__":
    out = run("--quick" in sys.argv)
    for line in table(out):
        print(line)
