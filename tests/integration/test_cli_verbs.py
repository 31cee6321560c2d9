"""`pykubelet exec`, `port-forward` and `top pods` against the real agent's kubelet API (its
--port, HTTPS), as a user runs them: a subprocess each, its output, its exit code.

The agent runs a static pod on the process runtime; anonymous access (`--anonymous-auth`) for
the verbs themselves, and a client CA (`--client-ca-file`) with a certificate made here for the
credentials: in a kubeconfig, by flags, and a certificate of another CA, refused in one line."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization

from tests.fixtures.apiserver.pki import make_ca, make_client_cert, write_pem
from tests.integration.agent import Agent, pod_yaml, wait_for, write_pod
from tests.integration.test_port_forward import SERVER, free_port

TIMEOUT = 30.0


def pykubelet(
    *args: str, stdin: bytes | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "pykubelet", *args],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )


def running(agent: Agent, name: str) -> bool:
    pod = agent.pod(name)
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in s.get("state", {}) for s in statuses)


@pytest.fixture
def node(start_agent: Callable[..., Agent], manifests: Path) -> tuple[Agent, list[str]]:
    """The agent with a pod `web`, and the flags that reach it (its self-signed certificate
    is not checked)."""
    write_pod(manifests, "web", pod_yaml("web", "while true; do sleep 1; done", grace=1))
    agent = start_agent("--anonymous-auth")
    wait_for("web running", lambda: running(agent, "web"))
    return agent, ["--server", agent.secure_url, "--insecure-skip-tls-verify"]


def drain(master: int) -> bytes:
    """What the terminal still holds once the command has exited (until 0.2 s of quiet)."""
    out = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            out += os.read(master, 4096)
        except OSError:
            break
    return out


def test_exec_exit_code_output_and_stdin(node: tuple[Agent, list[str]]) -> None:
    agent, flags = node
    result = pykubelet("exec", "web", *flags, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert result.returncode == 3, result
    assert result.stdout == b"out\n"
    assert result.stderr == b"err\ncommand terminated with exit code 3\n"

    result = pykubelet("exec", "-i", "web", *flags, "--", "wc", "-l", stdin=b"a\nb\nc\n")
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, b"3", b""), result

    # Bytes, not text: stdin and stdout carry anything.
    blob = bytes(range(256)) * 512
    result = pykubelet("exec", "-i", "web", *flags, "--", "cat", stdin=blob)
    assert result.returncode == 0 and result.stdout == blob, result.stderr

    # One line each: no such pod, no such container, nothing listening.
    result = pykubelet("exec", "nope", *flags, "--", "true")
    assert (result.returncode, result.stderr) == (
        1,
        b'error: pod "nope" not found in namespace "default"\n',
    )
    result = pykubelet("exec", "web", "-c", "other", *flags, "--", "true")
    assert result.returncode == 1 and result.stderr.count(b"\n") == 1, result
    assert b"container other is not valid" in result.stderr
    port = free_port()
    result = pykubelet("exec", "web", "--server", f"https://127.0.0.1:{port}", "--", "true")
    assert result.returncode == 1, result
    assert (
        result.stderr
        == (
            f"error: cannot connect to the node at https://127.0.0.1:{port}: connection refused "
            "(is pykubelet running there? see --server)\n"
        ).encode()
    )
    # The node's certificate, self-signed, is not trusted without a word about it.
    result = pykubelet("exec", "web", "--server", agent.secure_url, "--", "true")
    assert result.returncode == 1 and result.stderr.count(b"\n") == 1, result
    assert b"is not trusted (self-signed certificate)" in result.stderr
    assert "exec in container main of pod default/web-testnode over WebSocket" in agent.log()
    assert "(v5.channel.k8s.io)" in agent.log()


def test_exec_with_a_terminal(node: tuple[Agent, list[str]]) -> None:
    """`exec -it` under a pty: the command's terminal has ours' size, and the new one after a
    SIGWINCH; keys go through raw (no local echo); ours is restored after."""
    _, flags = node
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    before = termios.tcgetattr(slave)
    script = "tty; stty size; echo ready; read x; stty size; echo got $x; exit 4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pykubelet", "exec", "-it", "web", *flags, "--", "sh", "-c", script],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    output = b""
    typed = False
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                output += os.read(master, 4096)
            if b"ready" in output and not typed:
                fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
                # Not in the terminal's foreground group (its own session): told directly.
                proc.send_signal(signal.SIGWINCH)
                time.sleep(0.3)
                os.write(master, b"hello\r")
                typed = True
        assert proc.wait(timeout=10) == 4, output
        output += drain(master)
        after = termios.tcgetattr(slave)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(slave)
    text = output.decode(errors="replace").replace("\r\n", "\n")
    assert "/dev/pts/" in text, text
    assert "33 111\nready\n" in text, text
    assert "40 120\ngot hello\n" in text, text
    assert text.endswith("command terminated with exit code 4\n"), text
    assert after == before  # the terminal as it was: cooked, echoing


def stdio_pod(manifests: Path, name: str, script: str, **stdio: bool) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
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
    write_pod(manifests, name, json.dumps(pod))  # JSON is YAML


def test_attach_to_a_container_with_stdin(
    start_agent: Callable[..., Agent], manifests: Path
) -> None:
    """`attach -i`: the container's output from then on, our stdin to its stdin; with
    `stdinOnce` its stdin closes with our end of input, it exits and the attach ends, exit 0.
    `-t` for a container without a terminal says so and goes on without."""
    reader = 'echo started; while read -r line; do echo "got $line"; done; echo "stdin closed"'
    stdio_pod(manifests, "reader", reader, stdin=True, stdinOnce=True)
    stdio_pod(manifests, "talker", "while true; do echo tick; sleep 0.2; done")
    agent = start_agent("--anonymous-auth")
    flags = ["--server", agent.secure_url, "--insecure-skip-tls-verify"]
    wait_for("both running", lambda: running(agent, "reader") and running(agent, "talker"))
    wait_for("reader started", lambda: agent.logs("reader", "main") == "started\n" or None)

    result = pykubelet("attach", "-i", "reader", *flags, stdin=b"one\ntwo\n")
    assert result.returncode == 0, result
    assert result.stdout == b"got one\ngot two\nstdin closed\n", result
    assert result.stderr == b"If you don't see a command prompt, try pressing enter.\n"
    assert "attach in container main of pod default/reader-testnode over WebSocket" in agent.log()

    # Without -i, the output only; Ctrl-C (SIGINT) detaches with 130, the container runs on.
    # -t for a container without a terminal: said, and the attach goes on without one.
    proc = subprocess.Popen(
        [sys.executable, "-m", "pykubelet", "attach", "-t", "talker", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"tick\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 130
        assert proc.stderr.read() == (
            b"error: Unable to use a TTY - container main did not allocate one\n"
            b"If you don't see a command prompt, try pressing enter.\n"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
    assert running(agent, "talker")

    gone = pykubelet("attach", "nope", *flags)
    assert (gone.returncode, gone.stderr) == (
        1,
        b'error: pod "nope" not found in namespace "default"\n',
    )


def test_attach_with_a_terminal(start_agent: Callable[..., Agent], manifests: Path) -> None:
    """`attach -it` to a container with `tty: true`, under a pty: raw keys reach the
    container's terminal (of our size), Ctrl-C too (its shell dies of SIGINT, the attach ends,
    exit 0, with how to resume); our terminal is restored."""
    script = 'while read -r line; do echo "[$line] $(stty size)"; done'
    stdio_pod(manifests, "term", script, stdin=True, tty=True)
    agent = start_agent("--anonymous-auth")
    flags = ["--server", agent.secure_url, "--insecure-skip-tls-verify"]
    wait_for("term running", lambda: running(agent, "term"))
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
    before = termios.tcgetattr(slave)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pykubelet", "attach", "-it", "term", *flags],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    output = b""
    stage = 0
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                output += os.read(master, 4096)
            if stage == 0 and b"try pressing enter" in output:
                time.sleep(0.3)
                os.write(master, b"hello\r")
                stage = 1
            elif stage == 1 and b"[hello] 33 111" in output:
                os.write(master, b"\x03")  # Ctrl-C, raw: for the container's terminal
                stage = 2
        assert proc.wait(timeout=10) == 0, output
        output += drain(master)
        after = termios.tcgetattr(slave)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
        os.close(slave)
    text = output.decode(errors="replace").replace("\r\n", "\n")
    assert stage == 2, text
    assert "Session ended, resume using 'pykubelet attach term-testnode -c main -i -t'" in text
    assert after == before


def test_port_forward_two_ports_many_connections(
    start_agent: Callable[..., Agent], manifests: Path
) -> None:
    """Two ports, one of them on a free local port; concurrent connections on both, each with
    more than a window of data and a half-close; a port nothing listens on fails its own
    connection only; Ctrl-C ends it, exit 0."""
    ports = free_port(), free_port()
    dead = free_port()
    containers = [
        {
            "name": tag,
            "image": "busybox:test",
            "command": [sys.executable, "-c", SERVER, str(port), prog],
        }
        for tag, port, prog in (("one", ports[0], "cat"), ("two", ports[1], "tr"))
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "servers"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": containers},
    }
    write_pod(manifests, "servers", json.dumps(pod))  # JSON is YAML
    agent = start_agent("--anonymous-auth")
    wait_for("servers running", lambda: running(agent, "servers"))
    wait_for("both listening", lambda: all(_listening(p) for p in ports))
    fixed = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pykubelet",
            "port-forward",
            "servers",
            f":{ports[0]}",
            f"{fixed}:{ports[1]}",
            f"0:{dead}",
            "--server",
            agent.secure_url,
            "--insecure-skip-tls-verify",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        lines = [proc.stdout.readline().decode() for _ in range(3)]
        found = [re.fullmatch(r"Forwarding from 127\.0\.0\.1:(\d+) -> (\d+)\n", x) for x in lines]
        assert all(found), lines
        local = {int(m.group(2)): int(m.group(1)) for m in found if m}
        assert local[ports[1]] == fixed and local[ports[0]] != 0

        results: dict[tuple[int, int], bytes] = {}

        def connect(port: int, i: int) -> None:
            data = (b"line %d of connection %d\n" % (port, i)) * 8000  # ~200 KiB
            with socket.create_connection(("127.0.0.1", local[port]), timeout=TIMEOUT) as s:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)  # half-close: the answer still comes
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
            results[(port, i)] = got

        threads = [
            threading.Thread(target=connect, args=(port, i)) for port in ports for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        for (port, i), got in results.items():
            sent = (b"line %d of connection %d\n" % (port, i)) * 8000
            assert got == (sent.upper() if port == ports[1] else sent), (port, i, len(got))
        assert len(results) == 8

        # Nothing listens there: that connection is closed, with the node's message.
        with socket.create_connection(("127.0.0.1", local[dead]), timeout=TIMEOUT) as s:
            assert s.recv(10) == b""
        assert b"an error occurred forwarding" in proc.stderr.readline()
        # ... and the session goes on.
        connect(ports[0], 99)
        assert results[(ports[0], 99)].startswith(b"line")

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "port-forward to pod servers-testnode_default over SPDY/3.1" in agent.log()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_top_pods_and_node(node: tuple[Agent, list[str]]) -> None:
    """`top pods` and `top node` as kubectl top prints them. The agent has just started: its
    sample has no CPU rate yet, so the verb waits for the node's next one (10 s); all runs at
    once, so the test waits once."""
    _, flags = node
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "pykubelet", "top", *args, *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        for args in (["pods"], ["pod", "web", "--containers"], ["node"])
    ]
    (out, err), (containers, err2), (top_node, err3) = (
        proc.communicate(timeout=60) for proc in runs
    )
    assert [proc.returncode for proc in runs] == [0, 0, 0], (err, err2, err3)
    node_lines = top_node.decode().splitlines()
    assert re.fullmatch(
        r"NAME\s+CPU\(cores\)\s+CPU\(%\)\s+MEMORY\(bytes\)\s+MEMORY\(%\)", node_lines[0]
    ), node_lines
    match = re.fullmatch(r"testnode\s+\d+m\s+(\d+)%\s+\d+Mi\s+(\d+)%", node_lines[1])
    assert match, node_lines
    assert 0 < int(match[2]) <= 100  # the node's working set over its allocatable memory
    lines = out.decode().splitlines()
    assert re.fullmatch(r"NAME\s+CPU\(cores\)\s+MEMORY\(bytes\)", lines[0]), lines
    assert re.fullmatch(r"web-testnode\s+\d+m\s+\d+Mi", lines[1]), lines
    # Its column starts where the header's does, kubectl's tabwriter's way.
    assert lines[0].index("CPU") == lines[1].index(lines[1].split()[1])
    assert re.fullmatch(
        r"POD\s+NAME\s+CPU\(cores\)\s+MEMORY\(bytes\)\nweb-testnode\s+main\s+\d+m\s+\d+Mi\n",
        containers.decode(),
    ), containers


def test_credentials(start_agent: Callable[..., Agent], manifests: Path, tmp_path: Path) -> None:
    """A client certificate of the node's client CA, from a kubeconfig (data) or from flags
    (files); the node's certificate checked against its own file; a certificate of another
    CA, and none at all, each refused in one line."""
    ca = make_ca("clients")
    ca_file, _ = write_pem(tmp_path / "pki", "ca", *ca)
    cert_file, key_file = write_pem(tmp_path / "pki", "alice", *make_client_cert(ca, "alice", None))
    other = make_ca("other")
    bad_cert, bad_key = write_pem(tmp_path / "pki", "mallory", *make_client_cert(other, "m", None))
    write_pod(manifests, "web", pod_yaml("web", "while true; do sleep 1; done", grace=1))
    agent = start_agent("--client-ca-file", str(ca_file))
    wait_for("web running", lambda: running(agent, "web"))
    serving = tmp_path / "root" / "pki" / "kubelet.crt"

    key_pem = key_file.read_bytes()
    serialization.load_pem_private_key(key_pem, None)  # a key the kubeconfig can carry
    kubeconfig = tmp_path / "node.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "node",
                "clusters": [
                    {
                        "name": "node",
                        "cluster": {
                            "server": agent.secure_url,
                            # Relative: to the kubeconfig's folder, as kubectl takes it.
                            "certificate-authority": str(serving.relative_to(tmp_path)),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "alice",
                        "user": {
                            "client-certificate-data": base64.b64encode(
                                cert_file.read_bytes()
                            ).decode(),
                            "client-key-data": base64.b64encode(key_pem).decode(),
                        },
                    }
                ],
                "contexts": [{"name": "node", "context": {"cluster": "node", "user": "alice"}}],
            }
        )
    )
    result = pykubelet("exec", "web", "--kubeconfig", str(kubeconfig), "--", "echo", "hi")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"hi\n", b""), result

    by_flags = ["--server", agent.secure_url, "--certificate-authority", str(serving)]
    result = pykubelet(
        "exec",
        "web",
        *by_flags,
        "--client-certificate",
        str(cert_file),
        "--client-key",
        str(key_file),
        "--",
        "echo",
        "hi",
    )
    assert (result.returncode, result.stdout) == (0, b"hi\n"), result

    # A certificate of another CA: the node ends the TLS handshake.
    result = pykubelet(
        "exec", "web", "--kubeconfig", str(kubeconfig), "--client-certificate", str(bad_cert),
        "--client-key", str(bad_key), "--", "true",
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.count(b"\n") == 1, result
    refused = f"error: the node at {agent.secure_url} refused the client certificate {bad_cert} ("
    assert result.stderr.startswith(refused.encode()), result.stderr

    # No certificate: the node's 401, its Status message.
    result = pykubelet("exec", "web", *by_flags, "--", "true")
    assert result.returncode == 1, result
    assert result.stderr == (
        b"error: You must be logged in to the node (Unauthorized): GET /pods\n"
    ), result.stderr

    # A key that is not the certificate's: named, before anything is sent.
    result = pykubelet(
        "exec", "web", *by_flags, "--client-certificate", str(cert_file),
        "--client-key", str(bad_key), "--", "true",
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.count(b"\n") == 1, result
    assert f"cannot load the client certificate {cert_file} with the key {bad_key}".encode() in (
        result.stderr
    )
