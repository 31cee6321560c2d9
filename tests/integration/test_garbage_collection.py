"""Garbage collection and log rotation by the real agent on each runtime, seen where a user
would look: the engine's own list of containers (or the process runtime's files), the
agent's /containerLogs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import (
    LABEL_POD_NAME,
    LABEL_POD_UID,
    LABEL_TYPE,
    NODE,
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
    write_pod(
        manifests,
        "crash",
        pod_yaml("crash", "echo run; sleep 1; exit 1")
        + "    terminationMessagePath: /dev/termination-log\n",
    )
    agent = start_agent(*backend.flags, "--container-gc-period", "1s")
    pod = wait_for(
        "two restarts",
        lambda: (p := agent.pod("crash")) and container_state(p)["restartCount"] >= 2 and p,
        timeout=40,
    )
    uid = pod["metadata"]["uid"]
    # The newest dead instance is kept (--previous), older ones removed.
    messages = tmp_path / "root" / "pods" / uid / "containers" / "main"
    # Each instance's termination-log file goes with it.
    remaining = wait_for(
        "the first instances removed, with their termination-log files",
        lambda: (
            (found := attempts(backend, tmp_path / "root", uid))
            and 0 not in found
            and len(list(messages.iterdir())) == len(found)
            and found
        ),
    )
    assert len(remaining) <= 2, remaining
    assert wait_for("a log", lambda: agent.logs("crash", "main")) == "run\n"


EXTRA = "localhost/gc-extra:test"
DOCKER = pytest.param("docker", marks=pytest.mark.docker)
REMOTE = pytest.param("remote", marks=pytest.mark.cri)


def _tiny_archive(out: Path) -> None:
    """A Docker archive of an image of one small file, not busybox's (another image id)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        data = os.urandom(4096)
        info = tarfile.TarInfo("gc-extra")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/bin"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()],
            },
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [EXTRA], "Layers": ["l.tar"]}])
    with tarfile.open(out, "w") as t:
        for name, data in (
            ("l.tar", layer_bytes),
            (config_name, config),
            ("manifest.json", manifest.encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def add_unused_image(backend: Backend, tmp_path: Path, pod_name: str) -> None:
    """An image no container uses: on docker the pod's container committed (a new image id),
    on the CRI an archive imported with containerd's own `ctr`."""
    engine = backend.engine
    if isinstance(engine, Engine):
        rows = engine.containers(**{LABEL_POD_NAME: f"{pod_name}-{NODE}"})
        cid = next(r["Id"] for r in rows if r["Labels"][LABEL_TYPE] != "podsandbox")
        engine.request(
            "POST",
            "commit",
            {"container": cid, "repo": "localhost/gc-extra", "tag": "test"},
            body={},
        )
        return
    assert isinstance(engine, CriEngine)
    archive = tmp_path / "extra.tar"
    _tiny_archive(archive)
    address = engine.endpoint.removeprefix("unix://")
    subprocess.run(
        ["ctr", "--address", address, "--namespace", "k8s.io", "images", "import", str(archive)],
        check=True,
        capture_output=True,
    )


def image_names(backend: Backend) -> set[str]:
    engine = backend.engine
    if isinstance(engine, Engine):
        return {
            t
            for row in engine.request("GET", "images/json") or []
            for t in row.get("RepoTags") or []
        }
    assert isinstance(engine, CriEngine)
    api = engine.api
    reply: Any = engine.call(
        "ListImages", api.ListImagesRequest(), api.ListImagesResponse, service="ImageService"
    )
    return {t for image in reply.images for t in image.repo_tags}


@pytest.mark.parametrize("backend", [DOCKER, REMOTE], indirect=True)
def test_unused_images_are_removed_above_the_high_threshold(
    start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path, backend: Backend
) -> None:
    write_pod(manifests, "busy", pod_yaml("busy", backend.forever()))
    # The image file system is surely over 1 % used: every pass frees what it can and, short
    # of 0 %, says it could not free enough.
    agent = start_agent(
        *backend.flags,
        "--image-gc-high-threshold", "1",
        "--image-gc-low-threshold", "0",
        "--image-minimum-gc-age", "0s",
        "--image-gc-period", "1s",
    )  # fmt: skip
    wait_for("busy running", lambda: "running" in container_state(agent.pod("busy"))["state"])
    add_unused_image(backend, tmp_path, "busy")
    assert EXTRA in image_names(backend)
    wait_for("the unused image removed", lambda: EXTRA not in image_names(backend))
    names = image_names(backend)
    # The image a container uses and the pod infra image stay.
    assert {"localhost/busybox:test", "localhost/pause:test"} <= names, names
    events = wait_for(
        "the events",
        lambda: [
            e for e in agent.events() if e["reason"] in ("FreeDiskSpaceFailed", "ImageGCFailed")
        ],
    )
    assert events[0]["involvedObject"]["kind"] == "Node"
    assert events[0]["message"].startswith("Failed to garbage collect required amount of images.")


# About 12 KB a second: a line number and 100 x's.
WRITER = (
    'i=0; while :; do i=$((i+1)); echo "line $i $(head -c 100 /dev/zero | tr "\\0" x)"; '
    "sleep 0.01; done"
)


def log_files(backend: Backend, root: Path, pod: dict[str, Any]) -> list[Path]:
    uid = pod["metadata"]["uid"]
    if backend.engine is None:
        directory = root / "runtime" / "process" / uid / "logs" / "main"
    else:
        name = pod["metadata"]["name"]
        directory = root / "logs" / "pods" / f"default_{name}_{uid}" / "main"
    return sorted(directory.glob("0.log*"))


def numbers(text: str) -> list[int]:
    """The numbers of the whole lines the writer wrote (a first line cut by a rotation of the
    process runtime's file, at a block boundary, is left out)."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "line" and parts[2] == "x" * 100:
            out.append(int(parts[1]))
    return out


@pytest.mark.parametrize("backend", ["process", REMOTE], indirect=True)
def test_logs_rotate_and_the_latest_lines_still_show(
    start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path, backend: Backend
) -> None:
    # The writer shell is PID 1 in a container and ignores SIGTERM: a short grace ends the test.
    write_pod(manifests, "chatty", pod_yaml("chatty", WRITER, grace=2))
    agent = start_agent(
        *backend.flags,
        "--container-log-max-size", "16Ki",
        "--container-log-max-files", "3",
        "--container-log-monitor-interval", "1s",
    )  # fmt: skip
    wait_for("chatty running", lambda: "running" in container_state(agent.pod("chatty"))["state"])
    pod = agent.pod("chatty")
    # Rotated, then compressed at the next rotation, and never more than 3 files.
    files = wait_for(
        "a compressed rotated log",
        lambda: (
            (found := log_files(backend, tmp_path / "root", pod))
            and any(p.name.endswith(".gz") for p in found)
            and found
        ),
        timeout=60,
    )
    for _ in range(5):
        files = log_files(backend, tmp_path / "root", pod)
        assert len([p for p in files if not p.name.endswith(".tmp")]) <= 3, files
        time.sleep(1)
    # What /containerLogs shows is the current file: consecutive lines, up to the latest.
    first = numbers(agent.logs("chatty", "main"))
    assert first and first == list(range(first[0], first[-1] + 1)), first[:5]
    later = wait_for(
        "more lines",
        lambda: (
            (n := numbers(agent.logs("chatty", "main", "?tailLines=5"))) and n[-1] > first[-1] and n
        ),
    )
    assert later == list(range(later[0], later[0] + len(later))), later
    # The rotated files hold what came before, none lost: the oldest kept file onwards.
    ordered = sorted(
        log_files(backend, tmp_path / "root", pod), key=lambda p: (p.name == "0.log", p.name)
    )
    blob = b"".join(
        gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        for p in ordered
        if not p.name.endswith(".tmp")
    )
    if backend.engine is not None:
        blob = b"".join(
            line.split(b" ", 3)[3] + b"\n" for line in blob.splitlines() if line.count(b" ") >= 3
        )
    seen = numbers(blob.decode())
    assert seen == list(range(seen[0], seen[0] + len(seen))), "a line was lost"
