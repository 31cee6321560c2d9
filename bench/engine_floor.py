"""The engines' own floor, in one run on one private engine: N pods started by a bare loop of
API calls (no agent), against N pods started by pykubelet on the same engine.

- docker (`run_docker`): a private Podman service (scripts/podman-test-env, as bench/podman.py).
  Per pod the bare loop does what the docker runtime must: create and start the infra container,
  then create (joined to its namespaces) and start the app container; four calls over the
  project's own client (pykubelet/runtime/docker/client.py, aiodocker). `podman kube play` of
  the same pods is timed too (bench/podman.py's).
- remote (`run_cri`): a private containerd (scripts/containerd-test-env). Per pod the bare loop
  makes RunPodSandbox, CreateContainer and StartContainer over the project's CRI client and
  generated stubs (pykubelet/runtime/cri/client.py, proto/).

Each bare loop is timed twice: one pod after another ("sequential", the floor of one pod's work)
and every pod's chain at once ("concurrent", what the engine does with pykubelet's concurrency).
pykubelet's figure is bench/latency.py's: from the first manifest written to the last pod seen
running by polling /pods. Ratios are per pod, against the sequential loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from bench import latency, podman
from bench.stats import percentiles
from bench.targets import Target, at_most
from tests.integration.agent import Agent, CriEngine, Engine

ROOT = Path(__file__).resolve().parent.parent
PODMAN_SCRIPT = ROOT / "scripts" / "podman-test-env"
CONTAINERD_SCRIPT = ROOT / "scripts" / "containerd-test-env"
INFRA_IMAGE = "localhost/pause:test"
IMAGE = "localhost/busybox:test"
COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
CONCURRENCY = 16  # pod chains in flight at once in the concurrent loop


@contextlib.contextmanager
def private_engine(script: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """`script start DIR` … `script stop DIR`: (endpoint, DIR)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        directory = Path(tmp) / "engine"
        out = subprocess.run(
            [str(script), "start", str(directory)], capture_output=True, text=True, check=True
        )
        try:
            yield out.stdout.strip().splitlines()[-1], directory
        finally:
            subprocess.run([str(script), "stop", str(directory)], capture_output=True)


async def _timed(n: int, one: Callable[[int], Awaitable[None]], concurrency: int) -> float:
    started = time.monotonic()
    if concurrency <= 1:
        for i in range(n):
            await one(i)
    else:
        gate = asyncio.Semaphore(concurrency)

        async def gated(i: int) -> None:
            async with gate:
                await one(i)

        await asyncio.gather(*(gated(i) for i in range(n)))
    return time.monotonic() - started


def _figures(n: int, seconds: float) -> dict[str, float]:
    return {"seconds": round(seconds, 3), "per_pod_seconds": round(seconds / n, 4)}


# --- docker ----------------------------------------------------------------------------------


def _docker_labels(kind: str, pod: str, name: str) -> dict[str, str]:
    # The runtime's own labels (docker/convert.py), so Engine.remove_all finds these too.
    return {
        "io.kubernetes.docker.type": kind,
        "io.kubernetes.pod.uid": f"floor-{pod}",
        "io.kubernetes.pod.name": pod,
        "io.kubernetes.pod.namespace": "default",
        "io.kubernetes.container.name": name,
        "io.kubernetes.container.restartCount": "0",
    }


async def _docker_loop(endpoint: str, n: int, tag: str, concurrency: int) -> float:
    from pykubelet.runtime.docker.client import DockerClient

    client = DockerClient(endpoint)
    await client.open()

    async def one(i: int) -> None:
        pod = f"floor{tag}-{i}"
        infra = await client.json(
            "POST",
            "containers/create",
            {"name": f"k8s_POD_{pod}_default_floor-{pod}_0"},
            {
                "Image": INFRA_IMAGE,
                "Hostname": pod,
                "Labels": _docker_labels("podsandbox", pod, "POD"),
                "HostConfig": {"RestartPolicy": {"Name": "no"}, "IpcMode": "shareable"},
            },
        )
        await client.post(f"containers/{infra['Id']}/start")
        join = f"container:{infra['Id']}"
        app = await client.json(
            "POST",
            "containers/create",
            {"name": f"k8s_main_{pod}_default_floor-{pod}_0"},
            {
                "Image": IMAGE,
                "Entrypoint": COMMAND,
                "Cmd": [],
                "Env": ["VERSION=1"],
                "Labels": _docker_labels("container", pod, "main"),
                "HostConfig": {
                    "NetworkMode": join,
                    "IpcMode": join,
                    "UTSMode": join,
                    "RestartPolicy": {"Name": "no"},
                },
            },
        )
        await client.post(f"containers/{app['Id']}/start")

    try:
        return await _timed(n, one, concurrency)
    finally:
        await client.close()


