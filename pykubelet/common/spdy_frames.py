"""SPDY/3.1 frames, byte for byte as the SPDY/3 draft lays them out (moby/spdystream speaks
the same): SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE and
DATA with their flags (`FrameEncoder`, `FrameDecoder`; unknown control frame types are skipped,
as the draft asks), header blocks zlib-compressed with the SPDY/3 dictionary, one compression
context per direction for a whole session, and the errors (`SpdyError`, naming the frame and
the reason). The sessions over them are in `spdy.py`.
"""

from __future__ import annotations

import enum
import logging
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

log = logging.getLogger(__name__)

VERSION = 3

# Control frame types (SPDY/3 draft 2.6; spdy/types.go).
TYPE_SYN_STREAM = 0x0001
TYPE_SYN_REPLY = 0x0002
TYPE_RST_STREAM = 0x0003
TYPE_SETTINGS = 0x0004
TYPE_PING = 0x0006
TYPE_GOAWAY = 0x0007
TYPE_HEADERS = 0x0008
TYPE_WINDOW_UPDATE = 0x0009

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_SETTINGS_CLEAR_SETTINGS = 0x01

DEFAULT_WINDOW = 65536
MAX_WINDOW = 2**31 - 1
MAX_DATA_LENGTH = 2**24 - 1
MAX_STREAM_ID = 2**31 - 1
_ID_MASK = 0x7FFFFFFF

_FRAME_NAMES = {
    TYPE_SYN_STREAM: "SYN_STREAM",
    TYPE_SYN_REPLY: "SYN_REPLY",
    TYPE_RST_STREAM: "RST_STREAM",
    TYPE_SETTINGS: "SETTINGS",
    TYPE_PING: "PING",
    TYPE_GOAWAY: "GOAWAY",
    TYPE_HEADERS: "HEADERS",
    TYPE_WINDOW_UPDATE: "WINDOW_UPDATE",
}


class RstStatus(enum.IntEnum):
    """RST_STREAM status codes (SPDY/3 draft 2.6.3)."""

    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    INVALID_CREDENTIALS = 10
    FRAME_TOO_LARGE = 11


class GoAwayStatus(enum.IntEnum):
    """GOAWAY status codes (SPDY/3 draft 2.6.6)."""

    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


class SettingId(enum.IntEnum):
    """SETTINGS ids (SPDY/3 draft 2.6.4)."""

    UPLOAD_BANDWIDTH = 1
    DOWNLOAD_BANDWIDTH = 2
    ROUND_TRIP_TIME = 3
    MAX_CONCURRENT_STREAMS = 4
    CURRENT_CWND = 5
    DOWNLOAD_RETRANS_RATE = 6
    INITIAL_WINDOW_SIZE = 7
    CLIENT_CERTIFICATE_VECTOR_SIZE = 8


# The SPDY/3 header compression dictionary (draft 2.6.10.1; spdy/dictionary.go): these words,
# each behind its length as a 32-bit big-endian integer, then the text below as it stands.
_DICTIONARY_WORDS = (
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
)
_DICTIONARY_TEXT = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00"
    " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
HEADER_DICTIONARY: bytes = b"".join(
    struct.pack(">I", len(word)) + word.encode("ascii") for word in _DICTIONARY_WORDS
) + _DICTIONARY_TEXT.encode("ascii")


class SpdyError(Exception):
    """A SPDY protocol error or misuse: `frame` names the frame (or None), `reason` says why."""

    def __init__(self, reason: str, frame: str | None = None) -> None:
        super().__init__(f"{frame}: {reason}" if frame else reason)
        self.frame = frame
        self.reason = reason


class SpdyStreamReset(SpdyError):
    """The stream was reset, by the peer or by us; `status` is the RST_STREAM status."""

    def __init__(self, stream_id: int, status: int, by_peer: bool) -> None:
        who = "the peer" if by_peer else "us"
        try:
            name = RstStatus(status).name
        except ValueError:
            name = str(status)
        super().__init__(f"stream {stream_id} reset by {who}: {name}", "RST_STREAM")
        self.stream_id = stream_id
        self.status = status
        self.by_peer = by_peer


class SpdySessionClosed(SpdyError):
    """The session ended (closed, GOAWAY, idle, connection lost, protocol error) under a call."""


# --- frames -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SynStream:
    stream_id: int
    headers: dict[str, str]
    flags: int = 0
    associated_to: int = 0
    priority: int = 0
    slot: int = 0


@dataclass(frozen=True, slots=True)
class SynReply:
    stream_id: int
    headers: dict[str, str]
    flags: int = 0


