"""Container log rotation on real files: the kubelet's tidying of rotated files, and the
process runtime's rotation in place under a writer that appends, with a follower reading on."""

from __future__ import annotations

import asyncio
import gzip
import os
from pathlib import Path

from pykubelet.runtime import logrotation
from pykubelet.runtime.base import LogRotationPolicy
from pykubelet.runtime.process.logrotate import LogRotator


def test_rotated_files_are_tidied_as_the_kubelet_does(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"current\n")
    for name, data in (
        ("0.log.20260101-000001.gz", gzip.compress(b"one\n")),
        ("0.log.20260101-000002.gz", gzip.compress(b"two\n")),
        ("0.log.20260101-000003", b"three\n"),
        ("0.log.20260101-000004.tmp", b"half"),
        ("1.log.20260101-000001", b"another container\n"),
    ):
        (tmp_path / name).write_bytes(data)
    logrotation.tidy(log, LogRotationPolicy(max_size=1, max_files=4))
    # max_files - 2 rotated files stay (the current file and the one about to be rotated make
    # the rest), the newest, compressed; the temporary file is gone; others' are not touched.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "0.log",
        "0.log.20260101-000002.gz",
        "0.log.20260101-000003.gz",
        "1.log.20260101-000001",
    ]
    assert gzip.decompress((tmp_path / "0.log.20260101-000003.gz").read_bytes()) == b"three\n"
    target = logrotation.prepare(log, LogRotationPolicy(max_size=1, max_files=4))
    assert target is not None and target.name.startswith("0.log.") and not target.exists()
    assert logrotation.prepare(log, LogRotationPolicy(max_size=100, max_files=4)) is None


async def test_a_log_rotated_in_place_loses_nothing_for_its_writer_and_follower(
    tmp_path: Path,
) -> None:
    log = tmp_path / "0.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    written = b""
    try:

        def write(n: int) -> None:
            nonlocal written
            data = b"".join(b"line %d\n" % i for i in range(len(written), len(written) + n))
            os.write(fd, data)
            written += data

        rotator = LogRotator()
        write(2000)
        head, offset = await rotator.read_tail("c", log, 1)
        assert head == written.splitlines(keepends=True)[-1]
        followed = b""
        policy = LogRotationPolicy(max_size=4096, max_files=3)
        for _ in range(3):
            # Rotated files are named by the second (the kubelet's): one rotation a second.
            for _attempt in range(20):
                if await rotator.rotate("c", log, policy):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError("not rotated")
            write(500)
            while True:
                chunk, offset = await rotator.read_from("c", log, offset)
                if not chunk:
                    break
                followed += chunk
        assert followed == written[len(written) - len(followed) :]
        assert len(followed) == len(written) - len(b"".join(written.splitlines(True)[:2000]))
        # The current file and the rotated ones, oldest first, are everything written.
        files = logrotation.rotated_files(log)
        assert len(files) == 2 and files[0].name.endswith(".gz")
    finally:
        os.close(fd)
