"""The restricted profile on the docker runtime, against the real engine (the session's private
Podman), read from inside the containers: /proc/self/status (CapEff, NoNewPrivs, Seccomp),
the sandbox's sysctls, /proc masking, and runAsNonRoot checked against the image's user."""

from __future__ import annotations

import asyncio
import functools
import urllib.parse
from pathlib import Path

import pytest

from pykubelet.runtime.base import StartError
from pykubelet.runtime.docker.runtime import DockerRuntime
from tests.integration import restricted_checks as checks
from tests.integration.agent import Engine, _UnixConnection
from tests.integration.test_docker_security import finished, make_pod, runtime, sh

pytestmark = pytest.mark.docker
__all__ = ["runtime"]  # the fixture, shared


async def run(rt: DockerRuntime, script: str, pod_fields: dict[str, object] | None = None,
              **fields: object) -> tuple[int | None, str]:  # fmt: skip
    pod = make_pod()
    if pod_fields:
        pod = pod.model_validate({**pod.to_api(), "spec": {**pod.to_api()["spec"], **pod_fields}})
    sandbox = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, sandbox, sh(script, **fields))
    done = await finished(rt, c)
    return done.exit_code, (await rt.read_log(c)).decode()


async def test_restricted_container_sees_no_caps_no_new_privs_and_a_filter(
    runtime: DockerRuntime,
) -> None:
    await checks.no_caps_no_new_privs_and_a_filter(functools.partial(run, runtime))


async def test_default_is_unconfined_and_capabilities_are_added(runtime: DockerRuntime) -> None:
    await checks.unconfined_by_default_and_capabilities_added(functools.partial(run, runtime))


async def test_localhost_seccomp_profile_from_the_root_dir(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    await checks.localhost_seccomp_profile(
        functools.partial(run, runtime),
        tmp_path / "seccomp",
        "CreateContainerConfigError",
        "securityContext.seccompProfile.localhostProfile: cannot read",
    )


async def test_sysctls_on_the_sandbox_and_proc_unmasked(runtime: DockerRuntime) -> None:
    await checks.sysctls_on_the_sandbox_and_proc_unmasked(functools.partial(run, runtime))


async def test_run_as_non_root_checks_the_images_user(runtime: DockerRuntime) -> None:
    await checks.run_as_non_root_checks_the_images_user(functools.partial(run, runtime))


def commit(engine: Engine, query: dict[str, str]) -> None:
    """POST /commit with the (empty) config body the engine wants."""
    conn = _UnixConnection(engine.path, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1.41/commit?" + urllib.parse.urlencode(query),
            body=b"{}",
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert resp.status < 300, resp.read()
    finally:
        conn.close()


async def test_run_as_non_root_with_a_named_or_a_numeric_image_user(
    runtime: DockerRuntime, container_engine: Engine
) -> None:
    # Images whose configured user is a name or a number: busybox committed with a USER.
    pod = make_pod()
    sandbox = await runtime.run_sandbox(pod)
    base = await finished(runtime, await runtime.start_container(pod, sandbox, sh("true")))
    images = {"nobody": "localhost/busybox-user:named", "1000:1000": "localhost/busybox-user:id"}
    for user, image in images.items():
        repo, tag = image.rsplit(":", 1)
        query = {"container": base.id, "repo": repo, "tag": tag, "changes": f"USER {user}"}
        await asyncio.to_thread(commit, container_engine, query)
    try:
        with pytest.raises(StartError) as info:
            await run(runtime, "id -u", run_as_non_root=True, image=images["nobody"])
        assert info.value.reason == "CreateContainerConfigError"
        assert info.value.message.startswith(
            "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify "
            "user is non-root (pod: "
        )
        code, log = await run(runtime, "id -u", run_as_non_root=True, image=images["1000:1000"])
        assert (code, log.split()) == (0, ["1000"])
    finally:
        for image in images.values():
            path = f"images/{image}"
            await asyncio.to_thread(container_engine.request, "DELETE", path, {"force": "1"})
