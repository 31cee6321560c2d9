"""Faults of the file source: what happens to running pods when the directory misbehaves."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.integration.agent import NODE, container_state, pod_yaml, wait_for, write_pod


def running_names(agent) -> set[str]:  # type: ignore[no-untyped-def]
    return {
        name
        for name, pod in agent.pods().items()
        if (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("running")
    }


def test_files_renamed_over_each_other(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "a", pod_yaml("alpha", "echo alpha; sleep 600"), filename="a.yaml")
    write_pod(manifests, "b", pod_yaml("beta", "echo beta; sleep 600"), filename="b.yaml")
    agent = start_agent()
    wait_for("both running", lambda: running_names(agent) == {f"alpha-{NODE}", f"beta-{NODE}"})
    os.rename(manifests / "a.yaml", manifests / "tmp.yaml")
    os.rename(manifests / "b.yaml", manifests / "a.yaml")
    os.rename(manifests / "tmp.yaml", manifests / "b.yaml")
    # Each pod now comes from the other file (a new UID each): both restart, neither is lost.
    time.sleep(1)
    wait_for(
        "both running again", lambda: running_names(agent) == {f"alpha-{NODE}", f"beta-{NODE}"}
    )
    assert agent.logs("alpha", "main") == "alpha\n" and agent.logs("beta", "main") == "beta\n"
    assert len(agent.pods()) == 2


def test_symlink_loop_and_dangling_link_are_reported(start_agent, manifests: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "ok", pod_yaml("ok", "sleep 600"))
    os.symlink(manifests / "loop.yaml", manifests / "loop.yaml")
    os.symlink(manifests / "nowhere", manifests / "dangling.yaml")
    agent = start_agent()
    wait_for("ok running", lambda: running_names(agent) == {f"ok-{NODE}"})
    messages = wait_for(
        "both reported",
        lambda: (
            (m := [e["message"] for e in agent.events() if "cannot read" in e["message"]])
            and len(m) == 2
            and m
        ),
    )
    assert any("loop.yaml: cannot read: Too many levels of symbolic links" in m for m in messages)
    assert any("dangling.yaml: cannot read: No such file or directory" in m for m in messages)


def test_directory_removed_and_recreated(start_agent, manifests: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "web", pod_yaml("web", "sleep 600"))
    agent = start_agent()
    wait_for("running", lambda: running_names(agent) == {f"web-{NODE}"})
    backup = tmp_path / "backup"
    shutil.copytree(manifests, backup)
    shutil.rmtree(manifests)
    # As the kubelet: a directory that is gone holds no pods.
    wait_for("removed with the directory", lambda: agent.pods() == {})
    shutil.copytree(backup, manifests)
    wait_for("back with the directory", lambda: running_names(agent) == {f"web-{NODE}"}, timeout=30)


@pytest.mark.parametrize(
    ("files", "capacity"),
    [(400, 40), pytest.param(10_000, 200, marks=pytest.mark.soak, id="soak")],
    ids=lambda n: f"{n}",
)
def test_many_files_at_once_are_admitted_up_to_max_pods(  # type: ignore[no-untyped-def]
    start_agent, manifests: Path, files: int, capacity: int
) -> None:
    agent = start_agent("--max-pods", str(capacity))
    for i in range(files):
        write_pod(manifests, f"p{i}", pod_yaml(f"p{i}", "sleep 600"))
    wait = 60 + files / 50  # the soak's 10,000 files: about 4 minutes on 2 noisy cores
    wait_for("all listed", lambda: len(agent.pods()) == files, timeout=wait, interval=1)
    wait_for("all running", lambda: len(running_names(agent)) == capacity, timeout=wait)
    pods = agent.pods().values()
    rejected = [p for p in pods if p["status"].get("reason") == "OutOfpods"]
    assert len(rejected) == files - capacity
    assert all(container_state(p) for p in pods if p["status"].get("reason") != "OutOfpods")
    assert agent.get("/healthz") == (200, b"ok")
