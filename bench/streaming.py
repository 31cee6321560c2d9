"""`kubectl exec` and `kubectl port-forward` through the fixture API server to the real agent,
beside the engines' own exec (`podman exec`, `ctr task exec`) and a plain loopback copy.

Exec round trip of `true` (milliseconds), per runtime:
- `kubectl exec POD -- true` over WebSocket (kubectl's default) and over SPDY
  (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false), through the fixture API server;
- a WebSocket (`v5.channel.k8s.io`) exec by a small aiohttp client, to the API server's
  pods/exec (with its token) and straight to the node's --port (anonymous): what is left once
  kubectl's own start-up, then the API server's hop, are taken away; and, for the process
  runtime, the floors of both: `kubectl get --raw` of the pod (kubectl's start-up, TLS, one
  GET) and a GET /healthz on a new TLS connection to the node;
- the engine's own exec on the very container pykubelet runs: `podman --url ... exec` for the
  docker runtime (the tests' private Podman), `ctr task exec` for the remote one (the tests'
  private containerd), and the ratio of each path to it.

Port-forward throughput (MB/s, 10^6 bytes a second) of 64 MiB to a process-runtime pod whose
server reads and discards what it is sent (upload) or sends that much (download): through
`kubectl port-forward` (its default, SPDY tunnelled in a WebSocket that the API server ends;
and SPDY all the way), through a direct SPDY/3.1 session to the node
(`SpdySession(server=False)`), and a plain loopback TCP connection to the pod's port (the
floor). Each with the CPU seconds every process in the path spent on it.

The fixture API server runs in a process of its own (`--apiserver`), so that its relaying does
not share the GIL with the bench's clients.

python -m bench.streaming [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.podman import _podman_env
from bench.stats import percentiles
from tests.integration.agent import Agent, wait_for

ROOT = Path(__file__).resolve().parent.parent
PODMAN_SCRIPT = ROOT / "scripts" / "podman-test-env"
CONTAINERD_SCRIPT = ROOT / "scripts" / "containerd-test-env"
KUBECTL = "kubectl"
ENGINE_IMAGE = "localhost/busybox:test"
INFRA_IMAGE = "localhost/pause:test"
V5 = "v5.channel.k8s.io"
TRANSFER = 64 << 20
RESULTS = Path(__file__).with_name("results.json")
PIECE = 1 << 20
FORWARD_SCRIPT = 'trap "exit 0" TERM; while :; do sleep 1 & wait; done'

Obj = dict[str, Any]

# --- the fixture API server, in a child process ---------------------------------------------


def _serve_apiserver(directory: Path) -> None:
    """The child: an HTTPS fixture API server (as test_kubelet_api.py's), anonymous users of
    the nodes allowed nodes/proxy (the direct clients); one JSON line saying where; it ends
    when its stdin does."""
    from tests.fixtures.apiserver import ApiServer

    server = ApiServer(bookmark_interval=0.5, tls=True)
    server.start()
    try:
        server.grant("system:anonymous", "nodes/proxy", ["get", "create"])
        kubeconfig = server.write_kubeconfig(directory / "kubeconfig")
        info = {
            "url": server.url,
            "token": server.token,
            "kubeconfig": str(kubeconfig),
            "ca": str(server.pki.ca_file),
            "client_ca": str(server.kubelet_client_ca),
        }
        print(json.dumps(info), flush=True)
        sys.stdin.read()
    finally:
        server.close()


@dataclass
class ApiInfo:
    proc: subprocess.Popen[str]
    url: str
    token: str
    kubeconfig: Path
    ca: Path
    client_ca: Path


@contextmanager
def _apiserver(directory: Path) -> Iterator[ApiInfo]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.streaming", "--apiserver", str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fixture API server exited with {proc.wait()}")
        info = json.loads(line)
        yield ApiInfo(
            proc,
            info["url"],
            info["token"],
            Path(info["kubeconfig"]),
            Path(info["ca"]),
            Path(info["client_ca"]),
        )
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- nodes and pods -------------------------------------------------------------------------


def _client(api: ApiInfo) -> Any:
    from tests.integration.test_cluster import KubeClient

    return KubeClient(api.kubeconfig)


@contextmanager
def _node(api: ApiInfo, base: Path, name: str, flags: list[str]) -> Iterator[Agent]:
    """A cluster-mode agent as kubeadm sets a kubelet up (client certificates of the API
    server's CA, TokenReview, SubjectAccessReview), anonymous requests allowed to be
    reviewed too: the bench's direct clients come without credentials."""
    base.mkdir(parents=True, exist_ok=True)
    manifests = base / "manifests"
    manifests.mkdir(exist_ok=True)
    agent = Agent(
        manifests,
        base / "root",
        base / "agent.log",
        [
            *flags,
            "--kubeconfig",
            str(api.kubeconfig),
            "--node-name",
            name,
            "--node-ip",
            "127.0.0.1",
            "--client-ca-file",
            str(api.client_ca),
            "--authentication-token-webhook",
            "--authorization-mode",
            "Webhook",
            "--anonymous-auth",
        ],
    )
    agent.start()
    client = _client(api)
    try:
        wait_for(
            "the node advertising its kubelet port",
            lambda: (
                (n := client.node(name))
                and n["status"].get("daemonEndpoints", {}).get("kubeletEndpoint", {}).get("Port")
            ),
            timeout=30,
        )
        try:
            yield agent
        except (RuntimeError, AssertionError, subprocess.SubprocessError) as exc:
            tail = agent.log()[-3000:]
            raise RuntimeError(f"{exc}\n--- the agent's log, its end ---\n{tail}") from exc
    finally:
        try:
            for pod in client.pods():
                if pod["spec"].get("nodeName") == name:
                    client.delete_pod(pod["metadata"]["name"], grace=1)
            wait_for("the node's pods gone", lambda: not agent.pods(), timeout=60)
        except AssertionError as exc:
            print(f"streaming: {exc}", file=sys.stderr)
        finally:
            agent.stop(signal.SIGTERM, timeout=120)


def _run_pod(api: ApiInfo, node: str, name: str, command: list[str], image: str) -> Obj:
    client = _client(api)
    client.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": image, "command": command}],
            },
        }
    )

    def running() -> Obj | None:
        pod = client.pod(name)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        ok = statuses and statuses[0].get("ready") and "running" in statuses[0].get("state", {})
        return pod if ok else None

    pod: Obj = wait_for(f"pod {name} running", running, timeout=90)
    return pod


