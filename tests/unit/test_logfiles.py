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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykubelet.runtime import logfiles
from pykubelet.runtime.base import LogTimes, LogUnsupported
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


# --- since and timestamps (LogTimes) ------------------------------------------------------------

BASE_NS = 1_798_761_600 * 1_000_000_000  # 2027-01-01T00:00:00Z


def time_text(ns: int, offset_minutes: int, digits: int) -> bytes:
    """A record's time as a runtime may write it: in some offset, with 0-9 fraction digits
    (Go's RFC3339Nano trims trailing zeros; containerd writes a local offset)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    local = datetime.fromtimestamp(seconds, UTC) + timedelta(minutes=offset_minutes)
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{fraction:09d}"[:digits]
    if offset_minutes == 0:
        text += "Z"
    else:
        sign = "+" if offset_minutes > 0 else "-"
        h, m = divmod(abs(offset_minutes), 60)
        text += f"{sign}{h:02d}:{m:02d}"
    return text.encode()


def fixed(ns: int, offset_minutes: int) -> bytes:
    """The kubelet's RFC3339NanoFixed of that time, in that offset."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    local = datetime.fromtimestamp(seconds, UTC) + timedelta(minutes=offset_minutes)
    zone = "Z"
    if offset_minutes:
        h, m = divmod(abs(offset_minutes), 60)
        zone = f"{'+' if offset_minutes > 0 else '-'}{h:02d}:{m:02d}"
    return f"{local.strftime('%Y-%m-%dT%H:%M:%S')}.{fraction:09d}{zone}".encode()


@dataclass(frozen=True)
class Rec:
    ns: int  # its time as written (whole nanoseconds, of which the text may keep fewer)
    offset: int
    digits: int
    stream: bytes
    tag: bytes
    payload: bytes
    garbled: bool  # its time field is no time

    def line(self) -> bytes:
        when = b"yesterday" if self.garbled else time_text(self.ns, self.offset, self.digits)
        return b" ".join([when, self.stream, self.tag, self.payload]) + b"\n"

    def written_ns(self) -> int:
        """The time the text says (the fraction cut to its digits)."""
        unit = 10 ** (9 - self.digits)
        return self.ns // unit * unit


@st.composite
def timed_record(draw: st.DrawFn) -> Rec:
    return Rec(
        ns=BASE_NS + draw(st.integers(0, 5_000_000_000)),
        offset=draw(st.sampled_from([0, 0, 120, -330, 59])),
        digits=draw(st.sampled_from([0, 1, 3, 6, 9, 9])),
        stream=draw(st.sampled_from([b"stdout", b"stderr"])),
        tag=draw(st.sampled_from([b"F", b"F", b"P"])),
        payload=draw(no_newline),
        garbled=draw(st.integers(0, 9)) == 0,
    )


def whole_timed(
    recs: list[Rec], tail_lines: int | None, limit_bytes: int | None, times: LogTimes
) -> bytes:
    """What the kubelet gives, on the whole file: the records of the last lines, those at or
    after `since`, each prefixed with its time, then the limit."""
    data = b"".join(r.line() for r in recs)
    start = 0 if tail_lines is None else old_tail_start(data, tail_lines)
    out = bytearray()
    pos = 0
    for r in recs:
        size = len(r.line())
        pos += size
        if pos - size < start:
            continue
        if r.garbled and (times.since_ns is not None or times.timestamps):
            continue  # without times, a record's time is never read
        if times.since_ns is not None and r.written_ns() < times.since_ns:
            continue
        if times.timestamps:
            out += fixed(r.written_ns(), r.offset) + b" "
        out += r.payload + (b"" if r.tag == b"P" else b"\n")
    return bytes(out) if limit_bytes is None else bytes(out[: max(limit_bytes, 0)])


@settings(max_examples=400, deadline=None)
@given(
    st.lists(timed_record(), max_size=12),
    tails,
    limits,
    st.none() | st.integers(BASE_NS - 1, BASE_NS + 5_000_000_001),
    st.booleans(),
    blocks,
)
def test_since_and_timestamps_are_the_kubelets(
    files: Path,
    recs: list[Rec],
    tail_lines: int | None,
    limit_bytes: int | None,
    since_ns: int | None,
    timestamps: bool,
    block: int,
) -> None:
    """Random logs (times out of order, in several offsets and precisions, some unparseable):
    tail first, then since by each record's time, the prefixes, then limitBytes."""
    files.write_bytes(b"".join(r.line() for r in recs))
    times = LogTimes(since_ns=since_ns, timestamps=timestamps)
    want = whole_timed(recs, tail_lines, limit_bytes, times)
    assert read_cri_log(files, tail_lines, limit_bytes, times, block_size=block) == want
    head, _ = read_cri_tail(files, tail_lines, times, block_size=block)
    assert head == whole_timed(recs, tail_lines, None, times)


