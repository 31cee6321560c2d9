"""The restricted profile on the CRI runtime, against the real containerd the tests start, read
from inside the containers: /proc/self/status (CapEff, NoNewPrivs, Seccomp), the sandbox's
sysctls, the masked /proc paths, and runAsNonRoot checked against the image's user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pykubelet.runtime.base import StartError
from pykubelet.runtime.cri.runtime import CriRuntime
from tests.integration.test_docker_restricted import NET_ADMIN, STATUS, status
from tests.unit.test_cri_runtime import config, exited, make_pod, runtime

pytestmark = pytest.mark.cri
__all__ = ["runtime"]  # the fixture, shared


async def run(rt: CriRuntime, script: str, pod_spec: dict[str, Any] | None = None,
              **fields: Any) -> tuple[int | None, str]:  # fmt: skip
    pod = make_pod(**(pod_spec or {}))
    rt.test_uids.append(pod.uid)  # type: ignore[attr-defined]
    sandbox = await rt.run_sandbox(pod)
    c = await rt.start_container(pod, sandbox, config(script, **fields))
    done = await exited(rt, c)
    return done.exit_code, (await rt.read_log(c)).decode()


async def test_restricted_container_sees_no_caps_no_new_privs_and_a_filter(
    runtime: CriRuntime,
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


async def test_default_is_unconfined_and_capabilities_are_added(runtime: CriRuntime) -> None:
    code, log = await run(runtime, STATUS)
    assert code == 0, log
    plain = status(log)
    assert (plain["NoNewPrivs"], plain["Seccomp"]) == ("0", "0")
    code, log = await run(runtime, STATUS, capabilities_add=["NET_ADMIN"])
    assert code == 0, log
    assert int(status(log)["CapEff"], 16) == int(plain["CapEff"], 16) | NET_ADMIN


async def test_localhost_seccomp_profile_from_the_root_dir(
    runtime: CriRuntime, tmp_path: Path
) -> None:
    profiles = tmp_path / "root" / "seccomp" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "no-mkdir.json").write_text(
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


async def test_sysctls_on_the_sandbox_and_proc_unmasked(runtime: CriRuntime) -> None:
    keepalive = {"name": "net.ipv4.tcp_keepalive_time", "value": "600"}
    spec = {"securityContext": {"sysctls": [keepalive]}}
    script = (
        "cat /proc/sys/net/ipv4/tcp_keepalive_time; "
        "grep -cE ' /proc/(keys|acpi|sys) ' /proc/self/mountinfo"
    )
    _, log = await run(runtime, script, spec)
    assert log.split()[0] == "600" and int(log.split()[1]) >= 2, log
    _, log = await run(runtime, script, spec, proc_mount_unmasked=True)
    assert log.split() == ["600", "0"], log


async def test_run_as_non_root_checks_the_images_user(runtime: CriRuntime) -> None:
    with pytest.raises(StartError) as info:
        await run(runtime, "id -u", run_as_non_root=True)
    assert info.value.reason == "CreateContainerConfigError"
    assert info.value.message.startswith(
        "container has runAsNonRoot and image will run as root (pod: "
    )
    code, log = await run(runtime, "id -u", run_as_non_root=True, run_as_user=1000)
    assert (code, log.split()) == (0, ["1000"])