# --- CPU accounting -------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a process spent so far; with None, this process."""
    if pid is None:
        return time.process_time()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


class CpuMeter:
    """CPU seconds each named process spends between `start` and `stop`."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._before = {name: _cpu(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        return {name: round(_cpu(pid) - self._before[name], 3) for name, pid in self.pids.items()}


# --- exec -----------------------------------------------------------------------------------


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the node's self-signed serving certificate
    return ctx


def _kubectl_env(api: ApiInfo, **extra: str) -> dict[str, str]:
    return {**os.environ, "HOME": str(api.kubeconfig.parent), **extra}


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... exited {done.returncode}: {done.stderr}")
    return elapsed


async def _ws_exec(session: Any, url: str, headers: dict[str, str], ctx: ssl.SSLContext) -> float:
    """One WebSocket exec of `true`: connect (TLS included) to the outcome and the close."""
    from aiohttp import WSMsgType

    started = time.perf_counter()
    status: Obj | None = None
    async with session.ws_connect(url, protocols=(V5,), ssl=ctx, headers=headers) as ws:
        if ws.protocol != V5:
            raise RuntimeError(f"{url}: the server chose {ws.protocol!r}")
        async for msg in ws:
            if msg.type is WSMsgType.BINARY and msg.data[:1] == b"\x03":
                status = json.loads(msg.data[1:])
    elapsed = time.perf_counter() - started
    if not status or status.get("status") != "Success":
        raise RuntimeError(f"{url}: exec ended with {status!r}")
    return elapsed


class ExecPaths:
    """The ways to exec `true` in one container, each a callable timing one run."""

    def __init__(self, api: ApiInfo, agent: Agent, pod: str) -> None:
        self.api = api
        self.agent = agent
        self.pod = pod
        self._loop = asyncio.new_event_loop()
        self._session: Any = None
        self._node_ctx = _insecure()
        self._api_ctx = ssl.create_default_context(cafile=str(api.ca))

    def __enter__(self) -> ExecPaths:
        import aiohttp

        async def make() -> Any:
            return aiohttp.ClientSession()

        self._session = self._loop.run_until_complete(make())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._session is not None:
            self._loop.run_until_complete(self._session.close())
        self._loop.close()

    def kubectl(self, websockets: str) -> Callable[[], float]:
        argv = [KUBECTL, "--kubeconfig", str(self.api.kubeconfig), "exec", self.pod, "--", "true"]
        env = _kubectl_env(self.api, KUBECTL_REMOTE_COMMAND_WEBSOCKETS=websockets)
        return lambda: _timed(argv, env)

    def kubectl_get(self) -> Callable[[], float]:
        """kubectl's floor: its start-up, the kubeconfig, TLS to the API server, one GET."""
        path = f"/api/v1/namespaces/default/pods/{self.pod}"
        argv = [KUBECTL, "--kubeconfig", str(self.api.kubeconfig), "get", "--raw", path]
        env = _kubectl_env(self.api)
        return lambda: _timed(argv, env)

    def node_healthz(self) -> Callable[[], float]:
        """The node's floor: a new TLS connection to --port and one authorized GET."""
        url = urllib.parse.urlsplit(self.agent.secure_url)

        def once() -> float:
            started = time.perf_counter()
            conn = http.client.HTTPSConnection(
                url.hostname or "", url.port, context=self._node_ctx, timeout=10
            )
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                body = resp.read()
            finally:
                conn.close()
            if resp.status != 200:
                raise RuntimeError(f"/healthz: {resp.status} {body[:200]!r}")
            return time.perf_counter() - started

        return once

    def via_apiserver(self) -> Callable[[], float]:
        query = urllib.parse.urlencode({"command": "true", "stdout": "true", "stderr": "true"})
        base = self.api.url.replace("https://", "wss://")
        url = f"{base}/api/v1/namespaces/default/pods/{self.pod}/exec?{query}"
        headers = {"Authorization": f"Bearer {self.api.token}"}
        return lambda: self._loop.run_until_complete(
            _ws_exec(self._session, url, headers, self._api_ctx)
        )

    def direct(self) -> Callable[[], float]:
        query = urllib.parse.urlencode({"command": "true", "output": "1", "error": "1"})
        base = self.agent.secure_url.replace("https://", "wss://")
        url = f"{base}/exec/default/{self.pod}/main?{query}"
        return lambda: self._loop.run_until_complete(
            _ws_exec(self._session, url, {}, self._node_ctx)
        )


