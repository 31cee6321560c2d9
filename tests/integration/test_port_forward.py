"""`kubectl port-forward`, end to end: the real kubectl 1.32, the fixture API server forwarding
pods/portforward to the node as kube-apiserver 1.32 does (a WebSocket tunnel ends there and
goes on as SPDY; SPDY is relayed), and the real agent dialling the pod's ports, on each
runtime (host processes share the host's network; docker and CRI containers are reached in
their sandbox's network namespace).

The pod runs two small TCP servers, one per container: one sends back what it reads, the
other the same in capitals, until the end of the client's stream. kubectl forwards a free
local port to each, and several connections at once go through each, with data both ways,
more than a window's worth, and half-closes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import pytest

from pykubelet.common.spdy import SpdySession, SpdyStream
from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, Backend, wait_for
from tests.integration.kubelet_node import https_apiserver, start_kubelet_node
from tests.integration.test_cluster import KubeClient, running_in_api
from tests.integration.test_kubelet_api import KUBECTL, NODE, call, status_of

Obj = dict[str, Any]
PROTOCOLS = pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket", "spdy"])


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


@pytest.fixture
def node(
    apiserver: ApiServer, backend: Backend, start_agent: Callable[..., Agent], tmp_path: Path
) -> tuple[Agent, KubeClient, Path]:
    """The kubeadm-like node of kubelet_node.py, on each runtime."""
    return start_kubelet_node(apiserver, start_agent, tmp_path, NODE, *backend.flags)


# Each line back as it came (`cat`), or in capitals (`tr a-z A-Z`), per connection, until the
# client's end of stream: what busybox's `nc -ll -p PORT -e cat` does in a container.
SERVER = r"""
import socket, sys, threading
port, upper = int(sys.argv[1]), sys.argv[2] == "tr"
def answer(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data.upper() if upper else data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
while True:
    conn, _ = s.accept()
    threading.Thread(target=answer, args=(conn,), daemon=True).start()
"""
PROGRAMS = {"one": ["cat"], "two": ["tr", "a-z", "A-Z"]}


def answered(container: str, line: bytes) -> bytes:
    return line.upper() if container == "two" else line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def servers_pod(name: str, ports: tuple[int, int], backend: Backend) -> Obj:
    """Container "one" serves ports[0], "two" ports[1]: host processes (python) for the
    process runtime, busybox's nc in containers."""

    def command(tag: str, port: int) -> list[str]:
        if backend.engine is None:
            return [sys.executable, "-c", SERVER, str(port), PROGRAMS[tag][0]]
        return ["nc", "-ll", "-p", str(port), "-e", *PROGRAMS[tag]]

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": tag, "image": "busybox:test", "command": command(tag, port)}
                for tag, port in zip(("one", "two"), ports, strict=True)
            ],
        },
    }


def all_running(client: KubeClient, name: str) -> Obj | None:
    pod = running_in_api(client, name)
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return pod if len(statuses) == 2 and all(s.get("ready") for s in statuses) else None


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class PortForward:
    """`kubectl port-forward` running, with what it printed."""

    def __init__(self, kubeconfig: Path, websockets: str, pod: str, *mappings: str) -> None:
        assert KUBECTL is not None, "kubectl is not installed (the machine image ships 1.32)"
        self.proc = subprocess.Popen(
            [
                KUBECTL,
                "--kubeconfig",
                str(kubeconfig),
                "port-forward",
                "--address",
                "127.0.0.1",
                pod,
                *mappings,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={
                **os.environ,
                "HOME": str(kubeconfig.parent),
                # false: SPDY/3.1 all the way, as kubectl before 1.31 speaks it.
                "KUBECTL_PORT_FORWARD_WEBSOCKETS": websockets,
            },
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._collect, args=(self.proc.stdout, self.stdout)),
            threading.Thread(target=self._collect, args=(self.proc.stderr, self.stderr)),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _collect(pipe: IO[str], lines: list[str]) -> None:
        for line in pipe:
            lines.append(line)

    def wait_forwarding(self, count: int) -> None:
        wait_for(
            "kubectl to listen",
            lambda: (
                len([line for line in self.stdout if line.startswith("Forwarding from")]) >= count
                or self.proc.poll() is not None
            ),
        )
        assert self.proc.poll() is None, self.output()

    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def wait(self, timeout: float) -> int:
        """kubectl's exit code, once it exited and all it wrote was read (the readers are
        threads: its last line may still be in the pipe when the process is gone)."""
        code = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=5)


