"""Where a node is and who we are to it: the connection the `exec`, `port-forward` and `top` verbs
make to a node's kubelet API (`--port`, HTTPS), in kubectl's terms.

What it promises:
- **Where**: `--server https://HOST:PORT`, else the current context's cluster `server` of
  `--kubeconfig`, else https://127.0.0.1:10250.
- **Who**, kubeconfig style: `--kubeconfig PATH` (its current context, or `--context`): the
  cluster's `certificate-authority` / `-data`, `insecure-skip-tls-verify`, `tls-server-name`, the
  user's `client-certificate` / `client-key` (files, relative to the kubeconfig's folder, or
  `-data`), `token` / `tokenFile`. The flags `--certificate-authority`, `--client-certificate`,
  `--client-key`, `--token`, `--insecure-skip-tls-verify`, `--tls-server-name` override them. Only
  the kubeconfig named is read: `~/.kube/config` points at an API server, not at a node.
- **Errors are one line** (`CtlError`) and say what to change: a file that does not load (named),
  a node certificate that is not trusted (naming the CA it was checked against), a client
  certificate the node refused (named), a connection refused (naming the server), and the node's
  own Status message for a 401 or a 403.
- `NodeClient` is one aiohttp session (JSON GETs, WebSocket upgrades) plus `upgrade()`, a raw TLS
  connection upgraded to another protocol (SPDY/3.1), the client's end of what
  `server/streaming/hijack.py` takes over.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import errno
import json
import os
import socket
import ssl
import tempfile
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml

Obj = dict[str, Any]

DEFAULT_NODE_SERVER = "https://127.0.0.1:10250"
# A response head or an error body past this is not a kubelet's: refused, not buffered.
_HEAD_LIMIT = 64 * 1024
_ERROR_BODY_LIMIT = 64 * 1024


class CtlError(Exception):
    """A problem to show the user as one line (`error: ...`), exit code 1."""


# --- credentials ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pem:
    """A PEM file or PEM bytes, with how to name it in an error message."""

    origin: str  # a path, or e.g. "client-certificate-data of kubeconfig /x/config"
    path: Path | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class Credentials:
    server: str = DEFAULT_NODE_SERVER
    certificate_authority: Pem | None = None
    client_certificate: Pem | None = None
    client_key: Pem | None = None
    token: str | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    # Where the settings came from, for messages: "--kubeconfig /x/config (context node)".
    sources: tuple[str, ...] = field(default=())


def _b64(value: Any, what: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise CtlError(f"{what} is not valid base64") from None


def _section(doc: Obj, kind: str, name: str, path: Path) -> Obj:
    for entry in doc.get(f"{kind}s") or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(kind)
            return body if isinstance(body, dict) else {}
    raise CtlError(f'kubeconfig {path}: {kind} "{name}" not found')


def load_kubeconfig(path: Path, context: str | None = None) -> Credentials:
    """The credentials of `context` (default: current-context) of the kubeconfig at `path`;
    relative file names are taken relative to the kubeconfig's folder, as kubectl does."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CtlError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise CtlError(f"kubeconfig {path} is not valid YAML{line}") from None
    if not isinstance(doc, dict):
        raise CtlError(f"kubeconfig {path} is not a kubeconfig (no mapping at the top)")
    name = context or doc.get("current-context")
    if not name:
        raise CtlError(f"kubeconfig {path} has no current-context: give --context")
    ctx = _section(doc, "context", str(name), path)
    cluster = (
        _section(doc, "cluster", str(ctx.get("cluster", "")), path) if ctx.get("cluster") else {}
    )
    user = _section(doc, "user", str(ctx.get("user", "")), path) if ctx.get("user") else {}
    base = path.parent

    def pem(section: Obj, key: str) -> Pem | None:
        if section.get(f"{key}-data"):
            origin = f"{key}-data of kubeconfig {path}"
            return Pem(origin, data=_b64(section[f"{key}-data"], origin))
        if section.get(key):
            file = base / os.path.expanduser(str(section[key]))
            return Pem(str(file), path=file)
        return None

    token = user.get("token")
    if not token and user.get("tokenFile"):
        token_path = base / os.path.expanduser(str(user["tokenFile"]))
        try:
            token = token_path.read_text().strip()
        except OSError as exc:
            raise CtlError(f"cannot read the token file {token_path}: {exc.strerror}") from None
    if user.get("exec") or user.get("auth-provider"):
        raise CtlError(
            f"kubeconfig {path}: user of context {name!r} uses a credential plugin, "
            "which the node client does not run: give a client certificate or a token"
        )
    return Credentials(
        server=str(cluster.get("server") or DEFAULT_NODE_SERVER),
        certificate_authority=pem(cluster, "certificate-authority"),
        client_certificate=pem(user, "client-certificate"),
        client_key=pem(user, "client-key"),
        token=str(token) if token else None,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        tls_server_name=cluster.get("tls-server-name") or None,
        sources=(f"kubeconfig {path} (context {name})",),
    )


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the node and the credentials (kubeconfig style)")
    g.add_argument(
        "--server",
        "-s",
        metavar="https://HOST:PORT",
        help="the node's kubelet API (default: the kubeconfig's server, "
        f"else {DEFAULT_NODE_SERVER})",
    )
    g.add_argument(
        "--kubeconfig", type=Path, metavar="PATH", help="a kubeconfig: its current context is used"
    )
    g.add_argument(
        "--context", metavar="NAME", help="the kubeconfig context to use instead of current-context"
    )
    g.add_argument(
        "--certificate-authority", type=Path, metavar="FILE", help="CA file to verify the node with"
    )
    g.add_argument(
        "--client-certificate", type=Path, metavar="FILE", help="client certificate file (PEM)"
    )
    g.add_argument(
        "--client-key", type=Path, metavar="FILE", help="client certificate's key file (PEM)"
    )
    g.add_argument("--token", help="bearer token (the node reviews it with the API server)")
    g.add_argument(
        "--insecure-skip-tls-verify",
        action="store_true",
        default=None,
        help="do not verify the node's certificate (e.g. its self-signed one)",
    )
    g.add_argument(
        "--tls-server-name", metavar="NAME", help="the name the node's certificate must carry"
    )


