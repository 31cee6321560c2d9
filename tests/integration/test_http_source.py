"""Pods from a manifest URL, end to end: a real HTTP(S) server in a thread, the real agent, and
what it reports through its own HTTP API."""

from __future__ import annotations

import hashlib
import json
import signal
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.agent import (
    NODE,
    Agent,
    container_state,
    pid_alive,
    pod_yaml,
    wait_for,
    write_pod,
)
from tests.tls import make_tls

CHECK = ["--http-check-frequency", "1s"]


class ManifestServer:
    """A threaded HTTP server serving one manifest; the test changes what it answers and reads
    the log of what it was asked."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.lock = threading.Lock()
        self.status = 200
        self.body = b""
        self.etag = False  # answer If-None-Match with 304
        self.last_modified: str | None = None  # answer If-Modified-Since with 304
        self.delay = 0.0
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with server.lock:
                    status, body, delay = server.status, server.body, server.delay
                    headers: dict[str, str] = {}
                    if server.etag:
                        headers["ETag"] = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                        if self.headers.get("If-None-Match") == headers["ETag"]:
                            status, body = 304, b""
                    if server.last_modified is not None:
                        headers["Last-Modified"] = server.last_modified
                        if self.headers.get("If-Modified-Since") == server.last_modified:
                            status, body = 304, b""
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "status": status}
                    )
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    if status != 304:
                        self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False  # do not wait for a deliberately slow answer
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}/pods"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def serve(self, body: bytes | str = b"", status: int = 200, **kwargs: Any) -> None:
        with self.lock:
            self.body = body.encode() if isinstance(body, str) else body
            self.status = status
            for key, value in kwargs.items():
                setattr(self, key, value)

    def log(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[ManifestServer]:
    srv = ManifestServer()
    yield srv
    srv.close()


def running(agent: Agent, name: str) -> dict[str, Any] | None:
    pod = agent.pod(name)
    if pod is None or pod["status"].get("phase") != "Running":
        return None
    state = container_state(pod)
    return pod if "running" in state["state"] else None


def sleeper(name: str, tag: str = "v1") -> str:
    return pod_yaml(name, f"echo {tag} $$$$; exec sleep 600", grace=5)


def as_dict(manifest: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(manifest)
    return doc


def events(agent: Agent, reason: str, needle: str) -> list[str]:
    return [
        e["message"] for e in agent.events() if e["reason"] == reason and needle in e["message"]
    ]


def test_pod_podlist_and_stream_and_changes(start_agent, server: ManifestServer) -> None:  # type: ignore[no-untyped-def]
    server.serve(sleeper("web"))
    agent = start_agent("--manifest-url", server.url, *CHECK)
    web = wait_for("web running", lambda: running(agent, "web"))
    meta = web["metadata"]
    assert meta["annotations"]["kubernetes.io/config.source"] == "http"
    assert meta["annotations"]["kubernetes.io/config.hash"] == meta["uid"]
    assert web["spec"]["nodeName"] == NODE
    web_id = container_state(web)["containerID"]

    # A JSON PodList keeping web as it was: web is the same pod (its UID names it, not its place).
    podlist = {
        "apiVersion": "v1",
        "kind": "PodList",
        "items": [as_dict(sleeper("api")), as_dict(sleeper("web"))],
    }
    server.serve(json.dumps(podlist))
    wait_for("api running", lambda: running(agent, "api"))
    # A YAML stream.
    server.serve("---\n".join([sleeper("web"), sleeper("api"), sleeper("db")]))
    wait_for("db running", lambda: running(agent, "db"))
    web = agent.pod("web")
    assert web is not None and web["metadata"]["uid"] == meta["uid"]
    st = container_state(web)
    assert st["containerID"] == web_id and st["restartCount"] == 0

    # A change on the server is seen within one check period.
    changed = time.monotonic()
    server.serve("---\n".join([sleeper("web", "v2"), sleeper("api")]))
    wait_for(
        "new web listed",
        lambda: (p := agent.pod("web")) and p["metadata"]["uid"] != meta["uid"],
        timeout=5,
        interval=0.05,
    )
    assert time.monotonic() - changed < 2.5  # one 1 s period, and slack for a busy machine
    wait_for("db removed", lambda: agent.pod("db") is None, timeout=5)
    wait_for(
        "web v2 running",
        lambda: running(agent, "web") and agent.logs("web", "main").startswith("v2 "),
    )

    server.serve(b"")  # an empty body: no pods
    wait_for("all gone", lambda: agent.pods() == {}, timeout=10)


def test_unchanged_manifest_costs_a_304_and_restarts_nothing(
    start_agent, server: ManifestServer
) -> None:  # type: ignore[no-untyped-def]
    server.serve(sleeper("steady"), etag=True)
    agent = start_agent("--manifest-url", server.url, *CHECK)
    first = container_state(wait_for("steady running", lambda: running(agent, "steady")))
    time.sleep(2.5)
    log = server.log()
    assert len(log) >= 3, log
    assert "If-None-Match" not in log[0]["headers"] and log[0]["status"] == 200
    tag = log[1]["headers"]["If-None-Match"]
    assert all(r["headers"].get("If-None-Match") == tag and r["status"] == 304 for r in log[1:]), (
        log
    )

    # Without validators, a byte-identical body must not restart anything either.
    server.serve(server.body, etag=False)
    time.sleep(2.5)
    # And with Last-Modified only.
    stamp = "Mon, 01 Jan 2024 00:00:00 GMT"
    server.serve(server.body, last_modified=stamp)
    wait_for(
        "If-Modified-Since sent",
        lambda: any(r["headers"].get("If-Modified-Since") == stamp for r in server.log()),
        timeout=5,
    )
    assert any(r["status"] == 304 for r in server.log() if "If-Modified-Since" in r["headers"])
    now = container_state(agent.pod("steady"))
    assert now["containerID"] == first["containerID"] and now["restartCount"] == 0
    assert "running" in now["state"]


def test_failures_keep_pods_running_and_are_reported(start_agent, server: ManifestServer) -> None:  # type: ignore[no-untyped-def]
    good = sleeper("sturdy")
    server.serve(good)
    agent = start_agent("--manifest-url", server.url, *CHECK, "--manifest-url-max-bytes", "4Ki")
    before = container_state(wait_for("sturdy running", lambda: running(agent, "sturdy")))

    def still_running() -> None:
        pod = running(agent, "sturdy")
        assert pod is not None, agent.pods()
        st = container_state(pod)
        assert st["containerID"] == before["containerID"] and st["restartCount"] == 0

    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("500", {"body": "oops", "status": 500}, "FailedFetch", "HTTP 500 Internal Server Error"),
        ("404", {"body": "", "status": 404}, "FailedFetch", "HTTP 404 Not Found"),
        ("garbage", {"body": b"\x89PNG\r\n\x1a\n\xff\x00"}, "FailedValidation", "not UTF-8 text"),
        ("oversized", {"body": good + "#" * 5000 + "\n"}, "FailedFetch", "over the limit of 4096"),
    ]
    for what, answer, reason, needle in cases:
        server.serve(**answer)
        message = wait_for(
            f"{what} reported", lambda r=reason, n=needle: events(agent, r, n), timeout=5
        )
        assert message[0].startswith(server.url), message
        assert "keep running" in message[0], message
        still_running()
    # Each error was logged once although every check saw it (500 lasted for several checks).
    assert agent.log().count("HTTP 500 Internal Server Error") == 1

    server.serve(good, delay=11.0)
    wait_for(
        "timeout reported",
        lambda: events(agent, "FailedFetch", "no complete answer within 10s"),
        timeout=15,
    )
    still_running()
    server.serve(good, delay=0.0)
    time.sleep(1.5)
    still_running()


def test_headers_arrive_as_given(start_agent, server: ManifestServer) -> None:  # type: ignore[no-untyped-def]
    agent = start_agent(
        "--manifest-url",
        server.url,
        *CHECK,
        "--manifest-url-header",
        "Authorization:Bearer abc:def",
        "--manifest-url-header",
        "X-Fleet: blue",
    )
    wait_for("a request", server.log)
    headers = server.log()[0]["headers"]
    assert headers["Authorization"] == "Bearer abc:def"
    assert headers["X-Fleet"] == "blue"
    assert agent.pods() == {}


def test_file_and_http_sources_together_name_clash_keeps_the_first(
    start_agent, server: ManifestServer, manifests: Path
) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "clash", sleeper("clash", "file"))
    server.serve(status=503)
    agent = start_agent("--manifest-url", server.url, *CHECK)
    from_file = wait_for("file pod running", lambda: running(agent, "clash"))
    assert from_file["metadata"]["annotations"]["kubernetes.io/config.source"] == "file"

    server.serve("---\n".join([sleeper("clash", "http"), sleeper("solo")]))
    wait_for("http pod running", lambda: running(agent, "solo"))
    clash = wait_for(
        "clash reported",
        lambda: events(agent, "FailedValidation", f"duplicate pod default/clash-{NODE}"),
    )
    assert "from source http: already provided by source file" in clash[0], clash
    pod = agent.pod("clash")
    assert pod is not None
    assert pod["metadata"]["uid"] == from_file["metadata"]["uid"]
    assert agent.logs("clash", "main").startswith("file ")

    # When the file's pod goes, the waiting one from the URL takes the name.
    (manifests / "clash.yaml").unlink()
    wait_for(
        "http clash running",
        lambda: running(agent, "clash") and agent.logs("clash", "main").startswith("http "),
        timeout=15,
    )


def test_no_garbage_collection_until_the_url_answers(
    start_agent, server: ManifestServer, manifests: Path
) -> None:  # type: ignore[no-untyped-def]
    write_pod(manifests, "orphan", sleeper("orphan"))
    agent = start_agent()
    wait_for("orphan running", lambda: running(agent, "orphan"))
    pid = int(agent.logs("orphan", "main").split()[1])
    agent.stop(signal.SIGKILL)
    (manifests / "orphan.yaml").unlink()

    server.serve(status=500)
    again = start_agent("--manifest-url", server.url, *CHECK)
    wait_for("not ready reported", lambda: events(again, "FailedFetch", "not ready"))
    time.sleep(4.5)  # two housekeeping passes: the orphan must survive them
    assert pid_alive(pid), "a pod was garbage-collected before every source was ready"

    server.serve(b"")
    wait_for("orphan collected once the URL answered", lambda: not pid_alive(pid), timeout=15)


def test_https_with_a_private_ca(start_agent, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ca, cert, key = make_tls(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    srv = ManifestServer(ssl_context=context)
    try:
        srv.serve(sleeper("secure"))
        agent = start_agent("--manifest-url", srv.url, *CHECK, "--manifest-url-ca-file", str(ca))
        wait_for("secure running", lambda: running(agent, "secure"))
    finally:
        srv.close()
