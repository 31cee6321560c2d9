"""SPDY/3.1 (pykubelet/common/spdy.py) and taking aiohttp connections over for it
(hijack.py): frames against bytes written out from the SPDY/3 draft and spdystream, sessions
over real 127.0.0.1 sockets, flow control, and an upgrade through an aiohttp server on TLS."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import struct
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import http_parser, web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pykubelet.common.spdy import SpdySession, SpdyStream
from pykubelet.common.spdy_frames import (
    FLAG_FIN,
    FLAG_UNIDIRECTIONAL,
    HEADER_DICTIONARY,
    Data,
    Frame,
    FrameDecoder,
    FrameEncoder,
    GoAway,
    GoAwayStatus,
    HeaderCompressor,
    HeaderDecompressor,
    Headers,
    Ping,
    RstStatus,
    RstStream,
    SettingId,
    Settings,
    SpdyError,
    SpdySessionClosed,
    SpdyStreamReset,
    SynReply,
    SynStream,
    UnknownControl,
    WindowUpdate,
    decode_header_block,
    encode_header_block,
)
from pykubelet.server.streaming.hijack import HijackError, upgrade_to_spdy, upgraded_response

Reader = asyncio.StreamReader
Writer = asyncio.StreamWriter


def h(text: str) -> bytes:
    """Hex with spaces and comments (after #) allowed, for frames written out by hand."""
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return bytes.fromhex("".join(lines))


async def until(predicate: Callable[[], bool], within: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.002)


# --- the dictionary and fixed-layout frames ------------------------------------------------


def test_dictionary_is_the_spdy3_one() -> None:
    # spdy/dictionary.go: 1423 bytes; its Adler-32 is the DICTID a SPDY/3 zlib stream names.
    assert len(HEADER_DICTIONARY) == 1423
    assert zlib.adler32(HEADER_DICTIONARY) == 0xE3C6A7C2
    assert HEADER_DICTIONARY.startswith(h("00 00 00 07") + b"options" + h("00 00 00 04") + b"head")
    assert h("00 00 00 06") + b"200 OK" in HEADER_DICTIONARY
    assert h("00 00 00 06") + b"origin100101201" in HEADER_DICTIONARY  # the words end there
    assert HEADER_DICTIONARY.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")


FIXED_FRAMES: list[tuple[Frame, str]] = [
    (
        RstStream(1, RstStatus.CANCEL),
        """80 03        # control bit, version 3
           00 03        # type 3: RST_STREAM
           00 000008    # flags 0, length 8
           00000001     # stream id 1
           00000005     # status 5: CANCEL""",
    ),
    (
        Settings(((0, SettingId.INITIAL_WINDOW_SIZE, 65536),)),
        """80 03 00 04  # SETTINGS
           00 00000c    # flags 0, length 12 = 4 + 8 per entry
           00000001     # one entry
           00 000007    # entry flags 0, id 7: SETTINGS_INITIAL_WINDOW_SIZE (24 bits)
           00010000     # value 65536""",
    ),
    (
        Ping(1),
        """80 03 00 06  # PING
           00 000004    # flags 0, length 4
           00000001     # ping id 1 (odd: the client's)""",
    ),
    (
        GoAway(3, GoAwayStatus.PROTOCOL_ERROR),
        """80 03 00 07  # GOAWAY
           00 000008    # flags 0, length 8 (SPDY/3 adds the status)
           00000003     # last good stream id 3
           00000001     # status 1: PROTOCOL_ERROR""",
    ),
    (
        WindowUpdate(1, 32768),
        """80 03 00 09  # WINDOW_UPDATE
           00 000008    # flags 0, length 8
           00000001     # stream id 1 (0 would be the SPDY/3.1 session window)
           00008000     # delta 32768""",
    ),
    (
        Data(1, b"hi", FLAG_FIN),
        """00000001     # control bit 0: DATA, stream id 1
           01 000002    # flags FIN, length 2
           6869         # hi""",
    ),
    (
        Data(2, b""),
        """00000002     # DATA on stream 2
           00 000000    # no flags, empty""",
    ),
]


@pytest.mark.parametrize(("frame", "wire"), FIXED_FRAMES)
def test_fixed_frames_encode_and_decode(frame: Frame, wire: str) -> None:
    assert FrameEncoder().encode(frame) == h(wire)
    assert FrameDecoder().decode(h(wire)) == [frame]


def test_syn_stream_layout() -> None:
    frame = SynStream(3, {"StreamType": "error"}, FLAG_FIN, associated_to=1, priority=2, slot=0)
    wire = FrameEncoder().encode(frame)
    (length,) = struct.unpack(">I", b"\0" + wire[5:8])
    assert wire[:5] == h("80 03 00 01 01")  # control, version 3, type 1, flags FIN
    assert length == len(wire) - 8
    assert wire[8:18] == h(
        """00000003  # stream id 3
           00000001  # associated-to stream 1
           40        # priority 2 in the top 3 bits
           00        # slot"""
    )
    # The header block is a zlib stream over the SPDY/3 dictionary: CMF 0x78, FLG 0xf9
    # (FDICT set, level 3 bits), then the dictionary's Adler-32.
    assert wire[18:24] == h("78 f9 e3c6a7c2")
    assert wire.endswith(h("0000ffff"))  # each block ends with a sync flush
    decoded = FrameDecoder().decode(wire)
    assert decoded == [SynStream(3, {"streamtype": "error"}, FLAG_FIN, 1, 2, 0)]


def test_decodes_a_header_block_written_by_hand() -> None:
    # Not our compressor's output: a zlib stream (header naming the dictionary) holding one
    # stored deflate block, as any SPDY/3 peer may send. The raw block for
    # {"streamtype": "error"} is 27 bytes.
    raw = h("00000001 0000000a") + b"streamtype" + h("00000005") + b"error"
    assert len(raw) == 27
    compressed = h(
        """78 f9 e3c6a7c2  # zlib header, FDICT, SPDY/3 dictionary id
           00              # stored block, not final
           1b00 e4ff       # LEN 27, NLEN its complement (little-endian)"""
    )
    wire = (
        h(
            """80 03 00 01  # SYN_STREAM
               00 000030    # flags 0, length 48 = 10 + 38
               00000001     # stream id 1
               00000000     # associated-to 0
               00 00        # priority 0, slot 0"""
        )
        + compressed
        + raw
    )
    assert len(compressed + raw) == 38
    assert FrameDecoder().decode(wire) == [SynStream(1, {"streamtype": "error"})]


def test_one_compression_context_per_direction() -> None:
    headers = {"streamtype": "stdout", "port": "8080", "requestid": "42"}
    sender, receiver = HeaderCompressor(), HeaderDecompressor()
    first, second = sender.compress(headers), sender.compress(headers)
    # The second block refers back into the first: the context is the session's.
    assert len(second) < len(first)
    assert receiver.decompress(first) == headers
    assert receiver.decompress(second) == headers
    with pytest.raises(SpdyError, match="does not decompress"):
        HeaderDecompressor().decompress(second)


def test_header_blocks() -> None:
    block = encode_header_block({"Content-Type": "a", "multi": "x\0y"})
    assert block == (
        h("00000002 0000000c")
        + b"content-type"  # lowercased on the way out
        + h("00000001")
        + b"a"
        + h("00000005")
        + b"multi"
        + h("00000003")
        + b"x\0y"  # several values: NUL-separated
    )
    assert decode_header_block(block) == {"content-type": "a", "multi": "x\0y"}
    assert decode_header_block(h("00000000")) == {}
    upper = h("00000001 00000001") + b"A" + h("00000000")
    with pytest.raises(SpdyError, match="not lowercase"):
        decode_header_block(upper, "SYN_STREAM")
    twice = h("00000002") + (h("00000001") + b"a" + h("00000000")) * 2
    with pytest.raises(SpdyError, match="twice"):
        decode_header_block(twice)
    with pytest.raises(SpdyError, match="claims 1000"):
        decode_header_block(h("000003e8"))
    with pytest.raises(SpdyError, match="given twice"):
        encode_header_block({"A": "1", "a": "2"})


def test_header_bomb_is_refused() -> None:
    huge = {"x": "a" * 200_000}
    with pytest.raises(SpdyError, match="inflates past"):
        HeaderDecompressor(max_size=100_000).decompress(HeaderCompressor().compress(huge))


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ("80 02 0006 00000004 00000001", "PING: version 2: only SPDY/3"),
        ("80 03 0003 00000008 00000001 00000000", "RST_STREAM: stream 1: status 0"),
        ("80 03 0003 00000008 00000000 00000005", "RST_STREAM: stream id 0"),
        ("80 03 0006 00000008 00000001 00000001", "PING: length 8, must be 4"),
        ("80 03 0007 00000004 00000001", "GOAWAY: length 4, must be 8"),
        ("80 03 0004 00000004 00000001", "SETTINGS: length 4 does not hold 1 entries"),
        ("80 03 0009 00000008 00000001 00000000", "WINDOW_UPDATE: stream 1: delta 0"),
        ("80 03 0001 0000000a 00000000 00000000 0000", "SYN_STREAM: stream id 0"),
        ("80 03 0001 00000004 00000001", "SYN_STREAM: length 4, must be at least 10"),
        ("00000000 00000000", "DATA: stream id 0"),
        ("00000001 00000005 6869", "DATA: length 5, 2 bytes left"),
    ],
)
def test_bad_frames_name_the_frame(wire: str, message: str) -> None:
    with pytest.raises(SpdyError) as caught:
        FrameDecoder().decode(h(wire))
    assert message in str(caught.value)