def _pykubelet(n: int, extra: list[str]) -> dict[str, Any]:
    """Only the start of bench/latency.py's scenario: n manifests, until all run."""
    with tempfile.TemporaryDirectory(prefix="pykubelet-floor-") as tmp:
        base = Path(tmp)
        manifests = base / "manifests"
        manifests.mkdir()
        scenario = latency.Scenario(n, str(os.getpid() % 1000).zfill(3), IMAGE, True)
        agent = Agent(
            manifests, base / "root", base / "agent.log", ["--max-pods", str(n + 10), *extra]
        )
        agent.start()
        try:
            written: dict[int, float] = {}
            for i in range(n):
                tmp_path = manifests / f".bench-{i}.tmp"
                tmp_path.write_text(scenario.manifest(i, 1))
                os.replace(tmp_path, manifests / f"bench-{i}.json")
                written[i] = time.time()
            observed, polled, total, _ = latency._wait_running(agent, n, written, {}, 600)
        finally:
            # Killed, not stopped: its pods are removed by the caller, all at once.
            agent.stop(signal.SIGKILL, timeout=120)
    return {
        "agent_observed": percentiles(observed),
        "external_poll": percentiles(polled),
        **_figures(n, total),
    }


def run_docker(n: int) -> dict[str, Any]:
    with private_engine(PODMAN_SCRIPT, "pykubelet-floor-podman-") as (endpoint, directory):
        engine = Engine(endpoint)
        with tempfile.TemporaryDirectory(prefix="pykubelet-play-") as play_dir:
            play = podman._kube_play(n, podman._podman_env(directory), Path(play_dir))
        engine.remove_all()
        sequential = asyncio.run(_docker_loop(endpoint, n, "s", 1))
        engine.remove_all()
        concurrent = asyncio.run(_docker_loop(endpoint, n, "c", CONCURRENCY))
        engine.remove_all()
        ours = _pykubelet(
            n,
            [
                "--container-runtime",
                "docker",
                "--container-runtime-endpoint",
                endpoint,
                "--pod-infra-container-image",
                INFRA_IMAGE,
            ],
        )
        engine.remove_all()
    per_pod = ours["per_pod_seconds"]
    floor = sequential / n
    return {
        "n": n,
        "podman_kube_play": play,
        "bare_sequential": _figures(n, sequential),
        "bare_concurrent": _figures(n, concurrent),
        "pykubelet_docker": ours,
        "ratio_to_kube_play": round(per_pod / play["per_pod_seconds"], 2),
        "ratio_to_bare_loop": round(per_pod / floor, 2),
        "ratio_to_bare_concurrent": round(per_pod / (concurrent / n), 2),
    }


# --- remote (CRI) ----------------------------------------------------------------------------


