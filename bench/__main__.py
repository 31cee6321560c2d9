"""Run the benchmarks, print a table, write bench/results.json.

python -m bench [--quick] [--no-flamegraphs]
                [--only latency,merger,steady,podman,engines,streaming,node_resources,
                cluster,cluster_start]

The latency section runs the floor (bench/floor.py) beside the agent for each N and prints the
agent's start figures as ratios to it (for N of 100 and more, the medians of PAIRS floor-then-
agent runs); with py-spy installed it also keeps flame graphs of the
agent's 100- and 1,000-manifest bursts in bench/flamegraphs/. Last comes the targets table
(bench/targets.py): each target of issue 19 a section measured, PASS or MISS.
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

from bench import (
    cluster_scale,
    cluster_start,
    cpucost,
    engine_floor,
    floor,
    fscost,
    latency,
    merger,
    node_resources,
    podman,
    profile,
    quietdisk,
    steady,
    streaming,
)
from bench.targets import Target, table

RESULTS = Path(__file__).with_name("results.json")
# Floor-then-agent runs of each burst of 100 manifests or more: a ratio is the median of its
# pairs' (one pair moved by 10-40 % from run to run on this shared machine).
PAIRS = 3


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
        # Which build: /usr is the distribution's (Debian's: PGO and LTO, linked statically),
        # a pyenv prefix an unoptimized one of its own (bench/HISTORY.md, session 22).
        "python_prefix": sys.base_prefix,
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller N and shorter windows")
    parser.add_argument(
        "--only", default="latency,merger,steady,podman,engines,streaming,node_resources"
    )
    parser.add_argument(
        "--no-flamegraphs", action="store_true", help="no py-spy runs in the latency section"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    results: dict[str, Any] = {"machine": machine()}
    targets: list[Target] = []
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
        results["spawn_capacity"] = cpucost.spawn_capacity()
        print(cpucost.line(results["spawn_capacity"]), flush=True)
        results["latency_process"] = []
        for n in sizes:
            # The floor just before the agent, on the same manifests and writer: one ratio
            # compares two runs a few seconds apart on the same (shared, noisy) machine.
            # The floor's files kept until the agent's run is done, and each run in a fresh
            # part of the disk (bench/quietdisk.py). The bursts of 100 and more are run as
            # PAIRS such pairs (the later ones start only): their ratios are the medians.
            pairs: list[dict[str, Any]] = []
            r = {}
            for i in range(PAIRS if n >= 100 and not args.quick else 1):
                try:
                    f = floor.run(n, keep=True)
                    if i == 0:
                        r = latency.run(n, edits_one=20, deletes_one=20)
                        agent = r
                    else:
                        agent = latency.run(n, start_only=True)
                finally:
                    quietdisk.remove_deferred()
                pairs.append(floor.pair(agent, f))
            r["floor"], r["pairs"] = pairs[0]["floor"], pairs
            r["ratio_to_floor"] = floor.median_ratios(pairs)
            print(fscost.line(r["file_system"]), flush=True)
            results["latency_process"].append(r)
            for line in _latency_lines(r):
                print(line, flush=True)
        targets += floor.targets(results["latency_process"])
        targets += latency.targets(results["latency_process"])
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
        targets += steady.targets(results["steady_process"])
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
    if "engines" in only:
        n = 20 if args.quick else 100
        r = engine_floor.run(n)
        results["engine_floor"] = r
        d, c = r["docker"], r["remote"]
        print(
            f"docker n={n}: kube play {d['podman_kube_play']['per_pod_seconds']:.3f}s, bare "
            f"{d['bare_sequential']['per_pod_seconds']:.3f}s (concurrent "
            f"{d['bare_concurrent']['per_pod_seconds']:.3f}s), pykubelet "
            f"{d['pykubelet_docker']['per_pod_seconds']:.3f}s per pod",
            flush=True,
        )
        print(
            f"remote n={n}: bare {c['bare_sequential']['per_pod_seconds']:.3f}s (concurrent "
            f"{c['bare_concurrent']['per_pod_seconds']:.3f}s), pykubelet "
            f"{c['pykubelet_remote']['per_pod_seconds']:.3f}s per pod",
            flush=True,
        )
        targets += engine_floor.targets(r)
    if "node_resources" in only:
        results["node_resources"] = node_resources.run(args.quick)
        for line in node_resources.table(results["node_resources"]):
            print(line, flush=True)
    if "cluster" in only:  # not in the default list: 10 agents, about as long as the rest
        r = cluster_scale.run(3, 20, 10.0) if args.quick else cluster_scale.run(10, 110, 60.0)
        results["cluster_scale"] = r
        for line in cluster_scale.table(r):
            print(line, flush=True)
        targets += cluster_scale.targets(r)
    if "cluster_start" in only:  # not in the default list: 1,000 pods twice (file, then API)
        r = cluster_start.run(100 if args.quick else 1000)
        results["cluster_start"] = r
        for line in cluster_start.table(r):
            print(line, flush=True)
        targets += cluster_start.targets(r)
    # Other sections add their rows above (targets += section.targets(results[...])).
    results["targets"] = [t.as_dict() for t in targets]
    for line in table(targets):
        print(line, flush=True)
    # A run of some sections keeps the last figures of the others.
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(json.dumps({**previous, **results}, indent=2) + "\n")
    if "latency" in only and not args.no_flamegraphs:
        # Last: py-spy's sampling costs the agent CPU; no figure above is taken under it.
        results["flamegraphs"] = _flamegraphs([100] if args.quick else [100, 1000])
        RESULTS.write_text(json.dumps({**previous, **results}, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


def _latency_lines(r: dict[str, Any]) -> list[str]:
    n, s, f, ratio = r["n"], r["start"], r["floor"], r["ratio_to_floor"]
    e, d = r["edit"], r["delete"]
    one, worker, gone = r["edit_one_of_n"], r["edit_one_of_n_to_worker"], r["delete_one_of_n"]
    lines = [
        f"floor   n={n:>4}: start p50 {f['start']['p50']:.3f}s p99 {f['start']['p99']:.3f}s, "
        f"all running {f['all_running_seconds']:.3f}s",
        f"process n={n:>4}: start p50 {s['agent_observed']['p50']:.3f}s "
        f"p99 {s['agent_observed']['p99']:.3f}s (poll p99 {s['external_poll']['p99']:.3f}s), "
        f"all running {s['all_running_agent_observed_seconds']:.3f}s (poll "
        f"{s['all_running_seconds']:.2f}s) | ratio to floor: p50 start {ratio['p50_start']}x, "
        f"p99 start {ratio['p99_start']}x, all running {ratio['all_running']}x"
        + (f" (medians of {len(r['pairs'])} pairs)" if len(r.get("pairs", ())) > 1 else ""),
        f"process n={n:>4}: edit p99 {e['agent_observed']['p99']:.3f}s | one edit p99 "
        f"{one['p99']:.3f}s, to its worker p50 {1000 * worker['p50']:.1f} ms p99 "
        f"{1000 * worker['p99']:.1f} ms ({worker['count']}) | delete p99 "
        f"{d['process_gone']['p99']:.3f}s, all gone {d['all_gone_seconds']:.2f}s",
    ]
    if gone["count"]:
        lines[-1] += (
            f" | one delete p50 {1000 * gone['p50']:.1f} ms p99 {1000 * gone['p99']:.1f} ms "
            f"({gone['count']})"
        )
    for p in r.get("pairs") or []:
        if p["floor"].get("cpu") and p["start"].get("cpu"):
            lines.append(cpucost.pair_line(n, p["floor"]["cpu"], p["start"]["cpu"]))
    pairs = r.get("pairs") or []
    if len(pairs) > 1:
        lines.append(
            f"pairs   n={n:>4}: floor / agent p99 start and all running (ratios): "
            + "; ".join(
                f"{p['floor']['start']['p99']:.3f} / {p['start']['agent_observed']['p99']:.3f} s, "
                f"{p['floor']['all_running_seconds']:.3f} / "
                f"{p['start']['all_running_agent_observed_seconds']:.3f} s "
                f"({p['ratio_to_floor']['p99_start']}x, {p['ratio_to_floor']['all_running']}x)"
                for p in pairs
            )
        )
    return lines


def _flamegraphs(sizes: list[int]) -> list[dict[str, Any]]:
    if profile.py_spy() is None:
        print("flame graphs skipped: py-spy is not installed (pip install -e '.[bench]')")
        return []
    out = []
    for n in sizes:
        for gil in (False, True):
            try:
                r = profile.flamegraph(n, gil=gil)
            except Exception as exc:  # a missing flame graph must not lose the run's figures
                print(f"flame graph n={n}: failed: {exc!r}", flush=True)
                continue
            out.append(r)
            top = ", ".join(f"{share}% {frame}" for frame, share in r["top"][:5])
            held = f", the interpreter lock held {r['lock_held_seconds']:.2f} s" if gil else ""
            print(
                f"flame graph n={n:>4}: {r['svg']} (start p99 "
                f"{r['start']['agent_observed']['p99']:.3f}s under py-spy{held}); top "
                f"{'lock-held ' if gil else ''}self time: {top}",
                flush=True,
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
