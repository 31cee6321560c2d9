"""The restricted profile on the process runtime: no_new_privs and capability sets enforced by
the launcher, read from /proc/self/status in the container; what it cannot do is refused
naming the field."""

from __future__ import annotations

import os

import pytest

from pykubelet.runtime.base import StartError
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.unit.test_launcher_security import log_of
from tests.unit.test_process_launcher import with_
from tests.unit.test_process_runtime import make_pod, new_pod, sh, wait_exited

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's features need root")

STATUS = "grep -E '^(CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; id -G"
NET_BIND_SERVICE = 1 << 10


def status(log: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in log.splitlines() if ":\t" in line)


async def run(rt: ProcessRuntime, **fields: object) -> str:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, with_(sh(STATUS), **fields))
    done = await wait_exited(rt, c)
    log = await log_of(rt, c)
    assert done.exit_code == 0, log
    return log


async def test_drop_all_add_one_for_a_user_with_no_new_privs(rt: ProcessRuntime) -> None:
    log = await run(
        rt,
        run_as_user=1000,
        run_as_group=3000,
        supplemental_groups=[2000],
        no_new_privileges=True,
        capabilities_drop=["ALL"],
        capabilities_add=["NET_BIND_SERVICE"],
    )
    st = status(log)
    assert int(st["CapEff"], 16) == NET_BIND_SERVICE
    assert int(st["CapBnd"], 16) == NET_BIND_SERVICE
    assert int(st["CapAmb"], 16) == NET_BIND_SERVICE
    assert st["NoNewPrivs"] == "1" and st["Seccomp"] == "0"
    assert log.split()[-2:] == ["3000", "2000"]


async def test_root_keeps_all_but_what_it_drops(rt: ProcessRuntime) -> None:
    plain = status(await run(rt))
    assert plain["NoNewPrivs"] == "0"
    dropped = status(await run(rt, capabilities_drop=["NET_BIND_SERVICE"], no_new_privileges=True))
    assert int(dropped["CapEff"], 16) == int(plain["CapEff"], 16) & ~NET_BIND_SERVICE
    assert dropped["NoNewPrivs"] == "1"


async def test_what_it_cannot_enforce_is_refused_naming_the_field(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    with pytest.raises(StartError, match=r"securityContext\.seccompProfile: RuntimeDefault"):
        await rt.start_container(pod, sb, with_(sh("true"), seccomp="RuntimeDefault"))
    with pytest.raises(StartError, match="container has runAsNonRoot and image will run as root"):
        await rt.start_container(pod, sb, with_(sh("true"), run_as_non_root=True))
    sysctl = make_pod("sysctl").model_validate(
        {
            **make_pod("sysctl").to_api(),
            "spec": {
                **make_pod("sysctl").to_api()["spec"],
                "securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]},
            },
        }
    )
    sb2 = await rt.run_sandbox(sysctl)
    with pytest.raises(StartError, match=r"spec\.securityContext\.sysctls: not supported"):
        await rt.start_container(sysctl, sb2, sh("true"))
