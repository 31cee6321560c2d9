"""The agent's collector settings: what start-up made is never scanned again, and a reference
cycle made afterwards is still freed. Run in a child interpreter: the settings are the
process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import gc, weakref
    from pykubelet.common.gcpolicy import YOUNG_THRESHOLD, tune_collector

    class Node:
        pass

    before = Node()
    tune_collector()
    assert gc.get_freeze_count() > 0, "nothing frozen"
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD

    # A cycle made now, then dropped: reference counting cannot free it, the collector must.
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    kept = [[] for _ in range(2 * YOUNG_THRESHOLD)]  # allocations enough for a young collection
    assert gone() is None, "the cycle outlived a young collection"
    print("ok", len(kept))
    """
)


def test_a_cycle_made_after_tuning_is_freed_by_a_young_collection() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")