def _exec_series(paths: dict[str, Callable[[], float]], n: int) -> dict[str, Any]:
    """Each path once to warm up (tokens and reviews are cached after the first), then n rounds
    of every path in turn, so that a noisy moment of the machine hits all of them alike."""
    for run in paths.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(n):
        for name, run in paths.items():
            times[name].append(1000 * run())
    return {
        name: {k: round(v, 1) if k != "count" else v for k, v in percentiles(values).items()}
        for name, values in times.items()
    }


def _ratios(result: dict[str, Any], engine: str) -> dict[str, float]:
    base = result[engine]["p50"]
    return {name: round(r["p50"] / base, 2) for name, r in result.items() if name != engine}


def _exec_process(api: ApiInfo, base: Path, n: int) -> dict[str, Any]:
    with _node(api, base, "bench-process", []) as agent:
        _run_pod(api, "bench-process", "shell", ["/bin/sh", "-c", FORWARD_SCRIPT], "busybox:test")
        with ExecPaths(api, agent, "shell") as paths:
            return _exec_series(
                {
                    "kubectl_websocket": paths.kubectl("true"),
                    "kubectl_spdy": paths.kubectl("false"),
                    "kubectl_get_pod": paths.kubectl_get(),
                    "apiserver_websocket": paths.via_apiserver(),
                    "direct_websocket": paths.direct(),
                    "node_healthz": paths.node_healthz(),
                },
                n,
            )