def test_unknown_control_frames_decode_as_such() -> None:
    # Type 10 was SPDY/3's CREDENTIAL: a session skips what it does not know.
    wire = h("80 03 000a 00 000002 abcd")
    assert FrameDecoder().decode(wire) == [UnknownControl(10, 0, h("abcd"))]


# --- sessions over real sockets ------------------------------------------------------------


@contextlib.asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[Reader, Writer, Reader, Writer]]:
    """(server reader, server writer, client reader, client writer) over 127.0.0.1."""
    accepted: asyncio.Queue[tuple[Reader, Writer]] = asyncio.Queue()

    async def on_connection(reader: Reader, writer: Writer) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client_reader, client_writer = await asyncio.open_connection("127.0.0.1", port)
    server_reader, server_writer = await accepted.get()
    try:
        yield server_reader, server_writer, client_reader, client_writer
    finally:
        for writer in (client_writer, server_writer):
            writer.close()
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def sessions(
    server_idle: float | None = None,
) -> AsyncIterator[tuple[SpdySession, SpdySession]]:
    async with socket_pair() as (sr, sw, cr, cw):
        server = SpdySession(sr, sw, server=True, idle_timeout=server_idle)
        client = SpdySession(cr, cw, server=False)
        try:
            yield server, client
        finally:
            await client.close()
            await server.close()