def credentials_from(ns: argparse.Namespace) -> Credentials:
    """The kubeconfig's settings (if one is given), each overridden by its flag."""
    creds = Credentials()
    if ns.kubeconfig is not None:
        creds = load_kubeconfig(ns.kubeconfig, ns.context)
    elif ns.context:
        raise CtlError("--context needs --kubeconfig")
    changes: dict[str, Any] = {}
    if ns.server:
        changes["server"] = ns.server
    if ns.certificate_authority is not None:
        changes["certificate_authority"] = Pem(
            str(ns.certificate_authority), path=ns.certificate_authority
        )
    if ns.client_certificate is not None:
        changes["client_certificate"] = Pem(str(ns.client_certificate), path=ns.client_certificate)
    if ns.client_key is not None:
        changes["client_key"] = Pem(str(ns.client_key), path=ns.client_key)
    if ns.token:
        changes["token"] = ns.token
    if ns.insecure_skip_tls_verify is not None:
        changes["insecure_skip_tls_verify"] = ns.insecure_skip_tls_verify
    if ns.tls_server_name:
        changes["tls_server_name"] = ns.tls_server_name
    creds = replace(creds, **changes)
    check_server(creds.server)
    if creds.insecure_skip_tls_verify and creds.certificate_authority is not None:
        raise CtlError(
            "specifying a root certificates file with the insecure flag is not allowed: "
            "give --certificate-authority or --insecure-skip-tls-verify"
        )
    if (creds.client_certificate is None) != (creds.client_key is None):
        missing = "--client-key" if creds.client_key is None else "--client-certificate"
        raise CtlError(
            f"a client certificate needs its key and the key its certificate: give {missing}"
        )
    return creds


