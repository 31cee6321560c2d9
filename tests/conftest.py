"""Fixtures shared by the unit and integration tests."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTAINERD_SCRIPT = ROOT / "scripts" / "containerd-test-env"
# A CRI runtime already running (its socket) instead of the private containerd; it must have
# localhost/pause:test and busybox:test (see the script).
CRI_ENDPOINT_VARIABLE = "PYKUBELET_TEST_CRI_ENDPOINT"


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
    directory = tempfile.mkdtemp(prefix="pykubelet-containerd-")
    try:
        proc = subprocess.run(
            [str(CONTAINERD_SCRIPT), "start", directory],
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        proc = subprocess.CompletedProcess(e.cmd, 1, "", f"timed out after {e.timeout}s")
    if proc.returncode != 0:
        subprocess.run(
            [str(CONTAINERD_SCRIPT), "stop", directory], capture_output=True, timeout=120
        )
        pytest.fail(
            "the remote runtime's tests need containerd (Debian: containerd, runc, "
            "containernetworking-plugins, busybox-static) and root; "
            f"`{CONTAINERD_SCRIPT.relative_to(ROOT)} start` failed "
            f"(exit {proc.returncode}):\n{proc.stderr.strip()}\n"
            f"(or point {CRI_ENDPOINT_VARIABLE} at a running CRI runtime)",
            pytrace=False,
        )
    try:
        gateway = (Path(directory) / "gateway").read_text().strip()
        yield Containerd(proc.stdout.strip().splitlines()[-1], gateway)
    finally:
        subprocess.run(
            [str(CONTAINERD_SCRIPT), "stop", directory], capture_output=True, timeout=300
        )