class RawPeer:
    """A peer speaking frames by hand, as spdystream does: no SETTINGS, no WINDOW_UPDATE."""

    def __init__(self, reader: Reader, writer: Writer) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = FrameEncoder(), FrameDecoder()

    async def send(self, *frames: Frame) -> None:
        for frame in frames:
            self.writer.write(self.encoder.encode(frame))
        await self.writer.drain()

    async def frame(self, within: float = 1.0) -> Frame:
        async with asyncio.timeout(within):
            head = await self.reader.readexactly(8)
            length = FrameDecoder.parse_head(head).length
            payload = await self.reader.readexactly(length)
        (frame,) = self.decoder.decode(head + payload)
        return frame

    async def frame_of(self, kind: type[Frame], within: float = 1.0) -> Frame:
        """The next frame of `kind`, skipping WINDOW_UPDATEs and SETTINGS."""
        while True:
            frame = await self.frame(within)
            if isinstance(frame, kind):
                return frame
            assert isinstance(frame, (WindowUpdate, Settings)), frame


@contextlib.asynccontextmanager
async def raw_client(
    idle_timeout: float | None = None,
) -> AsyncIterator[tuple[SpdySession, RawPeer]]:
    async with socket_pair() as (sr, sw, cr, cw):
        server = SpdySession(sr, sw, server=True, idle_timeout=idle_timeout)
        try:
            yield server, RawPeer(cr, cw)
        finally:
            await server.close()


async def read_all(stream: SpdyStream) -> bytes:
    chunks = []
    while chunk := await stream.read():
        chunks.append(chunk)
    return b"".join(chunks)


