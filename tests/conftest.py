"""Fixtures shared by the unit and integration tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.fixtures.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
CONTAINERD_SCRIPT = ROOT / "scripts" / "containerd-test-env"
PODMAN_SCRIPT = ROOT / "scripts" / "podman-test-env"
# An engine already running (Docker, or a Podman service) instead of the private Podman.
DOCKER_ENDPOINT_VARIABLE = "PYKUBELET_TEST_DOCKER_ENDPOINT"
# A CRI runtime already running (its socket) instead of the private containerd; it must have
# localhost/pause:test and busybox:test (see the script).
CRI_ENDPOINT_VARIABLE = "PYKUBELET_TEST_CRI_ENDPOINT"


@contextlib.contextmanager
def private_service(
    script: Path, prefix: str, needs: str, alternative: str
) -> Iterator[tuple[str, Path]]:
    """`script start DIR` a private service for the session, `script stop DIR` afterwards;
    yields (the endpoint it prints last, DIR). If it cannot start, the tests that need it fail
    with the reason: they are part of what `make test` checks, and a skip would hide that."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        proc = subprocess.run(
            [str(script), "start", str(directory)],
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        proc = subprocess.CompletedProcess(e.cmd, 1, "", f"timed out after {e.timeout}s")
    if proc.returncode != 0:
        subprocess.run([str(script), "stop", str(directory)], capture_output=True, timeout=120)
        pytest.fail(
            f"{needs}; `{script.relative_to(ROOT)} start` failed "
            f"(exit {proc.returncode}):\n{proc.stderr.strip()}\n{alternative}",
            pytrace=False,
        )
    try:
        yield proc.stdout.strip().splitlines()[-1], directory
    finally:
        subprocess.run([str(script), "stop", str(directory)], capture_output=True, timeout=300)


@dataclass(frozen=True)
class Containerd:
    endpoint: str
    gateway: str  # the host's address on the pod network, as the containers reach it


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    """A private containerd with its CRI plugin for the session (scripts/containerd-test-env),
    or the runtime named by $PYKUBELET_TEST_CRI_ENDPOINT. Without one the remote runtime's tests
    fail: they are part of what `make test` checks, and a skip would hide that they never ran."""
    endpoint = os.environ.get(CRI_ENDPOINT_VARIABLE)
    if endpoint:
        yield Containerd(endpoint, os.environ.get("PYKUBELET_TEST_CRI_GATEWAY", "127.0.0.1"))
        return
    with private_service(
        CONTAINERD_SCRIPT,
        "pykubelet-containerd-",
        "the remote runtime's tests need containerd (Debian: containerd, runc, "
        "containernetworking-plugins, busybox-static) and root",
        f"(or point {CRI_ENDPOINT_VARIABLE} at a running CRI runtime)",
    ) as (endpoint, directory):
        yield Containerd(endpoint, (directory / "gateway").read_text().strip())


@pytest.fixture(scope="session")
def podman_endpoint() -> Iterator[str]:
    """A private Podman service for the session (scripts/podman-test-env), or the engine named
    by $PYKUBELET_TEST_DOCKER_ENDPOINT; one for the unit and the integration tests alike.
    Without one the docker runtime's tests fail: they are part of what `make test` checks, and a
    skip would hide that they never ran."""
    endpoint = os.environ.get(DOCKER_ENDPOINT_VARIABLE)
    if endpoint:
        yield endpoint
        return
    with private_service(
        PODMAN_SCRIPT,
        "pykubelet-podman-",
        "the docker runtime's tests need Podman (Debian: podman, runc, busybox-static) and root",
        f"(or point {DOCKER_ENDPOINT_VARIABLE} at a running engine)",
    ) as (endpoint, _):
        yield endpoint


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    """A real registry on 127.0.0.1 with htpasswd authentication and an image pushed to it
    (tests/fixtures/registry.py), for the session. Without its packages the pull tests fail
    with the reason: a skip would hide that they never ran."""
    from tests.fixtures.registry import Registry

    server = Registry(Path(tempfile.mkdtemp(prefix="pykubelet-registry-")))
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        server.close()
        pytest.fail(f"the pull tests need a registry: {e}", pytrace=False)
    try:
        yield server
    finally:
        server.close()


# Marked as each item is collected: pytest-xdist's worker turns the xdist_group marks into the
# node IDs' @group suffix (which --dist loadgroup schedules by) in its own
# pytest_collection_modifyitems, which may run before a conftest's.
def pytest_itemcollected(item: pytest.Item) -> None:
    """Under pytest-xdist (`make test`, `--dist loadgroup`) every test that needs the private
    Podman runs on one worker, and every one that needs containerd on one worker: each engine is
    started once, and two private Podmans (whose default bridge network is the machine's one
    10.88.0.0/16) never run on the machine at once."""
    needs = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("docker") or needs & {"podman_endpoint", "container_engine"}:
        item.add_marker(pytest.mark.xdist_group("podman"))
    elif item.get_closest_marker("cri") or "containerd" in needs:
        item.add_marker(pytest.mark.xdist_group("containerd"))
    elif "registry" in needs:
        item.add_marker(pytest.mark.xdist_group("registry"))
