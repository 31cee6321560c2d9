"""The authenticated kubelet API (--port), end to end: the real agent in cluster mode, the fixture
API server proxying `kubectl logs` to it with its client certificate, and the real `kubectl`.

The agent runs as kubeadm configures a kubelet: client certificates verified against the API
server's CA (--client-ca-file), bearer tokens through TokenReview, authorization through
SubjectAccessReview, no anonymous access.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import re
import select
import shutil
import ssl
import struct
import subprocess
import termios
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.fixtures.apiserver.pki import make_ca, make_client_cert, write_pem
from tests.integration.agent import Agent, Backend, wait_for
from tests.integration.kubelet_node import https_apiserver, start_kubelet_node
from tests.integration.test_cluster import KubeClient, pod_body, running_in_api

Obj = dict[str, Any]
NODE = "api-node"
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


@pytest.fixture
def node(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> tuple[Agent, KubeClient, Path]:
    return start_kubelet_node(apiserver, start_agent, tmp_path, NODE)


def kubectl(kubeconfig: Path, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None, "kubectl is not installed (the machine image ships 1.32)"
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HOME": str(kubeconfig.parent)},
    )


def call(
    agent: Agent,
    path: str,
    *,
    token: str | None = None,
    cert: tuple[Path, Path] | None = None,
    method: str = "GET",
) -> tuple[int, str]:
    url = urllib.parse.urlsplit(agent.secure_url)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the node's self-signed serving certificate
    if cert is not None:
        ctx.load_cert_chain(*cert)
    conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=ctx, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def status_of(body: str) -> Obj:
    data: Obj = json.loads(body)
    assert data["kind"] == "Status", data
    return data


def test_kubectl_logs_reach_the_node_through_the_api_server(
    node: tuple[Agent, KubeClient, Path], apiserver: ApiServer
) -> None:
    agent, client, kubeconfig = node
    client.create_pod(
        pod_body(
            "talker",
            NODE,
            "for i in 1 2 3; do echo line $i; done; while true; do echo tick; sleep 0.3; done",
        )
    )
    wait_for("the pod running", lambda: running_in_api(client, "talker"), timeout=30)

    out = wait_for(
        "kubectl logs to show the first lines",
        lambda: (
            (r := kubectl(kubeconfig, "logs", "talker")).returncode == 0
            and "line 3" in r.stdout
            and r
        ),
    )
    assert out.stdout.startswith("line 1\nline 2\nline 3\n"), out.stdout[:200]

    tail = kubectl(kubeconfig, "logs", "talker", "--tail=1")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == "tick\n"

    limited = kubectl(kubeconfig, "logs", "talker", "--limit-bytes=7")
    assert limited.returncode == 0, limited.stderr
    assert limited.stdout == "line 1\n"

    # The process runtime's log is plain bytes: --since is answered where it keeps all of it
    # (the container started within the hour) ...
    recent = kubectl(kubeconfig, "logs", "talker", "--since=1h")
    assert recent.returncode == 0, recent.stderr
    assert recent.stdout.startswith("line 1\nline 2\nline 3\n"), recent.stdout[:200]
    # ... and refused, saying why, where lines would have to be told apart or stamped.
    stamped = kubectl(kubeconfig, "logs", "talker", "--timestamps")
    assert stamped.returncode != 0
    assert "timestamps: this runtime's log is the bytes the container wrote" in stamped.stderr
    # Once the container is older than a second (until then all of its log is that recent):
    chatty = wait_for(
        "--since=1s refused",
        lambda: (r := kubectl(kubeconfig, "logs", "talker", "--since=1s")).returncode != 0 and r,
    )
    assert "sinceSeconds/sinceTime: this runtime's log has no time per line" in chatty.stderr

    # -f streams what the container writes after it started.
    assert KUBECTL is not None
    follow = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "logs", "-f", "--tail=1", "talker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(kubeconfig.parent)},
    )
    try:
        assert follow.stdout is not None
        lines = [follow.stdout.readline() for _ in range(3)]
        assert lines == ["tick\n"] * 3, lines
    finally:
        follow.kill()
        follow.wait(timeout=10)

    wrong = kubectl(kubeconfig, "logs", "talker", "-c", "nope")
    assert wrong.returncode != 0
    assert "container nope is not valid for pod talker" in wrong.stderr

    # The API server came as its client certificate says (system:masters), and the node asked
    # the API server whether that user may use nodes/proxy.
    asked = [r["spec"] for r in apiserver.reviews() if r["kind"] == "SubjectAccessReview"]
    assert {
        "user": "kube-apiserver-kubelet-client",
        "groups": ["system:masters"],
        "resourceAttributes": {
            "verb": "get",
            "group": "",
            "version": "v1",
            "resource": "nodes",
            "subresource": "proxy",
            "name": NODE,
            "namespace": "",
        },
    } in asked

    # The Node says where its kubelet listens, and under which names.
    status = client.node(NODE)["status"]  # type: ignore[index]
    port = status["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert agent.secure_url.endswith(f":{port}")
    addresses = {a["type"]: a["address"] for a in status["addresses"]}
    # Hostname: the kubelet's hostname, which --hostname-override (our --node-name) sets.
    assert addresses == {"InternalIP": "127.0.0.1", "Hostname": NODE}


TIMESTAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z"


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("remote", marks=pytest.mark.cri),
    ],
    indirect=True,
)
def test_kubectl_logs_since_and_timestamps_on_the_container_runtimes(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path, backend: Backend
) -> None:
    """Their logs have each record's time: `kubectl logs --timestamps`, `--since-time` (whole
    seconds, as kubectl sends it) and `--since` leave out what is older, as on a kubelet."""
    _, client, kubeconfig = start_kubelet_node(
        apiserver, start_agent, tmp_path, NODE, *backend.flags
    )
    trap = 'trap "exit 0" TERM; while :; do sleep 1 & wait; done'
    client.create_pod(pod_body("stamps", NODE, f"echo early; sleep 3; echo late; {trap}", grace=2))
    wait_for("the pod running", lambda: running_in_api(client, "stamps"), timeout=60)
    wait_for(
        "both lines",
        lambda: kubectl(kubeconfig, "logs", "stamps").stdout == "early\nlate\n" or None,
        timeout=30,
    )
    stamped = kubectl(kubeconfig, "logs", "stamps", "--timestamps")
    assert stamped.returncode == 0, stamped.stderr
    found = re.fullmatch(f"({TIMESTAMP}) early\n({TIMESTAMP}) late\n", stamped.stdout)
    assert found, stamped.stdout
    late = datetime.fromisoformat(found[2])
    whole_second = late.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    since_time = kubectl(kubeconfig, "logs", "stamps", f"--since-time={whole_second}")
    assert (since_time.returncode, since_time.stdout) == (0, "late\n"), since_time.stderr
    assert kubectl(kubeconfig, "logs", "stamps", "--since=1h").stdout == "early\nlate\n"
    wait_for("the last line 3 s old", lambda: datetime.now(UTC) > late + timedelta(seconds=3))
    recent = kubectl(kubeconfig, "logs", "stamps", "--since=2s")
    assert (recent.returncode, recent.stdout) == (0, ""), recent.stderr


def test_the_kubelet_api_authenticates_and_authorizes_every_request(
    node: tuple[Agent, KubeClient, Path], apiserver: ApiServer, tmp_path: Path
) -> None:
    agent, _, _ = node
    apiserver.add_token("alice-token", "alice", ("developers",))
    apiserver.add_token("bob-token", "bob")
    apiserver.add_token("carol-token", "carol")
    apiserver.grant("bob", "nodes/metrics", ["get"])
    apiserver.grant("developers", "nodes/proxy", ["get", "create"])

    # No credentials, or a token the API server does not know: 401, with a Status.
    for token in (None, "no-such-token"):
        code, body = call(agent, "/pods", token=token)
        assert code == 401, body
        assert status_of(body)["reason"] == "Unauthorized"

    # Known, but not allowed: 403 naming the user and what was asked, as the kubelet says it.
    code, body = call(agent, "/pods", token="carol-token")
    assert code == 403, body
    assert status_of(body)["message"] == (
        "Forbidden (user=carol, verb=get, resource=nodes, subresource=proxy)"
    )

    # The kubelet's subresources: /metrics is nodes/metrics, everything else nodes/proxy.
    assert call(agent, "/metrics", token="bob-token")[0] == 200
    code, body = call(agent, "/pods", token="bob-token")
    assert code == 403 and "subresource=proxy" in status_of(body)["message"]

    # A grant to a group: alice is in it.
    code, body = call(agent, "/pods", token="alice-token")
    assert code == 200, body
    assert json.loads(body)["kind"] == "PodList"

    # What pykubelet does not serve yet says so; a request that makes no sense says why.
    code, body = call(agent, "/run/default/web/main", token="alice-token", method="POST")
    assert code == 501, body
    assert "run is not supported by pykubelet yet" in status_of(body)["message"]
    code, body = call(agent, "/exec/default/web/main?command=true", token="alice-token")
    assert code == 400, body
    assert status_of(body)["message"] == "you must specify at least 1 of stdin, stdout, stderr"

    # Tokens are reviewed once and the answer kept.
    reviews = len([r for r in apiserver.reviews() if r["kind"] == "TokenReview"])
    for _ in range(3):
        call(agent, "/healthz", token="alice-token")
    assert len([r for r in apiserver.reviews() if r["kind"] == "TokenReview"]) == reviews

    # A client certificate of the API server's CA is a user; one from another CA never gets
    # past the TLS handshake.
    assert call(agent, "/healthz", cert=apiserver.pki.kubelet_client) == (200, "ok")
    other_ca = make_ca("someone-else")
    stranger = write_pem(tmp_path / "pki", "stranger", *make_client_cert(other_ca, "admin", None))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        call(agent, "/healthz", cert=stranger)


def test_a_bad_serving_certificate_stops_the_agent_with_the_file_named(
    start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.crt"
    bad.write_text("not a certificate\n")
    with pytest.raises(AssertionError) as failed:
        start_agent("--tls-cert-file", str(bad), "--tls-private-key-file", str(bad))
    assert f"--tls-cert-file {bad}" in str(failed.value)


def test_the_self_signed_certificate_names_the_node_and_is_kept(
    start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    agent = start_agent("--anonymous-auth")
    code, body = call(agent, "/healthz")
    assert (code, body) == (200, "ok")  # anonymous, AlwaysAllow
    pki = tmp_path / "root" / "pki"
    assert (pki / "kubelet.key").stat().st_mode & 0o777 == 0o600
    first = (pki / "kubelet.crt").read_bytes()
    agent.stop()
    time.sleep(0.1)
    start_agent("--anonymous-auth")
    assert (pki / "kubelet.crt").read_bytes() == first


# --- kubectl exec, through the API server, over both wire protocols -------------------------------

PROTOCOLS = pytest.mark.parametrize("websockets", ["true", "false"], ids=["websocket", "spdy"])
# The runtimes whose exec and attach differ below the kubelet API: host processes, and the
# remote runtime, where they go through containerd's own streaming server.
STREAM_RUNTIMES = ["process", pytest.param("remote", marks=pytest.mark.cri)]


def runtime_flags(request: pytest.FixtureRequest) -> list[str]:
    """The agent's flags for the runtime a `stream_node`-style fixture is parametrized with."""
    if request.param == "remote":
        flags: list[str] = request.getfixturevalue("cri_backend").flags
        return flags
    return []