async def test_streams_in_both_directions() -> None:
    async with sessions() as (server, client):
        ours = await client.open_stream({"streamType": "stdin", "requestID": "7"})
        theirs = await server.accept_stream()
        assert theirs is not None
        assert theirs.id == 1 and ours.id == 1
        assert theirs.headers == {"streamtype": "stdin", "requestid": "7"}
        await theirs.reply({"x-ok": "yes"})
        assert await ours.wait_reply() == {"x-ok": "yes"}
        await ours.write(b"ping ")
        await ours.write(b"pong")
        await ours.close()
        assert await read_all(theirs) == b"ping pong"
        await theirs.write(b"back")
        await theirs.close()
        assert await read_all(ours) == b"back"
        assert ours.closed and theirs.closed

        # The server opens one too (even ids); the client accepts it.
        pushed = await server.open_stream({"streamtype": "data", "port": "80"}, fin=False)
        assert pushed.id == 2
        got = await client.accept_stream()
        assert got is not None and got.headers == {"streamtype": "data", "port": "80"}
        await got.write(b"auto-replied")  # sends the SYN_REPLY first
        await got.close()
        assert await read_all(pushed) == b"auto-replied"
        await pushed.close()
        with pytest.raises(SpdyError, match="write after close"):
            await pushed.write(b"more")


async def test_fin_and_unidirectional_on_syn_stream() -> None:
    async with raw_client() as (server, peer):
        await peer.send(SynStream(1, {"streamtype": "error"}, FLAG_FIN | FLAG_UNIDIRECTIONAL))
        stream = await server.accept_stream()
        assert stream is not None and stream.closed
        assert await stream.read() == b""
        with pytest.raises(SpdyError, match="write after close"):
            await stream.write(b"x")


async def test_flow_control_blocks_the_writer_until_window_update() -> None:
    async with sessions() as (server, client):
        ours = await client.open_stream({"streamtype": "stdout"})
        theirs = await server.accept_stream()
        assert theirs is not None
        await theirs.reply()
        payload = bytes(range(256)) * 800  # 204800 bytes
        writer = asyncio.create_task(theirs.write(payload))
        # The client reads nothing: the server stops at the 64 KiB window.
        await until(lambda: ours._buffered == 65536)
        await asyncio.sleep(0.05)
        assert not writer.done()
        assert theirs._send_window == 0
        assert ours._buffered == 65536  # nothing beyond the window
        got = bytearray()
        while len(got) < len(payload):
            got += await ours.read(10000)
            assert ours._buffered <= 65536
        await writer
        assert bytes(got) == payload

        # The other way round: the client, too, keeps to the server's window.
        writer = asyncio.create_task(ours.write(payload))
        await until(lambda: theirs._buffered == 65536)
        await asyncio.sleep(0.05)
        assert not writer.done()
        got = bytearray()
        while len(got) < len(payload):
            got += await theirs.read()
        await writer
        assert bytes(got) == payload


async def test_peer_without_flow_control_is_held_back_by_tcp() -> None:
    # spdystream keeps no windows: our writes must not wait for WINDOW_UPDATEs that never
    # come, and its writes past our window must not pile up in memory.
    async with raw_client() as (server, peer):
        await peer.send(SynStream(1, {"streamtype": "stdin"}))
        stream = await server.accept_stream()
        assert stream is not None
        await stream.reply()
        assert isinstance(await peer.frame(), Settings)  # after the client's first frame
        assert isinstance(await peer.frame(), SynReply)

        async def collect(size: int) -> bytes:
            got = bytearray()
            while len(got) < size:
                frame = await peer.frame_of(Data)
                assert isinstance(frame, Data)
                got += frame.data
            return bytes(got)

        payload = b"x" * 200_000
        collector = asyncio.create_task(collect(len(payload)))
        async with asyncio.timeout(1):
            await stream.write(payload)  # never waits on a window
        assert await collector == payload

        # 300 kB in frames of 100 kB while the application reads nothing.
        got = bytearray()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(peer.send(*(Data(1, b"y" * 100_000) for _ in range(3))))
            await until(lambda: stream._buffered > 65536)
            await asyncio.sleep(0.05)
            # At most the window plus one read chunk; the rest waits in TCP.
            assert stream._buffered <= 65536 + 65536
            while len(got) < 300_000:
                got += await stream.read()
                assert stream._buffered <= 65536 + 65536
        assert bytes(got) == b"y" * 300_000


async def test_window_overrun_by_a_flow_control_peer_is_a_stream_error() -> None:
    async with raw_client() as (server, peer):
        # SETTINGS says the peer keeps windows; then it sends past 64 KiB anyway.
        await peer.send(Settings(((0, SettingId.INITIAL_WINDOW_SIZE, 65536),)))
        await peer.send(SynStream(1, {"streamtype": "stdin"}), Data(1, b"z" * 70_000))
        stream = await server.accept_stream()
        assert stream is not None
        reset = await peer.frame_of(RstStream)
        assert reset == RstStream(1, RstStatus.FLOW_CONTROL_ERROR)
        with pytest.raises(SpdyStreamReset) as caught:
            await stream.read()
        assert caught.value.status == RstStatus.FLOW_CONTROL_ERROR
        assert not server.closed  # a stream error, not a session one


