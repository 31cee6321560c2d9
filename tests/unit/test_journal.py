"""Journal entries (the native protocol) against a real datagram socket the test binds, and the
`<N>` fallback."""

from __future__ import annotations

import array
import fcntl
import io
import logging
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykubelet.cmd import journal, logs
from pykubelet.common.events import EventRecorder, ObjectRef


def decode(datagram: bytes) -> dict[str, str]:
    """The native protocol read back, as journald reads it."""
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line, sep, after = rest.partition(b"\n")
        assert sep, f"unterminated field {rest!r}"
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            rest = after
        else:
            (size,) = struct.unpack("<Q", after[:8])
            fields[line.decode()] = after[8 : 8 + size].decode()
            assert after[8 + size : 9 + size] == b"\n"
            rest = after[9 + size :]
    return fields


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "journal.socket")
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


@pytest.fixture
def journal_logger(journald: tuple[str, socket.socket]) -> Iterator[logging.Logger]:
    handler = journal.JournalHandler(journald[0])
    logger = logging.getLogger("pykubelet.test-journal")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger
    logger.removeHandler(handler)
    handler.close()


def entry(sock: socket.socket) -> dict[str, str]:
    data, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
    if ancdata:  # a memfd: the entry is its contents
        fds = array.array("i")
        fds.frombytes(ancdata[0][2][: fds.itemsize])
        # Sealed, as journald requires of a memfd it is handed.
        assert fcntl.fcntl(fds[0], fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
        with os.fdopen(fds[0], "rb") as f:
            f.seek(0)  # journald reads it from the start (the offset is the writer's)
            return decode(f.read())
    return decode(data)


def test_a_record_with_its_priority_and_code_location(
    journald: tuple[str, socket.socket], journal_logger: logging.Logger
) -> None:
    journal_logger.warning("disk %s is %d%% full", "/var", 91)
    fields = entry(journald[1])
    assert fields["MESSAGE"] == "disk /var is 91% full"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "pykubelet"
    assert fields["LOGGER"] == "pykubelet.test-journal"
    assert fields["CODE_FILE"] == __file__
    assert int(fields["CODE_LINE"]) > 0
    assert fields["CODE_FUNC"] == "test_a_record_with_its_priority_and_code_location"
    journal_logger.error("e")
    journal_logger.info("i")
    journal_logger.debug("d")
    assert [entry(journald[1])["PRIORITY"] for _ in range(3)] == ["3", "6", "7"]


def test_an_event_about_a_pod_has_pod_and_namespace(
    journald: tuple[str, socket.socket], journal_logger: logging.Logger
) -> None:
    events = logging.getLogger("pykubelet.common.events")
    events.addHandler(journal_logger.handlers[0])
    try:
        EventRecorder().record(
            "Warning",
            "BackOff",
            "Back-off restarting failed container",
            ObjectRef("Pod", "web", "prod", "u1"),
        )
    finally:
        events.removeHandler(journal_logger.handlers[0])
    fields = entry(journald[1])
    assert fields["POD"] == "web" and fields["NAMESPACE"] == "prod"
    assert fields["REASON"] == "BackOff" and fields["KIND"] == "Pod"
    assert fields["OBJECT"] == "prod/web" and fields["TYPE"] == "Warning"
    assert fields["PRIORITY"] == "4"
    assert fields["MESSAGE"] == "pod prod/web BackOff: Back-off restarting failed container"


def test_multi_line_and_large_entries(
    journald: tuple[str, socket.socket], journal_logger: logging.Logger
) -> None:
    try:
        raise RuntimeError("engine went away")
    except RuntimeError:
        journal_logger.exception("housekeeping failed")
    fields = entry(journald[1])
    assert fields["MESSAGE"].startswith("housekeeping failed\nTraceback")
    assert "RuntimeError: engine went away" in fields["MESSAGE"]
    assert fields["PRIORITY"] == "3"
    # Larger than the socket takes in one datagram: sent as a sealed memfd.
    big = "x" * (1 << 20)
    journal_logger.info("%s", big)
    assert entry(journald[1])["MESSAGE"] == big


def test_field_names_are_the_journals() -> None:
    assert journal.field_name("object") == "OBJECT"
    assert journal.field_name("pod-uid") == "POD_UID"
    assert journal.field_name("_PID") == "PID"  # never a trusted field
    assert journal.field_name("1st") is None
    assert journal.encode([("A", "b"), ("M", "x\ny")]) == (
        b"A=b\nM\n" + struct.pack("<Q", 3) + b"x\ny\n"
    )


def test_no_journal_socket_falls_back_to_prefixed_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    handler = journal.JournalHandler(str(tmp_path / "absent"), fallback=out)
    logger = logging.getLogger("pykubelet.test-journal-fallback")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        logger.error("line one\nline two")
        logger.info("fine")
    finally:
        logger.removeHandler(handler)
        handler.close()
    assert out.getvalue() == "<3>line one\n<3>line two\n<6>fine\n"


def test_journal_stream_must_be_stderr(tmp_path: Path) -> None:
    with (tmp_path / "stderr").open("w") as f:
        st = os.fstat(f.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert journal.stderr_is_journal(env, f.fileno())
        assert not journal.stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:1"}, f.fileno())
        assert not journal.stderr_is_journal({}, f.fileno())
        assert not journal.stderr_is_journal({"JOURNAL_STREAM": "bad"}, f.fileno())


def test_text_becomes_journal_only_under_the_journal_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert not isinstance(logs.make_handler("text"), journal.JournalHandler)
    assert isinstance(logs.make_handler("journal"), journal.JournalHandler)
    st = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert isinstance(logs.make_handler("text"), journal.JournalHandler)
    assert not isinstance(logs.make_handler("json"), journal.JournalHandler)