@pytest.fixture(params=STREAM_RUNTIMES)
def stream_node(
    request: pytest.FixtureRequest,
    apiserver: ApiServer,
    start_agent: Callable[..., Agent],
    tmp_path: Path,
) -> tuple[Agent, KubeClient, Path]:
    """The node on each of STREAM_RUNTIMES."""
    return start_kubelet_node(apiserver, start_agent, tmp_path, NODE, *runtime_flags(request))


def kubectl_exec(
    kubeconfig: Path, websockets: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return kubectl_stream(kubeconfig, websockets, "exec", *args, stdin=stdin)


def kubectl_stream(
    kubeconfig: Path, websockets: str, verb: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl exec` or `kubectl attach` over WebSocket (websockets "true") or SPDY."""
    assert KUBECTL is not None, "kubectl is not installed (the machine image ships 1.32)"
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), verb, *args],
        capture_output=True,
        text=True,
        timeout=30,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        env={
            **os.environ,
            "HOME": str(kubeconfig.parent),
            # false: SPDY/3.1 all the way, as kubectl before 1.30 and the API server speak it.
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets,
        },
    )


def shell_pod(client: KubeClient, name: str) -> None:
    client.create_pod(pod_body(name, NODE, "while true; do sleep 0.5; done"))
    wait_for("the pod running", lambda: running_in_api(client, name), timeout=30)


@PROTOCOLS
def test_kubectl_exec_runs_a_command_with_its_output_and_exit_code(
    stream_node: tuple[Agent, KubeClient, Path], websockets: str
) -> None:
    agent, client, kubeconfig = stream_node
    shell_pod(client, "shell")
    done = kubectl_exec(
        kubeconfig, websockets, "shell", "--", "sh", "-c", "echo out; echo err >&2; exit 3"
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "out\n"
    assert "err\n" in done.stderr
    assert "command terminated with exit code 3" in done.stderr

    ok = kubectl_exec(kubeconfig, websockets, "shell", "-c", "main", "--", "true")
    assert (ok.returncode, ok.stdout) == (0, ""), ok.stderr

    # stdin reaches the command, and its end ends cat.
    text = "hello\nworld\n"
    echoed = kubectl_exec(kubeconfig, websockets, "-i", "shell", "--", "cat", stdin=text)
    assert (echoed.returncode, echoed.stdout) == (0, text), echoed.stderr

    missing = kubectl_exec(kubeconfig, websockets, "shell", "--", "/no/such/program")
    assert missing.returncode != 0
    assert "/no/such/program" in missing.stderr

    # It went over the protocol asked for, to the kubelet itself (the API server relays it).
    transport = "WebSocket (v5.channel.k8s.io)" if websockets == "true" else "SPDY/3.1 (v5"
    assert f"exec in container main of pod default/shell over {transport}" in agent.log()


# The terminal's size once it has one: containerd 1.6 applies the first size only after it has
# started the command (the Kubernetes streaming server hands it over then), so a command that
# asks at once may find none yet; it asks until it has one.
# (busybox's stty says it has none on stderr, and exits 0 all the same.)
STTY_SIZE = (
    'i=0; while [ $i -lt 50 ]; do s=$(stty size 2>/dev/null); [ -n "$s" ] && break; '
    'i=$((i + 1)); sleep 0.1; done; echo "$s"'
)


@PROTOCOLS
def test_kubectl_exec_with_a_terminal(
    stream_node: tuple[Agent, KubeClient, Path], websockets: str
) -> None:
    """`kubectl exec -it`: the command gets a terminal of the size of kubectl's."""
    _, client, kubeconfig = stream_node
    shell_pod(client, "tty")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    assert KUBECTL is not None
    proc = subprocess.Popen(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
            "exec",
            "-it",
            "tty",
            "--",
            "sh",
            "-c",
            f"tty; {STTY_SIZE}",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={
            **os.environ,
            "HOME": str(kubeconfig.parent),
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": websockets,
        },
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:
                    break
        assert proc.wait(timeout=10) == 0, output
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = output.decode(errors="replace")
    assert "/dev/pts/" in text, text
    assert "33 111" in text, text


def test_requests_that_reach_nothing_are_answered_so(
    node: tuple[Agent, KubeClient, Path], apiserver: ApiServer
) -> None:
    """A pod of another node, a path outside the API, a header too large: each a clear answer,
    and the node goes on serving."""
    agent, client, kubeconfig = node
    apiserver.add_token("ops-token", "ops", ("ops",))
    apiserver.grant("ops", "nodes/proxy", ["get", "create"])
    client.create_pod(pod_body("elsewhere", f"{NODE}-other", "sleep 600"))

    # The API server sends a pod's requests to the pod's node; asked directly, this node does
    # not have it.
    path = "/exec/default/elsewhere/main?command=true&output=1"
    code, body = call(agent, path, token="ops-token")
    assert code == 404, body
    assert status_of(body)["message"] == 'pod "default/elsewhere" not found'
    code, body = call(agent, "/containerLogs/default/elsewhere/main", token="ops-token")
    assert code == 404 and "not found" in status_of(body)["message"]

    # Outside the API: authenticated first (401 without credentials), then not found.
    assert call(agent, "/no/such/path")[0] == 401
    assert call(agent, "/no/such/path", token="ops-token")[0] == 404

    # A header past the server's limit: refused, not buffered.
    url = urllib.parse.urlsplit(agent.secure_url)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(url.hostname or "", url.port, context=ctx, timeout=10)
    try:
        conn.request(
            "GET", "/pods", headers={"Authorization": "Bearer ops-token", "X-Big": "x" * 20000}
        )
        assert conn.getresponse().status in (400, 431)
    finally:
        conn.close()
    assert call(agent, "/healthz", token="ops-token") == (200, "ok")

    # Through the API server, a pod of a node that never registered is the API server's error.
    missing = kubectl_exec(kubeconfig, "true", "elsewhere", "--", "true")
    assert missing.returncode != 0
