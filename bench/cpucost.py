"""What a start burst costs in CPU: the process's own, the whole machine's, and the machine's
fastest spawns (issue 19: why the agent's bursts stay above 1.3x the floor's).

- `window(pid)` reads a process's CPU time (user + system, all its threads) and the machine's
  busy time through a burst. The floor's process and the agent's are measured the same way,
  from the first manifest written to the last process started (within 20 ms: the samples'
  spacing). The machine's figure holds the containers' own start (their exec and dynamic
  loading), the bench's polls, and whatever else ran on this shared machine meanwhile.
- `spawn_capacity()` times the least the machine takes per spawn of a `sleep`: one thread
  spawning back to back as the floor does (os.posix_spawnp), and two threads spawning side by
  side through pykubelet's own posix_spawn without the interpreter lock. On 2 cores the
  second is the floor under any agent's 1,000-process burst.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pykubelet.runtime.process import posixspawn

_TICK = os.sysconf("SC_CLK_TCK")
SPAWNS = 400
SAMPLE_SECONDS = 0.02  # /proc's CPU times count in 10 ms ticks


def _process_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime, all its threads


def _machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK  # all but idle and iowait


class Window:
    """The process's and the machine's CPU time, sampled every SAMPLE_SECONDS from `begin` to
    `end` by a thread, so that a burst's figures can end when its last process started rather
    than when the bench noticed it (`until`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._samples: list[tuple[float, float, float]] = []  # wall time, process, machine
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-window", daemon=True)

    def _sample(self) -> None:
        try:
            process = _process_seconds(self.pid)
        except OSError:
            return  # gone (a floor or an agent that failed): its error is the caller's to tell
        self._samples.append((time.time(), process, _machine_busy_seconds()))

    def _run(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            self._sample()

    def begin(self) -> None:
        self._sample()
        self._thread.start()

    def end(self) -> None:
        self._done.set()
        self._thread.join()
        self._sample()

    def until(self, at: float) -> dict[str, float]:
        """From `begin` to the first sample at or after wall time `at` (or the last one)."""
        if not self._samples:
            return {}
        began, process, machine = self._samples[0]
        last = next((s for s in self._samples if s[0] >= at), self._samples[-1])
        return {
            "process_cpu_seconds": round(last[1] - process, 2),
            "machine_cpu_seconds": round(last[2] - machine, 2),
            "seconds": round(last[0] - began, 3),
        }


@contextmanager
def window(pid: int) -> Iterator[Window]:
    w = Window(pid)
    w.begin()
    try:
        yield w
    finally:
        w.end()


def spawn_capacity(spawns: int = SPAWNS) -> dict[str, Any]:
    """Milliseconds per spawn of `sleep` at the machine's fastest: one thread (os.posix_spawnp,
    as the floor), and two threads (posix_spawn without the interpreter lock, as the agent)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    quiet = [(os.POSIX_SPAWN_DUP2, devnull, fd) for fd in (0, 1, 2)]
    env = dict(os.environ)

    def timed(threads: int, one: Any) -> float:
        pids: list[int] = []
        lock = threading.Lock()

        def spawn_share(first: int) -> None:
            for i in range(first, spawns, threads):
                pid = one(i)
                with lock:
                    pids.append(pid)

        workers = [threading.Thread(target=spawn_share, args=(k,)) for k in range(threads)]
        began = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        took = time.perf_counter() - began
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        return round(1000 * took / spawns, 3)

    def floor_way(i: int) -> int:
        argv = ["sleep", f"600.{i}"]
        return os.posix_spawnp("sleep", argv, env, file_actions=quiet)

    def agent_way(i: int) -> int:
        return posixspawn.spawn_process("sleep", ["sleep", f"600.{i}"], env, "/", devnull, devnull)

    try:
        result: dict[str, Any] = {"spawns": spawns, "one_thread_ms": timed(1, floor_way)}
        if posixspawn.available():
            result["two_threads_ms"] = timed(2, agent_way)
        return result
    finally:
        os.close(devnull)


def line(capacity: dict[str, Any]) -> str:
    two = capacity.get("two_threads_ms")
    return (
        f"spawn capacity: {capacity['one_thread_ms']:.3f} ms a spawn from one thread (as the "
        "floor)" + (f", {two:.3f} ms from two side by side (the machine's fastest)" if two else "")
    )


def pair_line(n: int, floor: dict[str, float], agent: dict[str, float]) -> str:
    """One floor-then-agent pair's CPU, each as its own (a pod's share) and the machine's."""

    def part(figures: dict[str, float]) -> str:
        own = figures["process_cpu_seconds"]
        return (
            f"{own:.2f} s ({1000 * own / n:.2f} ms a pod), machine "
            f"{figures['machine_cpu_seconds']:.2f} s in {figures['seconds']:.2f} s"
        )

    return f"cpu     n={n:>4}: floor {part(floor)} | agent {part(agent)}"


if __name__ == "__main__":
    print(line(spawn_capacity()))
