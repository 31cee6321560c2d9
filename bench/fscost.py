"""What a new file costs in the file system the agent's root dir is on, at this moment.

The agent makes six inodes a pod (its directory, the sandbox record, the log directories and
file, the container's record); the floor makes none. On an ext4 without a journal (these
machines' disk) each new inode is a scan past the inodes freed in the last minute or so
(`recently_deleted`), so one create costs 10-50 times more after a run has deleted thousands
of files than on a quiet disk. The bench makes each run's directory in a fresh part of the
disk (bench/quietdisk.py) and prints this, measured there, beside the start figures.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench import quietdisk

SAMPLES = 200


def measure(root: Path) -> dict[str, Any]:
    """Milliseconds per mkdir and per file create of SAMPLES new entries in `root` (made here),
    left for the caller to remove (a deletion just before a burst would slow it:
    bench/quietdisk.py)."""
    root.mkdir()
    t0 = time.perf_counter()
    for i in range(SAMPLES):
        os.mkdir(root / f"d{i}")
    t1 = time.perf_counter()
    for i in range(SAMPLES):
        os.close(os.open(root / f"d{i}" / "f", os.O_WRONLY | os.O_CREAT, 0o600))
    t2 = time.perf_counter()
    return {
        "mkdir_ms": round(1000 * (t1 - t0) / SAMPLES, 3),
        "create_ms": round(1000 * (t2 - t1) / SAMPLES, 3),
    }


def line(cost: dict[str, Any]) -> str:
    return (
        f"file system where the agent runs: mkdir {cost['mkdir_ms']:.3f} ms, "
        f"create {cost['create_ms']:.3f} ms (six of these a pod; none in the floor)"
    )


if __name__ == "__main__":
    with quietdisk.scratch("pykubelet-fscost-") as scratch:
        print(line(measure(scratch / "entries")))