@dataclass(frozen=True, slots=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class Settings:
    # (flags, id, value) per entry, in the order sent.
    entries: tuple[tuple[int, int, int], ...]
    flags: int = 0


@dataclass(frozen=True, slots=True)
class Ping:
    ping_id: int


@dataclass(frozen=True, slots=True)
class GoAway:
    last_good_stream_id: int
    status: int = GoAwayStatus.OK


@dataclass(frozen=True, slots=True)
class Headers:
    stream_id: int
    headers: dict[str, str]
    flags: int = 0


@dataclass(frozen=True, slots=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass(frozen=True, slots=True)
class Data:
    stream_id: int
    data: bytes
    flags: int = 0


@dataclass(frozen=True, slots=True)
class UnknownControl:
    """A control frame of a type SPDY/3 does not define: skipped by sessions."""

    frame_type: int
    flags: int
    payload: bytes


Frame: TypeAlias = (
    SynStream
    | SynReply
    | RstStream
    | Settings
    | Ping
    | GoAway
    | Headers
    | WindowUpdate
    | Data
    | UnknownControl
)


class FrameHead(NamedTuple):
    """The 8 bytes every frame starts with. For DATA, `frame_type` is 0 and `version` 0."""

    control: bool
    version: int
    frame_type: int
    stream_id: int
    flags: int
    length: int

    @property
    def name(self) -> str:
        if not self.control:
            return "DATA"
        return _FRAME_NAMES.get(self.frame_type, f"control frame type {self.frame_type}")


def _text(raw: bytes) -> str:
    # Header bytes are opaque to SPDY: surrogateescape keeps any byte round-trippable.
    return raw.decode("utf-8", "surrogateescape")


def encode_header_block(headers: Mapping[str, str]) -> bytes:
    """The uncompressed name/value block: 32-bit count, then 32-bit lengths before each name
    and value. Names are lowercased; several values of one name are NUL-separated in `value`."""
    parts = [struct.pack(">I", len(headers))]
    seen: set[bytes] = set()
    for name, value in headers.items():
        raw_name = name.lower().encode("utf-8", "surrogateescape")
        if not raw_name:
            raise SpdyError("an empty header name", "header block")
        if raw_name in seen:
            raise SpdyError(f"header {name!r} given twice", "header block")
        seen.add(raw_name)
        raw_value = value.encode("utf-8", "surrogateescape")
        parts += (struct.pack(">I", len(raw_name)), raw_name)
        parts += (struct.pack(">I", len(raw_value)), raw_value)
    return b"".join(parts)


def decode_header_block(raw: bytes, frame: str = "header block") -> dict[str, str]:
    """The inverse of `encode_header_block`; SpdyError for anything malformed, an uppercase
    or duplicate name (spdystream refuses those too) or bytes left over."""
    if len(raw) < 4:
        raise SpdyError("header block shorter than its count", frame)
    (count,) = struct.unpack_from(">I", raw)
    # Each pair takes at least its two lengths: a bigger count is a lie, refused up front.
    if count > (len(raw) - 4) // 8:
        raise SpdyError(f"header block claims {count} headers in {len(raw)} bytes", frame)
    headers: dict[str, str] = {}
    pos = 4
    for _ in range(count):
        fields: list[bytes] = []
        for what in ("name", "value"):
            if pos + 4 > len(raw):
                raise SpdyError(f"header block ends inside a {what} length", frame)
            (size,) = struct.unpack_from(">I", raw, pos)
            pos += 4
            if pos + size > len(raw):
                raise SpdyError(f"header {what} runs past the header block", frame)
            fields.append(raw[pos : pos + size])
            pos += size
        name, value = _text(fields[0]), _text(fields[1])
        if not name:
            raise SpdyError("an empty header name", frame)
        if name != name.lower():
            raise SpdyError(f"header name {name!r} is not lowercase", frame)
        if name in headers:
            raise SpdyError(f"header {name!r} appears twice", frame)
        headers[name] = value
    if pos != len(raw):
        raise SpdyError(f"{len(raw) - pos} bytes after the last header", frame)
    return headers


class HeaderCompressor:
    """One direction's header compression context: every block of a session goes through the
    same zlib stream, each ending with a sync flush so the peer can decode it at once."""

    def __init__(self) -> None:
        # Level 9 as spdystream (zlib.BestCompression); the level is not part of the wire.
        self._zlib = zlib.compressobj(
            9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, HEADER_DICTIONARY
        )

    def compress(self, headers: Mapping[str, str]) -> bytes:
        block = encode_header_block(headers)
        return self._zlib.compress(block) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    """The other direction's context; refuses a block that inflates past `max_size` (a small
    compressed block can inflate enormously)."""

    def __init__(self, max_size: int = 1 << 20) -> None:
        self._zlib = zlib.decompressobj(15, HEADER_DICTIONARY)
        self._max = max_size

    def decompress(self, block: bytes, frame: str = "header block") -> dict[str, str]:
        try:
            raw = self._zlib.decompress(block, self._max + 1)
        except zlib.error as exc:
            raise SpdyError(f"header block does not decompress: {exc}", frame) from exc
        if len(raw) > self._max or self._zlib.unconsumed_tail:
            raise SpdyError(f"header block inflates past {self._max} bytes", frame)
        return decode_header_block(raw, frame)


def _control(frame_type: int, flags: int, payload: bytes) -> bytes:
    if len(payload) > MAX_DATA_LENGTH:
        raise SpdyError(f"{len(payload)} bytes do not fit a frame", _FRAME_NAMES[frame_type])
    # Control bit, 15-bit version, 16-bit type; 8-bit flags, 24-bit length.
    return struct.pack(">HHI", 0x8000 | VERSION, frame_type, flags << 24 | len(payload)) + payload


def _check_id(stream_id: int, frame: str, zero_ok: bool = False) -> None:
    if not (0 if zero_ok else 1) <= stream_id <= MAX_STREAM_ID:
        raise SpdyError(f"stream id {stream_id} is out of range", frame)


class FrameEncoder:
    """Frames to bytes; holds the sending direction's header compression context, so frames
    must be sent in the order they were encoded."""

    def __init__(self) -> None:
        self._headers = HeaderCompressor()

    def encode(self, frame: Frame) -> bytes:
        match frame:
            case Data(stream_id, data, flags):
                _check_id(stream_id, "DATA")
                if len(data) > MAX_DATA_LENGTH:
                    raise SpdyError(f"{len(data)} bytes do not fit a frame", "DATA")
                return struct.pack(">II", stream_id, flags << 24 | len(data)) + data
            case SynStream(stream_id, headers, flags, associated_to, priority, slot):
                _check_id(stream_id, "SYN_STREAM")
                _check_id(associated_to, "SYN_STREAM", zero_ok=True)
                # Priority is the top 3 bits of its byte.
                fixed = struct.pack(">IIBB", stream_id, associated_to, (priority & 7) << 5, slot)
                return _control(TYPE_SYN_STREAM, flags, fixed + self._headers.compress(headers))
            case SynReply(stream_id, headers, flags):
                _check_id(stream_id, "SYN_REPLY")
                block = self._headers.compress(headers)
                return _control(TYPE_SYN_REPLY, flags, struct.pack(">I", stream_id) + block)
            case Headers(stream_id, headers, flags):
                _check_id(stream_id, "HEADERS")
                block = self._headers.compress(headers)
                return _control(TYPE_HEADERS, flags, struct.pack(">I", stream_id) + block)
            case RstStream(stream_id, status):
                _check_id(stream_id, "RST_STREAM")
                if status == 0:
                    raise SpdyError("status 0 is not a status", "RST_STREAM")
                return _control(TYPE_RST_STREAM, 0, struct.pack(">II", stream_id, status))
            case Settings(entries, flags):
                body = [struct.pack(">I", len(entries))]
                # 8-bit flags and 24-bit id in one big-endian word, then the 32-bit value.
                body += [struct.pack(">II", f << 24 | i, v) for f, i, v in entries]
                return _control(TYPE_SETTINGS, flags, b"".join(body))
            case Ping(ping_id):
                return _control(TYPE_PING, 0, struct.pack(">I", ping_id))
            case GoAway(last_good, status):
                _check_id(last_good, "GOAWAY", zero_ok=True)
                return _control(TYPE_GOAWAY, 0, struct.pack(">II", last_good, status))
            case WindowUpdate(stream_id, delta):
                _check_id(stream_id, "WINDOW_UPDATE", zero_ok=True)
                if not 1 <= delta <= MAX_WINDOW:
                    raise SpdyError(f"delta {delta} is out of range", "WINDOW_UPDATE")
                return _control(TYPE_WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta))
            case UnknownControl(frame_type, flags, payload):
                return (
                    struct.pack(">HHI", 0x8000 | VERSION, frame_type, flags << 24 | len(payload))
                    + payload
                )
        raise TypeError(f"not a SPDY frame: {frame!r}")


class FrameDecoder:
    """Bytes to frames; holds the receiving direction's header decompression context."""

    def __init__(self, max_header_block: int = 1 << 20) -> None:
        self._headers = HeaderDecompressor(max_header_block)

    @staticmethod
    def parse_head(head: bytes) -> FrameHead:
        first, second = struct.unpack(">II", head)
        flags, length = second >> 24, second & 0xFFFFFF
        if first & 0x80000000:
            version = first >> 16 & 0x7FFF
            return FrameHead(True, version, first & 0xFFFF, 0, flags, length)
        return FrameHead(False, 0, 0, first & _ID_MASK, flags, length)

    def control(self, head: FrameHead, payload: bytes) -> Frame:
        """The control frame `head` starts, given its payload."""
        name = head.name
        if head.version != VERSION:
            raise SpdyError(f"version {head.version}: only SPDY/3 is spoken", name)
        kind, flags, size = head.frame_type, head.flags, len(payload)

        def fixed(expected: int) -> None:
            if size != expected:
                raise SpdyError(f"length {size}, must be {expected}", name)

        def stream_id(offset: int = 0) -> int:
            sid: int = struct.unpack_from(">I", payload, offset)[0] & _ID_MASK
            if sid == 0:
                raise SpdyError("stream id 0 is not allowed", name)
            return sid

        if kind == TYPE_SYN_STREAM:
            if size < 10:
                raise SpdyError(f"length {size}, must be at least 10", name)
            sid = stream_id()
            associated = struct.unpack_from(">I", payload, 4)[0] & _ID_MASK
            priority, slot = payload[8] >> 5, payload[9]
            headers = self._headers.decompress(payload[10:], name)
            return SynStream(sid, headers, flags, associated, priority, slot)
        if kind in (TYPE_SYN_REPLY, TYPE_HEADERS):
            if size < 4:
                raise SpdyError(f"length {size}, must be at least 4", name)
            sid = stream_id()
            headers = self._headers.decompress(payload[4:], name)
            if kind == TYPE_SYN_REPLY:
                return SynReply(sid, headers, flags)
            return Headers(sid, headers, flags)
        if kind == TYPE_RST_STREAM:
            fixed(8)
            sid = stream_id()
            (status,) = struct.unpack_from(">I", payload, 4)
            if status == 0:
                raise SpdyError(f"stream {sid}: status 0 is not a status", name)
            return RstStream(sid, status)
        if kind == TYPE_SETTINGS:
            if size < 4:
                raise SpdyError(f"length {size}, must be at least 4", name)
            (count,) = struct.unpack_from(">I", payload)
            if size != 4 + 8 * count:
                raise SpdyError(f"length {size} does not hold {count} entries", name)
            entries = []
            for offset in range(4, size, 8):
                flag_id, value = struct.unpack_from(">II", payload, offset)
                entries.append((flag_id >> 24, flag_id & 0xFFFFFF, value))
            return Settings(tuple(entries), flags)
        if kind == TYPE_PING:
            fixed(4)
            return Ping(struct.unpack(">I", payload)[0])
        if kind == TYPE_GOAWAY:
            fixed(8)
            last_good, status = struct.unpack(">II", payload)
            return GoAway(last_good & _ID_MASK, status)
        if kind == TYPE_WINDOW_UPDATE:
            fixed(8)
            sid, delta = struct.unpack(">II", payload)
            delta &= _ID_MASK
            if delta == 0:
                raise SpdyError(f"stream {sid & _ID_MASK}: delta 0", name)
            return WindowUpdate(sid & _ID_MASK, delta)
        return UnknownControl(kind, flags, payload)

    def decode(self, data: bytes) -> list[Frame]:
        """Every frame in `data`, which must end at a frame boundary (tests, tools)."""
        frames: list[Frame] = []
        pos = 0
        while pos < len(data):
            if len(data) - pos < 8:
                raise SpdyError(f"{len(data) - pos} bytes left, a frame head takes 8")
            head = self.parse_head(data[pos : pos + 8])
            payload = data[pos + 8 : pos + 8 + head.length]
            if len(payload) != head.length:
                raise SpdyError(f"length {head.length}, {len(payload)} bytes left", head.name)
            pos += 8 + head.length
            if head.control:
                frames.append(self.control(head, payload))
            else:
                if head.stream_id == 0:
                    raise SpdyError("stream id 0 is not allowed", "DATA")
                frames.append(Data(head.stream_id, payload, head.flags))
        return frames
