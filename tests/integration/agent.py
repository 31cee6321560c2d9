"""Start the real `pykubelet` process and talk to it over its HTTP API, as a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

NODE = "testnode"
URL_LINE = re.compile(r"read-only API at (http://\S+)")


class Agent:
    def __init__(self, manifests: Path, root: Path, log_path: Path, extra: list[str]) -> None:
        self.manifests = manifests
        self.root = root
        self.log_path = log_path
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

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
            if match:
                self.url = match.group(1)
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
    except FileNotFoundError:
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
