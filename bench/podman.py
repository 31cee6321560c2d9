"""Side by side, in one run: N pods by `podman kube play` and by pykubelet's docker runtime
against the same private Podman service (scripts/podman-test-env).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import latency

ROOT = Path(__file__).resolve().parent.parent
ENV_SCRIPT = ROOT / "scripts" / "podman-test-env"


def _podman_env(directory: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(ENV_SCRIPT), "env", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        line = line.removeprefix("export ").strip()
        if "=" in line:
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


def _kube_play(n: int, env: dict[str, str], directory: Path) -> dict[str, float]:
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"play-{i}"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "localhost/busybox:test",
                        "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    }
                ]
            },
        }
        for i in range(n)
    ]
    path = directory / "play.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    started = time.monotonic()
    subprocess.run(["podman", "kube", "play", str(path)], env=env, check=True, capture_output=True)
    play = time.monotonic() - started
    started = time.monotonic()
    subprocess.run(["podman", "kube", "down", str(path)], env=env, check=True, capture_output=True)
    down = time.monotonic() - started
    return {
        "play_seconds": round(play, 3),
        "per_pod_seconds": round(play / n, 4),
        "down_seconds": round(down, 3),
    }


def run(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pykubelet-podman-") as tmp:
        directory = Path(tmp) / "podman"
        endpoint = (
            subprocess.run(
                [str(ENV_SCRIPT), "start", str(directory)],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        try:
            env = _podman_env(directory)
            play = _kube_play(n, env, Path(tmp))
            ours = latency.run(
                n,
                extra=[
                    "--container-runtime",
                    "docker",
                    "--container-runtime-endpoint",
                    endpoint,
                    "--pod-infra-container-image",
                    "localhost/pause:test",
                ],
                timeout=600,
                image="localhost/busybox:test",
                handles_term=True,
            )
        finally:
            subprocess.run([str(ENV_SCRIPT), "stop", str(directory)], capture_output=True)
    per_pod = ours["start"]["all_running_seconds"] / n
    return {
        "n": n,
        "podman_kube_play": play,
        "pykubelet_docker": ours,
        "pykubelet_per_pod_seconds": round(per_pod, 4),
        "ratio_to_kube_play": round(per_pod / play["per_pod_seconds"], 2),
    }
