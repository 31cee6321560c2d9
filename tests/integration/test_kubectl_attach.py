"""`kubectl attach` end to end: the real kubectl, the fixture API server relaying pods/attach to
the real agent's kubelet API, and the container's own stdio on the process runtime, docker and
the remote runtime (containerd's streaming server).

A container with `stdin: true` reads what the attach sends; with `stdinOnce` its stdin closes
when that attach ends; with `tty: true` it has a terminal of the size of kubectl's, and killing
kubectl detaches without stopping it.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import termios
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
    PROTOCOLS,
    STREAM_RUNTIMES,
    apiserver,
    kubectl,
    kubectl_stream,
    runtime_flags,
)

__all__ = ["apiserver"]  # the fixture, shared with test_kubelet_api

Obj = dict[str, Any]


def start_node(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path, *flags: str
) -> tuple[KubeClient, Path]:
    _, client, kubeconfig = start_kubelet_node(apiserver, start_agent, tmp_path, NODE, *flags)
    return client, kubeconfig


@pytest.fixture(params=STREAM_RUNTIMES)
def node(
    request: pytest.FixtureRequest,
    apiserver: ApiServer,
    start_agent: Callable[..., Agent],
    tmp_path: Path,
) -> tuple[KubeClient, Path]:
    return start_node(apiserver, start_agent, tmp_path, *runtime_flags(request))


def stdio_pod(client: KubeClient, name: str, script: str, **stdio: bool) -> None:
    client.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox:test",
                        "command": ["/bin/sh", "-c", script],
                        **stdio,
                    }
                ],
            },
        }
    )
    wait_for("the pod running", lambda: running_in_api(client, name), timeout=30)


def attach(
    kubeconfig: Path, websockets: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return kubectl_stream(kubeconfig, websockets, "attach", *args, stdin=stdin)


# Reads lines until its stdin closes, then says so and exits: the attach ends with it.
READER = 'echo started; while read -r line; do echo "got $line"; done; echo "stdin closed"'


def check_stdin_once(client: KubeClient, kubeconfig: Path, websockets: str) -> None:
    stdio_pod(client, "reader", READER, stdin=True, stdinOnce=True)
    done = attach(kubeconfig, websockets, "-i", "reader", stdin="one\ntwo\n")
    assert done.returncode == 0, done.stderr
    # Its output from the attach on (not "started", written before), and the EOF of stdinOnce.
    assert done.stdout == "got one\ngot two\nstdin closed\n", (done.stdout, done.stderr)
    logs = kubectl(kubeconfig, "logs", "reader")
    assert logs.stdout == "started\ngot one\ngot two\nstdin closed\n", logs.stderr


@PROTOCOLS
def test_kubectl_attach_with_stdin_once(node: tuple[KubeClient, Path], websockets: str) -> None:
    client, kubeconfig = node
    check_stdin_once(client, kubeconfig, websockets)


def test_kubectl_attach_with_a_terminal_then_detached(node: tuple[KubeClient, Path]) -> None:
    """`kubectl attach -it`: the container's terminal takes kubectl's size, input and output go
    through it, and killing kubectl detaches: the container runs on, not restarted."""
    client, kubeconfig = node
    script = 'while read -r line; do echo "[$line] $(stty size)"; done'
    stdio_pod(client, "term", script, stdin=True, tty=True)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    assert KUBECTL is not None
    proc = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "attach", "-it", "term"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "HOME": str(kubeconfig.parent)},
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    try:
        deadline = time.monotonic() + 20
        prompt: float | None = None
        typed = 0.0
        while time.monotonic() < deadline and b"[hello] 33 111" not in output:
            # kubectl prints its hint before its stream is open: the line is typed once the
            # session has had time to start, and again until it is answered.
            if prompt is None and b"pressing enter" in output:
                prompt = time.monotonic()
            now = time.monotonic()
            if prompt is not None and now - prompt > 1 and now - typed > 2:
                os.write(master, b"hello\r")
                typed = now
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:
                    break
        assert b"[hello] 33 111" in output, (output, kubectl(kubeconfig, "logs", "term").stdout)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    # Detached, not stopped.
    time.sleep(1)
    pod = running_in_api(client, "term")
    assert pod is not None
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    logs = kubectl(kubeconfig, "logs", "term")
    assert "[hello] 33 111" in logs.stdout, logs


@pytest.mark.docker
def test_kubectl_attach_on_docker(
    apiserver: ApiServer,
    start_agent: Callable[..., Agent],
    tmp_path: Path,
    docker_backend: Backend,
) -> None:
    """The engine's attach: created with OpenStdin/StdinOnce, the same session as above."""
    client, kubeconfig = start_node(apiserver, start_agent, tmp_path, *docker_backend.flags)
    check_stdin_once(client, kubeconfig, "true")