def check_server(server: str) -> None:
    url = urllib.parse.urlsplit(server)
    if url.scheme != "https" or not url.hostname:
        raise CtlError(
            f"--server {server!r}: the kubelet API is HTTPS: give https://HOST:PORT "
            "(the read-only http port serves get, logs and describe)"
        )
    try:
        url.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise CtlError(f"--server {server!r}: the port is not a number") from None


# --- TLS -----------------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(exc, ssl.SSLError) and isinstance(reason, str) and reason:
        return reason.replace("_", " ").lower()
    if isinstance(exc, OSError) and isinstance(exc.strerror, str) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def ssl_context(creds: Credentials) -> ssl.SSLContext:
    """The client TLS context; CtlError naming the file that does not load."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ca = creds.certificate_authority
    if creds.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca is not None:
        # Only the CA given: the node is trusted for being signed by it, not by a public CA.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            if ca.data is not None:
                ctx.load_verify_locations(cadata=ca.data.decode(errors="replace"))
            else:
                ctx.load_verify_locations(cafile=str(ca.path))
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise CtlError(
                f"cannot load the certificate authority {ca.origin}: {_reason(exc)}"
            ) from None
    cert, key = creds.client_certificate, creds.client_key
    if cert is not None and key is not None:
        _load_client_certificate(ctx, cert, key)
    return ctx


def _load_client_certificate(ctx: ssl.SSLContext, cert: Pem, key: Pem) -> None:
    # ssl loads a certificate chain from files only: -data goes through a private temporary
    # folder, removed as soon as it is loaded.
    with tempfile.TemporaryDirectory(prefix="pykubelet-") as tmp:
        paths = []
        for pem, name in ((cert, "client.crt"), (key, "client.key")):
            if pem.data is not None:
                file = Path(tmp) / name
                file.write_bytes(pem.data)
                file.chmod(0o600)
                paths.append(file)
            else:
                assert pem.path is not None
                paths.append(pem.path)
        for pem, file in ((cert, paths[0]), (key, paths[1])):
            if pem.data is None and not file.is_file():
                raise CtlError(f"cannot load {pem.origin}: no such file")
        try:
            ctx.load_cert_chain(str(paths[0]), str(paths[1]))
        except (OSError, ssl.SSLError) as exc:
            raise CtlError(
                f"cannot load the client certificate {cert.origin} with the key {key.origin}: "
                f"{_reason(exc)}"
            ) from None


# --- errors --------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        inner = getattr(current, "os_error", None) or getattr(current, "certificate_error", None)
        current = (
            inner if isinstance(inner, BaseException) else current.__cause__ or current.__context__
        )
    return seen


def connection_error(exc: BaseException, creds: Credentials) -> CtlError:
    """One line for a connection to the node that failed: what it was and what to change."""
    server = creds.server
    # Innermost first: aiohttp's wrappers subclass the ssl and OS errors they carry.
    chain = _chain(exc)[::-1]
    for err in chain:
        if isinstance(err, socket.gaierror):
            host = urllib.parse.urlsplit(server).hostname
            return CtlError(f"cannot connect to the node at {server}: {host}: {_reason(err)}")
        if isinstance(err, ssl.SSLCertVerificationError):
            detail = getattr(err, "verify_message", None) or _reason(err)
            ca = creds.certificate_authority
            if ca is not None:
                hint = f"checked against {ca.origin}"
            else:
                hint = (
                    "give --certificate-authority, "
                    "or --insecure-skip-tls-verify for a self-signed one"
                )
            return CtlError(f"the node's certificate at {server} is not trusted ({detail}): {hint}")
    for err in chain:
        if isinstance(err, ssl.SSLError):
            reason = _reason(err)
            if "alert" in reason and creds.client_certificate is not None:
                return CtlError(
                    f"the node at {server} refused the client certificate "
                    f"{creds.client_certificate.origin} ({reason})"
                )
            if "alert" in reason:
                return CtlError(
                    f"the node at {server} ended the TLS handshake ({reason}): "
                    "it may want a client certificate (--client-certificate, --client-key)"
                )
            return CtlError(f"TLS with the node at {server} failed: {reason}")
    # TLS 1.3: the node checks our certificate after the handshake, and its alert is lost in
    # the close; a node that closes (or resets) before any answer refused the certificate.
    cut = isinstance(exc, aiohttp.ServerDisconnectedError) or any(
        isinstance(err, OSError) and err.errno in (errno.ECONNRESET, errno.EPIPE) for err in chain
    )
    if cut and creds.client_certificate is not None:
        return CtlError(
            f"the node at {server} refused the client certificate "
            f"{creds.client_certificate.origin} (it closed the connection after the TLS "
            "handshake: is it signed by the node's --client-ca-file?)"
        )
    for err in chain:
        if isinstance(err, ConnectionRefusedError) or (
            isinstance(err, OSError) and err.errno == errno.ECONNREFUSED
        ):
            return CtlError(
                f"cannot connect to the node at {server}: connection refused "
                "(is pykubelet running there? see --server)"
            )
        if isinstance(err, (TimeoutError, asyncio.TimeoutError)):
            return CtlError(f"cannot connect to the node at {server}: timed out")
        if isinstance(err, OSError) and err.errno:
            reason = os.strerror(err.errno).lower()
            return CtlError(f"cannot connect to the node at {server}: {reason}")
    return CtlError(f"the connection to the node at {server} failed: {exc or type(exc).__name__}")


def status_error(status: int, body: bytes, what: str) -> CtlError:
    """A node's error answer: the message of its v1 Status, as kubectl shows it."""
    message = body.decode(errors="replace").strip()
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        message = str(json.loads(body).get("message") or message)
    if status == 401:
        return CtlError(f"You must be logged in to the node ({message or 'Unauthorized'}): {what}")
    if status == 403:
        return CtlError(f"{message or 'Forbidden'}: {what}")
    return CtlError(f"{message or 'no message'} (HTTP {status}): {what}")


