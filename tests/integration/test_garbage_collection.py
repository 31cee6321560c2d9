"""Garbage collection and log rotation by the real agent on each runtime, seen where a user
would look: the engine's own list of containers (or the process runtime's files), the
agent's /containerLogs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.integration.agent import (
    LABEL_POD_UID,
    LABEL_TYPE,
    Agent,
    Backend,
    CriEngine,
    Engine,
    container_state,
    pod_yaml,
    wait_for,
    write_pod,
)


def attempts(backend: Backend, root: Path, uid: str) -> list[int]:
    """The instances of the pod's container the runtime still has, by attempt."""
    engine = backend.engine
    if isinstance(engine, Engine):
        rows = engine.containers(**{LABEL_POD_UID: uid})
        labels = [r["Labels"] for r in rows if r["Labels"][LABEL_TYPE] != "podsandbox"]
        return sorted(int(label["io.kubernetes.container.restartCount"]) for label in labels)
    if isinstance(engine, CriEngine):
        return sorted(c.metadata.attempt for c in engine.containers(**{LABEL_POD_UID: uid}))
    logs = root / "runtime" / "process" / uid / "logs" / "main"
    return sorted(int(p.name.removesuffix(".log")) for p in logs.glob("*.log"))


def test_dead_containers_beyond_the_last_one_are_collected(
    start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path, backend: Backend
) -> None:
    # Each instance prints its start, runs a little and fails: restarted at once, then after
    # 10 s of back-off (the kubelet's timing).
    write_pod(manifests, "crash", pod_yaml("crash", "echo run; sleep 1; exit 1"))
    agent = start_agent(*backend.flags, "--container-gc-period", "1s")
    pod = wait_for(
        "two restarts",
        lambda: (p := agent.pod("crash")) and container_state(p)["restartCount"] >= 2 and p,
        timeout=40,
    )
    uid = pod["metadata"]["uid"]
    # The newest dead instance is kept (--previous), older ones removed.
    remaining = wait_for(
        "the first instances removed",
        lambda: (found := attempts(backend, tmp_path / "root", uid)) and 0 not in found and found,
    )
    assert len(remaining) <= 2, remaining
    assert wait_for("a log", lambda: agent.logs("crash", "main")) == "run\n"