async def _cri_loop(endpoint: str, n: int, tag: str, concurrency: int, logs: Path) -> float:
    from pykubelet.runtime.cri.client import CriClient
    from pykubelet.runtime.cri.proto import cri_api_pb2 as api

    client = CriClient(endpoint)
    await client.wait_ready(10)

    async def one(i: int) -> None:
        pod = f"floor{tag}-{i}"
        labels = {"io.pykubelet.managed": "true", "io.kubernetes.pod.name": pod}
        log_dir = logs / pod
        await asyncio.to_thread(os.makedirs, log_dir / "main", exist_ok=True)
        config = api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(
                name=pod, uid=f"floor-{pod}", namespace="default", attempt=0
            ),
            hostname=pod,
            log_directory=str(log_dir),
            labels=labels,
            linux=api.LinuxPodSandboxConfig(
                security_context=api.LinuxSandboxSecurityContext(
                    namespace_options=api.NamespaceOption(
                        network=api.POD, pid=api.CONTAINER, ipc=api.POD
                    )
                )
            ),
        )
        sandbox = await client.call(
            "RunPodSandbox", api.RunPodSandboxRequest(config=config), api.RunPodSandboxResponse
        )
        container = api.ContainerConfig(
            metadata=api.ContainerMetadata(name="main", attempt=0),
            image=api.ImageSpec(image=IMAGE),
            command=COMMAND,
            envs=[api.KeyValue(key="VERSION", value="1")],
            labels={**labels, "io.kubernetes.container.name": "main"},
            log_path="main/0.log",
            linux=api.LinuxContainerConfig(
                security_context=api.LinuxContainerSecurityContext(
                    namespace_options=api.NamespaceOption(
                        network=api.POD, pid=api.CONTAINER, ipc=api.POD
                    )
                )
            ),
        )
        created = await client.call(
            "CreateContainer",
            api.CreateContainerRequest(
                pod_sandbox_id=sandbox.pod_sandbox_id, config=container, sandbox_config=config
            ),
            api.CreateContainerResponse,
        )
        await client.call(
            "StartContainer",
            api.StartContainerRequest(container_id=created.container_id),
            api.StartContainerResponse,
        )

    try:
        return await _timed(n, one, concurrency)
    finally:
        await client.close()


def run_cri(n: int) -> dict[str, Any]:
    with private_engine(CONTAINERD_SCRIPT, "pykubelet-floor-containerd-") as (endpoint, directory):
        engine = CriEngine(endpoint, (directory / "gateway").read_text().strip())
        logs = directory / "floor-logs"
        engine.remove_all()
        sequential = asyncio.run(_cri_loop(endpoint, n, "s", 1, logs))
        engine.remove_all()
        concurrent = asyncio.run(_cri_loop(endpoint, n, "c", CONCURRENCY, logs))
        engine.remove_all()
        ours = _pykubelet(
            n,
            [
                "--container-runtime",
                "remote",
                "--container-runtime-endpoint",
                endpoint,
                "--pod-infra-container-image",
                INFRA_IMAGE,
            ],
        )
        engine.remove_all()
    per_pod = ours["per_pod_seconds"]
    return {
        "n": n,
        "bare_sequential": _figures(n, sequential),
        "bare_concurrent": _figures(n, concurrent),
        "pykubelet_remote": ours,
        "ratio_to_bare_loop": round(per_pod / (sequential / n), 2),
        "ratio_to_bare_concurrent": round(per_pod / (concurrent / n), 2),
    }


def run(n: int) -> dict[str, Any]:
    """Both engines, one after the other (each on its own private engine)."""
    return {"docker": run_docker(n), "remote": run_cri(n)}


if __name__ == "__main__":
    import json
    import sys

    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    result = {"docker": run_docker, "remote": run_cri, "all": run}[which](count)
    print(json.dumps(result, indent=2))


def targets(r: dict[str, Any]) -> list[Target]:
    """Issue 19's engine targets: docker ≤ 0.5x kube play's per-pod time and ≤ 1.3x the bare
    loop (its concurrent form: pykubelet starts pods concurrently too), remote ≤ 1.3x its loop."""
    d, c = r["docker"], r["remote"]
    ours_d, ours_c = (
        d["pykubelet_docker"]["per_pod_seconds"],
        c["pykubelet_remote"]["per_pod_seconds"],
    )
    play = d["podman_kube_play"]["per_pod_seconds"]
    bare_d = d["bare_concurrent"]["per_pod_seconds"]
    bare_c = c["bare_concurrent"]["per_pod_seconds"]
    return [
        at_most("docker, per pod / podman kube play", d["ratio_to_kube_play"], 0.5, "x",
                f"{ours_d:.3f} s / {play:.3f} s"),
        at_most("docker, per pod / bare create+start loop", d["ratio_to_bare_concurrent"], 1.3,
                "x", f"{ours_d:.3f} s / {bare_d:.3f} s"),
        at_most("remote, per pod / bare CRI loop", c["ratio_to_bare_concurrent"], 1.3, "x",
                f"{ours_c:.3f} s / {bare_c:.3f} s"),
    ]  # fmt: skip
