"""SPDY/3.1 sessions over an asyncio StreamReader/StreamWriter pair, as Kubernetes speaks them.

The kube-apiserver talks to a kubelet's exec, attach and port-forward endpoints (and kubectl to
the apiserver) over SPDY/3.1: k8s.io/apimachinery/pkg/util/httpstream/spdy, built on
github.com/moby/spdystream. This module is that protocol, both ends of it.

What it promises:

* Frames (`spdy_frames.py`): every SPDY/3 frame, header blocks compressed with the SPDY/3
  dictionary, one compression context per direction for the whole session.
* `SpdySession`: either end (``server=True`` takes the even stream ids). It accepts the streams
  the peer opens (`accept_stream`), opens its own (`open_stream`), answers PINGs, honours
  GOAWAY (no new streams; streams the peer never processed are reset; the session ends when
  the last stream does) and closes after `idle_timeout` seconds without a frame either way.
  A protocol error from the peer ends the session with GOAWAY(PROTOCOL_ERROR).
* Flow control, bounded memory: each stream buffers at most its receive window (64 KiB by
  default) plus one read chunk, and WINDOW_UPDATEs (stream and session, SPDY/3.1) go out as
  the application reads. spdystream - hence kubectl and the kube-apiserver - never sends
  WINDOW_UPDATE or SETTINGS and ignores windows; so windows bind our writes only once the
  peer has shown it keeps them (it sent SETTINGS or WINDOW_UPDATE), and a peer that writes
  past its window without having shown that is held back by TCP instead: the session stops
  reading the connection until the application drains the stream. A peer that announced flow
  control and overruns a window gets RST_STREAM(FLOW_CONTROL_ERROR).
* A server session says nothing before the client's first frame: Kubernetes' client reads
  the 101 response through a buffered reader and would swallow bytes sent right behind it.
* Errors are `SpdyError`s naming the frame and the reason; `SpdyStreamReset` when a stream
  was reset (either side), `SpdySessionClosed` when the session ended under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Mapping
from types import TracebackType

from pykubelet.common.spdy_frames import (
    DEFAULT_WINDOW,
    FLAG_FIN,
    FLAG_UNIDIRECTIONAL,
    MAX_STREAM_ID,
    MAX_WINDOW,
    Data,
    Frame,
    FrameDecoder,
    FrameEncoder,
    FrameHead,
    GoAway,
    GoAwayStatus,
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
)

log = logging.getLogger(__name__)

# --- sessions ------------------------------------------------------------------------------

# DATA payloads are read off the connection, and written, in pieces of at most this much: it
# bounds what one stream holds beyond its window, whatever length the peer's frames claim.
_CHUNK = 65536
# Past this many bytes waiting in the transport, PINGs go unanswered: a peer that floods PINGs
# without reading the answers must not grow our write buffer without limit.
_PING_ANSWER_LIMIT = 1 << 20


class SpdyStream:
    """One stream of a `SpdySession`. `headers` are its SYN_STREAM headers (ours if we opened
    it); `reply_headers` the SYN_REPLY's, once one came, on a stream we opened."""

    def __init__(
        self,
        session: SpdySession,
        stream_id: int,
        headers: dict[str, str],
        *,
        opened_here: bool,
        priority: int = 0,
    ) -> None:
        self._session = session
        self.id = stream_id
        self.headers = headers
        self.priority = priority
        self.reply_headers: dict[str, str] | None = None
        # HEADERS frames that came after the SYN_STREAM/SYN_REPLY, in order.
        self.late_headers: list[dict[str, str]] = []
        self._opened_here = opened_here
        self._replied = False
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._local_fin = False
        self._remote_fin = False
        self._reset: SpdyStreamReset | None = None
        self._broken: SpdyError | None = None
        # Set on every change a reader or writer may wait for: data, FIN, reset, window, reply.
        self._changed = asyncio.Event()
        # Set when the application took data out of the buffer (the read loop may wait on it).
        self._drained = asyncio.Event()
        self._send_window = session._peer_initial_window
        self._recv_window = session._initial_window
        self._unacked = 0

    def __repr__(self) -> str:
        return f"<SpdyStream {self.id} {self.headers!r}>"

    @property
    def closed(self) -> bool:
        """Both halves are done (FIN both ways), or the stream was reset, or the session ended."""
        return (
            self._reset is not None
            or self._broken is not None
            or (self._local_fin and self._remote_fin)
        )

    async def reply(self, headers: Mapping[str, str] | None = None, fin: bool = False) -> None:
        """Accept a stream the peer opened: SYN_REPLY (with FIN, `fin`: nothing to send)."""
        if self._opened_here:
            raise SpdyError(f"stream {self.id} is ours: the peer replies to it", "SYN_REPLY")
        if self._replied:
            raise SpdyError(f"stream {self.id} has been replied to already", "SYN_REPLY")
        self._raise_if_dead()
        self._replied = True
        self._session._send(SynReply(self.id, dict(headers or {}), FLAG_FIN if fin else 0))
        if fin:
            self._local_fin = True
            self._session._retire_if_done(self)
        await self._session._drain()

    async def wait_reply(self) -> dict[str, str]:
        """The SYN_REPLY headers of a stream we opened, waiting for them."""
        if not self._opened_here:
            raise SpdyError(f"stream {self.id} is the peer's: we reply to it", "SYN_REPLY")
        while not self._replied:
            self._raise_if_dead()
            self._changed.clear()
            await self._changed.wait()
        return self.reply_headers or {}

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all that is buffered if -1), waiting for some; b"" at the peer's FIN.
        SpdyStreamReset once what came before a reset by the peer was read (at once after our
        own), SpdySessionClosed if the session ended first."""
        while True:
            # What the peer sent before it reset the stream is still delivered (the Kubernetes
            # streaming server resets the error stream right behind the status it wrote).
            if self._buffer:
                return self._take(n)
            if self._reset is not None:
                raise self._reset
            if self._remote_fin:
                return b""
            if self._broken is not None:
                raise self._broken
            self._changed.clear()
            await self._changed.wait()

    def _take(self, n: int) -> bytes:
        if n < 0 or n >= self._buffered:
            data = b"".join(self._buffer)
            self._buffer.clear()
        else:
            pieces = []
            wanted = n
            while wanted:
                head = self._buffer[0]
                if len(head) <= wanted:
                    pieces.append(self._buffer.popleft())
                    wanted -= len(head)
                else:
                    pieces.append(head[:wanted])
                    self._buffer[0] = head[wanted:]
                    wanted = 0
            data = b"".join(pieces)
        self._buffered -= len(data)
        self._session._consumed(self, len(data))
        return data

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data`, as DATA frames no bigger than the peer's windows allow (waiting for
        WINDOW_UPDATEs when they are used up: back-pressure). On a stream we opened, waits for
        the SYN_REPLY first (spdystream drops data that comes before it); on the peer's, sends
        an empty SYN_REPLY first if `reply` was not called."""
        view = memoryview(data).cast("B")
        session = self._session
        while view.nbytes:
            self._raise_if_unwritable()
            if not self._replied:
                if self._opened_here:
                    await self.wait_reply()
                else:
                    await self.reply()
                continue
            size = min(view.nbytes, _CHUNK)
            if session._peer_flow_control:
                size = min(size, self._send_window, session._send_window)
                if size <= 0:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
            chunk, view = bytes(view[:size]), view[size:]
            self._send_window -= size
            session._send_window -= size
            session._send(Data(self.id, chunk))
            await session._drain()

    async def close(self) -> None:
        """Half-close: our FIN (the peer may still send). A no-op if already done or reset."""
        if self._local_fin or self._reset is not None or self._broken is not None:
            return
        if not self._opened_here and not self._replied:
            await self.reply(fin=True)
            return
        if not self._replied:
            try:
                await self.wait_reply()
            except SpdyError:
                return
            if self._local_fin:
                return
        self._local_fin = True
        self._session._send(Data(self.id, b"", FLAG_FIN))
        self._session._retire_if_done(self)
        await self._session._drain()

    def reset(self, status: int = RstStatus.CANCEL) -> None:
        """RST_STREAM: the stream is over both ways, at once; buffered data is dropped."""
        if self.closed:
            return
        self._reset = SpdyStreamReset(self.id, status, by_peer=False)
        self._buffer.clear()
        self._buffered = 0
        self._session._send_rst(self.id, status)
        self._session._retire(self)
        self._wake()

    # -- called by the session --

    def _raise_if_dead(self) -> None:
        if self._reset is not None:
            raise self._reset
        if self._broken is not None:
            raise self._broken

    def _raise_if_unwritable(self) -> None:
        self._raise_if_dead()
        if self._local_fin:
            raise SpdyError(f"stream {self.id}: write after close", "DATA")

    def _wake(self) -> None:
        self._changed.set()
        self._drained.set()

    def _peer_reset(self, status: int) -> None:
        if self._reset is None:
            self._reset = SpdyStreamReset(self.id, status, by_peer=True)
        self._wake()

    def _session_ended(self, error: SpdyError) -> None:
        if self._broken is None and self._reset is None:
            self._broken = error
        self._wake()


