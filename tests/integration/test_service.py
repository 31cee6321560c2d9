"""pykubelet as a systemd service: `make install` and its files, the notify protocol and the
journal, seen by sockets the tests bind where systemd would be (this machine's PID 1 is not
systemd; where it is, `systemctl start` is tried too)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykubelet.cmd.cli import parse_options
from tests.integration.agent import NODE, Agent, container_state, pod_yaml, wait_for, write_pod

REPO = Path(__file__).resolve().parents[2]


def pid1() -> str:
    return Path("/proc/1/comm").read_text().strip()


@pytest.fixture
def datagrams(tmp_path: Path) -> Iterator[Callable[[str], tuple[str, socket.socket]]]:
    bound: list[socket.socket] = []

    def bind(name: str) -> tuple[str, socket.socket]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = str(tmp_path / name)
        sock.bind(path)
        bound.append(sock)
        return path, sock

    yield bind
    for sock in bound:
        sock.close()


def receive_until(
    sock: socket.socket, what: str, found: Callable[[bytes], bool], timeout: float = 20.0
) -> list[bytes]:
    """Every datagram up to and including the first for which `found` is true."""
    seen: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            break
        seen.append(data)
        if found(data):
            return seen
    raise AssertionError(f"no {what} within {timeout}s; received: {seen[-10:]!r}")


# --- the notify protocol --------------------------------------------------------------------


def test_ready_watchdog_stopping_from_the_real_agent(
    start_agent: Callable[..., Agent],
    manifests: Path,
    datagrams: Callable[[str], tuple[str, socket.socket]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, manager = datagrams("notify")
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")  # WATCHDOG=1 every second
    agent = start_agent()
    messages = receive_until(manager, "READY=1", lambda m: b"READY=1" in m.split(b"\n"))
    assert b"STATUS=starting the process runtime" in messages
    ready = messages[-1].decode().split("\n")
    assert ready[1] == f"STATUS=running: node {NODE}, runtime process"
    # Ready means the manifest directory is watched: a pod written now starts. The variables
    # were systemd's to the agent, not to its containers.
    write_pod(manifests, "web", pod_yaml("web", "echo notify=${NOTIFY_SOCKET:-none}; sleep 60"))
    wait_for("web running", lambda: "running" in container_state(agent.pod("web"))["state"])
    assert wait_for("web's log", lambda: agent.logs("web", "main")) == "notify=none\n"
    pings = 0
    for _ in range(3):
        receive_until(manager, "WATCHDOG=1", lambda m: m == b"WATCHDOG=1", timeout=10)
        pings += 1
    assert pings == 3
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    stopping = receive_until(manager, "STOPPING=1", lambda m: m.startswith(b"STOPPING=1"))
    assert stopping[-1] == b"STOPPING=1\nSTATUS=stopping the pods"
    assert agent.proc.wait(timeout=60) == 0


# --- the journal ----------------------------------------------------------------------------


def test_records_reach_the_journal_with_their_fields(
    tmp_path: Path, manifests: Path, datagrams: Callable[[str], tuple[str, socket.socket]]
) -> None:
    path, journald = datagrams("journal.socket")
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("wb") as stderr:
        st = os.fstat(stderr.fileno())
        env = {
            **os.environ,
            "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}",  # stderr is "the journal's stream"
            "PYKUBELET_JOURNAL_SOCKET": path,  # where journald's socket would be
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pykubelet",
                "--pod-manifest-path",
                str(manifests),
                "--root-dir",
                str(tmp_path / "root"),
                "--read-only-port",
                "0",
                "--port",
                "0",
                "--node-name",
                NODE,
            ],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            env=env,
        )
    try:

        def fields(datagram: bytes) -> dict[str, str]:
            lines = datagram.decode(errors="replace").split("\n")
            return dict(line.split("=", 1) for line in lines if "=" in line)

        started = receive_until(
            journald, "the API's address", lambda d: b"MESSAGE=read-only API at" in d
        )
        first = fields(started[-1])
        assert first["PRIORITY"] == "6" and first["SYSLOG_IDENTIFIER"] == "pykubelet"
        assert first["CODE_FILE"].endswith("pykubelet/app.py") and int(first["CODE_LINE"]) > 0
        write_pod(manifests, "web", pod_yaml("web", "sleep 60"))
        events = receive_until(
            journald,
            "web's Started event",
            lambda d: b"REASON=Started" in d and f"POD=web-{NODE}".encode() in d,
        )
        started_event = fields(events[-1])
        assert started_event["NAMESPACE"] == "default" and started_event["KIND"] == "Pod"
        assert started_event["OBJECT"] == f"default/web-{NODE}"
        write_pod(manifests, "bad", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec: {}\n")
        warning = receive_until(journald, "a warning", lambda d: b"REASON=FailedValidation" in d)
        assert fields(warning[-1])["PRIORITY"] == "4"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Everything went to the journal, nothing to the stream.
    assert stderr_path.read_text() == ""


# --- make install ---------------------------------------------------------------------------


@pytest.mark.slow
def test_make_install_lays_down_the_service(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make = ["make", "-C", str(REPO), f"DESTDIR={root}", f"PYTHON={shutil.which('python3')}"]
    done = subprocess.run([*make, "install"], capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr
    unit = root / "etc/systemd/system/pykubelet.service"
    dropin = root / "etc/systemd/system/pykubelet.service.d/10-pykubelet.conf"
    text = unit.read_text()
    for line in ("Type=notify", "Restart=always", "ExecStart=/opt/pykubelet/bin/pykubelet"):
        assert line in text.splitlines()
    assert any(line.startswith("WatchdogSec=") for line in text.splitlines())
    lines = dropin.read_text().splitlines()
    assert "EnvironmentFile=-/etc/default/pykubelet" in lines
    assert "EnvironmentFile=-/var/lib/pykubelet/kubeadm-flags.env" in lines
    cleared = lines.index("ExecStart=")
    assert lines[cleared + 1] == (
        "ExecStart=/opt/pykubelet/bin/pykubelet $PYKUBELET_KUBECONFIG_ARGS $PYKUBELET_CONFIG_ARGS"
        " $PYKUBELET_KUBEADM_ARGS $PYKUBELET_EXTRA_ARGS"
    )
    # The virtualenv's scripts name where it will be, not the staging root.
    venv = root / "opt/pykubelet"
    assert (venv / "bin/pykubelet").read_text().splitlines()[0] == "#!/opt/pykubelet/bin/python3"
    version = subprocess.run(
        [str(venv / "bin/python"), "-m", "pykubelet", "--version"], capture_output=True, text=True
    )
    assert version.stdout.strip().startswith("pykubelet "), version.stderr
    # The service's --config is one the agent takes.
    config = root / "var/lib/pykubelet/config.yaml"
    opts = parse_options(["--config", str(config)])
    assert str(opts.pod_manifest_path) == "/etc/kubernetes/manifests"
    assert (root / "etc/default/pykubelet").is_file()

    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        # The unit and its drop-in, pointed at the staged virtualenv so its ExecStart exists.
        staged = tmp_path / "units"
        (staged / "pykubelet.service.d").mkdir(parents=True)
        for source, target in (
            (unit, staged / "pykubelet.service"),
            (dropin, staged / "pykubelet.service.d/10-pykubelet.conf"),
        ):
            target.write_text(source.read_text().replace("/opt/pykubelet", str(venv)))
        verify = subprocess.run(
            [analyze, "verify", "--man=no", str(staged / "pykubelet.service")],
            capture_output=True,
            text=True,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "pykubelet" not in verify.stderr, verify.stderr  # no warning about our unit

    # The operator's files stay; the rest goes.
    done = subprocess.run([*make, "uninstall"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not unit.exists() and not dropin.exists() and not venv.exists()
    assert config.is_file() and (root / "etc/default/pykubelet").is_file()
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit was not verified")


@pytest.mark.skipif(pid1() != "systemd", reason=f"PID 1 is {pid1()!r}, not systemd")
def test_systemctl_start_on_a_systemd_machine() -> None:
    # Only where the machine boots with systemd: the real service, started and stopped.
    if os.geteuid() != 0:
        pytest.skip("needs root to install a unit")
    done = subprocess.run(["make", "-C", str(REPO), "install"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        start = subprocess.run(["systemctl", "start", "pykubelet"], capture_output=True, text=True)
        assert start.returncode == 0, start.stderr  # Type=notify: returns once READY=1 came
        state = subprocess.run(
            ["systemctl", "show", "-p", "ActiveState", "--value", "pykubelet"],
            capture_output=True,
            text=True,
        )
        assert state.stdout.strip() == "active"
    finally:
        subprocess.run(["systemctl", "stop", "pykubelet"], check=False)
        subprocess.run(["make", "-C", str(REPO), "uninstall"], check=False)
