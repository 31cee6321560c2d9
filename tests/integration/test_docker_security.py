"""The docker runtime's mounts, users, read-only root and pids limit, against the real engine
(the session's private Podman): DockerRuntime driven directly with ContainerConfigs, since
manifests cannot carry volumes or a securityContext yet."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pykubelet.api.model import Pod
from pykubelet.runtime.base import ContainerConfig, ContainerRunState, Mount, RuntimeContainer
from pykubelet.runtime.docker.runtime import DockerRuntime
from tests.integration.agent import Engine

pytestmark = pytest.mark.docker
INFRA = os.environ.get("PYKUBELET_TEST_INFRA_IMAGE", "localhost/pause:test")
TIMEOUT = 60.0


def make_pod() -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": "sec", "namespace": "default", "uid": uuid.uuid4().hex},
            "spec": {"containers": [{"name": "c", "image": "localhost/busybox:test"}]},
        }
    )


def sh(script: str, name: str = "c", **fields: object) -> ContainerConfig:
    base = ContainerConfig(
        name=name,
        image="localhost/busybox:test",
        command=["/bin/sh", "-c", script],
        args=[],
        env=[],
        working_dir=None,
        attempt=0,
        spec_hash="h",
        image_pull_policy="Never",
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def runtime(container_engine: Engine, tmp_path: Path) -> AsyncIterator[DockerRuntime]:
    container_engine.remove_all()
    rt = DockerRuntime(container_engine.endpoint, INFRA, tmp_path, pod_pids_limit=20)
    await rt.start()
    yield rt
    for pod in await rt.list_pods():
        await rt.remove_pod(pod.uid)
    await rt.close()


async def finished(rt: DockerRuntime, c: RuntimeContainer) -> RuntimeContainer:
    deadline = time.monotonic() + TIMEOUT
    while True:
        pod = await rt.get_pod(c.pod_uid)
        found = [x for x in (pod.containers if pod else []) if x.id == c.id]
        if found and found[0].state is ContainerRunState.EXITED:
            return found[0]
        if time.monotonic() > deadline:
            pytest.fail(f"container {c.name} did not exit")
        await asyncio.sleep(0.1)


async def test_binds_user_groups_read_only_root_and_pids_limit(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    data, conf = tmp_path / "data", tmp_path / "conf"
    data.mkdir()
    data.chmod(0o777)
    conf.mkdir()
    (conf / "app.conf").write_text("key=value\n")
    pod = make_pod()
    sandbox = await runtime.run_sandbox(pod)
    script = (
        "id -u; id -g; id -G; cat /conf/app.conf; echo hi > /data/out; "
        "touch /conf/x 2>/dev/null || echo conf-ro; touch /rootfile 2>/dev/null || echo root-ro; "
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"
    )
    c = await runtime.start_container(
        pod,
        sandbox,
        sh(
            script,
            mounts=[Mount(str(data), "/data"), Mount(str(conf), "/conf", read_only=True)],
            run_as_user=1000,
            run_as_group=3000,
            supplemental_groups=[4000],
            read_only_root_filesystem=True,
        ),
    )
    done = await finished(runtime, c)
    log = (await runtime.read_log(c)).decode().split()
    assert done.exit_code == 0, log
    assert log[:2] == ["1000", "3000"] and "4000" in log[2:4]
    assert log[-4:] == ["key=value", "conf-ro", "root-ro", "20"]
    assert (data / "out").read_text() == "hi\n"


async def test_privileged_container_gets_the_devices(runtime: DockerRuntime) -> None:
    pod = make_pod()
    sandbox = await runtime.run_sandbox(pod)
    script = "ls /dev | wc -l"
    plain = await runtime.start_container(pod, sandbox, sh(script, name="plain"))
    privileged = await runtime.start_container(
        pod, sandbox, sh(script, name="privileged", privileged=True)
    )
    counts = []
    for c in (plain, privileged):
        done = await finished(runtime, c)
        log = await runtime.read_log(c)
        assert done.exit_code == 0, log
        counts.append(int(log.split()[-1]))
    assert counts[1] > counts[0]  # the host's devices, not the engine's minimal /dev
