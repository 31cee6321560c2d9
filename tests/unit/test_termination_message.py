"""The termination message's rules (runtime/termination.py) and what each backend records to
read it: the file made per start, the kubelet's truncation, FallbackToLogsOnError, the engine's
own message joined, the file found among the mounts."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import Pod
from pykubelet.runtime.base import ContainerConfig, ContainerRunState, Mount
from pykubelet.runtime.cri.convert import container_config, container_entry
from pykubelet.runtime.cri.proto import cri_api_pb2 as api
from pykubelet.runtime.docker.convert import container_body, parse_inspect
from pykubelet.runtime.process.termination import message_bind
from pykubelet.runtime.sandbox.engine import ContainerEntry
from pykubelet.runtime.sandbox.messages import finish_exited
from pykubelet.runtime.termination import (
    ANNOTATION_PATH,
    ANNOTATION_POLICY,
    MAX_LOG_BYTES,
    MAX_LOG_LINES,
    MAX_MESSAGE_BYTES,
    create_message_file,
    is_message_file,
    read_message_file,
    termination_message,
    with_engine_message,
)

FALLBACK = "FallbackToLogsOnError"


def test_the_file_is_empty_0666_whatever_the_umask(tmp_path: Path) -> None:
    uid = uuid.uuid4().hex
    old = os.umask(0o077)
    try:
        path = create_message_file(tmp_path / uid, "app")
    finally:
        os.umask(old)
    assert path is not None
    p = Path(path)
    assert p.parent == tmp_path / uid / "containers" / "app"
    assert len(p.name) == 8 and int(p.name, 16) >= 0
    assert stat.S_IMODE(p.stat().st_mode) == 0o666 and p.stat().st_size == 0
    assert stat.S_IMODE(p.parent.stat().st_mode) & 0o027 == 0  # the kubelet's 0750, less the umask
    assert is_message_file(path, uid, "app")
    assert not is_message_file(path, uid, "other") and not is_message_file(path, "x", "app")
    assert not is_message_file(str(tmp_path / "volume" / "termination-log"), uid, "app")
    # A new file per start: a restarted container never shows its predecessor's message.
    assert create_message_file(tmp_path / uid, "app") != path


def test_the_file_in_a_pod_directory_made_before(tmp_path: Path) -> None:
    # As a sandbox record makes it: the containers' directories are made under it.
    pod = tmp_path / uuid.uuid4().hex
    pod.mkdir(mode=0o700)
    first = create_message_file(pod, "app")
    second = create_message_file(pod, "sidecar")
    again = create_message_file(pod, "app")
    assert first is not None and second is not None and again is not None
    assert Path(first).parent == Path(again).parent == pod / "containers" / "app"
    assert Path(second).parent == pod / "containers" / "sidecar"
    assert all(Path(p).stat().st_size == 0 for p in (first, second, again))
    assert stat.S_IMODE(pod.stat().st_mode) == 0o700  # left as it was


def test_the_file_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "pod").write_text("a file where the pod's directory should be")
    assert create_message_file(tmp_path / "pod", "app") is None


def test_at_most_the_last_4096_bytes(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_bytes(b"a" * 1000 + b"b" * MAX_MESSAGE_BYTES)
    message, empty = read_message_file(str(path))
    assert message == "b" * MAX_MESSAGE_BYTES and not empty
    path.write_bytes(b"bye")
    assert read_message_file(str(path)) == ("bye", False)
    path.write_bytes(b"")
    assert read_message_file(str(path)) == ("", True)
    assert read_message_file(str(tmp_path / "gone")) == ("", True)
    message, empty = read_message_file(str(tmp_path))
    assert message == f"Error on reading termination log {tmp_path}: is a directory"
    assert not empty


class Log:
    def __init__(self, data: bytes = b"", fail: bool = False) -> None:
        self.data, self.fail = data, fail
        self.asked: list[int] = []

    async def __call__(self, lines: int) -> bytes:
        self.asked.append(lines)
        if self.fail:
            raise RuntimeError("the engine is gone")
        return self.data


async def _read(path: str) -> tuple[str, bool]:
    return await asyncio.to_thread(read_message_file, path)


def _message(host: str | None, policy: str, code: int, log: Log, reason: str = "Error") -> str:
    return asyncio.run(termination_message(host, policy, code, reason, _read, log))


def test_fallback_to_logs_on_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    written = tmp_path / "written"
    written.write_bytes(b"bye")
    tail = b"".join(b"line %03d\n" % i for i in range(300))
    log = Log(tail)
    # An empty file, a failure: the log's last 80 lines (asked of the runtime), 2048 bytes.
    assert _message(str(empty), FALLBACK, 3, log) == tail[-MAX_LOG_BYTES:].decode()
    assert log.asked == [MAX_LOG_LINES]
    # Nothing bound at the path reads as an empty file.
    assert _message(None, FALLBACK, 1, log) == tail[-MAX_LOG_BYTES:].decode()
    # The file wins when it says something; success and File never read the log.
    log = Log(b"from the log\n")
    assert _message(str(written), FALLBACK, 3, log) == "bye"
    assert _message(str(empty), FALLBACK, 0, log, reason="Completed") == ""
    assert _message(str(empty), "File", 3, log) == ""
    assert _message(str(written), "File", 0, log, reason="Completed") == "bye"
    # A container that never ran has no log.
    assert _message(str(empty), FALLBACK, 128, log, reason="ContainerCannotRun") == ""
    assert log.asked == []
    assert _message(str(empty), FALLBACK, 2, Log(b"short\n")) == "short\n"
    failing = _message(str(empty), FALLBACK, 2, Log(fail=True))
    assert failing == "Error on reading termination message from logs: the engine is gone"
    # An unreadable file says why, and does not fall back.
    assert _message(str(tmp_path), FALLBACK, 2, log).startswith("Error on reading termination")


def test_the_engines_message_is_enriched() -> None:
    assert with_engine_message("", "bye") == "bye"
    assert with_engine_message(None, "") is None
    assert with_engine_message("oom", "") == "oom"
    assert with_engine_message("oom", "bye") == "oom: bye"


def _config(**fields: Any) -> ContainerConfig:
    base = ContainerConfig(
        name="c", image="busybox", command=[], args=[], env=[], working_dir=None, attempt=0,
        spec_hash="h", image_pull_policy="Never",
    )  # fmt: skip
    return dataclasses.replace(base, **fields)


def _pod() -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": "p", "namespace": "default", "uid": uuid.uuid4().hex},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )


def test_docker_records_the_path_and_finds_the_file() -> None:
    pod = _pod()
    own = f"/var/lib/pykubelet/pods/{pod.uid}/containers/c/0123abcd"
    config = _config(
        mounts=[Mount("/vol", "/data"), Mount(own, "/dev/termination-log")],
        termination_message_path="/dev/termination-log",
        termination_message_policy=FALLBACK,
    )
    body = container_body(pod, "sb", config, podman=True)
    assert f"{own}:/dev/termination-log" in body["HostConfig"]["Binds"]  # read-write
    labels = body["Labels"]
    assert labels[ANNOTATION_PATH] == "/dev/termination-log"
    assert labels[ANNOTATION_POLICY] == FALLBACK
    info = {
        "Id": "abc",
        "Created": "2026-01-01T00:00:00Z",
        "Config": {"Labels": labels, "Image": "busybox"},
        "State": {"Status": "exited", "ExitCode": 3, "FinishedAt": "2026-01-01T00:00:01Z"},
        "Mounts": [
            {"Source": "/vol", "Destination": "/data"},
            {"Source": own, "Destination": "/dev/termination-log"},
        ],
    }
    entry = parse_inspect(info, "10.0.0.1")
    assert isinstance(entry, ContainerEntry)
    assert entry.termination_file == own and entry.termination_message_policy == FALLBACK
    labels[ANNOTATION_PATH] = ""
    entry = parse_inspect(info, "10.0.0.1")
    assert isinstance(entry, ContainerEntry) and entry.termination_file == ""


def test_cri_annotations_and_the_first_mount_at_the_path() -> None:
    pod = _pod()
    config = _config(
        mounts=[Mount("/a", "/dev/termination-log"), Mount("/b", "/dev/termination-log")],
        termination_message_path="/dev/termination-log",
    )
    request = container_config(pod, config, 1 << 30)
    assert dict(request.annotations) == {
        ANNOTATION_PATH: "/dev/termination-log",
        ANNOTATION_POLICY: "File",
    }
    assert [m.host_path for m in request.mounts] == ["/a", "/b"]
    assert not any(m.readonly for m in request.mounts)
    status = api.ContainerStatus(
        id="c1",
        metadata=request.metadata,
        state=api.CONTAINER_EXITED,
        labels=request.labels,
        annotations=request.annotations,
        mounts=request.mounts,
        exit_code=3,
        finished_at=1,
    )
    entry = container_entry("c1", api.ContainerStatusResponse(status=status))
    assert entry is not None
    assert entry.termination_file == "/a"  # the kubelet reads the first one it finds


def _entry(**fields: Any) -> ContainerEntry:
    now = datetime.now(UTC)
    base = ContainerEntry(
        id="c1", pod_uid="u", pod_name="p", pod_namespace="d", name="c", attempt=0,
        spec_hash="h", image="i", state=ContainerRunState.EXITED, created_at=now,
        finished_at=now, exit_code=137, oom_killed=True,
    )  # fmt: skip
    return dataclasses.replace(base, **fields)


def test_a_sandbox_entry_is_read_once_per_exit(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.write_bytes(b"bye")
    log = Log(b"tail\n")

    async def read_log(entry: ContainerEntry, lines: int) -> bytes:
        return await log(lines)

    entry = _entry(termination_file=str(path), termination_message_policy=FALLBACK, message="x")
    asyncio.run(finish_exited(entry, None, read_log))
    assert entry.message == "x: bye" and entry.message_read
    # The same exit inspected again takes the message read before, whatever the file says now.
    path.write_bytes(b"changed")
    again = _entry(termination_file=str(path), message="x", finished_at=entry.finished_at)
    asyncio.run(finish_exited(again, entry, read_log))
    assert again.message == "x: bye"
    # OOMKilled with an empty file falls back to the log.
    path.write_bytes(b"")
    oom = _entry(termination_file=str(path), termination_message_policy=FALLBACK)
    asyncio.run(finish_exited(oom, None, read_log))
    assert oom.message == "tail\n" and log.asked == [MAX_LOG_LINES]
    running = _entry(state=ContainerRunState.RUNNING, termination_file=str(path))
    asyncio.run(finish_exited(running, None, read_log))
    assert not running.message_read


def test_process_binds_its_file_and_reads_the_first(tmp_path: Path) -> None:
    uid = uuid.uuid4().hex
    own = create_message_file(tmp_path / uid, "c")
    assert own is not None
    config = _config(
        mounts=[Mount(own, "/dev/termination-log")],
        termination_message_path="/dev/termination-log",
    )
    started, host = message_bind(config, uid)
    assert host == own
    if os.geteuid() == 0:
        assert started.mounts == config.mounts  # bound, in its own mount namespace
    else:
        assert started.mounts == []  # cannot be bound; its user cannot write /dev either
    assert message_bind(_config(), uid) == (_config(), None)


@pytest.mark.parametrize("policy", ["File", FALLBACK])
def test_a_volume_at_the_path_is_read_not_ours(tmp_path: Path, policy: str) -> None:
    volume_file = tmp_path / "volume" / "log"
    uid = uuid.uuid4().hex
    own = create_message_file(tmp_path / uid, "c")
    assert own is not None
    config = _config(
        mounts=[
            Mount(str(volume_file), "/dev/termination-log"),
            Mount(own, "/dev/termination-log"),
        ],
        termination_message_path="/dev/termination-log",
        termination_message_policy=policy,
    )
    _, host = message_bind(config, uid)
    assert host == str(volume_file) and not is_message_file(host, uid, "c")