async def test_ping() -> None:
    async with sessions() as (server, client):
        assert 0 <= await client.ping() < 1
        assert 0 <= await server.ping() < 1
    async with raw_client() as (server, peer):
        await peer.send(Ping(1))  # odd: a client's ping, echoed with the same id
        assert await peer.frame_of(Ping) == Ping(1)


async def test_goaway_from_the_client() -> None:
    async with sessions() as (server, client):
        ours = await client.open_stream({"streamtype": "stdin"})
        theirs = await server.accept_stream()
        assert theirs is not None
        await client.close()
        assert await server.accept_stream() is None
        with pytest.raises(SpdySessionClosed):
            await theirs.read()
        await asyncio.wait_for(server.wait_closed(), 1)
        with pytest.raises(SpdySessionClosed):
            await ours.write(b"late")


async def test_goaway_resets_streams_the_peer_never_processed() -> None:
    async with socket_pair() as (sr, sw, cr, cw):
        peer = RawPeer(sr, sw)  # a hand-written server this time
        client = SpdySession(cr, cw, server=False)
        assert isinstance(await peer.frame(), Settings)
        first = await client.open_stream({"streamtype": "a"})
        second = await client.open_stream({"streamtype": "b"})
        assert await peer.frame_of(SynStream) == SynStream(1, {"streamtype": "a"})
        await peer.frame_of(SynStream)
        await peer.send(SynReply(1, {}), GoAway(1, GoAwayStatus.OK))
        with pytest.raises(SpdyStreamReset) as caught:
            await second.read()
        assert caught.value.status == RstStatus.REFUSED_STREAM and caught.value.by_peer
        with pytest.raises(SpdyError, match="GOAWAY"):
            await client.open_stream({"streamtype": "c"})
        assert not client.closed  # stream 1 is still going
        await peer.send(Data(1, b"done", FLAG_FIN))
        assert await read_all(first) == b"done"
        await first.close()  # the last stream: the session ends
        await asyncio.wait_for(client.wait_closed(), 1)
        assert await client.accept_stream() is None


async def test_reset_by_either_side() -> None:
    async with sessions() as (server, client):
        ours = await client.open_stream({"streamtype": "stdin"})
        theirs = await server.accept_stream()
        assert theirs is not None
        await theirs.reply()
        ours.reset()
        with pytest.raises(SpdyStreamReset) as caught:
            await theirs.read()
        assert caught.value.status == RstStatus.CANCEL and caught.value.by_peer
        with pytest.raises(SpdyStreamReset):
            await theirs.write(b"x")
        with pytest.raises(SpdyStreamReset):
            await ours.read()
        await theirs.close()  # a no-op on a reset stream
        # The session goes on.
        again = await client.open_stream({"streamtype": "stdout"})
        accepted = await server.accept_stream()
        assert accepted is not None and accepted.id == again.id == 3


async def test_data_before_the_peers_reset_is_still_read() -> None:
    # The Kubernetes streaming server writes the Status on the error stream and resets it
    # right behind: the Status must not be lost.
    async with sessions() as (server, client):
        ours = await client.open_stream({"streamtype": "error"})
        theirs = await server.accept_stream()
        assert theirs is not None
        await theirs.reply()
        await theirs.write(b'{"status":"Success"}')
        theirs.reset()
        await until(lambda: ours.closed)
        assert await ours.read() == b'{"status":"Success"}'
        with pytest.raises(SpdyStreamReset):
            await ours.read()


async def test_protocol_error_ends_the_session_with_goaway() -> None:
    async with raw_client() as (server, peer):
        await peer.send(SynStream(1, {"streamtype": "stdin"}))
        stream = await server.accept_stream()
        assert stream is not None
        peer.writer.write(h("80 02 0006 00000004 00000001"))  # PING from SPDY/2
        assert await peer.frame_of(GoAway) == GoAway(1, GoAwayStatus.PROTOCOL_ERROR)
        assert await peer.reader.read() == b""  # and the connection is closed
        await server.wait_closed()
        assert server.error is not None and "PING: version 2" in str(server.error)
        with pytest.raises(SpdySessionClosed, match="protocol error"):
            await stream.read()


