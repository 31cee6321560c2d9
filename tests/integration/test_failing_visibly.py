"""A node whose --root-dir is full, seen as a user sees it (process runtime, static pods): a new
pod's sandbox that cannot be written gives FailedCreatePodSandBox and containers waiting in
ContainerCreating; a container whose files cannot be created gives `Failed` and the waiting
reason CreateContainerError. Each is one line in the agent's log naming the pod, the step and
the reason (no traceback), is retried, and starts once there is room; the other pods run on."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent import (
    NODE,
    Agent,
    Backend,
    container_state,
    pod_yaml,
    wait_for,
    write_pod,
)

NO_SPACE = "no space left on device"
# No disk threshold: the node must not evict or refuse pods meanwhile, only fail to make them.
FLAGS = ("--eviction-hard=memory.available<1Mi",)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs)")


def mount_tmpfs(root: Path, options: str) -> None:
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root)], check=True)


@pytest.fixture
def small_root(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs --root-dir small in bytes and in inodes (set up before the agent, gone after)."""
    root = tmp_path / "root"  # the agent fixture's --root-dir
    mount_tmpfs(root, "size=16m,nr_inodes=4096")
    yield root
    subprocess.run(["umount", "-l", str(root)], check=False)


def fill_bytes(root: Path) -> Path:
    path = root / "fill"
    with path.open("wb", buffering=0) as f:
        for size in (1 << 20, 4096):  # then the last pages
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    return path


def fill_inodes(root: Path) -> Path:
    directory = root / "inodes"
    directory.mkdir()
    n = 0
    try:
        while True:
            (directory / str(n)).touch()
            n += 1
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    return directory


def events_of(agent: Agent, pod: str, reason: str) -> list[str]:
    return [
        e["message"]
        for e in agent.events()
        if e["reason"] == reason and e["involvedObject"]["name"] == f"{pod}-{NODE}"
    ]


def waiting(agent: Agent, pod: str) -> dict[str, Any]:
    return container_state(agent.pod(pod))["state"].get("waiting") or {}


def running(agent: Agent, pod: str) -> bool:
    return "running" in container_state(agent.pod(pod))["state"]


def check_quiet(agent: Agent, log_text: str) -> None:
    assert "Traceback" not in log_text, log_text[-5000:]
    assert running(agent, "steady")
    assert container_state(agent.pod("steady"))["restartCount"] == 0


@needs_root
def test_a_full_root_dir_fails_the_sandbox_visibly_and_the_pod_starts_once_there_is_room(
    small_root: Path, manifests: Path, start_agent: Callable[..., Agent]
) -> None:
    write_pod(manifests, "steady", pod_yaml("steady", "sleep 600"))
    agent = start_agent(*FLAGS)
    wait_for("steady running", lambda: running(agent, "steady"))
    fill = fill_bytes(small_root)
    write_pod(manifests, "late", pod_yaml("late", "sleep 600"))
    messages = wait_for(
        "the FailedCreatePodSandBox event of late",
        lambda: events_of(agent, "late", "FailedCreatePodSandBox"),
        timeout=30,
    )
    assert messages[0].startswith("Failed to create pod sandbox: "), messages
    assert NO_SPACE in messages[0], messages
    state = wait_for("late waiting", lambda: waiting(agent, "late"))
    assert state["reason"] == "ContainerCreating"
    assert NO_SPACE in state["message"]
    lines = [line for line in agent.log().splitlines() if "cannot create its sandbox" in line]
    assert lines and f"default/late-{NODE}" in lines[0] and NO_SPACE in lines[0], lines
    check_quiet(agent, agent.log())

    fill.unlink()
    # Retried under the pod workers' back-off: it starts without anyone touching it.
    wait_for("late running once there is room", lambda: running(agent, "late"), timeout=30)
    check_quiet(agent, agent.log())


@needs_root
@pytest.mark.parametrize("volume", [False, True], ids=["plain", "launched-with-a-volume"])
def test_a_container_whose_files_cannot_be_created_waits_in_create_container_error(
    small_root: Path, manifests: Path, start_agent: Callable[..., Agent], volume: bool
) -> None:
    write_pod(manifests, "steady", pod_yaml("steady", "sleep 600"))
    crasher = pod_yaml("crasher", "sleep 3; exit 1")
    if volume:
        # A volume's bind: the start goes through the launcher (its files made in its thread).
        mount_point = small_root.parent / "crasher-scratch"
        mount_point.mkdir()
        crasher = pod_yaml(
            "crasher",
            "sleep 3; exit 1",
            extra_spec="  volumes:\n  - name: scratch\n    emptyDir: {}\n",
        )
        crasher = _with_container_fields(
            crasher, f"volumeMounts:\n- {{name: scratch, mountPath: {mount_point}}}\n"
        )
    write_pod(manifests, "crasher", crasher)
    agent = start_agent(*FLAGS)
    wait_for("steady running", lambda: running(agent, "steady"))
    wait_for("crasher running", lambda: running(agent, "crasher"))
    # No inodes left: its restart cannot create the container's files (as a full node's would).
    inodes = fill_inodes(small_root)
    messages = wait_for(
        "the Failed event of crasher",
        lambda: [m for m in events_of(agent, "crasher", "Failed") if NO_SPACE in m],
        timeout=30,
    )
    assert messages[0].startswith("Error: "), messages
    state = wait_for("crasher waiting", lambda: waiting(agent, "crasher"))
    assert state["reason"] == "CreateContainerError", state
    assert NO_SPACE in state["message"]
    lines = [line for line in agent.log().splitlines() if "CreateContainerError" in line]
    assert lines and f"default/crasher-{NODE}" in lines[0] and NO_SPACE in lines[0], lines
    check_quiet(agent, agent.log())

    shutil.rmtree(inodes)
    wait_for("crasher running again", lambda: running(agent, "crasher"), timeout=40)
    check_quiet(agent, agent.log())