@contextmanager
def _private(script: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """`script start DIR` (tests/conftest.py's private_service), `script stop DIR` after."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        proc = subprocess.run(
            [str(script), "start", str(directory)],
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{script.name} start failed: {proc.stderr.strip()[-2000:]}")
        yield proc.stdout.strip().splitlines()[-1], directory
    finally:
        subprocess.run([str(script), "stop", str(directory)], capture_output=True, timeout=300)
        _reap(directory)


def _reap(directory: Path) -> None:
    """Kill what outlived the service of `directory`: Podman's exec sessions leave a conmon
    behind that sleeps out containers.conf's exit_command_delay (5 minutes) before its
    cleanup, and the stop script does not look for them. Only processes whose command line
    names this (mkdtemp-unique) directory."""
    mark = str(directory).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if mark in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def _container_id(pod: Obj) -> str:
    return str(pod["status"]["containerStatuses"][0]["containerID"]).split("://", 1)[1]


def _exec_engine(api: ApiInfo, base: Path, n: int, runtime: str) -> dict[str, Any]:
    script, engine = (
        (PODMAN_SCRIPT, "podman_exec") if runtime == "docker" else (CONTAINERD_SCRIPT, "ctr_exec")
    )
    with _private(script, f"pykubelet-bench-{runtime}-") as (endpoint, directory):
        flags = [
            "--container-runtime",
            runtime,
            "--container-runtime-endpoint",
            endpoint,
            "--pod-infra-container-image",
            INFRA_IMAGE,
        ]
        node = f"bench-{runtime}"
        with _node(api, base, node, flags) as agent:
            pod = _run_pod(api, node, "shell", ["/bin/sh", "-c", FORWARD_SCRIPT], ENGINE_IMAGE)
            cid = _container_id(pod)
            if runtime == "docker":
                env = _podman_env(directory)
                argv = ["podman", "--url", endpoint, "exec", cid, "true"]

                def own() -> float:
                    return _timed(argv, env)
            else:
                address = endpoint.removeprefix("unix://")
                counter = iter(range(1 << 30))
                ctr = ["ctr", "--address", address, "-n", "k8s.io", "task", "exec"]

                def own() -> float:
                    exec_id = f"bench-{next(counter)}"
                    return _timed([*ctr, "--exec-id", exec_id, cid, "true"])

            with ExecPaths(api, agent, "shell") as paths:
                result = _exec_series(
                    {
                        engine: own,
                        "kubectl_websocket": paths.kubectl("true"),
                        "kubectl_spdy": paths.kubectl("false"),
                        "apiserver_websocket": paths.via_apiserver(),
                        "direct_websocket": paths.direct(),
                    },
                    n,
                )
    return {**result, "ratio_to_engine_p50": _ratios(result, engine)}


# --- port-forward ---------------------------------------------------------------------------

# The pod's server: a 9-byte request, b"w" or b"r" and a 64-bit size; "w": read that many bytes
# and answer b"ok"; "r": send that many. Then its end of stream, and it waits for the client's.
SINK = r"""
import socket, struct, sys, threading
def serve(conn):
    with conn:
        head = b""
        while len(head) < 9:
            data = conn.recv(9 - len(head))
            if not data:
                return
            head += data
        mode, left = head[:1], struct.unpack(">Q", head[1:])[0]
        if mode == b"w":
            buf = bytearray(1 << 20)
            while left:
                n = conn.recv_into(buf, min(left, len(buf)))
                if not n:
                    return
                left -= n
            conn.sendall(b"ok")
        else:
            chunk = memoryview(b"x" * (1 << 20))
            while left:
                n = min(left, len(chunk))
                conn.sendall(chunk[:n])
                left -= n
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(65536):
            pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    conn, _ = s.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tcp_transfer(port: int, mode: str, size: int) -> float:
    """Upload ("w") or download ("r") `size` bytes over a TCP connection to 127.0.0.1:port;
    seconds from the request to the last byte (upload: to the server's answer)."""
    payload = memoryview(b"x" * PIECE)
    with socket.create_connection(("127.0.0.1", port), timeout=300) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        conn.sendall(mode.encode() + struct.pack(">Q", size))
        if mode == "w":
            left = size
            while left:
                n = min(left, PIECE)
                conn.sendall(payload[:n])
                left -= n
            answer = b""
            while len(answer) < 2:
                data = conn.recv(2 - len(answer))
                if not data:
                    raise RuntimeError(f"port {port}: closed before the answer")
                answer += data
        else:
            buf = bytearray(PIECE)
            got = 0
            while got < size:
                n = conn.recv_into(buf)
                if not n:
                    raise RuntimeError(f"port {port}: closed after {got} of {size} bytes")
                got += n
        elapsed = time.perf_counter() - started
        conn.shutdown(socket.SHUT_WR)
    return elapsed


async def _spdy_transfer(secure_url: str, pod: str, port: int, mode: str, size: int) -> float:
    """The same over a SPDY/3.1 port-forward session of our own, straight to the node: the
    upgrade of a TLS connection, then an error and a data stream for the one connection."""
    from pykubelet.common.spdy import SpdySession

    url = urllib.parse.urlsplit(secure_url)
    host, node_port = url.hostname or "", url.port or 443
    reader, writer = await asyncio.open_connection(host, node_port, ssl=_insecure())
    head = [
        f"POST /portForward/default/{pod} HTTP/1.1",
        f"Host: {host}:{node_port}",
        "Connection: Upgrade",
        "Upgrade: SPDY/3.1",
        "X-Stream-Protocol-Version: portforward.k8s.io",
        "Content-Length: 0",
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    await writer.drain()
    status = await reader.readline()
    if b" 101 " not in status:
        writer.close()
        raise RuntimeError(f"port-forward upgrade: {status!r}")
    while (await reader.readline()).strip():
        pass
    session = SpdySession(reader, writer, server=False)
    try:
        headers = {"streamType": "error", "port": str(port), "requestID": "0"}
        error = await session.open_stream(headers, fin=True)
        data = await session.open_stream({**headers, "streamType": "data"})
        await data.wait_reply()
        started = time.perf_counter()
        await data.write(mode.encode() + struct.pack(">Q", size))
        if mode == "w":
            payload = memoryview(b"x" * PIECE)
            left = size
            while left:
                n = min(left, PIECE)
                await data.write(payload[:n])
                left -= n
            answer = b""
            while len(answer) < 2:
                chunk = await data.read(2 - len(answer))
                if not chunk:
                    raise RuntimeError("the data stream ended before the answer")
                answer += chunk
        else:
            got = 0
            while got < size:
                chunk = await data.read()
                if not chunk:
                    raise RuntimeError(f"the data stream ended after {got} of {size} bytes")
                got += len(chunk)
        elapsed = time.perf_counter() - started
        await data.close()
        if problem := await error.read():
            raise RuntimeError(f"port-forward error stream: {problem!r}")
        return elapsed
    finally:
        await session.close()


class PortForward:
    """`kubectl port-forward` of a free local port to the pod's, until stopped."""

    def __init__(self, api: ApiInfo, pod: str, remote: int, websockets: str) -> None:
        self.local = _free_port()
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                KUBECTL,
                "--kubeconfig",
                str(api.kubeconfig),
                "port-forward",
                "--address",
                "127.0.0.1",
                f"pod/{pod}",
                f"{self.local}:{remote}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=_kubectl_env(api, KUBECTL_PORT_FORWARD_WEBSOCKETS=websockets),
        )
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._collect, args=(self.proc.stdout,))
        self._reader.start()
        try:
            wait_for(
                "kubectl port-forward to listen",
                lambda: (
                    any(line.startswith("Forwarding from") for line in self.lines)
                    or self.proc.poll() is not None
                ),
            )
            if self.proc.poll() is not None:
                raise RuntimeError(f"kubectl port-forward exited: {''.join(self.lines)}")
        except BaseException:
            self.stop()
            raise

    def _collect(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)


