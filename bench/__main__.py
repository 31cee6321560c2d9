"""Run the benchmarks, print a table, write bench/results.json.

python -m bench [--quick] [--only latency,merger,steady,podman,streaming]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench import latency, merger, podman, steady, streaming

RESULTS = Path(__file__).with_name("results.json")


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller N and shorter windows")
    parser.add_argument("--only", default="latency,merger,steady,podman,streaming")
    args = parser.parse_args()
    only = set(args.only.split(","))
    results: dict[str, Any] = {"machine": machine()}
    sizes = [1, 100] if args.quick else [1, 100, 1000]
    if "merger" in only:
        results["merger"] = [merger.run(n) for n in (1000, 10000)]
        for r in results["merger"]:
            print(
                f"merger n={r['n']:>5}: first SET {r['first_set_seconds']:.3f}s "
                f"({r['first_set_pods_per_second']}/s), unchanged SET "
                f"{r['unchanged_set_seconds']:.4f}s, one changed "
                f"{r['one_changed_set_seconds']:.4f}s, single updates "
                f"{r['single_updates_per_second']}/s",
                flush=True,
            )
    if "latency" in only:
        results["latency_process"] = []
        for n in sizes:
            r = latency.run(n)
            results["latency_process"].append(r)
            s, e, d = r["start"], r["edit"], r["delete"]
            print(
                f"process n={n:>4}: start p50 {s['agent_observed']['p50']:.3f}s "
                f"p99 {s['agent_observed']['p99']:.3f}s (poll p99 {s['external_poll']['p99']:.3f}s)"
                f", all running {s['all_running_seconds']:.2f}s | edit p99 "
                f"{e['agent_observed']['p99']:.3f}s | delete p99 {d['process_gone']['p99']:.3f}s, "
                f"all gone {d['all_gone_seconds']:.2f}s",
                flush=True,
            )
    if "steady" in only:
        window = 10.0 if args.quick else 60.0
        results["steady_process"] = []
        for n in (0, 110) if args.quick else (0, 110, 1000):
            r = steady.run(n, window)
            results["steady_process"].append(r)
            print(
                f"steady n={n:>4}: CPU {100 * r['cpu_fraction_of_a_core']:.2f}% of a core over "
                f"{window:.0f}s, RSS {r['rss_mib']:.0f} MiB, /pods p50 "
                f"{1000 * r['pods_endpoint_seconds']['p50']:.1f} ms",
                flush=True,
            )
    if "podman" in only:
        n = 20 if args.quick else 100
        r = podman.run(n)
        results["docker_vs_kube_play"] = r
        s = r["pykubelet_docker"]["start"]
        print(
            f"docker n={n}: podman kube play {r['podman_kube_play']['per_pod_seconds']:.3f}s per "
            f"pod; pykubelet {r['pykubelet_per_pod_seconds']:.3f}s per pod (ratio "
            f"{r['ratio_to_kube_play']}), start p99 {s['agent_observed']['p99']:.2f}s, all "
            f"running {s['all_running_seconds']:.1f}s",
            flush=True,
        )
    if "streaming" in only:
        results["streaming"] = streaming.run(args.quick)
        for line in streaming.table(results["streaming"]):
            print(line, flush=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
