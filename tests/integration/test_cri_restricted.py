"""The restricted profile on the CRI runtime, against the real containerd the tests start, read
from inside the containers: /proc/self/status (CapEff, NoNewPrivs, Seccomp), the sandbox's
sysctls, the masked /proc paths, and runAsNonRoot checked against the image's user."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from pykubelet.runtime.cri.runtime import CriRuntime
from tests.integration import restricted_checks as checks
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
    await checks.no_caps_no_new_privs_and_a_filter(functools.partial(run, runtime))


async def test_default_is_unconfined_and_capabilities_are_added(runtime: CriRuntime) -> None:
    await checks.unconfined_by_default_and_capabilities_added(functools.partial(run, runtime))


async def test_localhost_seccomp_profile_from_the_root_dir(
    runtime: CriRuntime, tmp_path: Path
) -> None:
    # containerd reads the profile at create: a missing one is its CreateContainerError.
    await checks.localhost_seccomp_profile(
        functools.partial(run, runtime),
        tmp_path / "root" / "seccomp",
        "CreateContainerError",
        "nope.json",
    )


async def test_sysctls_on_the_sandbox_and_proc_unmasked(runtime: CriRuntime) -> None:
    await checks.sysctls_on_the_sandbox_and_proc_unmasked(functools.partial(run, runtime))


async def test_run_as_non_root_checks_the_images_user(runtime: CriRuntime) -> None:
    await checks.run_as_non_root_checks_the_images_user(functools.partial(run, runtime))
