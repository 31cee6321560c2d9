"""Start the real `pykubelet` process and talk to it over its HTTP API, as a user would."""

from __future__ import annotations

import ctypes
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE = "testnode"
URL_LINE = re.compile(r"read-only API at (http://\S+)")
SECURE_URL_LINE = re.compile(r"kubelet API at (https://\S+)")


class Agent:
    def __init__(self, manifests: Path, root: Path, log_path: Path, extra: list[str]) -> None:
        self.manifests = manifests
        self.root = root
        self.log_path = log_path
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.secure_url = ""  # the authenticated kubelet API (--port)

    def start(self, timeout: float = 20.0) -> Agent:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        args = [
            sys.executable,
            "-m",
            "pykubelet",
            "--pod-manifest-path",
            str(self.manifests),
            "--root-dir",
            str(self.root),
            "--read-only-port",
            "0",
            "--port",
            "0",
            "--node-name",
            NODE,
            "--file-check-frequency",
            "2s",
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            match = URL_LINE.search(text)
            secure = SECURE_URL_LINE.search(text)
            if match and secure:
                self.url = match.group(1)
                self.secure_url = secure.group(1)
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"agent did not start in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"agent did not stop within {timeout}s") from None

    # --- HTTP -------------------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def pods(self) -> dict[str, dict[str, Any]]:
        status, body = self.get("/pods")
        assert status == 200, body
        return {p["metadata"]["name"]: p for p in json.loads(body)["items"]}

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.pods().get(f"{name}-{NODE}")

    def logs(self, pod: str, container: str, query: str = "") -> str:
        status, body = self.get(f"/containerLogs/default/{pod}-{NODE}/{container}{query}")
        assert status == 200, body
        return body.decode()

    def events(self) -> list[dict[str, Any]]:
        status, body = self.get("/events")
        assert status == 200
        items: list[dict[str, Any]] = json.loads(body)["items"]
        return items


def write_pod(directory: Path, name: str, body: str, filename: str | None = None) -> Path:
    """Write a manifest atomically (as `kubectl`-minded tools and editors do)."""
    path = directory / (filename or f"{name}.yaml")
    tmp = directory / f".{path.name}.tmp"
    tmp.write_text(textwrap.dedent(body))
    os.replace(tmp, path)
    return path


def pod_yaml(
    name: str,
    script: str,
    *,
    restart: str = "Always",
    grace: int = 30,
    container: str = "main",
    extra_spec: str = "",
) -> str:
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: {restart}
  terminationGracePeriodSeconds: {grace}
{extra_spec}  containers:
  - name: {container}
    image: busybox:test
    command: ["/bin/sh", "-c", {json.dumps(script)}]
"""


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1
) -> Any:
    """Poll until `check()` returns something truthy; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, KeyError, TypeError, urllib.error.URLError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def container_state(pod: dict[str, Any] | None, index: int = 0) -> dict[str, Any]:
    assert pod is not None, "pod not listed"
    statuses = pod["status"].get("containerStatuses") or []
    assert statuses, "no container status yet"
    return statuses[index]  # type: ignore[no-any-return]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return False
    return state != "Z"


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line contains `marker` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in cmdline and pid_alive(int(entry)):
            found.append(int(entry))
    return found


# --- the container engine, for the docker runtime's tests -----------------------------------------

LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_TYPE = "io.kubernetes.docker.type"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class Engine:
    """Just enough of the Docker Engine API to check what the agent did, as `docker` would."""

    def __init__(self, endpoint: str) -> None:
        assert endpoint.startswith("unix://"), endpoint
        self.endpoint = endpoint
        self.path = endpoint[len("unix://") :]

    def request(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        conn = _UnixConnection(self.path, timeout=30)
        try:
            url = "/v1.41/" + path + ("?" + urllib.parse.urlencode(query) if query else "")
            if body is None:
                conn.request(method, url)
            else:
                headers = {"Content-Type": "application/json"}
                conn.request(method, url, body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status == 404:
            return None
        assert resp.status < 300, f"{method} {path}: {resp.status} {body[:500]!r}"
        return json.loads(body) if body.strip() else None

    def containers(self, **labels: str) -> list[dict[str, Any]]:
        """Every container (running or not) with these labels; all of the agent's without any."""
        wanted = [f"{k}={v}" for k, v in labels.items()] or [LABEL_TYPE]
        rows = self.request(
            "GET", "containers/json", {"all": "1", "filters": json.dumps({"label": wanted})}
        )
        return list(rows or [])

    def pod_containers(self, pod_name: str) -> list[dict[str, Any]]:
        return self.containers(**{LABEL_POD_NAME: f"{pod_name}-{NODE}"})

    def inspect(self, container_id: str) -> dict[str, Any] | None:
        cid = container_id.split("://", 1)[-1]
        info: dict[str, Any] | None = self.request("GET", f"containers/{cid}/json")
        return info

    def pid(self, container_id: str) -> int | None:
        info = self.inspect(container_id) or {}
        found = (info.get("State") or {}).get("Pid")
        return int(found) if found else None

    def gateway(self) -> str:
        """The host's address on the engine's default network, as the containers reach it."""
        for name in ("podman", "bridge"):
            net = self.request("GET", f"networks/{name}")
            if net:
                for conf in (net.get("IPAM") or {}).get("Config") or []:
                    if conf.get("Gateway"):
                        return str(conf["Gateway"])
        raise AssertionError("the engine has no default network with a gateway")

    def remove_all(self) -> None:
        # Members first: an infra container goes only once nothing joined to it is left.
        rows = self.containers()
        rows.sort(key=lambda r: (r.get("Labels") or {}).get(LABEL_TYPE) == "podsandbox")
        for row in rows:
            self.request("DELETE", f"containers/{row['Id']}", {"force": "1", "v": "1"})


class CriEngine:
    """Just enough of the CRI to check what the agent did, as `crictl` would."""

    def __init__(self, endpoint: str, gateway_ip: str) -> None:
        import grpc  # type: ignore[import-untyped]

        from pykubelet.runtime.cri.proto import cri_api_pb2 as api

        self.endpoint = endpoint
        self.api = api
        self._gateway = gateway_ip
        self._channel = grpc.insecure_channel(endpoint)

    def call(self, name: str, request: Any, response: Any, service: str = "RuntimeService") -> Any:
        method = self._channel.unary_unary(
            f"/runtime.v1.{service}/{name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )
        return method(request, timeout=60)

    @staticmethod
    def _selector(labels: dict[str, str]) -> dict[str, str]:
        return {"io.pykubelet.managed": "true", **labels}

    def sandboxes(self, **labels: str) -> list[Any]:
        api = self.api
        request = api.ListPodSandboxRequest(
            filter=api.PodSandboxFilter(label_selector=self._selector(labels))
        )
        return list(self.call("ListPodSandbox", request, api.ListPodSandboxResponse).items)

    def containers(self, **labels: str) -> list[Any]:
        api = self.api
        request = api.ListContainersRequest(
            filter=api.ContainerFilter(label_selector=self._selector(labels))
        )
        return list(self.call("ListContainers", request, api.ListContainersResponse).containers)

    def pod_containers(self, pod_name: str) -> list[Any]:
        """The pod's sandboxes and containers."""
        labels = {LABEL_POD_NAME: f"{pod_name}-{NODE}"}
        return [*self.sandboxes(**labels), *self.containers(**labels)]

    def container_status(self, container_id: str) -> Any:
        api = self.api
        cid = container_id.split("://", 1)[-1]
        return self.call(
            "ContainerStatus",
            api.ContainerStatusRequest(container_id=cid, verbose=True),
            api.ContainerStatusResponse,
        )

    def sandbox_status(self, sandbox_id: str) -> Any:
        api = self.api
        return self.call(
            "PodSandboxStatus",
            api.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True),
            api.PodSandboxStatusResponse,
        )

    def pid(self, container_id: str) -> int | None:
        info = json.loads(self.container_status(container_id).info.get("info", "{}"))
        return int(info["pid"]) if info.get("pid") else None

    def gateway(self) -> str:
        return self._gateway

    def remove_all(self) -> None:
        api = self.api
        # Removing a sandbox removes its containers.
        for sandbox in self.sandboxes():
            request = api.StopPodSandboxRequest(pod_sandbox_id=sandbox.id)
            self.call("StopPodSandbox", request, api.StopPodSandboxResponse)
            request = api.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id)
            self.call("RemovePodSandbox", request, api.RemovePodSandboxResponse)
        for container in self.containers():
            request = api.RemoveContainerRequest(container_id=container.id)
            self.call("RemoveContainer", request, api.RemoveContainerResponse)


class _JournalHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.lines.append(self.path.strip("/"))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class Journal:
    """Lines written by containers, in the order they were written. With host processes, a file;
    containers see no host file (there are no volumes yet), so they report to an HTTP server the
    test runs on the engine network's gateway."""

    def __init__(self, path: Path | None, host: str = "") -> None:
        self.path = path
        self.server: http.server.ThreadingHTTPServer | None = None
        if path is None:
            server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _JournalHandler)
            server.lines = []  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.server = server
            self.url = f"http://{host}:{server.server_address[1]}"

    def append(self, word: str) -> str:
        """A shell command that appends `word` (it may hold $(VAR) references)."""
        if self.path is not None:
            return f"echo {word} >> {self.path}"
        return f"wget -q -O /dev/null {self.url}/{word}"

    def lines(self) -> list[str]:
        if self.path is not None:
            return self.path.read_text().split() if self.path.exists() else []
        assert self.server is not None
        return list(self.server.lines)  # type: ignore[attr-defined]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Backend:
    """The runtime the agent under test uses, and how a test checks what it runs: host
    processes directly, containers through the engine."""

    name: str
    flags: list[str] = field(default_factory=list)
    engine: Engine | CriEngine | None = None
    journals: list[Journal] = field(default_factory=list)

    @property
    def scheme(self) -> str:
        # containerID's scheme is the runtime's own name: containerd's through the CRI.
        return "containerd://" if self.name == "remote" else f"{self.name}://"

    def forever(self, exec_: bool = True) -> str:
        """A shell command that runs until it is stopped. In a container the shell is PID 1,
        which ignores SIGTERM unless it traps it (as in Kubernetes): it traps it."""
        if self.engine is None:
            return "exec sleep 600" if exec_ else "sleep 600"
        return 'trap "exit 0" TERM; while :; do sleep 1 & wait; done'

    def scratch(self, tmp_path: Path) -> Path:
        """A directory every container of a pod sees, across restarts: the host's for
        processes; the pod's /dev/shm (its IPC namespace, held by the infra) for containers."""
        return tmp_path if self.engine is None else Path("/dev/shm")

    def journal(self, tmp_path: Path) -> Journal:
        if self.engine is None:
            journal = Journal(tmp_path / "journal")
        else:
            journal = Journal(None, self.engine.gateway())
        self.journals.append(journal)
        return journal

    def pid_of(self, agent: Agent, pod: str, field: int = 0, container: str = "main") -> int:
        """The host pid of the container's main process. A process prints its own pid (field
        `field` of its log); a container's is the engine's, for the container in the status."""
        if self.engine is None:
            text = wait_for(f"{pod} log", lambda: agent.logs(pod, container))
            return int(text.split()[field])
        engine = self.engine

        def pid() -> int | None:
            statuses = (agent.pod(pod) or {}).get("status", {}).get("containerStatuses") or []
            for st in statuses:
                if st["name"] == container and "running" in st["state"]:
                    return engine.pid(st["containerID"])
            return None

        return int(wait_for(f"{pod} pid", pid))

    def close(self) -> None:
        for journal in self.journals:
            journal.close()
        if self.engine is not None:
            self.engine.remove_all()


def unmount_below(path: Path) -> None:
    """Detach what agents left mounted below `path`: the pods directory's own bind and the pods'
    tmpfs volumes stay after an agent was killed (its next start adopts them), and would keep
    the test's directory from being removed and pile up in every later launcher's namespace."""
    root = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if line.strip()]
    libc = ctypes.CDLL(None, use_errno=True)
    for point in sorted((p for p in points if p.startswith(root + "/")), reverse=True):
        libc.umount2(os.fsencode(point), 2)  # MNT_DETACH; gone already with a parent: fine
