"""Two or more versions of the agent alternated on one scenario, in the same minutes, and
whether the difference is more than this machine's noise.

    python -m bench.ab [--rounds R] [--pods N] [--scenario file|edits|cluster|idle] [--tmpfs]
                       ARM ARM [ARM ...]

Each ARM is a git revision of this repository (its `pykubelet` package exported with `git
archive`) or a directory holding a `pykubelet` package; `label=ARM` names it. Only the agent
changes from arm to arm: the scenario, the fixtures and the measuring are this checkout's.

A burst's figures move by 10-40 % from one run to the next on these shared machines
(bench/HISTORY.md), so one run of each says nothing: R rounds run every arm once each, the
order reversed every other round, each run in a process of its own. Its working directory is
the arm's: `python -m pykubelet` puts the working directory first on sys.path, so an agent
started from the repository would run the repository's package whatever PYTHONPATH says.

Scenarios (bench/latency.py, bench/cluster_start.py, bench/steady.py):
  file     N manifests written at once, until all run (the agent-observed figures)
  edits    the same, then 20 single edits and 20 single deletes among the N pods
  cluster  N pods bound to the node through the fixture API server, --kube-api-qps 1000
  idle     N pods running, the agent's CPU over IDLE_WINDOW_SECONDS and its RSS (bench/steady.py)

Printed: each run's figures; then per arm the median and range of each figure and, for each
arm after the first, in how many rounds it was lower than the first arm and the sign test's
two-sided p of that count (below 0.05: unlikely to be the noise alone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "RESULT "
RUN_TIMEOUT = 900.0


@dataclass
class Arm:
    label: str
    tree: Path  # holds the arm's pykubelet package


def _file(pods: int) -> dict[str, float]:
    from bench import latency

    start = latency.run(pods, start_only=True)["start"]
    return {
        "all_running_s": start["all_running_agent_observed_seconds"],
        "start_p99_s": start["agent_observed"]["p99"],
        "agent_cpu_s": start["cpu"]["process_cpu_seconds"],
    }


def _edits(pods: int) -> dict[str, float]:
    from bench import latency

    r = latency.run(pods, edits_one=20, deletes_one=20)
    return {
        "all_running_s": r["start"]["all_running_agent_observed_seconds"],
        "edit_to_worker_p99_s": r["edit_one_of_n_to_worker"]["p99"],
        "delete_p99_s": r["delete_one_of_n"]["p99"],
    }


def _cluster(pods: int) -> dict[str, float]:
    from bench import cluster_start

    # No file source run beside it (its ratio, to 1 s here, is left out): the file scenario
    # compares the file source.
    r = cluster_start.run_cluster(pods, cluster_start.RAISED_QPS, 1.0)
    return {
        "all_running_s": r["all_running_seconds"],
        "status_lag_p99_s": r["status_lag_seconds"]["p99"],
    }


def _idle(pods: int) -> dict[str, float]:
    from bench import steady

    r = steady.run(pods, IDLE_WINDOW_SECONDS)
    return {"cpu_percent": round(100 * r["cpu_fraction_of_a_core"], 3), "rss_mib": r["rss_mib"]}


# Shorter than `make bench`'s minute: rounds are alternated, so what a window misses (the
# minute's resync of every pod) falls in every arm's alike.
IDLE_WINDOW_SECONDS = 30.0

SCENARIOS: dict[str, Callable[[int], dict[str, float]]] = {
    "file": _file,
    "edits": _edits,
    "cluster": _cluster,
    "idle": _idle,
}


def sign_test(lower: int, higher: int) -> float:
    """Two-sided p of `lower` rounds against `higher` (ties left out) if either arm were as
    likely to be lower in each round."""
    n = lower + higher
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(lower, higher) + 1)) / (1 << n)
    return min(1.0, 2.0 * tail)


Round = dict[str, float] | None  # one run's figures; None if it failed


def summary(labels: list[str], runs: dict[str, list[Round]]) -> list[str]:
    """Per arm: each figure's median and range; against the first arm, the rounds it was
    lower in (of those where both ran) and the sign test's p."""
    lines: list[str] = []
    base = runs[labels[0]]
    for label in labels:
        mine = runs[label]
        done = [run for run in mine if run is not None]
        if not done:
            lines.append(f"{label}: no run finished")
            continue
        lines.append(f"{label} ({len(done)} runs):")
        for figure in done[0]:
            values = [run[figure] for run in done if figure in run]
            text = (
                f"  {figure}: median {statistics.median(values):.4g}"
                f" ({min(values):.4g}-{max(values):.4g})"
            )
            if label != labels[0]:
                pairs = [
                    (run[figure], first[figure])
                    for run, first in zip(mine, base, strict=True)
                    if run is not None and first is not None and figure in run and figure in first
                ]
                lower = sum(1 for a, b in pairs if a < b)
                higher = sum(1 for a, b in pairs if a > b)
                text += (
                    f"; lower than {labels[0]} in {lower} of {len(pairs)} rounds"
                    f" (sign test p {sign_test(lower, higher):.2f})"
                )
            lines.append(text)
    return lines