class SpdySession:
    """A SPDY/3.1 session over `reader`/`writer`, which it owns (and closes).

    ``server=True`` for the end that accepted the connection: it opens even-numbered streams
    and pings, the client odd ones. `idle_timeout` (seconds, None for none) closes the session
    when no frame went either way for that long, as spdystream's SetIdleTimeout does.
    `initial_window` is the receive window we give each stream: what a stream may buffer.
    `max_streams` bounds the streams open at once; SYN_STREAMs beyond it are refused.
    Must be created in a running event loop: it starts reading at once.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        server: bool,
        idle_timeout: float | None = None,
        initial_window: int = DEFAULT_WINDOW,
        max_streams: int = 1000,
        max_header_block: int = 1 << 20,
    ) -> None:
        if not 1 <= initial_window <= MAX_WINDOW:
            raise ValueError(f"initial_window {initial_window} is out of range")
        self._loop = asyncio.get_running_loop()
        self._reader = reader
        self._writer = writer
        self.server = server
        self._encoder = FrameEncoder()
        self._decoder = FrameDecoder(max_header_block)
        self._max_control = max_header_block + 64
        self._initial_window = initial_window
        self._max_streams = max_streams
        self._next_id = 2 if server else 1
        self._next_ping = 2 if server else 1
        self._last_peer_id = 0
        self._streams: dict[int, SpdyStream] = {}
        self._incoming: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self._pings: dict[int, asyncio.Future[None]] = {}
        # Flow control (SPDY/3.1): what the peer lets us send, per stream and per session.
        self._peer_flow_control = False
        self._peer_initial_window = DEFAULT_WINDOW
        self._send_window = DEFAULT_WINDOW
        self._session_unacked = 0
        self._settings_sent = False
        self._goaway_sent = False
        self._peer_goaway: GoAway | None = None
        self._closed = False
        self._error: SpdySessionClosed | None = None
        self._done = asyncio.Event()
        self._idle_timeout = idle_timeout if idle_timeout and idle_timeout > 0 else None
        self._last_activity = self._loop.time()
        self._idle_handle: asyncio.TimerHandle | None = None
        if not server:
            # The client speaks first; this also tells the peer we keep windows.
            self._send_settings()
        self._arm_idle(self._last_activity)
        self._reader_task = self._loop.create_task(
            self._read_loop(), name=f"spdy-read-{id(self):x}"
        )

    async def __aenter__(self) -> SpdySession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def error(self) -> SpdySessionClosed | None:
        """Why the session ended, once it has."""
        return self._error

    async def wait_closed(self) -> None:
        """Until the session has ended, however it ends."""
        await self._done.wait()

    async def accept_stream(self) -> SpdyStream | None:
        """The next stream the peer opened; None once the session ended or the peer sent
        GOAWAY and the streams it opened before have all been handed out."""
        stream = await self._incoming.get()
        if stream is None:
            # Every later call gets None too.
            self._incoming.put_nowait(None)
        return stream

    async def open_stream(
        self, headers: Mapping[str, str], fin: bool = False, priority: int = 0
    ) -> SpdyStream:
        """SYN_STREAM (with FIN, `fin`: we send nothing on it). Does not wait for the reply:
        `write`/`close` do, or `wait_reply`."""
        self._raise_if_closed()
        if self._peer_goaway is not None:
            raise SpdyError("the peer sent GOAWAY: it takes no new streams", "SYN_STREAM")
        stream_id = self._next_id
        if stream_id > MAX_STREAM_ID:
            raise SpdyError("stream ids are used up: open a new session", "SYN_STREAM")
        self._next_id += 2
        lowered = {name.lower(): value for name, value in headers.items()}
        stream = SpdyStream(self, stream_id, lowered, opened_here=True, priority=priority)
        stream._local_fin = fin
        self._streams[stream_id] = stream
        self._send(SynStream(stream_id, lowered, FLAG_FIN if fin else 0, priority=priority))
        await self._drain()
        return stream

    async def ping(self) -> float:
        """PING the peer: the round trip in seconds."""
        self._raise_if_closed()
        ping_id = self._next_ping
        self._next_ping += 2
        if self._next_ping > 0xFFFFFFFF:
            self._next_ping = 2 if self.server else 1
        answer: asyncio.Future[None] = self._loop.create_future()
        self._pings[ping_id] = answer
        start = self._loop.time()
        try:
            self._send(Ping(ping_id))
            await self._drain()
            await answer
        finally:
            self._pings.pop(ping_id, None)
        return self._loop.time() - start

    async def close(self, status: int = GoAwayStatus.OK) -> None:
        """GOAWAY, then close the connection (what was written is still flushed). Streams
        still open get SpdySessionClosed. Idempotent."""
        self._shutdown(SpdySessionClosed("the session was closed"), goaway=status)
        await self._join_reader()

    # -- sending --

    def _raise_if_closed(self) -> None:
        if self._closed:
            assert self._error is not None
            raise self._error

    def _send(self, frame: Frame) -> None:
        # Encoding and writing happen in one synchronous step: frames reach the wire in the
        # order their header blocks went through the compressor, whatever tasks send them.
        self._raise_if_closed()
        self._writer.write(self._encoder.encode(frame))
        self._last_activity = self._loop.time()

    async def _drain(self) -> None:
        if self._closed:
            # What was sent before the end is flushed as the connection closes; a send after
            # it raises in _send.
            return
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._shutdown(SpdySessionClosed(f"connection lost: {exc}"))
            raise SpdySessionClosed(f"connection lost: {exc}") from exc

    def _send_settings(self) -> None:
        self._settings_sent = True
        entry = (0, SettingId.INITIAL_WINDOW_SIZE, self._initial_window)
        self._send(Settings((entry,)))

    def _send_rst(self, stream_id: int, status: int) -> None:
        if not self._closed:
            self._send(RstStream(stream_id, status))

    def _consumed(self, stream: SpdyStream, size: int) -> None:
        """The application read `size` bytes of `stream`: give the window back in batches."""
        stream._drained.set()
        if not size or self._closed or stream._remote_fin or stream.closed:
            return
        stream._unacked += size
        if stream._unacked >= self._initial_window // 2:
            delta, stream._unacked = stream._unacked, 0
            stream._recv_window += delta
            self._send(WindowUpdate(stream.id, delta))

    # -- stream bookkeeping --

    def _retire(self, stream: SpdyStream) -> None:
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]
        if self._peer_goaway is not None and not self._streams and not self._closed:
            self._shutdown(SpdySessionClosed("the peer sent GOAWAY and every stream is done"))

    def _retire_if_done(self, stream: SpdyStream) -> None:
        if stream._local_fin and stream._remote_fin:
            self._retire(stream)

    def _is_peer_id(self, stream_id: int) -> bool:
        # Clients open odd streams, servers even ones.
        return (stream_id % 2 == 1) == self.server

    def _never_opened(self, stream_id: int) -> bool:
        if self._is_peer_id(stream_id):
            return stream_id > self._last_peer_id
        return stream_id >= self._next_id

    # -- ending --

    def _shutdown(self, error: SpdySessionClosed, goaway: int | None = None) -> None:
        if self._closed:
            return
        if goaway is not None and not self._goaway_sent:
            self._goaway_sent = True
            with contextlib.suppress(Exception):
                self._writer.write(self._encoder.encode(GoAway(self._last_peer_id, goaway)))
        self._closed = True
        self._error = error
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        for stream in list(self._streams.values()):
            stream._session_ended(error)
        self._streams.clear()
        for answer in self._pings.values():
            if not answer.done():
                answer.set_exception(error)
        self._incoming.put_nowait(None)
        with contextlib.suppress(Exception):
            self._writer.close()
        if self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
        self._done.set()

    async def _join_reader(self) -> None:
        if self._reader_task is asyncio.current_task():
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self._reader_task)

    def _arm_idle(self, since: float) -> None:
        if self._idle_timeout is not None:
            self._idle_handle = self._loop.call_at(since + self._idle_timeout, self._on_idle)

    def _on_idle(self) -> None:
        self._idle_handle = None
        if self._closed or self._idle_timeout is None:
            return
        if self._loop.time() < self._last_activity + self._idle_timeout:
            # There was a frame since: wait out the rest from the last one.
            self._arm_idle(self._last_activity)
            return
        log.info("SPDY session idle for %gs: closing it", self._idle_timeout)
        self._shutdown(
            SpdySessionClosed(f"no frame for {self._idle_timeout:g}s: idle timeout"),
            goaway=GoAwayStatus.OK,
        )

    # -- receiving --

    async def _read_loop(self) -> None:
        reader = self._reader
        try:
            while not self._closed:
                head = FrameDecoder.parse_head(await reader.readexactly(8))
                self._last_activity = self._loop.time()
                if self.server and not self._settings_sent:
                    # The client has spoken: it is past reading the 101, safe to talk.
                    self._send_settings()
                if head.control:
                    if head.length > self._max_control:
                        raise SpdyError(f"length {head.length} is over our limit", head.name)
                    payload = await reader.readexactly(head.length) if head.length else b""
                    self._handle_control(self._decoder.control(head, payload))
                else:
                    await self._handle_data(head)
        except asyncio.IncompleteReadError as exc:
            why = "in the middle of a frame" if exc.partial else "by the peer"
            self._shutdown(SpdySessionClosed(f"connection closed {why}"))
        except SpdyError as exc:
            log.warning("SPDY protocol error from the peer, sending GOAWAY: %s", exc)
            closed = SpdySessionClosed(f"protocol error from the peer: {exc}", exc.frame)
            closed.__cause__ = exc
            self._shutdown(closed, goaway=GoAwayStatus.PROTOCOL_ERROR)
        except (ConnectionError, OSError) as exc:
            self._shutdown(SpdySessionClosed(f"connection lost: {exc}"))
        except asyncio.CancelledError:
            self._shutdown(SpdySessionClosed("the session was closed"))
            raise
        except Exception as exc:
            log.exception("SPDY session failed")
            self._shutdown(
                SpdySessionClosed(f"internal error: {exc}"), goaway=GoAwayStatus.INTERNAL_ERROR
            )

    def _credit_session(self, size: int) -> None:
        # The session window comes back as soon as data is in a stream's buffer: the stream
        # windows already bound what is buffered, and a session window held by one slow stream
        # would stall all the others.
        self._session_unacked += size
        if self._session_unacked >= DEFAULT_WINDOW // 2 and not self._closed:
            delta, self._session_unacked = self._session_unacked, 0
            self._send(WindowUpdate(0, delta))

    async def _skip(self, size: int) -> None:
        while size:
            chunk = await self._reader.readexactly(min(size, _CHUNK))
            size -= len(chunk)
            self._credit_session(len(chunk))

    async def _handle_data(self, head: FrameHead) -> None:
        sid, size = head.stream_id, head.length
        if sid == 0:
            raise SpdyError("stream id 0 is not allowed", "DATA")
        stream = self._streams.get(sid)
        if stream is None or stream._remote_fin:
            if stream is not None:
                # DATA after the peer's own FIN.
                self._fail_stream(stream, RstStatus.STREAM_ALREADY_CLOSED)
            elif self._never_opened(sid):
                self._send_rst(sid, RstStatus.INVALID_STREAM)
            # Otherwise the stream is gone (reset, closed): frames in flight are dropped.
            await self._skip(size)
            return
        if self._peer_flow_control and size > stream._recv_window:
            log.warning("SPDY peer overran the window of stream %d", sid)
            self._fail_stream(stream, RstStatus.FLOW_CONTROL_ERROR)
            await self._skip(size)
            return
        stream._recv_window -= size
        remaining = size
        while remaining:
            chunk = await self._reader.readexactly(min(remaining, _CHUNK))
            remaining -= len(chunk)
            self._credit_session(len(chunk))
            if stream.closed:
                continue
            stream._buffer.append(chunk)
            stream._buffered += len(chunk)
            stream._changed.set()
            # A peer that ignores windows is held back here: we stop reading the connection
            # until the application has drained the stream to its window.
            while stream._buffered > self._initial_window and not stream.closed:
                stream._drained.clear()
                await stream._drained.wait()
        if head.flags & FLAG_FIN and not stream.closed:
            stream._remote_fin = True
            stream._changed.set()
            self._retire_if_done(stream)

    def _fail_stream(self, stream: SpdyStream, status: RstStatus) -> None:
        self._send_rst(stream.id, status)
        stream._reset = SpdyStreamReset(stream.id, status, by_peer=False)
        stream._buffer.clear()
        stream._buffered = 0
        stream._wake()
        self._retire(stream)

    def _handle_control(self, frame: Frame) -> None:
        match frame:
            case SynStream():
                self._on_syn_stream(frame)
            case SynReply(sid, headers, flags):
                stream = self._streams.get(sid)
                if stream is None:
                    return
                if not stream._opened_here:
                    self._fail_stream(stream, RstStatus.PROTOCOL_ERROR)
                elif stream._replied:
                    self._fail_stream(stream, RstStatus.STREAM_IN_USE)
                else:
                    stream._replied = True
                    stream.reply_headers = headers
                    self._remote_flags(stream, flags)
            case Headers(sid, headers, flags):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream.late_headers.append(headers)
                    self._remote_flags(stream, flags)
            case RstStream(sid, status):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._peer_reset(status)
                    self._retire(stream)
            case Settings(entries):
                self._peer_flow_control = True
                for _, setting, value in entries:
                    if setting == SettingId.INITIAL_WINDOW_SIZE:
                        if value > MAX_WINDOW:
                            raise SpdyError(f"initial window {value} is too big", "SETTINGS")
                        delta, self._peer_initial_window = value - self._peer_initial_window, value
                        for stream in self._streams.values():
                            stream._send_window += delta
                            stream._changed.set()
            case Ping(ping_id):
                # Servers ping with even ids, clients with odd ones (as spdystream): an id of
                # our parity answers one of our pings, any other is the peer's, echoed back.
                if (ping_id % 2 == 0) == self.server:
                    if (answer := self._pings.get(ping_id)) is not None and not answer.done():
                        answer.set_result(None)
                elif self._writer.transport.get_write_buffer_size() < _PING_ANSWER_LIMIT:
                    self._send(Ping(ping_id))
            case GoAway():
                self._on_goaway(frame)
            case WindowUpdate(sid, delta):
                self._peer_flow_control = True
                if sid == 0:
                    self._send_window += delta
                    if self._send_window > MAX_WINDOW:
                        raise SpdyError("the session window overflows", "WINDOW_UPDATE")
                    for stream in self._streams.values():
                        stream._changed.set()
                elif (stream := self._streams.get(sid)) is not None:
                    stream._send_window += delta
                    if stream._send_window > MAX_WINDOW:
                        self._fail_stream(stream, RstStatus.FLOW_CONTROL_ERROR)
                    else:
                        stream._changed.set()
            case UnknownControl(kind):
                log.debug("SPDY: skipped a control frame of unknown type %d", kind)

    def _remote_flags(self, stream: SpdyStream, flags: int) -> None:
        stream._changed.set()
        if flags & FLAG_FIN:
            stream._remote_fin = True
            self._retire_if_done(stream)

    def _on_syn_stream(self, frame: SynStream) -> None:
        sid = frame.stream_id
        if not self._is_peer_id(sid):
            raise SpdyError(f"stream id {sid} has the parity of our streams", "SYN_STREAM")
        if sid <= self._last_peer_id:
            raise SpdyError(
                f"stream id {sid} is not above the last one, {self._last_peer_id}", "SYN_STREAM"
            )
        self._last_peer_id = sid
        if self._goaway_sent or self._peer_goaway is not None:
            # After GOAWAY, new streams are ignored (draft 2.6.6).
            return
        # Streams not yet accepted count too: a peer opening streams faster than the
        # application takes them is refused, not queued without limit.
        if max(len(self._streams), self._incoming.qsize()) >= self._max_streams:
            self._send_rst(sid, RstStatus.REFUSED_STREAM)
            return
        stream = SpdyStream(self, sid, frame.headers, opened_here=False, priority=frame.priority)
        if frame.flags & FLAG_UNIDIRECTIONAL:
            # We may not send on it, nor reply.
            stream._local_fin = True
            stream._replied = True
        if frame.flags & FLAG_FIN:
            stream._remote_fin = True
        if not (stream._local_fin and stream._remote_fin):
            self._streams[sid] = stream
        self._incoming.put_nowait(stream)

    def _on_goaway(self, frame: GoAway) -> None:
        if self._peer_goaway is not None:
            return
        self._peer_goaway = frame
        for stream in list(self._streams.values()):
            if stream._opened_here and stream.id > frame.last_good_stream_id:
                # The peer never processed it (draft 2.6.6): as good as refused.
                stream._peer_reset(RstStatus.REFUSED_STREAM)
                self._retire(stream)
        self._incoming.put_nowait(None)
        if not self._streams:
            self._shutdown(SpdySessionClosed("the peer sent GOAWAY"))
