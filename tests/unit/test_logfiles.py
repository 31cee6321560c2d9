"""The shared log-file readers: plain logs (the process runtime) and CRI logs (the CRI runtime).

The property tests hold the backwards readers to what reading the whole file gives: for plain
logs the last lines of the bytes, for CRI logs the whole-file code the CRI runtime had before
(copied below as the oracle), for random logs and block sizes down to one byte.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykubelet.runtime import logfiles
from pykubelet.runtime.logfiles import (
    CriLogDecoder,
    cri_tail_offset,
    decode_records,
    read_cri_log,
    read_cri_tail,
    read_from,
    read_log,
    read_tail,
    tail_offset,
    tail_start,
)

# --- oracles: reading the whole file ------------------------------------------------------------


def whole_plain(data: bytes, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    if tail_lines is not None:
        if tail_lines <= 0:
            data = b""
        else:
            parts = data.split(b"\n")
            lines = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
            data = b"".join(lines[-tail_lines:])
    return data if limit_bytes is None else data[: max(limit_bytes, 0)]


def old_tail_start(data: bytes, lines: int) -> int:
    """tail_start as it was, on the whole file in memory."""
    if lines <= 0:
        return len(data)
    count = 0
    pos = len(data)
    while pos > 0:
        start = data.rfind(b"\n", 0, pos - 1) + 1
        parts = data[start:pos].split(b" ", 3)
        full = len(parts) >= 3 and parts[2] != b"P"
        if full:
            if count == lines:
                return pos
            count += 1
        pos = start
    return 0


def whole_cri(data: bytes, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    """The CRI runtime's _read_log as it was: the whole records, tail_start, decode, limit."""
    data = data[: data.rfind(b"\n") + 1]
    if tail_lines is not None:
        data = data[old_tail_start(data, tail_lines) :]
    out = decode_records(data)
    return out if limit_bytes is None else out[: max(limit_bytes, 0)]


# --- strategies ---------------------------------------------------------------------------------

TIME = b"2026-01-01T00:00:00.000000001Z"
no_newline = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x"))
words = st.lists(st.sampled_from([b"a", b"bb", b" ", b"\n", b"\r", b"\xff", b"ccc d"]), max_size=30)
plain_logs = words.map(b"".join)
tails = st.none() | st.integers(-1, 12)
limits = st.none() | st.integers(-1, 40)
blocks = st.integers(1, 17)


@st.composite
def cri_record(draw: st.DrawFn, well_formed: bool) -> bytes:
    if well_formed:
        stream = draw(st.sampled_from([b"stdout", b"stderr"]))
        tag = draw(st.sampled_from([b"F", b"P"]))
        payload = draw(no_newline)
        return b" ".join([TIME, stream, tag, payload])
    kind = draw(st.integers(0, 3))
    if kind == 0:  # garbage, or a blank line
        return draw(no_newline)
    fields = [
        draw(st.sampled_from([TIME, b"", b"t" * 20])),
        draw(st.sampled_from([b"stdout", b"stderr", b"bogus", b""])),
        draw(st.sampled_from([b"F", b"P", b"X", b""])),
    ]
    if kind >= 2:  # with a payload, which may hold spaces
        fields.append(draw(no_newline))
    return b" ".join(fields)


def cri_logs(well_formed: bool) -> st.SearchStrategy[bytes]:
    # Whole records, then maybe one still being written (no newline yet).
    return st.tuples(
        st.lists(cri_record(well_formed), max_size=12),
        st.none() | cri_record(well_formed),
    ).map(lambda t: b"".join(r + b"\n" for r in t[0]) + (t[1] or b""))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Module scope: hypothesis runs many examples per test call.
    yield tmp_path_factory.mktemp("logs") / "0.log"


# --- plain logs ---------------------------------------------------------------------------------