def _summary(runs: list[tuple[float, dict[str, float]]], size: int) -> dict[str, Any]:
    seconds = statistics.median(s for s, _ in runs)
    cpu = {name: round(statistics.median(c[name] for _, c in runs), 3) for name in runs[0][1]}
    return {
        "mb_per_second": round(size / seconds / 1e6, 1),
        "seconds": round(seconds, 3),
        "runs": [round(s, 3) for s, _ in runs],
        "cpu_seconds": cpu,
        # What the agent spends per 64 KiB of the stream (one SPDY DATA frame's worth).
        "agent_cpu_us_per_64k": round(1e6 * cpu.get("agent", 0.0) / (size / 65536), 1),
    }


def _port_forward(api: ApiInfo, base: Path, repeats: int, size: int) -> dict[str, Any]:
    node = "bench-forward"
    results: dict[str, Any] = {"bytes": size, "repeats": repeats}
    with _node(api, base, node, []) as agent:
        assert agent.proc is not None
        port = _free_port()
        _run_pod(api, node, "sink", [sys.executable, "-c", SINK, str(port)], "busybox:test")
        wait_for("the sink listening", lambda: _listening(port))
        pids: dict[str, int | None] = {"agent": agent.proc.pid, "apiserver": api.proc.pid}
        loop = asyncio.new_event_loop()
        try:
            for mode, label in (("w", "upload"), ("r", "download")):
                out: dict[str, Any] = {}

                def measure(
                    name: str, run: Callable[[], float], meter: CpuMeter, out: Obj = out
                ) -> None:
                    run()  # warm-up: the connection's set-up, reviews, the first streams
                    runs = []
                    for _ in range(repeats):
                        meter.start()
                        seconds = run()
                        runs.append((seconds, meter.stop()))
                    out[name] = _summary(runs, size)

                measure(
                    "loopback",
                    lambda mode=mode: _tcp_transfer(port, mode, size),  # type: ignore[misc]
                    CpuMeter({"client": None}),
                )
                measure(
                    "direct_spdy",
                    lambda mode=mode: loop.run_until_complete(  # type: ignore[misc]
                        _spdy_transfer(agent.secure_url, "sink", port, mode, size)
                    ),
                    CpuMeter({**pids, "client": None}),
                )
                for websockets, name in (("true", "kubectl_websocket"), ("false", "kubectl_spdy")):
                    forward = PortForward(api, "sink", port, websockets)
                    try:
                        measure(
                            name,
                            lambda mode=mode, f=forward: _tcp_transfer(  # type: ignore[misc]
                                f.local, mode, size
                            ),
                            CpuMeter({**pids, "kubectl": forward.proc.pid, "client": None}),
                        )
                    finally:
                        forward.stop()
                floor = out["loopback"]["mb_per_second"]
                for entry in out.values():
                    entry["fraction_of_loopback"] = round(entry["mb_per_second"] / floor, 3)
                results[label] = out
        finally:
            loop.close()
    return results


