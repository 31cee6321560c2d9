"""A py-spy profile of the agent during the 1,000-pod latency scenario: the top hot spots.

python -m bench.profile [N]   (needs py-spy: `pip install py-spy`)
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import latency
from tests.integration.agent import Agent


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 1
    out = Path(tempfile.mkdtemp(prefix="pykubelet-profile-")) / "profile.txt"
    recorder: list[subprocess.Popen[bytes]] = []

    def attach(agent: Agent) -> None:
        assert agent.proc is not None
        recorder.append(
            subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(agent.proc.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--output",
                    str(out),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    result = latency.run(n, on_start=attach)
    recorder[0].wait(timeout=60)
    self_time: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        total += int(count)
        self_time[frames[-1]] += int(count)
    print(
        f"n={n}: start p99 {result['start']['agent_observed']['p99']}s, "
        f"edit p99 {result['edit']['agent_observed']['p99']}s; {total} samples"
    )
    print("top self time:")
    for frame, count in self_time.most_common(15):
        print(f"  {100 * count / total:5.1f}%  {frame}")
    print(f"raw profile: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