@settings(max_examples=200, deadline=None)
@given(st.lists(timed_record(), max_size=8), st.integers(1, 7), st.booleans())
def test_a_follower_decodes_times_across_any_split(
    recs: list[Rec], step: int, timestamps: bool
) -> None:
    data = b"".join(r.line() for r in recs)
    times = LogTimes(since_ns=BASE_NS + 2_500_000_000, timestamps=timestamps)
    decoder = CriLogDecoder(times)
    out = b"".join(decoder.feed(data[i : i + step]) for i in range(0, len(data), step))
    assert out == decode_records(data, times) == whole_timed(recs, None, None, times)


@pytest.mark.parametrize(
    ("raw", "ns", "shown"),
    [
        (b"2027-01-01T00:00:00Z", BASE_NS, b"2027-01-01T00:00:00.000000000Z"),
        (b"2027-01-01T00:00:00.5Z", BASE_NS + 500_000_000, b"2027-01-01T00:00:00.500000000Z"),
        (b"2027-01-01T00:00:00.000000001+00:00", BASE_NS + 1, b"2027-01-01T00:00:00.000000001Z"),
        (
            b"2027-01-01T02:00:00.123456789+02:00",
            BASE_NS + 123_456_789,
            b"2027-01-01T02:00:00.123456789+02:00",
        ),
        (b"2026-12-31T18:30:00-05:30", BASE_NS, b"2026-12-31T18:30:00.000000000-05:30"),
        (b"2028-02-29T00:00:00Z", 1_835_395_200 * 10**9, b"2028-02-29T00:00:00.000000000Z"),
    ],
)
def test_record_times_parse_as_go_parses_rfc3339nano(raw: bytes, ns: int, shown: bytes) -> None:
    assert logfiles.parse_time(raw) == (ns, shown)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"2027-01-01",
        b"2027-01-01T00:00:00",  # no zone
        b"2027-01-01T00:00:00.Z",
        b"2027-01-01T00:00:00.1234567890Z",  # ten digits
        b"2027-02-29T00:00:00Z",  # not a leap year
        b"2027-13-01T00:00:00Z",
        b"2027-01-01T24:00:00Z",
        b"2027-01-01T00:00:00+24:00",
        b"2027-01-01 00:00:00Z",
        b"\xff",
    ],
)
def test_what_is_no_record_time(raw: bytes) -> None:
    assert logfiles.parse_time(raw) is None


def test_since_keeps_a_record_of_that_very_time_and_prefixes_partial_records() -> None:
    data = (
        b"2027-01-01T00:00:00.999999999Z stdout F before\n"
        b"2027-01-01T00:00:01Z stdout P par\n"
        b"2027-01-01T00:00:01.5Z stderr F tial\n"
        b"garbage stdout F dropped only when times are asked\n"
    )
    since = LogTimes(since_ns=BASE_NS + 1_000_000_000)
    assert decode_records(data, since) == b"partial\n"
    stamped = LogTimes(since_ns=BASE_NS + 1_000_000_000, timestamps=True)
    assert decode_records(data, stamped) == (
        b"2027-01-01T00:00:01.000000000Z par2027-01-01T00:00:01.500000000Z tial\n"
    )
    assert decode_records(data).endswith(b"dropped only when times are asked\n")


def test_limit_bytes_counts_the_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(b"2027-01-01T00:00:00Z stdout F one\n2027-01-01T00:00:01Z stdout F two\n")
    stamped = LogTimes(timestamps=True)
    assert read_cri_log(path, None, 34, stamped) == b"2027-01-01T00:00:00.000000000Z one"
    assert read_cri_log(path, 1, None, stamped) == b"2027-01-01T00:00:01.000000000Z two\n"
    # The tail is found first, then since applies: a last line older than since leaves nothing.
    late = LogTimes(since_ns=BASE_NS + 5_000_000_000)
    assert read_cri_log(path, 1, None, late) == b""


def test_a_plain_log_answers_since_only_when_it_is_all_or_nothing() -> None:
    first, last, now = BASE_NS, BASE_NS + 10 * 10**9, BASE_NS + 20 * 10**9
    assert logfiles.plain_times(LogTimes(), first, last, now) is True
    assert logfiles.plain_times(LogTimes(since_ns=first), first, last, now) is True
    assert logfiles.plain_times(LogTimes(since_ns=last + 1), first, last, now) is False
    with pytest.raises(LogUnsupported, match=r"^sinceSeconds/sinceTime: .*between "):
        logfiles.plain_times(LogTimes(since_ns=first + 1), first, last, now)
    with pytest.raises(LogUnsupported, match="in the future"):
        logfiles.plain_times(LogTimes(since_ns=now + 1), first, last, now)
    with pytest.raises(LogUnsupported, match=r"^timestamps: "):
        logfiles.plain_times(LogTimes(timestamps=True), first, last, now)
    assert logfiles.format_time(BASE_NS + 7) == b"2027-01-01T00:00:00.000000007Z"