def parse_arm(text: str, index: int) -> tuple[str, str]:
    """`label=ARM`, or `ARM` labelled by itself (a path by its last component); an empty
    label is the arm's position."""
    label, sep, arm = text.partition("=")
    if not sep:
        arm = text
        label = Path(text).name if os.sep in text else text
    return (label or f"arm{index}"), arm


def export(arm: str, scratch: Path, index: int) -> Path:
    """A directory of the scratch whose `pykubelet` package is the arm's, and nothing else
    (a `bench` or `tests` beside it would shadow this checkout's)."""
    tree = scratch / f"arm{index}"
    directory = Path(arm)
    if (directory / "pykubelet").is_dir():
        tree.mkdir()
        (tree / "pykubelet").symlink_to((directory / "pykubelet").resolve())
        return tree
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{arm}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if rev.returncode != 0:
        raise SystemExit(f"{arm}: neither a git revision nor a directory with a pykubelet package")
    tree.mkdir()
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", rev.stdout.strip(), "pykubelet"],
        stdout=subprocess.PIPE,
    )
    assert archive.stdout is not None
    try:
        subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    finally:
        archive.stdout.close()
    if archive.wait() != 0:
        raise SystemExit(f"{arm}: git archive failed")
    return tree


def run_arm(arm: Arm, scenario: str, pods: int, env: dict[str, str]) -> dict[str, float] | str:
    """One run in a process of its own, in the arm's tree: its figures, or why it failed."""
    child_env = dict(env, PYTHONPATH=os.pathsep.join([str(arm.tree), str(ROOT)]))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench.ab", "--run", scenario, "--pods", str(pods)],
            cwd=arm.tree,
            env=child_env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {RUN_TIMEOUT:g} s"
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            figures: dict[str, float] = json.loads(line[len(RESULT_PREFIX) :])
            return figures
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return f"exit {done.returncode}: " + " | ".join(tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ab",
        description="Versions of the agent alternated on one scenario, with a sign test.",
    )
    parser.add_argument("arms", nargs="*", metavar="ARM")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="file")
    parser.add_argument(
        "--tmpfs", action="store_true", help="the runs' files on /dev/shm: no disk in the way"
    )
    parser.add_argument("--run", choices=sorted(SCENARIOS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:  # a child: one run of this tree's agent
        print(RESULT_PREFIX + json.dumps(SCENARIOS[args.run](args.pods)), flush=True)
        return 0
    if len(args.arms) < 2:
        parser.error("two arms or more")
    if args.rounds < 1 or args.pods < 1:
        parser.error("--rounds and --pods: 1 or more")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="pykubelet-ab-") as tmp:
        scratch = Path(tmp)
        arms = []
        for i, text in enumerate(args.arms):
            label, source = parse_arm(text, i)
            arms.append(Arm(label, export(source, scratch, i)))
        labels = [arm.label for arm in arms]
        if len(set(labels)) != len(labels):
            parser.error(f"two arms with one label: {labels}; name them, label=ARM")
        shm = None
        if args.tmpfs:
            shm = Path(tempfile.mkdtemp(prefix="pykubelet-ab-", dir="/dev/shm"))
            env["TMPDIR"] = str(shm)
        try:
            runs: dict[str, list[Round]] = {label: [] for label in labels}
            for round_ in range(args.rounds):
                for arm in arms if round_ % 2 == 0 else arms[::-1]:
                    result = run_arm(arm, args.scenario, args.pods, env)
                    if isinstance(result, str):
                        print(f"round {round_ + 1} {arm.label}: failed, {result}", flush=True)
                        runs[arm.label].append(None)
                        continue
                    runs[arm.label].append(result)
                    shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items())
                    print(f"round {round_ + 1} {arm.label}: {shown}", flush=True)
        finally:
            if shm is not None:
                shutil.rmtree(shm, ignore_errors=True)
    print(f"{args.scenario}, {args.pods} pods, {args.rounds} rounds:")
    for line in summary(labels, runs):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