@pytest.fixture
def forwards() -> Iterator[list[PortForward]]:
    started: list[PortForward] = []
    yield started
    for forward in started:
        forward.stop()


def converse(port: int, lines: list[bytes]) -> bytes:
    """Send `lines` one at a time (each answered before the next), then the end of our
    stream; everything the server sent until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
        received = b""
        f = conn.makefile("rb")
        for line in lines:
            conn.sendall(line)
            received += f.readline()
        conn.shutdown(socket.SHUT_WR)
        received += f.read()
        return received


def start_pod(client: KubeClient, name: str, backend: Backend) -> tuple[int, int]:
    """The pod's two ports: free ones of the host for host processes (they share its
    network), any for containers (each pod has its own)."""
    ports = (free_port(), free_port()) if backend.engine is None else (7001, 7002)
    client.create_pod(servers_pod(name, ports, backend))
    wait_for("both containers running", lambda: all_running(client, name), timeout=60)
    if backend.engine is None:
        wait_for("both servers listening", lambda: all(map(listening, ports)))
    return ports


def closed_port(backend: Backend) -> int:
    return free_port() if backend.engine is None else 7003


@PROTOCOLS
def test_kubectl_port_forward_carries_concurrent_connections_to_two_ports(
    node: tuple[Agent, KubeClient, Path],
    apiserver: ApiServer,
    backend: Backend,
    forwards: list[PortForward],
    websockets: str,
) -> None:
    agent, client, kubeconfig = node
    remote = start_pod(client, "servers", backend)
    local = (free_port(), free_port())
    forward = PortForward(
        kubeconfig,
        websockets,
        "pod/servers",
        *(f"{lp}:{rp}" for lp, rp in zip(local, remote, strict=True)),
    )
    forwards.append(forward)
    forward.wait_forwarding(2)

    # Eight connections at once to each port, each with its own lines, a large one included
    # (more than a SPDY window and a socket buffer: flow control both ways).
    big = b"x" * 300_000 + b"\n"

    def one(index: int) -> tuple[int, bytes]:
        port = local[index % 2]
        lines = [f"conn {index} line {n}\n".encode() for n in range(3)] + [big]
        return index, converse(port, lines)

    with ThreadPoolExecutor(16) as pool:
        results = dict(pool.map(one, range(16)))
    for index, got in results.items():
        container = "one" if index % 2 == 0 else "two"
        expected = b"".join(
            answered(container, line)
            for line in [f"conn {index} line {n}\n".encode() for n in range(3)] + [big]
        )
        assert got == expected, (index, got[:200])

    # kubectl said so for each, and nothing failed.
    assert forward.output().count("Handling connection for") == 16, forward.output()
    assert "error" not in "".join(forward.stderr).lower(), forward.output()
    # kubectl came as it was told (a WebSocket is a GET, SPDY a POST); the API server ended a
    # WebSocket tunnel and spoke SPDY to the node, as kube-apiserver 1.32 does.
    methods = {r.method for r in apiserver.requests() if r.path.endswith("/portforward")}
    assert methods == ({"GET"} if websockets == "true" else {"POST"})
    assert "port-forward to pod servers_default over SPDY/3.1" in agent.log()


@PROTOCOLS
def test_a_port_nothing_listens_on_is_reported_by_kubectl(
    node: tuple[Agent, KubeClient, Path],
    backend: Backend,
    forwards: list[PortForward],
    websockets: str,
) -> None:
    _, client, kubeconfig = node
    remote = start_pod(client, "servers", backend)
    closed = closed_port(backend)
    good, bad = free_port(), free_port()
    forward = PortForward(
        kubeconfig, websockets, "servers", f"{good}:{remote[0]}", f"{bad}:{closed}"
    )
    forwards.append(forward)
    forward.wait_forwarding(2)
    assert converse(good, [b"before\n"]) == b"before\n"

    # The connection to the closed port gets nothing; kubectl prints the kubelet's reason.
    with socket.create_connection(("127.0.0.1", bad), timeout=15) as conn:
        conn.settimeout(15)
        assert conn.recv(100) == b""
    message = wait_for(
        "kubectl's error",
        lambda: re.search(r"an error occurred forwarding .*", forward.output()),
    )
    assert (
        f"an error occurred forwarding {bad} -> {closed}: error forwarding port {closed} "
        f"to pod servers_default, uid "
    ) in message.group(0), forward.output()
    assert f"dial tcp4 127.0.0.1:{closed}: connect: connection refused" in forward.output()
    # kubectl 1.32 (client-go's PortForwarder) closes its whole session once an error stream
    # carries a message, and exits; the kubelet's session would have gone on (below).
    assert forward.wait(timeout=15) == 1
    assert "error: lost connection to pod" in forward.output()


def test_a_refused_connection_leaves_the_others_of_the_session_going(
    node: tuple[Agent, KubeClient, Path], apiserver: ApiServer, backend: Backend
) -> None:
    """What kubectl does not show: on one session through the API server, a connection to a
    port nothing listens on fails alone; one already open and one opened after carry on."""
    _, client, _ = node
    remote = start_pod(client, "servers", backend)
    closed = closed_port(backend)

    async def scenario() -> None:
        async with api_session(apiserver, "servers") as session:
            before = await forwarded(session, remote[0], 0)
            assert await exchange(before[1], b"first\n") == b"first\n"
            error, _ = await forwarded(session, closed, 1)
            message = await read_all(error)
            assert message.endswith(
                f"dial tcp4 127.0.0.1:{closed}: connect: connection refused".encode()
            ), message
            assert await exchange(before[1], b"second\n") == b"second\n"
            after = await forwarded(session, remote[1], 2)
            assert await exchange(after[1], b"third\n") == b"THIRD\n"
            for _, data in (before, after):
                await data.close()
                assert await read_all(data) == b""

    asyncio.run(asyncio.wait_for(scenario(), 60))

    # What the kubelet refuses before any upgrade, with a Status saying why.
    agent = node[0]
    cert = apiserver.pki.kubelet_client
    for path, code, message in (
        ("/portForward/default/nope", 404, 'pod "default/nope" not found'),
        ("/portForward/default/servers/not-its-uid", 404, 'pod "default/servers" not found'),
        ("/portForward/default/servers?port=http", 400, 'unable to parse "http" as a port'),
        ("/portForward/default/servers", 400, "port-forward needs a streaming upgrade"),
    ):
        status, body = call(agent, path, cert=cert)
        assert status == code, body
        assert message in status_of(body)["message"]


@contextlib.asynccontextmanager
async def api_session(apiserver: ApiServer, pod: str) -> AsyncIterator[SpdySession]:
    """pods/portforward upgraded to SPDY through the API server, as client-go does it."""
    url = urllib.parse.urlsplit(apiserver.url)
    host, port = url.hostname or "", url.port or 443
    ctx = ssl.create_default_context(cafile=str(apiserver.pki.ca_file))
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    head = [
        f"POST /api/v1/namespaces/default/pods/{pod}/portforward HTTP/1.1",
        f"Host: {host}:{port}",
        f"Authorization: Bearer {apiserver.token}",
        "Connection: Upgrade",
        "Upgrade: SPDY/3.1",
        "X-Stream-Protocol-Version: portforward.k8s.io",
        "Content-Length: 0",
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await writer.drain()
    status = await reader.readline()
    assert b" 101 " in status, status
    while (await reader.readline()).strip():
        pass
    session = SpdySession(reader, writer, server=False)
    try:
        yield session
    finally:
        await session.close()


async def forwarded(
    session: SpdySession, port: int, request_id: int
) -> tuple[SpdyStream, SpdyStream]:
    headers = {"streamType": "error", "port": str(port), "requestID": str(request_id)}
    error = await session.open_stream(headers, fin=True)
    data = await session.open_stream({**headers, "streamType": "data"})
    return error, data


async def exchange(data: SpdyStream, line: bytes) -> bytes:
    await data.write(line)
    received = b""
    while not received.endswith(b"\n"):
        chunk = await data.read(1)
        assert chunk, received
        received += chunk
    return received


async def read_all(stream: SpdyStream) -> bytes:
    received = b""
    while chunk := await stream.read():
        received += chunk
    return received