def test_plain_tail_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"out\nerr\na\nb\nc\n")
    assert read_log(path, None, None) == b"out\nerr\na\nb\nc\n"
    assert read_log(path, 2, None) == b"b\nc\n"
    assert read_log(path, 0, None) == b""
    assert read_log(path, 100, None) == b"out\nerr\na\nb\nc\n"
    assert read_log(path, None, 6) == b"out\ner"  # the beginning is kept
    assert read_log(path, 2, 3) == b"b\nc"
    path.write_bytes(b"x\ny")  # an unfinished last line is a line
    assert read_log(path, 1, None, block_size=1) == b"y"
    assert read_log(tmp_path / "missing.log", 3, None) == b""


def test_plain_follow_starts_where_the_tail_ends(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"a\nb\n")
    head, offset = read_tail(path, 1)
    assert (head, offset) == (b"b\n", 4)
    with path.open("ab") as f:
        f.write(b"c\n")
    assert read_from(path, offset) == b"c\n"
    assert read_from(path, offset, max_bytes=1) == b"c"
    assert read_tail(tmp_path / "missing.log", 1) == (b"", 0)
    assert read_from(tmp_path / "missing.log", 0) == b""


class CountingReader(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        out = super().read(size)
        self.bytes_read += len(out)
        return out


def test_the_tail_of_a_large_log_reads_only_its_end() -> None:
    plain = CountingReader(b"".join(b"line %d\n" % i for i in range(500_000)))
    offset = tail_offset(plain, 2)
    assert plain.getvalue()[offset:] == b"line 499998\nline 499999\n"
    assert plain.bytes_read <= 2 * logfiles.BLOCK_SIZE
    record = TIME + b" stdout F line\n"
    cri = CountingReader(record * 200_000 + TIME + b" stdout P part\n" + record)
    end = len(cri.getvalue())
    offset = cri_tail_offset(cri, 2, end)
    assert decode_records(cri.getvalue()[offset:]) == b"line\npartline\n"
    assert cri.bytes_read <= 2 * logfiles.BLOCK_SIZE


@settings(max_examples=300, deadline=None)
@given(plain_logs, tails, limits, blocks)
def test_plain_backwards_equals_the_whole_file(
    files: Path, data: bytes, tail_lines: int | None, limit_bytes: int | None, block: int
) -> None:
    files.write_bytes(data)
    want = whole_plain(data, tail_lines, limit_bytes)
    assert read_log(files, tail_lines, limit_bytes, block_size=block) == want
    head, offset = read_tail(files, tail_lines, block_size=block)
    assert head == whole_plain(data, tail_lines, None) and offset == len(data)


# --- CRI logs -----------------------------------------------------------------------------------

LOG = (
    b"2026-01-01T00:00:00.000000001Z stdout F one\n"
    b"2026-01-01T00:00:00.000000002Z stdout P two \n"
    b"2026-01-01T00:00:00.000000003Z stdout F part\n"
    b"2026-01-01T00:00:00.000000004Z stderr F err\n"
)


def test_cri_records_join_partial_lines() -> None:
    assert decode_records(LOG) == b"one\ntwo part\nerr\n"
    assert decode_records(LOG[tail_start(LOG, 2) :]) == b"two part\nerr\n"
    assert decode_records(LOG[tail_start(LOG, 1) :]) == b"err\n"
    assert tail_start(LOG, 10) == 0 and tail_start(LOG, 0) == len(LOG)
    decoder = CriLogDecoder()
    out = b"".join(decoder.feed(LOG[i : i + 7]) for i in range(0, len(LOG), 7))
    assert out == b"one\ntwo part\nerr\n"
    assert decode_records(b"garbage\n" + LOG[:45]) == b"one\n"


@pytest.mark.parametrize("block", [1, 2, 5, 44, 45, 46, logfiles.BLOCK_SIZE])
def test_cri_tail_limit_and_unfinished_records(tmp_path: Path, block: int) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(LOG + b"2026-01-01T00:00:00.000000005Z stdout F still being wri")
    assert read_cri_log(path, None, None, block_size=block) == b"one\ntwo part\nerr\n"
    # The line continued by a P record counts once.
    assert read_cri_log(path, 2, None, block_size=block) == b"two part\nerr\n"
    assert read_cri_log(path, 1, None, block_size=block) == b"err\n"
    assert read_cri_log(path, 0, None, block_size=block) == b""
    assert read_cri_log(path, 9, None, block_size=block) == b"one\ntwo part\nerr\n"
    assert read_cri_log(path, 2, 6, block_size=block) == b"two pa"  # the beginning is kept
    assert read_cri_log(path, None, 0, block_size=block) == b""
    head, offset = read_cri_tail(path, 2, block_size=block)
    assert (head, offset) == (b"two part\nerr\n", len(LOG))


def test_cri_missing_file_and_long_records(tmp_path: Path) -> None:
    assert read_cri_log(tmp_path / "missing.log", 1, None) == b""
    assert read_cri_tail(tmp_path / "missing.log", 1) == (b"", 0)
    # Fields past the first block: the record is read on, a block at a time.
    path = tmp_path / "0.log"
    long_time = b"t" * 300
    path.write_bytes(LOG + long_time + b" stdout P x\n" + long_time + b" stdout F y\n")
    assert read_cri_log(path, 1, None, block_size=16) == b"xy\n"
    assert read_cri_log(path, 2, None, block_size=16) == b"err\nxy\n"


def test_the_cri_module_keeps_its_names() -> None:
    from pykubelet.runtime.cri import log

    assert log.CriLogDecoder is CriLogDecoder
    assert log.decode_records is decode_records and log.tail_start is tail_start
    assert log.read_cri_log is read_cri_log


def test_shared_log_readers_import_no_backend() -> None:
    code = (
        "import sys, pykubelet.runtime.logfiles\n"
        "bad = [m for m in sys.modules if m.startswith(('pykubelet.runtime.process',"
        " 'pykubelet.runtime.docker', 'pykubelet.runtime.cri'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@settings(max_examples=400, deadline=None)
@given(cri_logs(well_formed=False), tails, limits, blocks)
def test_cri_backwards_equals_the_whole_file(
    files: Path, data: bytes, tail_lines: int | None, limit_bytes: int | None, block: int
) -> None:
    files.write_bytes(data)
    want = whole_cri(data, tail_lines, limit_bytes)
    assert read_cri_log(files, tail_lines, limit_bytes, block_size=block) == want
    head, offset = read_cri_tail(files, tail_lines, block_size=block)
    assert head == whole_cri(data, tail_lines, None)
    assert offset == data.rfind(b"\n") + 1


@settings(max_examples=300, deadline=None)
@given(cri_logs(well_formed=False), st.integers(-1, 12), blocks)
def test_tail_start_is_unchanged(data: bytes, lines: int, block: int) -> None:
    # Also on data that does not end with a newline, as tail_start always accepted.
    assert tail_start(data, lines) == old_tail_start(data, lines)
    assert cri_tail_offset(io.BytesIO(data), lines, len(data), block) == old_tail_start(data, lines)


@settings(max_examples=300, deadline=None)
@given(cri_logs(well_formed=True), st.integers(-1, 12), blocks)
def test_cri_tail_is_the_last_lines_written(
    files: Path, data: bytes, tail_lines: int, block: int
) -> None:
    """In a well-formed log, the last N lines the container wrote (a line continued by P
    records once), then what it has written of the next one."""
    files.write_bytes(data)
    written = decode_records(data[: data.rfind(b"\n") + 1])
    complete, _, unfinished = written.rpartition(b"\n")
    lines = [line + b"\n" for line in complete.split(b"\n")] if b"\n" in written else []
    want = b"".join(lines[-tail_lines:]) + unfinished if tail_lines > 0 else b""
    assert read_cri_log(files, tail_lines, None, block_size=block) == want
