"""The sd_notify protocol against real unix datagram sockets the test binds."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykubelet.common.sdnotify import Notifier, NotifyError, socket_address, watchdog_interval


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound socket standing for the service manager's, with its $NOTIFY_SOCKET value."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_status_stopping_are_one_datagram_each(manager: tuple[str, socket.socket]) -> None:
    path, sock = manager
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    notifier.ready("running: node n1, runtime process")
    assert received(sock) == ["READY=1", "STATUS=running: node n1, runtime process"]
    notifier.status("starting")
    assert received(sock) == ["STATUS=starting"]
    notifier.stopping("stopping the pods")
    assert received(sock) == ["STOPPING=1", "STATUS=stopping the pods"]
    notifier.close()


def test_abstract_socket_name() -> None:
    name = f"pykubelet-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        assert Notifier.from_environment({"NOTIFY_SOCKET": "@" + name}).notify("READY=1")
        assert received(sock) == ["READY=1"]
    finally:
        sock.close()


def test_watchdog_at_half_the_timeout(manager: tuple[str, socket.socket]) -> None:
    path, sock = manager
    now = [100.0]
    env = {"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier(socket_address(path), watchdog_interval(env, os.getpid()), lambda: now[0])
    assert notifier.watchdog_every == 2.0
    sock.setblocking(False)
    pings = 0
    # A loop turning every half second for 10 s: one ping per 2 s, the first at once.
    for _ in range(20):
        notifier.watchdog()
        try:
            while True:
                assert sock.recv(64) == b"WATCHDOG=1"
                pings += 1
        except BlockingIOError:
            pass
        now[0] += 0.5
    assert pings == 5


def test_environment_taken_out_and_watchdog_of_another_process(
    manager: tuple[str, socket.socket],
) -> None:
    path, _ = manager
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}
    notifier = Notifier.from_environment(env)
    assert env == {}  # the containers it starts must not inherit them
    assert notifier.enabled and notifier.watchdog_every is None


def test_no_notify_socket_is_a_no_op() -> None:
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert notifier.watchdog_every is None
    assert not notifier.notify("READY=1")
    notifier.watchdog()
    notifier.ready("x")


def test_bad_values_named() -> None:
    with pytest.raises(NotifyError, match="NOTIFY_SOCKET='vsock:2:1'"):
        socket_address("vsock:2:1")
    with pytest.raises(NotifyError, match="WATCHDOG_USEC='soon'"):
        watchdog_interval({"WATCHDOG_USEC": "soon"}, 1)
    # Logged, and notification left off, rather than the agent refusing to start.
    assert not Notifier.from_environment({"NOTIFY_SOCKET": "relative"}).enabled


def test_manager_gone_is_dropped_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert not notifier.notify("READY=1")
    assert not notifier.notify("WATCHDOG=1")
    warnings = [r for r in caplog.records if "cannot notify" in r.getMessage()]
    assert len(warnings) == 1  # said once