# --- the client ----------------------------------------------------------------------------------


@dataclass
class Upgraded:
    """A connection after its 101: ours to speak the new protocol on."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    headers: Mapping[str, str]


class NodeClient:
    """One node's kubelet API, as `creds` reach it. An async context manager."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self._ssl = ssl_context(creds)
        url = urllib.parse.urlsplit(creds.server)
        assert url.hostname is not None
        self.host = url.hostname
        self.port = url.port or 443
        self._base = f"https://{url.netloc}"
        self._headers = {"Authorization": f"Bearer {creds.token}"} if creds.token else {}
        self._session: aiohttp.ClientSession | None = None
        # aiohttp's WebSocket handshake drops the body of a refused upgrade; this middleware
        # keeps the last one, so the node's Status message reaches the user.
        self._last_error: tuple[int, bytes] | None = None

    async def __aenter__(self) -> NodeClient:
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=0)

        async def keep_error_body(
            request: aiohttp.ClientRequest,
            handler: Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]],
        ) -> aiohttp.ClientResponse:
            response = await handler(request)
            if response.status >= 400:
                self._last_error = (response.status, (await response.read())[:_ERROR_BODY_LIMIT])
            return response

        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            middlewares=(keep_error_body,),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use NodeClient as an async context manager"
        return self._session

    def url(self, path: str) -> str:
        return self._base + path

    async def get_json(self, path: str, wait: float = 15.0) -> Any:
        """The JSON the node answers GET `path` with (waiting at most `wait` seconds)."""
        timeout = wait
        try:
            async with self.session.get(
                self.url(path),
                timeout=aiohttp.ClientTimeout(total=timeout),
                server_hostname=self.creds.tls_server_name,
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise status_error(resp.status, body, f"GET {path}")
                return json.loads(body)
        except aiohttp.ClientError as exc:
            raise connection_error(exc, self.creds) from None
        except TimeoutError:
            raise CtlError(
                f"the node at {self.creds.server} did not answer GET {path} in {timeout:g}s"
            ) from None
        except ValueError:
            raise CtlError(
                f"the node at {self.creds.server} answered GET {path} with no JSON"
            ) from None

    async def websocket(
        self, path: str, protocols: tuple[str, ...]
    ) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket on `path`, offering `protocols`; CtlError with the node's message when
        it refuses."""
        self._last_error = None
        try:
            return await self.session.ws_connect(
                self.url(path),
                protocols=protocols,
                autoping=True,
                max_msg_size=0,
                server_hostname=self.creds.tls_server_name,
            )
        except aiohttp.WSServerHandshakeError as exc:
            status, body = self._last_error or (exc.status, b"")
            raise status_error(status, body, f"the upgrade of {path.split('?')[0]}") from None
        except aiohttp.ClientError as exc:
            raise connection_error(exc, self.creds) from None

    async def upgrade(self, method: str, path: str, headers: Mapping[str, str]) -> Upgraded:
        """A request answered with 101 Switching Protocols, its connection handed to us (for
        SPDY/3.1: aiohttp upgrades to WebSockets only). CtlError with the node's Status
        message if it answers otherwise."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.creds.tls_server_name or self.host,
                    limit=1 << 16,
                ),
                10.0,
            )
        except (OSError, TimeoutError) as exc:
            raise connection_error(exc, self.creds) from None
        try:
            return await self._handshake(reader, writer, method, path, headers)
        except BaseException:
            writer.close()
            raise

    async def _handshake(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        headers: Mapping[str, str],
    ) -> Upgraded:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in {**self._headers, **headers}.items()]
        lines += ["Content-Length: 0", "", ""]
        try:
            writer.write("\r\n".join(lines).encode("latin-1"))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15.0)
        except (asyncio.LimitOverrunError, asyncio.IncompleteReadError) as exc:
            if isinstance(exc, asyncio.IncompleteReadError) and not exc.partial:
                # Closed without a word: after a TLS handshake, that is a refused certificate.
                raise connection_error(aiohttp.ServerDisconnectedError(), self.creds) from None
            raise CtlError(
                f"the node at {self.creds.server} sent no HTTP answer to {method} {path}"
            ) from None
        except TimeoutError:
            raise CtlError(
                f"the node at {self.creds.server} did not answer {method} {path}"
            ) from None
        except OSError as exc:
            raise connection_error(exc, self.creds) from None
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise CtlError(f"the node at {self.creds.server} answered {status_line!r}")
        status = int(parts[1])
        answer: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                answer[name.strip().lower()] = value.strip()
        if status != 101:
            length = int(answer.get("content-length", "0") or 0)
            body = b""
            with contextlib.suppress(asyncio.IncompleteReadError, OSError, TimeoutError):
                body = await asyncio.wait_for(
                    reader.readexactly(min(length, _ERROR_BODY_LIMIT)), 5.0
                )
            raise status_error(status, body, f"the upgrade of {path.split('?')[0]}")
        return Upgraded(reader, writer, answer)


# --- pods ----------------------------------------------------------------------------------------


def find_pod(pods: list[Obj], name: str, namespace: str) -> Obj:
    """The pod of that name in the namespace; a static pod also by the name its manifest gives
    it (without the `-<node>` suffix). CtlError as kubectl words it when there is none."""
    in_ns = [p for p in pods if p["metadata"].get("namespace") == namespace]
    for pod in in_ns:
        if pod["metadata"]["name"] == name:
            return pod
    suffixed = [p for p in in_ns if p["metadata"]["name"].startswith(f"{name}-")]
    nodes = {p["metadata"]["name"]: p for p in suffixed if p["spec"].get("nodeName")}
    matches = [p for n, p in nodes.items() if n == f"{name}-{p['spec']['nodeName'].lower()}"]
    if len(matches) == 1:
        return matches[0]
    raise CtlError(f'pod "{name}" not found in namespace "{namespace}"')


async def get_pod(client: NodeClient, name: str, namespace: str) -> Obj:
    pods: list[Obj] = (await client.get_json("/pods")).get("items") or []
    return find_pod(pods, name, namespace)


def quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")