# --- all of it ------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    n = 5 if quick else 20
    repeats = 1 if quick else 5
    # The machine is shared: its load says how noisy the figures are.
    result: dict[str, Any] = {"exec_runs": n, "load_average_before": os.getloadavg(), "errors": {}}
    with tempfile.TemporaryDirectory(prefix="pykubelet-bench-streaming-") as tmp:
        base = Path(tmp)
        (base / "api").mkdir()
        with _apiserver(base / "api") as api:
            result["exec"] = {"process": _exec_process(api, base / "process", n)}
            for runtime in ("docker", "remote"):
                try:
                    result["exec"][runtime] = _exec_engine(api, base / runtime, n, runtime)
                except (RuntimeError, AssertionError, subprocess.SubprocessError) as exc:
                    result["errors"][runtime] = str(exc)[-5000:]
                    print(f"streaming exec {runtime} failed: {exc}", file=sys.stderr, flush=True)
            result["port_forward"] = _port_forward(api, base / "forward", repeats, TRANSFER)
    result["load_average_after"] = os.getloadavg()
    if not result["errors"]:
        del result["errors"]
    return result


def table(result: dict[str, Any]) -> list[str]:
    """The lines `python -m bench` prints."""
    lines = []
    for runtime, paths in result.get("exec", {}).items():
        ratios = paths.get("ratio_to_engine_p50", {})
        cells = []
        for name, r in paths.items():
            if name == "ratio_to_engine_p50":
                continue
            ratio = f" ({ratios[name]}x)" if name in ratios else ""
            cells.append(f"{name} {r['p50']:.0f}/{r['p90']:.0f}{ratio}")
        lines.append(f"exec {runtime} ms p50/p90: " + ", ".join(cells))
    for runtime, error in result.get("errors", {}).items():
        first = error.splitlines()[0] if error else ""
        lines.append(f"exec {runtime}: not measured: {first[:300]}")
    forward = result.get("port_forward", {})
    for label in ("upload", "download"):
        if label in forward:
            cells = [
                f"{name} {r['mb_per_second']:.0f} (agent {r['agent_cpu_us_per_64k']:.0f} us/64K)"
                if name != "loopback"
                else f"{name} {r['mb_per_second']:.0f}"
                for name, r in forward[label].items()
            ]
            size = forward["bytes"] >> 20
            lines.append(f"port-forward {label} {size} MiB, MB/s: " + ", ".join(cells))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.streaming")
    parser.add_argument("--quick", action="store_true", help="5 execs, one transfer each")
    parser.add_argument("--apiserver", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.apiserver is not None:
        _serve_apiserver(args.apiserver)
        return 0
    result = run(args.quick)
    for line in table(result):
        print(line)
    # The other benchmarks' figures stay as their last run left them.
    try:
        results = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        results = {}
    results["streaming"] = result
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote the streaming figures to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
