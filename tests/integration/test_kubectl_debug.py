"""`kubectl debug` end to end: the real kubectl adds an ephemeral container through the fixture
API server's pods/ephemeralcontainers, the real agent starts it in the running pod (nothing else
restarts) and reports it in ephemeralContainerStatuses; `kubectl logs -c` reads it, and
`kubectl debug -i` attaches to it (docker). On each runtime: the process runtime runs it as a
host process like the pod's other containers; docker and the remote runtime in the pod's
sandbox, in the target container's PID namespace with `--target`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, Backend, wait_for
from tests.integration.kubelet_node import start_kubelet_node
from tests.integration.test_cluster import KubeClient, running_in_api
from tests.integration.test_kubelet_api import (
    KUBECTL,
    NODE,
    apiserver,
    kubectl,
    kubectl_stream,
)

__all__ = ["apiserver"]  # the fixture, shared with test_kubelet_api

Obj = dict[str, Any]
# The target's main process: on docker and CRI, PID 1 of the namespace a --target joins.
APP = "echo app-started; while true; do sleep 1; done"


def start_node(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path, *flags: str
) -> tuple[KubeClient, Path]:
    _, client, kubeconfig = start_kubelet_node(apiserver, start_agent, tmp_path, NODE, *flags)
    client.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "app", "image": "busybox:test", "command": ["/bin/sh", "-c", APP]}
                ],
            },
        }
    )
    wait_for("the pod running", lambda: running_in_api(client, "web"), timeout=60)
    return client, kubeconfig


def ephemeral_status(client: KubeClient, name: str) -> Obj | None:
    pod = client.pod("web")
    statuses = (pod or {}).get("status", {}).get("ephemeralContainerStatuses") or []
    return next((s for s in statuses if s["name"] == name), None)


def app_status(client: KubeClient) -> Obj:
    pod = client.pod("web")
    assert pod is not None
    status: Obj = pod["status"]["containerStatuses"][0]
    return status


def debug_and_read_logs(client: KubeClient, kubeconfig: Path, *target: str) -> str:
    """`kubectl debug web` with a command, then its logs once it has exited; the pod's own
    container is neither restarted nor replaced."""
    before = app_status(client)
    script = "echo from-debug; tr '\\0' ' ' < /proc/1/cmdline; echo"
    done = kubectl(
        kubeconfig,
        "debug",
        "web",
        "--image=busybox:test",
        "-c",
        "debugger",
        *target,
        "--",
        "sh",
        "-c",
        script,
    )
    assert done.returncode == 0, done.stderr
    status = wait_for(
        "the ephemeral container terminated",
        lambda: (s := ephemeral_status(client, "debugger")) and "terminated" in s["state"] and s,
        timeout=60,
    )
    assert status["state"]["terminated"]["exitCode"] == 0, status
    assert status["restartCount"] == 0 and status["ready"] is False
    logs = kubectl(kubeconfig, "logs", "web", "-c", "debugger")
    assert logs.returncode == 0, logs.stderr
    after = app_status(client)
    assert after["containerID"] == before["containerID"] and after["restartCount"] == 0
    assert "running" in after["state"]
    # Exited, it stays so: an ephemeral container is never restarted.
    time.sleep(2)
    again = ephemeral_status(client, "debugger")
    assert again is not None and again["state"] == status["state"]
    return logs.stdout


def test_kubectl_debug_on_the_process_runtime(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    """The process runtime runs it as it runs every container: a host process (the image
    recorded, not pulled), in the host's namespaces, which are the pod's."""
    client, kubeconfig = start_node(apiserver, start_agent, tmp_path)
    logs = debug_and_read_logs(client, kubeconfig, "--target=app")
    assert logs.startswith("from-debug\n"), logs
    check_piped_stdin(kubeconfig)
    check_interactive_shell(kubeconfig)
    # Another one beside them; the first is kept as it was.
    done = kubectl(kubeconfig, "debug", "web", "--image=busybox:test", "-c", "two", "--", "true")
    assert done.returncode == 0, done.stderr
    pod = client.pod("web")
    assert pod is not None
    names = [c["name"] for c in pod["spec"]["ephemeralContainers"]]
    assert names == ["debugger", "reader", "shell", "two"]
    # The API server refuses a name that is taken.
    taken = kubectl(kubeconfig, "debug", "web", "--image=busybox:test", "-c", "app", "--", "true")
    assert taken.returncode != 0
    assert 'spec.ephemeralContainers[4].name: Duplicate value: "app"' in taken.stderr
    # kubectl's general profile adds the SYS_PTRACE capability: the container gets it.
    traced = kubectl(
        kubeconfig,
        "debug",
        "web",
        "--image=busybox:test",
        "-c",
        "traced",
        "--profile=general",
        "--",
        "sh",
        "-c",
        "grep CapEff /proc/self/status",
    )
    assert traced.returncode == 0, traced.stderr
    status = wait_for(
        "the general profile's container done",
        lambda: (s := ephemeral_status(client, "traced")) and "terminated" in s["state"] and s,
    )
    assert status["state"]["terminated"]["exitCode"] == 0, status
    cap_eff = int(kubectl(kubeconfig, "logs", "web", "-c", "traced").stdout.split()[-1], 16)
    assert cap_eff & (1 << 19), hex(cap_eff)  # CAP_SYS_PTRACE
    assert running_in_api(client, "web") is not None


@pytest.mark.docker
def test_kubectl_debug_on_docker(
    apiserver: ApiServer,
    start_agent: Callable[..., Agent],
    tmp_path: Path,
    docker_backend: Backend,
) -> None:
    """In the pod's sandbox; with --target, PID 1 is the target's process."""
    client, kubeconfig = start_node(apiserver, start_agent, tmp_path, *docker_backend.flags)
    logs = debug_and_read_logs(client, kubeconfig, "--target=app")
    assert logs.startswith("from-debug\n/bin/sh -c echo app-started"), logs

    check_piped_stdin(kubeconfig)
    check_interactive_shell(kubeconfig)


def check_piped_stdin(kubeconfig: Path) -> None:
    """-i: kubectl waits for it to run, then attaches to its stdin and output."""
    done = kubectl_stream(
        kubeconfig,
        "true",
        "debug",
        "-i",
        "web",
        "--image=busybox:test",
        "-c",
        "reader",
        "--",
        "sh",
        "-c",
        'read -r a; read -r b; echo "got $a $b"',
        stdin="one\ntwo\n",
    )
    assert done.returncode == 0, done.stderr
    assert "got one two" in done.stdout, (done.stdout, done.stderr)


def check_interactive_shell(kubeconfig: Path) -> None:
    """`kubectl debug -it`: a shell on a terminal, typed into and answered, left with exit."""
    assert KUBECTL is not None
    master, slave = os.openpty()
    args = ["debug", "-it", "web", "--image=busybox:test", "-c", "shell", "--", "sh"]
    proc = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "HOME": str(kubeconfig.parent)},
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    try:
        deadline = time.monotonic() + 60
        typed = 0.0
        while time.monotonic() < deadline and b"answer-42" not in output:
            now = time.monotonic()
            # Typed again until answered: the first keys may precede the attach.
            if b"pressing enter" in output and now - typed > 2:
                os.write(master, b"echo answer-$((6*7))\r")
                typed = now
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:
                    break
        assert b"answer-42" in output, output
        os.write(master, b"exit\r")
        assert proc.wait(timeout=20) == 0, output
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        os.close(master)


@pytest.mark.cri
def test_kubectl_debug_on_the_remote_runtime(
    apiserver: ApiServer,
    start_agent: Callable[..., Agent],
    tmp_path: Path,
    cri_backend: Backend,
) -> None:
    """A CreateContainer in the pod's sandbox, the target's PID namespace (NamespaceMode
    TARGET); -it attaches through the runtime's streaming server. (Not -i with piped input:
    containerd ends a non-terminal stdinOnce attach's output when its input ends, as docker
    attach does, so an answer after the input is not seen; the kubelet's proxy shows the same.)"""
    client, kubeconfig = start_node(apiserver, start_agent, tmp_path, *cri_backend.flags)
    logs = debug_and_read_logs(client, kubeconfig, "--target=app")
    assert logs.startswith("from-debug\n/bin/sh -c echo app-started"), logs

    check_interactive_shell(kubeconfig)