async def test_syn_stream_of_the_wrong_parity_is_a_protocol_error() -> None:
    async with raw_client() as (server, peer):
        await peer.send(SynStream(2, {"streamtype": "stdin"}))  # even: a server's id
        assert await peer.frame_of(GoAway) == GoAway(0, GoAwayStatus.PROTOCOL_ERROR)
        await server.wait_closed()
        assert server.error is not None and "SYN_STREAM" in str(server.error)


async def test_unknown_control_frames_are_skipped() -> None:
    async with raw_client() as (server, peer):
        peer.writer.write(h("80 03 000a 00 000002 abcd"))
        await peer.send(Ping(1))
        assert await peer.frame_of(Ping) == Ping(1)
        assert not server.closed


async def test_server_says_nothing_before_the_client() -> None:
    # Kubernetes' client reads the 101 through a buffered reader that would swallow bytes
    # sent right behind it: the server's first frame waits for the client's.
    async with raw_client() as (_, peer):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(peer.reader.read(1), 0.05)
        await peer.send(SynStream(1, {"streamtype": "error"}))
        assert isinstance(await peer.frame(), Settings)


async def test_idle_timeout_closes_the_session() -> None:
    async with raw_client(idle_timeout=0.1) as (server, peer):
        start = time.monotonic()
        assert await peer.frame() == GoAway(0, GoAwayStatus.OK)
        assert await peer.reader.read() == b""
        assert 0.08 <= time.monotonic() - start < 0.5
        assert server.closed and "idle" in str(server.error)


async def test_frames_keep_an_idle_session_open() -> None:
    async with sessions(server_idle=0.1) as (server, client):
        for _ in range(6):
            await client.ping()
            await asyncio.sleep(0.04)
        assert not server.closed
        await asyncio.wait_for(server.wait_closed(), 0.5)
        assert await client.accept_stream() is None  # the client saw the GOAWAY


# --- taking an aiohttp connection over, on TLS ---------------------------------------------


def make_pems() -> tuple[bytes, bytes]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert_pem, key_pem


@pytest.fixture(scope="module")
def pems() -> tuple[bytes, bytes]:
    return make_pems()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def tls_server(
    pems: tuple[bytes, bytes], tmp_path: Path, handler: Handler
) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(pems[0])
    key_file.write_bytes(pems[1])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_file, key_file)
    client_ctx = ssl.create_default_context(cadata=pems[0].decode())

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/exec", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, client_ctx
    finally:
        await runner.cleanup()


UPGRADE_REQUEST = (
    b"POST /exec?command=cat HTTP/1.1\r\n"
    b"Host: 127.0.0.1\r\n"
    b"Connection: Upgrade\r\n"
    b"Upgrade: SPDY/3.1\r\n"
    b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
    b"X-Stream-Protocol-Version: channel.k8s.io\r\n"
    b"Content-Length: 0\r\n"
    b"\r\n"
)


async def echo_upper(request: web.Request) -> web.StreamResponse:
    offered = request.headers.getall("X-Stream-Protocol-Version", ["channel.k8s.io"])
    session = await upgrade_to_spdy(request, {"X-Stream-Protocol-Version": offered[0]}, 5.0)
    async with session:
        stream = await session.accept_stream()
        assert stream is not None
        await stream.reply()
        while data := await stream.read():
            await stream.write(data.upper())
        await stream.close()
        await session.wait_closed()
    # As a handler may: nothing of it reaches the upgraded connection.
    return web.Response(text="not written")


async def test_upgrade_over_tls_then_plain_requests_still_work(
    pems: tuple[bytes, bytes], tmp_path: Path
) -> None:
    async with tls_server(pems, tmp_path, echo_upper) as (port, client_ctx):
        url = f"https://127.0.0.1:{port}/healthz"
        async with aiohttp.ClientSession() as http:
            async with http.get(url, ssl=client_ctx) as before:
                assert await before.text() == "ok"

            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
            )
            writer.write(UPGRADE_REQUEST)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1)
            lines = head.decode().split("\r\n")
            assert lines[0] == "HTTP/1.1 101 Switching Protocols"
            fields = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
            assert fields["connection"] == "Upgrade"
            assert fields["upgrade"] == "SPDY/3.1"
            assert fields["x-stream-protocol-version"] == "v4.channel.k8s.io"
            assert "content-length" not in fields and "transfer-encoding" not in fields

            client = SpdySession(reader, writer, server=False)
            stream = await client.open_stream({"streamtype": "stdin"})
            # Meanwhile the server answers other requests, on the same keep-alive pool.
            async with http.get(url, ssl=client_ctx) as during:
                assert await during.text() == "ok"
            await stream.write(b"hello over ")
            await stream.write(b"tls")
            await stream.close()
            assert await read_all(stream) == b"HELLO OVER TLS"
            await client.close()

            async with http.get(url, ssl=client_ctx) as after:
                assert await after.text() == "ok"


