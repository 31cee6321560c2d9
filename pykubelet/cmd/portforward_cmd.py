"""`pykubelet port-forward POD [LOCAL:]REMOTE...`: local TCP ports forwarded to a pod's ports
through a node's kubelet API, as `kubectl port-forward` does.

- Ports as kubectl reads them: `8080:80` (local 8080), `80` (local 80 too), `:80` or `0:80` (a
  free local port). Each is listened on at `--address` (127.0.0.1) and announced as kubectl
  does: `Forwarding from 127.0.0.1:8080 -> 80`; each connection: `Handling connection for 8080`.
- **One SPDY/3.1 session per invocation** (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version:
  portforward.k8s.io`, over TLS; `common/spdy.py`'s client session), and per accepted
  connection a new pair of streams: `streamtype` error then data, with `port` and a new
  `requestid`. Why SPDY and not the WebSocket channel protocol: over channels a WebSocket
  carries one connection per port, for its whole life (no stream per connection, no half-close),
  so concurrent connections would need a WebSocket each; SPDY multiplexes any number of
  connections with their own end of stream and error, on one session, as kubectl and the
  kube-apiserver use it.
- Half-close both ways: the local end's EOF is the data stream's FIN, the pod's FIN the local
  socket's EOF. A connection the node cannot make (nothing listens on the pod's port) prints
  the node's message (`error: an error occurred forwarding 8080 -> 80: ...`) and closes that
  connection; the session and the other connections go on (kubectl ends the session then).
- The session ending under us (the node went away) ends the command: `error: lost connection
  to pod`, exit 1. Ctrl-C (or SIGTERM) ends it cleanly: listeners closed, GOAWAY, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from pykubelet.cmd.nodeclient import (
    CtlError,
    NodeClient,
    add_connection_flags,
    credentials_from,
    get_pod,
    quote,
)
from pykubelet.common.spdy import SpdySession, SpdyStream
from pykubelet.common.spdy_frames import SpdyError

PORT_FORWARD_PROTOCOL = "portforward.k8s.io"
CHUNK = 32 * 1024

EXAMPLES = """\
examples:
  pykubelet port-forward web 8080:80            # local 8080 to the pod's 80
  pykubelet port-forward web :80 8443:443       # a free local port to 80, and 8443 to 443
  pykubelet port-forward --insecure-skip-tls-verify web 5432
