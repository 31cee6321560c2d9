"""The restricted profile on the docker runtime, against the real engine (the session's private
Podman), read from inside the containers: /proc/self/status (CapEff, NoNewPrivs, Seccomp),
the sandbox's sysctls, /proc masking, and runAsNonRoot checked against the image's user."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from pathlib import Path

import pytest

from pykubelet.runtime.base import StartError
from pykubelet.runtime.docker.runtime import DockerRuntime
from tests.integration.agent import Engine, _UnixConnection
from tests.integration.test_docker_security import finished, make_pod, runtime, sh

pytestmark = pytest.mark.docker
__all__ = ["runtime"]  # the fixture, shared

STATUS = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
# CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE,
# SYS_CHROOT, SETFCAP: Podman's default set (it leaves out MKNOD, NET_RAW, AUDIT_WRITE).
NET_ADMIN = 1 << 12


def status(log: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in log.splitlines() if ":\t" in line)


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
    code, log = await run(
        runtime,
        STATUS,
        run_as_user=1000,
        no_new_privileges=True,
        capabilities_drop=["ALL"],
        seccomp="RuntimeDefault",
    )
    assert code == 0, log
    assert status(log) == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}


async def test_default_is_unconfined_and_capabilities_are_added(runtime: DockerRuntime) -> None:
    code, log = await run(runtime, STATUS)
    assert code == 0, log
    plain = status(log)
    assert (plain["NoNewPrivs"], plain["Seccomp"]) == ("0", "0")
    code, log = await run(runtime, STATUS, capabilities_add=["NET_ADMIN"])
    assert code == 0, log
    added = int(status(log)["CapEff"], 16)
    assert added == int(plain["CapEff"], 16) | NET_ADMIN


async def test_localhost_seccomp_profile_from_the_root_dir(
    runtime: DockerRuntime, tmp_path: Path
) -> None:
    (tmp_path / "seccomp" / "profiles").mkdir(parents=True)
    (tmp_path / "seccomp" / "profiles" / "no-mkdir.json").write_text(
        json.dumps(
            {
                "defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}],
            }
        )
    )
    code, log = await run(
        runtime,
        f"{STATUS}; mkdir /tmp/x 2>/dev/null && echo made || echo refused",
        seccomp="Localhost",
        seccomp_localhost_profile="profiles/no-mkdir.json",
    )
    assert code == 0, log
    assert status(log)["Seccomp"] == "2"
    assert log.split()[-1] == "refused"
    with pytest.raises(StartError) as info:
        await run(runtime, "true", seccomp="Localhost", seccomp_localhost_profile="nope.json")
    assert info.value.reason == "CreateContainerConfigError"
    assert "securityContext.seccompProfile.localhostProfile: cannot read" in info.value.message


async def test_sysctls_on_the_sandbox_and_proc_unmasked(runtime: DockerRuntime) -> None:
    keepalive = {"name": "net.ipv4.tcp_keepalive_time", "value": "600"}
    sysctls = {"securityContext": {"sysctls": [keepalive]}}
    # Masked (/proc/keys, /proc/acpi) and read-only (/proc/sys) paths are mounts over /proc.
    script = (
        "cat /proc/sys/net/ipv4/tcp_keepalive_time; "
        "grep -cE ' /proc/(keys|acpi|sys) ' /proc/self/mountinfo"
    )
    _, log = await run(runtime, script, sysctls)
    assert log.split()[0] == "600" and int(log.split()[1]) >= 2, log
    _, log = await run(runtime, script, sysctls, proc_mount_unmasked=True)
    assert log.split() == ["600", "0"], log


async def test_run_as_non_root_checks_the_images_user(runtime: DockerRuntime) -> None:
    with pytest.raises(StartError) as info:
        await run(runtime, "id -u", run_as_non_root=True)
    assert info.value.reason == "CreateContainerConfigError"
    assert info.value.message.startswith(
        "container has runAsNonRoot and image will run as root (pod: "
    )
    code, log = await run(runtime, "id -u", run_as_non_root=True, run_as_user=1000)
    assert (code, log.split()) == (0, ["1000"])


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