async def test_the_handler_response_is_not_written_into_the_stream(
    pems: tuple[bytes, bytes], tmp_path: Path
) -> None:
    kept: list[SpdySession] = []

    async def upgrade_and_return(request: web.Request) -> web.StreamResponse:
        kept.append(await upgrade_to_spdy(request, {}, None))
        return web.Response(text="HTTP/1.1 200 leaked")

    async with tls_server(pems, tmp_path, upgrade_and_return) as (port, client_ctx):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        writer.write(UPGRADE_REQUEST)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(1), 0.1)
        writer.close()
        await kept[0].close()


async def test_not_an_upgrade_is_a_400(pems: tuple[bytes, bytes], tmp_path: Path) -> None:
    async with (
        tls_server(pems, tmp_path, echo_upper) as (port, client_ctx),
        aiohttp.ClientSession() as http,
        http.post(f"https://127.0.0.1:{port}/exec", ssl=client_ctx) as response,
    ):
        assert response.status == 400
        assert "missing upgrade headers" in await response.text()


async def test_bytes_aiohttp_parsed_before_the_upgrade_are_not_silently_lost(
    pems: tuple[bytes, bytes], tmp_path: Path
) -> None:
    # A client that speaks before the 101 while the handler is still busy (authorizing, say):
    # aiohttp parses what comes behind the head. Never a corrupt stream: an error, or (with
    # the pure-Python parser, which holds such bytes back) the bytes handed over.
    outcome: list[object] = []
    started = asyncio.Event()

    async def slow_upgrade(request: web.Request) -> web.StreamResponse:
        started.set()
        protocol: object = request.protocol
        await until(lambda: bool(protocol._messages or getattr(protocol._parser, "_tail", b"")))  # type: ignore[attr-defined]
        try:
            session = await upgrade_to_spdy(request, {}, None)
        except HijackError as exc:
            outcome.append(exc)
            return web.Response(status=500)
        await until(lambda: session._peer_flow_control)
        outcome.append("handed over")
        await session.close()
        return upgraded_response(request)

    async with tls_server(pems, tmp_path, slow_upgrade) as (port, client_ctx):
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        writer.write(UPGRADE_REQUEST)
        await started.wait()
        writer.write(FrameEncoder().encode(Settings(((0, 7, 65536),))))
        await until(lambda: bool(outcome), within=2)
        writer.close()
    if http_parser.HttpRequestParser is not http_parser.HttpRequestParserPy:
        assert isinstance(outcome[0], HijackError)  # the C parser took them as a request
    else:
        assert outcome[0] == "handed over"  # AIOHTTP_NO_EXTENSIONS=1: the Python parser


def test_headers_frame_roundtrip() -> None:
    encoder, decoder = FrameEncoder(), FrameDecoder()
    frames: list[Frame] = [
        SynReply(1, {"a": "b"}, FLAG_FIN),
        Headers(1, {"c": "d"}),
        SynReply(3, {}),
    ]
    assert decoder.decode(b"".join(encoder.encode(f) for f in frames)) == frames


async def test_a_client_gone_mid_session_ends_it(pems: tuple[bytes, bytes], tmp_path: Path) -> None:
    ended: asyncio.Queue[SpdySession] = asyncio.Queue()

    async def wait_for_the_end(request: web.Request) -> web.StreamResponse:
        session = await upgrade_to_spdy(request, {}, 5.0)
        await session.wait_closed()
        await ended.put(session)
        return upgraded_response(request)

    async with tls_server(pems, tmp_path, wait_for_the_end) as (port, client_ctx):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        writer.write(UPGRADE_REQUEST)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1)
        writer.transport.abort()
        session = await asyncio.wait_for(ended.get(), 1)
        assert "connection closed" in str(session.error)