"""


@dataclass(frozen=True)
class PortMapping:
    local: int  # 0: a free port
    remote: int


def parse_port_mapping(text: str) -> PortMapping:
    """`[LOCAL:]REMOTE` as kubectl reads it; ValueError in its words."""
    local_text, sep, remote_text = text.rpartition(":")
    if not sep:
        local_text = remote_text
    elif not local_text:
        local_text = "0"

    def port(value: str, what: str, zero: bool) -> int:
        if not (value.isascii() and value.isdigit()):
            raise ValueError(
                f"invalid port mapping {text!r}: {what} port {value!r} is not a number"
            )
        number = int(value)
        if not (0 if zero else 1) <= number <= 65535:
            raise ValueError(f"invalid port mapping {text!r}: {what} port {number} out of range")
        return number

    return PortMapping(port(local_text, "local", True), port(remote_text, "remote", False))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "port-forward",
        help="forward local ports to a pod (kubectl port-forward), over the node's kubelet API",
        description="Forward one or more local ports to a pod on the node, as kubectl "
        "port-forward does. Ctrl-C ends it.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pod", metavar="POD")
    p.add_argument("ports", nargs="+", metavar="[LOCAL:]REMOTE")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="local addresses to listen on, comma-separated (default 127.0.0.1)",
    )
    add_connection_flags(p)


class Forwarder:
    """One SPDY session to the node; a stream pair per local connection."""

    def __init__(self, session: SpdySession, out: Any = sys.stdout, err: Any = sys.stderr) -> None:
        self._session = session
        self._out = out
        self._err = err
        self._next_request = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def say(self, line: str) -> None:
        self._out.write(line + "\n")
        self._out.flush()

    def handler(self, local: int, remote: int) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            try:
                self.say(f"Handling connection for {local}")
                await self._connection(local, remote, reader, writer)
            finally:
                self._tasks.discard(task)
                writer.close()

        return handle

    async def _connection(
        self, local: int, remote: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        request_id = str(self._next_request)
        self._next_request += 1
        headers = {"port": str(remote), "requestid": request_id}
        try:
            # The error stream is the node's to write: our half is closed at once (FIN).
            error = await self._session.open_stream({**headers, "streamtype": "error"}, fin=True)
            data = await self._session.open_stream({**headers, "streamtype": "data"})
        except SpdyError as exc:
            self._err.write(f"error: cannot open streams for {local} -> {remote}: {exc}\n")
            return
        errors = asyncio.create_task(_read_all(error))
        relay = asyncio.create_task(_relay(data, reader, writer))
        try:
            done, _ = await asyncio.wait({errors, relay}, return_when=asyncio.FIRST_COMPLETED)
            if errors in done and (message := errors.result()):
                # The node could not make the connection (or it failed): this one is over.
                self._err.write(
                    f"error: an error occurred forwarding {local} -> {remote}: {message}\n"
                )
                self._err.flush()
                data.reset()
                return
            await relay
            message = await errors
            if message:
                self._err.write(
                    f"error: an error occurred forwarding {local} -> {remote}: {message}\n"
                )
                self._err.flush()
        except (SpdyError, OSError):
            pass  # the session ended or the local side went away: this connection is over
        finally:
            for task in (errors, relay):
                task.cancel()
            await asyncio.gather(errors, relay, return_exceptions=True)
            if not data.closed:
                data.reset()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._session.close()


async def _read_all(stream: SpdyStream) -> str:
    chunks = []
    with contextlib.suppress(SpdyError):
        while chunk := await stream.read():
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").strip()


async def _relay(
    stream: SpdyStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Both ways until both are done, each end of stream passed on as a half-close."""

    async def to_pod() -> None:
        while chunk := await reader.read(CHUNK):
            await stream.write(chunk)
        await stream.close()  # FIN: the pod's side sees the end

    async def from_pod() -> None:
        while chunk := await stream.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()

    tasks = [asyncio.create_task(to_pod()), asyncio.create_task(from_pod())]
    try:
        # The first that fails ends the other: the connection is over.
        for task in asyncio.as_completed(tasks):
            await task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _listen(
    addresses: list[str], mapping: PortMapping, forwarder: Forwarder
) -> list[asyncio.Server]:
    """Listen on each address; a free port (0) is chosen on the first and taken on the rest."""
    sockets: list[socket.socket] = []
    local = mapping.local
    try:
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, local))  # a local bind: it does not wait on anything
            local = sock.getsockname()[1]
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise CtlError(f"unable to listen on {address}:{local}: {exc.strerror or exc}") from None
    handle = forwarder.handler(local, mapping.remote)
    servers = [await asyncio.start_server(handle, sock=sock) for sock in sockets]
    for address in addresses:
        shown = f"[{address}]" if ":" in address else address
        forwarder.say(f"Forwarding from {shown}:{local} -> {mapping.remote}")
    return servers


async def _port_forward(ns: argparse.Namespace) -> int:
    try:
        mappings = [parse_port_mapping(text) for text in ns.ports]
    except ValueError as exc:
        raise CtlError(str(exc)) from None
    addresses = [a.strip() for a in ns.address.split(",") if a.strip()]
    if "localhost" in addresses:
        addresses = [a for a in addresses if a != "localhost"] + ["127.0.0.1"]
    creds = credentials_from(ns)
    async with NodeClient(creds) as client:
        pod = await get_pod(client, ns.pod, ns.namespace)
        phase = pod.get("status", {}).get("phase")
        if phase != "Running":
            raise CtlError(
                f"unable to forward port because pod is not running. Current status={phase}"
            )
        name = pod["metadata"]["name"]
        upgraded = await client.upgrade(
            "POST",
            f"/portForward/{quote(ns.namespace)}/{quote(name)}",
            {
                "Connection": "Upgrade",
                "Upgrade": "SPDY/3.1",
                "X-Stream-Protocol-Version": PORT_FORWARD_PROTOCOL,
            },
        )
        session = SpdySession(upgraded.reader, upgraded.writer, server=False)
        forwarder = Forwarder(session)
        servers: list[asyncio.Server] = []
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            for mapping in mappings:
                servers += await _listen(addresses, mapping, forwarder)
            ended = asyncio.create_task(session.wait_closed())
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({ended, stopped}, return_when=asyncio.FIRST_COMPLETED)
            ended.cancel()
            stopped.cancel()
            lost = not stop.is_set()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for server in servers:
                server.close()
            await forwarder.close()
    if lost:
        raise CtlError("lost connection to pod")
    return 0


def run(ns: argparse.Namespace) -> int:
    return asyncio.run(_port_forward(ns))