DOCKER = pytest.param("docker", marks=pytest.mark.docker)
REMOTE = pytest.param("remote", marks=pytest.mark.cri)


def _with_container_fields(body: str, fields: str) -> str:
    return body.rstrip("\n") + "\n" + textwrap.indent(textwrap.dedent(fields), "    ") + "\n"


@pytest.mark.parametrize("backend", [DOCKER, REMOTE], indirect=True)
def test_a_create_the_engine_refuses_is_a_create_container_error(
    manifests: Path, start_agent: Callable[..., Agent], backend: Backend
) -> None:
    write_pod(manifests, "steady", pod_yaml("steady", backend.forever()))
    # Below any engine's minimum memory limit (Podman's and runc's 6 MB): the engine refuses
    # the create, not the kubelet.
    tiny = _with_container_fields(
        pod_yaml("tiny", backend.forever()),
        """\
        resources:
          limits: {memory: 1Ki}
        """,
    )
    write_pod(manifests, "tiny", tiny)
    agent = start_agent(*backend.flags)
    wait_for("steady running", lambda: running(agent, "steady"), timeout=60)
    state = wait_for("tiny waiting", lambda: waiting(agent, "tiny"), timeout=60)
    # Podman's create succeeds and runc refuses at the start; containerd refuses the create.
    assert state["reason"] in ("CreateContainerError", "RunContainerError"), state
    messages = wait_for("the Failed event of tiny", lambda: events_of(agent, "tiny", "Failed"))
    assert messages[0] == f"Error: {state['message']}", messages
    lines = [line for line in agent.log().splitlines() if state["reason"] in line]
    assert lines and f"default/tiny-{NODE}: container main" in lines[0], lines
    assert "Traceback" not in agent.log()
    assert running(agent, "steady")


# containerd has no host ports without the CNI portmap plugin: nothing to refuse there.
@pytest.mark.parametrize("backend", [DOCKER], indirect=True)
def test_a_sandbox_the_engine_cannot_start_is_failed_create_pod_sandbox_until_it_can(
    manifests: Path, start_agent: Callable[..., Agent], backend: Backend
) -> None:
    # A host port someone else holds: the engine cannot start the pod's sandbox.
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        write_pod(manifests, "steady", pod_yaml("steady", backend.forever()))
        busy = _with_container_fields(
            pod_yaml("busy", backend.forever()),
            f"""\
            ports:
            - {{containerPort: 8080, hostPort: {port}}}
            """,
        )
        write_pod(manifests, "busy", busy)
        agent = start_agent(*backend.flags)
        wait_for("steady running", lambda: running(agent, "steady"), timeout=60)
        state = wait_for("busy waiting", lambda: waiting(agent, "busy"), timeout=60)
        assert state["reason"] == "ContainerCreating", state
        assert "address already in use" in state["message"], state
        messages = events_of(agent, "busy", "FailedCreatePodSandBox")
        assert messages and messages[0] == state["message"], messages
        lines = [line for line in agent.log().splitlines() if "cannot create its sandbox" in line]
        assert lines and f"default/busy-{NODE}" in lines[0], lines
        assert running(agent, "steady")
    # The port is free again: the next retry starts the pod.
    wait_for("busy running", lambda: running(agent, "busy"), timeout=40)
    assert "Traceback" not in agent.log()


@pytest.mark.parametrize("backend", [DOCKER, REMOTE], indirect=True)
def test_a_sandbox_the_engine_refuses_is_failed_create_pod_sandbox(
    manifests: Path, start_agent: Callable[..., Agent], backend: Backend
) -> None:
    write_pod(manifests, "steady", pod_yaml("steady", backend.forever()))
    # Allowed by the kubelet, unknown to the kernel: runc refuses the sandbox.
    odd = "net.ipv4.conf.all.no_such_setting"
    sysctls = f"  securityContext:\n    sysctls:\n    - {{name: {odd}, value: '1'}}\n"
    write_pod(manifests, "odd", pod_yaml("odd", backend.forever(), extra_spec=sysctls))
    agent = start_agent(*backend.flags, f"--allowed-unsafe-sysctls={odd}")
    wait_for("steady running", lambda: running(agent, "steady"), timeout=60)
    state = wait_for("odd waiting", lambda: waiting(agent, "odd"), timeout=60)
    assert state["reason"] == "ContainerCreating", state
    assert state["message"].startswith("Failed to create pod sandbox: "), state
    assert odd.replace(".", "/") in state["message"], state
    messages = events_of(agent, "odd", "FailedCreatePodSandBox")
    assert messages and messages[0] == state["message"], messages
    lines = [line for line in agent.log().splitlines() if "cannot create its sandbox" in line]
    assert lines and f"default/odd-{NODE}" in lines[0], lines
    assert "Traceback" not in agent.log()
    assert running(agent, "steady")
