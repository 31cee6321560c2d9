"""py-spy profiles of the agent: a recorder any scenario can wrap around a phase, the flame
graphs `make bench` keeps (bench/flamegraphs/), and the top self-time frames of a profile.

Each burst gets two flame graphs: every thread's samples while it runs (process-N.svg: a thread
in a system call counts, an fsync waiting for the disk too), and only those of the thread that
holds the interpreter lock (process-N-gil.svg, py-spy --gil): the agent's Python runs under that
one lock, and in a start burst it is what bounds the agent (README, "Benchmarks"). Its sample
count over the rate is about how long the lock was held.

python -m bench.profile [N]   the whole N-pod latency scenario (default 1,000), raw; prints the
                              top hot spots (needs py-spy, the `bench` extra: py-spy==0.4.3)
"""

from __future__ import annotations

import bisect
import collections
import html
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import latency
from tests.integration.agent import Agent

FLAMEGRAPHS = Path(__file__).with_name("flamegraphs")
RATE = 200
ATTACH_SECONDS = 1.0


def py_spy() -> str | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return spy if Path(spy).exists() else None


def start_recorder(
    pid: int, out: Path, fmt: str = "raw", gil: bool = False
) -> subprocess.Popen[bytes]:
    """py-spy sampling pid until it exits or gets SIGINT; returns once py-spy samples.

    --nonblocking: the agent is never paused to be read, so its timings stay its own (at the
    price of a rare torn stack); idle threads are left out (no --idle). `gil`: only the thread
    holding the interpreter lock is sampled."""
    spy = py_spy()
    if spy is None:
        raise RuntimeError("py-spy is not installed: pip install -e '.[bench]'")
    recorder = subprocess.Popen(
        [
            *(spy, "record", "--pid", str(pid), "--format", fmt, "--rate", str(RATE)),
            *("--output", str(out), "--nonblocking"),
            *(("--gil",) if gil else ()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # py-spy says when it samples only on a terminal; it takes ~0.2 s to read the target's
    # interpreter, so a second is enough.
    time.sleep(ATTACH_SECONDS)
    if recorder.poll() is not None:
        _, err = recorder.communicate()
        raise RuntimeError(f"py-spy exited with {recorder.returncode}: {err.decode()[-500:]}")
    return recorder


@contextmanager
def recording(pid: int, out: Path, fmt: str = "flamegraph", gil: bool = False) -> Iterator[None]:
    """Profile pid while the block runs; py-spy writes out when it leaves."""
    recorder = start_recorder(pid, out, fmt, gil)
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy's Ctrl-C: write the output and exit
        _, err = recorder.communicate(timeout=60)
        if recorder.returncode != 0 or not out.exists():
            raise RuntimeError(f"py-spy failed ({recorder.returncode}): {err.decode()[-500:]}")


def flamegraph(n: int, directory: Path = FLAMEGRAPHS, gil: bool = False) -> dict[str, Any]:
    """A flame graph of the agent while n manifests written at once start (process-N.svg, or
    process-N-gil.svg with `gil`: the lock holder's samples alone, and the seconds they make)."""
    directory.mkdir(exist_ok=True)
    out = directory / (f"process-{n}-gil.svg" if gil else f"process-{n}.svg")

    def during(agent: Agent) -> Any:
        assert agent.proc is not None
        return recording(agent.proc.pid, out, gil=gil)

    result = latency.run(n, during_start=during, start_only=True)
    r = {"n": n, "gil": gil, "svg": str(out), "start": result["start"], "top": svg_self_time(out)}
    if gil:
        r["lock_held_seconds"] = round(svg_samples(out) / RATE, 2)
    return r


_FRAME = re.compile(
    r"<title>(?P<title>[^<]*) \((?P<samples>[\d,]+) samples?, [\d.]+%\)</title>"
    r'<rect [^>]*y="(?P<y>\d+)"[^>]*fg:x="(?P<x>\d+)" fg:w="(?P<w>\d+)"'
)


def svg_self_time(svg: Path, top: int = 12) -> list[tuple[str, float]]:
    """The frames of a py-spy flame graph with the most self time, as shares of all samples.

    A frame's children are the rectangles one row further from the root inside its span."""
    rows: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    frames: list[tuple[str, int, int, int]] = []
    for m in _FRAME.finditer(svg.read_text()):
        title, y, x, w = html.unescape(m["title"]), int(m["y"]), int(m["x"]), int(m["w"])
        frames.append((title, y, x, w))
        rows[y].append((x, w))
    if not frames:
        return []
    ys = sorted(rows)
    step = (ys[1] - ys[0]) if len(ys) > 1 else 16
    for row in rows.values():
        row.sort()
    total = max(w for _, _, _, w in frames)
    self_time: collections.Counter[str] = collections.Counter()
    for title, y, x, w in frames:
        if title == "all":
            continue
        below = rows.get(y + step, [])  # py-spy draws the root at the top: children below
        i = bisect.bisect_left(below, (x, -1))
        inner = 0
        while i < len(below) and below[i][0] < x + w:
            inner += below[i][1]
            i += 1
        self_time[title] += w - inner
    return [(t, round(100 * c / total, 1)) for t, c in self_time.most_common(top)]


def svg_samples(svg: Path) -> int:
    """All the samples of a py-spy flame graph (its widest frame's)."""
    widths = [int(m["w"]) for m in _FRAME.finditer(svg.read_text())]
    return max(widths, default=0)


def raw_self_time(raw: Path, top: int = 15) -> list[tuple[str, float]]:
    self_time: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        self_time[stack.split(";")[-1]] += int(count)
    return [(f, round(100 * c / max(total, 1), 1)) for f, c in self_time.most_common(top)]


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    if py_spy() is None:
        print("py-spy is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    out = Path(tempfile.mkdtemp(prefix="pykubelet-profile-")) / "profile.txt"
    recorder: list[subprocess.Popen[bytes]] = []

    def attach(agent: Agent) -> None:
        assert agent.proc is not None
        recorder.append(start_recorder(agent.proc.pid, out))

    result = latency.run(n, on_start=attach)
    recorder[0].communicate(timeout=60)  # py-spy writes once the agent has exited
    print(
        f"n={n}: start p99 {result['start']['agent_observed']['p99']}s, "
        f"edit p99 {result['edit']['agent_observed']['p99']}s"
    )
    print("top self time:")
    for frame, share in raw_self_time(out):
        print(f"  {share:5.1f}%  {frame}")
    print(f"raw profile: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
