"""What the restricted profile looks like from inside a container, checked the same way on every
container runtime: each check takes the runtime's `run(script, pod_spec, **container_fields)`
(start a pod with one container running `script`, wait for it to exit, return its exit code and
log) and asserts what the container saw in /proc/self/status, /proc/sys and its mounts."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pykubelet.runtime.base import StartError

Run = Callable[..., Awaitable[tuple[int | None, str]]]

STATUS = "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
# CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP, NET_BIND_SERVICE,
# SYS_CHROOT, SETFCAP: the engines' default set (they leave out MKNOD, NET_RAW, AUDIT_WRITE).
NET_ADMIN = 1 << 12


def status(log: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in log.splitlines() if ":\t" in line)


async def no_caps_no_new_privs_and_a_filter(run: Run) -> None:
    code, log = await run(
        STATUS,
        run_as_user=1000,
        no_new_privileges=True,
        capabilities_drop=["ALL"],
        seccomp="RuntimeDefault",
    )
    assert code == 0, log
    assert status(log) == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}


async def unconfined_by_default_and_capabilities_added(run: Run) -> None:
    code, log = await run(STATUS)
    assert code == 0, log
    plain = status(log)
    assert (plain["NoNewPrivs"], plain["Seccomp"]) == ("0", "0")
    code, log = await run(STATUS, capabilities_add=["NET_ADMIN"])
    assert code == 0, log
    assert int(status(log)["CapEff"], 16) == int(plain["CapEff"], 16) | NET_ADMIN


async def localhost_seccomp_profile(run: Run, seccomp_root: Path, missing: str, says: str) -> None:
    """`seccomp_root` is `<root-dir>/seccomp`, where Localhost profiles are looked up; a
    missing profile fails the start with the reason `missing` and a message holding `says` (the
    docker runtime reads the file itself, the CRI runtime's engine reads it at create)."""
    (seccomp_root / "profiles").mkdir(parents=True)
    (seccomp_root / "profiles" / "no-mkdir.json").write_text(
        json.dumps(
            {
                "defaultAction": "SCMP_ACT_ALLOW",
                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}],
            }
        )
    )
    code, log = await run(
        f"{STATUS}; mkdir /tmp/x 2>/dev/null && echo made || echo refused",
        seccomp="Localhost",
        seccomp_localhost_profile="profiles/no-mkdir.json",
    )
    assert code == 0, log
    assert status(log)["Seccomp"] == "2"
    assert log.split()[-1] == "refused"
    with pytest.raises(StartError) as info:
        await run("true", seccomp="Localhost", seccomp_localhost_profile="nope.json")
    assert info.value.reason == missing
    assert says in info.value.message, info.value.message


async def sysctls_on_the_sandbox_and_proc_unmasked(run: Run) -> None:
    keepalive = {"name": "net.ipv4.tcp_keepalive_time", "value": "600"}
    spec: dict[str, Any] = {"securityContext": {"sysctls": [keepalive]}}
    # Masked (/proc/keys, /proc/acpi) and read-only (/proc/sys) paths are mounts over /proc.
    script = (
        "cat /proc/sys/net/ipv4/tcp_keepalive_time; "
        "grep -cE ' /proc/(keys|acpi|sys) ' /proc/self/mountinfo"
    )
    _, log = await run(script, spec)
    assert log.split()[0] == "600" and int(log.split()[1]) >= 2, log
    _, log = await run(script, spec, proc_mount_unmasked=True)
    assert log.split() == ["600", "0"], log


async def run_as_non_root_checks_the_images_user(run: Run) -> None:
    with pytest.raises(StartError) as info:
        await run("id -u", run_as_non_root=True)
    assert info.value.reason == "CreateContainerConfigError"
    assert info.value.message.startswith(
        "container has runAsNonRoot and image will run as root (pod: "
    )
    code, log = await run("id -u", run_as_non_root=True, run_as_user=1000)
    assert (code, log.split()) == (0, ["1000"])
