"""The HTTP source: pods from a URL (`--manifest-url`), fetched at start and every
`--http-check-frequency`.

As the kubelet's: a GET with a 10 s timeout; a failure (connection, timeout, TLS, a status other
than 200, a body that is cut off, too large or cannot be decoded) sends nothing, so the pods of the
last good answer keep running; an empty 200 body is an empty SET ("no pods"); a body byte-identical
to the last one sends nothing and is not parsed again (a bad body is not retried until it
changes); and nothing is sent before the first good answer, so until then the source is not ready
and no pod of any source is garbage-collected (SourcesReady).

What we add, and the choices made:

- Conditional requests: the last 200's `ETag` and `Last-Modified` go back as `If-None-Match` and
  `If-Modified-Since`, so an unchanged manifest costs a 304 and no parse.
- The body is a Pod, a v1 PodList or a YAML stream of Pods, JSON or YAML. One bad pod does not
  reject the body (the kubelet rejects all of it): the good pods are used and each bad one is
  reported, as one bad file never stops the others. A pod that was good and turns bad, matched by
  its `metadata.namespace`/`metadata.name`, keeps its last good version running, as a file that
  turns bad does; a pod that was never good is not run.
- The UID hashes the node, the URL without its `user:password@` (rotating a password restarts
  nothing) plus `#<namespace>/<name>` of the pod, and the pod: two pods of one body never share a
  UID, and reordering the body or adding a pod to it changes no other pod's UID.
- Each problem is logged once (through an event, so it is also in `/events`), then again only when
  it changes, after an answer came in between, or every 5 minutes; every failed check counts in
  `pykubelet_source_errors{source="http",reason=...}`.
- Redirects: at most 5, never to another scheme (https->http would drop TLS without a word), and
  the `--manifest-url-header` headers (often tokens) go to the URL's own origin only.
- https checks the server against the system trust store or, with `--manifest-url-ca-file`, against
  the CAs of that file only.
- A new connection per check: checks are seconds apart, and a kept-alive connection that the server
  closes just as it is reused would be a spurious error.
- Only a 200 carries pods: any other status, 204 included, is an error (as the kubelet).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from pykubelet import __version__
from pykubelet.api.decode import load_documents, pod_from_object, pod_items
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.static import apply_static_defaults
from pykubelet.common import metrics
from pykubelet.common.events import EventRecorder, ObjectRef
from pykubelet.config.types import HTTP_SOURCE, Op, PodUpdate

log = logging.getLogger(__name__)

FAILED_FETCH = "FailedFetch"
FAILED_VALIDATION = "FailedValidation"
MAX_REDIRECTS = 5
RELOG_SECONDS = 300.0
_CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

_Ident = tuple[str, str]  # (namespace, name) as the manifest gives them, namespace defaulted


def redact(url: URL) -> str:
    """The URL as shown and hashed: without `user:password@`."""
    return str(url.with_user(None)) if url.user is not None else str(url)


@dataclass
class BodyResult:
    pods: list[Pod]  # the source's whole state (when usable)
    errors: list[ManifestError]  # every problem of this body
    kept_stale: set[str]  # error locations whose pod keeps its last good version
    usable: bool  # False: the body as a whole cannot be decoded, nothing changes


def _identity(obj: Any) -> _Ident | None:
    """Which pod a document means, read before validation so a bad pod can still be matched."""
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        return None
    return (namespace if isinstance(namespace, str) and namespace else "default", name)


class ManifestBody:
    """The synchronous part: decode a body and keep the last good pod of each name.

    Runs in a worker thread: a 10 MiB YAML body takes seconds to parse. Remembers a digest of
    the last body, so the same bytes again cost a hash and no parse.
    """

    def __init__(self, location: str, node_name: str) -> None:
        self.location = location
        self.node_name = node_name
        self._digest: bytes | None = None
        self._good: dict[_Ident, Pod] = {}

    def _where(self, ident: _Ident | None) -> str:
        return self.location if ident is None else f"{self.location}#{ident[0]}/{ident[1]}"

    def load(self, data: bytes) -> BodyResult | None:
        """Decode `data`; None if it is byte-identical to the last body (good or bad)."""
        digest = hashlib.sha256(data).digest()
        if digest == self._digest:
            return None
        self._digest = digest
        try:
            items = pod_items(load_documents(data, self.location), self.location)
        except ManifestError as exc:
            return BodyResult(list(self._good.values()), [exc], set(), usable=False)
        pods: list[Pod] = []
        good: dict[_Ident, Pod] = {}
        bad: dict[_Ident, ManifestError] = {}
        errors: list[ManifestError] = []
        for obj, prefix in items:
            ident = _identity(obj)
            where = self._where(ident)
            try:
                pod = pod_from_object(obj, where, prefix)
                pod = apply_static_defaults(pod, self.node_name, HTTP_SOURCE, where)
            except ManifestError as exc:
                errors.append(exc)
                if ident is not None:
                    bad.setdefault(ident, exc)
                continue
            # Duplicate names go on to the merger, which reports them and keeps the first.
            pods.append(pod)
            if ident is not None:
                good.setdefault(ident, pod)
        kept: set[str] = set()
        for ident, error in bad.items():
            last = self._good.get(ident)
            if ident not in good and last is not None:
                good[ident] = last
                pods.append(last)
                kept.add(error.location)
        self._good = good
        return BodyResult(pods, errors, kept, usable=True)


class _FetchError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # the metric's label
        self.message = message


@dataclass(frozen=True)
class _Answer:
    body: bytes | None  # None: 304 Not Modified
    etag: str | None = None
    last_modified: str | None = None


class HttpSource:
    """The async shell: fetches at start and every `period` seconds, reports, and pushes SETs.

    `run()` owns an HTTP session for its lifetime; `async with source: await source.check()`
    does one check at a time (for tests).
    """

    def __init__(
        self,
        url: str,
        headers: list[tuple[str, str]],
        period: float,
        push: Callable[[PodUpdate], None],
        recorder: EventRecorder,
        node_name: str,
        max_bytes: int = 10 * 1024 * 1024,
        ca_file: Path | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.url = URL(url)
        self.display_url = redact(self.url)
        self.headers = list(headers)
        self.period = period
        self.max_bytes = max_bytes
        self.ca_file = ca_file
        self.timeout = timeout
        self._push = push
        self._recorder = recorder
        self._node = ObjectRef.node(node_name)
        self._body = ManifestBody(self.display_url, node_name)
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None
        self._etag: str | None = None
        self._last_modified: str | None = None
        self._last_sent: list[Pod] | None = None
        self._body_usable = False  # the last body read could be decoded
        self._body_problem: str | None = None  # its metric reason while it has problems
        self._error: str | None = None  # the fetch error last reported
        self._error_at = 0.0
        self._clock: Callable[[], float] = time.monotonic
        self.checks = 0
        if ca_file is not None and self.url.scheme != "https":
            log.warning("--manifest-url-ca-file is not used: %s is not https", self.display_url)

    @property
    def ready(self) -> bool:
        """Whether a SET has gone out (the merger counts the source as seen)."""
        return self._last_sent is not None

    async def __aenter__(self) -> HttpSource:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.timeout),
            connector=aiohttp.TCPConnector(force_close=True),
            # The manifest is not a browsing session: no state carries over between checks.
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": f"pykubelet/{__version__}"},
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        async with self:
            while True:
                started = loop.time()
                try:
                    await self.check()
                except Exception:
                    # A bug must not end the source for good: its pods would never change again.
                    log.exception("checking %s failed unexpectedly", self.display_url)
                    metrics.source_errors.labels(source=HTTP_SOURCE, reason="internal").inc()
                await asyncio.sleep(max(0.0, started + self.period - loop.time()))

    async def check(self) -> None:
        """Fetch once; report what is wrong; send a SET if the pods changed."""
        self.checks += 1
        try:
            answer = await self._fetch()
        except _FetchError as exc:
            self._fetch_failed(exc.reason, exc.message)
            return
        if self._error is not None:
            log.info("%s answers again", self.display_url)
            self._error = None
        if answer.body is not None:
            self._etag, self._last_modified = answer.etag, answer.last_modified
            result = await asyncio.to_thread(self._body.load, answer.body)
            if result is not None:
                self._apply(result)
        if self._body_problem is not None:
            metrics.source_errors.labels(source=HTTP_SOURCE, reason=self._body_problem).inc()
        if self._body_usable:
            metrics.source_last_success.labels(source=HTTP_SOURCE).set(time.time())

    def _apply(self, result: BodyResult) -> None:
        for error in result.errors:
            if not result.usable:
                suffix = " (the pods of its last good answer keep running)" if self.ready else ""
            elif error.location in result.kept_stale:
                suffix = " (its last good pod keeps running)"
            else:
                suffix = ""
            for line in error.lines():
                self._recorder.record("Warning", FAILED_VALIDATION, line + suffix, self._node)
        self._body_usable = result.usable
        if not result.usable:
            self._body_problem = "decode"
            return
        self._body_problem = "invalid" if result.errors else None
        if self._last_sent is not None and self._last_sent == result.pods:
            return  # a new body saying the same (a comment, reordered keys): nothing to send
        self._last_sent = list(result.pods)
        self._push(PodUpdate(list(result.pods), Op.SET, HTTP_SOURCE))
        metrics.source_updates.labels(source=HTTP_SOURCE).inc()

    def _fetch_failed(self, reason: str, message: str) -> None:
        metrics.source_errors.labels(source=HTTP_SOURCE, reason=reason).inc()
        if self.ready:
            message += " (the pods of its last good answer keep running)"
        else:
            message += " (not ready: no pod of any source is removed until it answers)"
        line = f"{self.display_url}: {message}"
        now = self._clock()
        if line == self._error and now - self._error_at < RELOG_SECONDS:
            log.debug("%s (again)", line)
            return
        self._error, self._error_at = line, now
        self._recorder.record("Warning", FAILED_FETCH, line, self._node)

    # --- fetching -----------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext | bool:
        if self.url.scheme != "https":
            return True  # aiohttp's default; unused for http
        if self._ssl is None:
            cafile = str(self.ca_file) if self.ca_file is not None else None
            try:
                # With a cafile the system store is not loaded: only the private CA is trusted.
                self._ssl = ssl.create_default_context(cafile=cafile)
            except OSError as exc:  # ssl.SSLError included
                raise _FetchError(
                    "tls", _one_line(f"cannot load --manifest-url-ca-file {self.ca_file}: {exc}")
                ) from None
        return self._ssl

    async def _fetch(self) -> _Answer:
        session = self._session
        assert session is not None, "use `async with source:` or run()"
        ssl_context = self._ssl_context()
        headers: CIMultiDict[str] = CIMultiDict(self.headers)
        validators: CIMultiDict[str] = CIMultiDict()
        if self._etag is not None:
            validators["If-None-Match"] = self._etag
        if self._last_modified is not None:
            validators["If-Modified-Since"] = self._last_modified
        headers.extend(validators)
        url = self.url
        try:
            # One deadline for the whole check, redirects and the body included.
            async with asyncio.timeout(self.timeout):
                for _ in range(MAX_REDIRECTS + 1):
                    async with session.get(
                        url, headers=headers, allow_redirects=False, ssl=ssl_context
                    ) as resp:
                        if resp.status in _REDIRECTS:
                            target = self._redirect_target(url, resp)
                            if target.origin() != url.origin():
                                headers = CIMultiDict(validators)
                            url = target
                            continue
                        return await self._answer(resp, conditional=bool(validators))
                raise _FetchError("redirect", f"more than {MAX_REDIRECTS} redirects")
        except TimeoutError:
            raise _FetchError("timeout", f"no complete answer within {self.timeout:g}s") from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise _FetchError(
                "tls", _one_line(f"server certificate not trusted: {exc.certificate_error}")
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise _FetchError("tls", _one_line(f"TLS failed: {exc}")) from None
        except aiohttp.ClientConnectorError as exc:
            raise _FetchError(
                "connection", _one_line(f"cannot connect to {exc.host}:{exc.port}: {exc.strerror}")
            ) from None
        except aiohttp.ClientPayloadError:
            # Not aiohttp's text: it counts the bytes received, which would make each cut-off a
            # new error to log.
            raise _FetchError(
                "truncated", "the body was cut off: the connection closed before its end"
            ) from None
        except aiohttp.ClientResponseError as exc:
            raise _FetchError(
                "connection", f"not a valid HTTP answer: {_one_line(exc.message)}"
            ) from None
        except aiohttp.ClientError as exc:
            raise _FetchError("connection", _one_line(f"{type(exc).__name__}: {exc}")) from None

    def _redirect_target(self, url: URL, resp: aiohttp.ClientResponse) -> URL:
        location = resp.headers.get("Location")
        if not location:
            raise _FetchError("status", f"HTTP {resp.status} without a Location header")
        try:
            target = url.join(URL(location))
        except ValueError:
            raise _FetchError("redirect", f"redirected to a bad URL {location!r}") from None
        if target.scheme != url.scheme:
            raise _FetchError(
                "redirect",
                f"redirected to {redact(target)}: refused, a redirect may not change the scheme "
                "(use that URL as --manifest-url if it is right)",
            )
        return target

    async def _answer(self, resp: aiohttp.ClientResponse, *, conditional: bool) -> _Answer:
        if resp.status == 304:
            if not conditional:
                raise _FetchError("status", "HTTP 304 to a request that was not conditional")
            return _Answer(None)
        if resp.status != 200:
            raise _FetchError("status", f"HTTP {resp.status} {resp.reason or ''}".rstrip())
        length = resp.content_length
        if length is not None and length > self.max_bytes:
            raise _FetchError(
                "size",
                f"the body is {length} bytes, over the limit of {self.max_bytes} bytes "
                "(--manifest-url-max-bytes)",
            )
        chunks: list[bytes] = []
        total = 0
        async for chunk in resp.content.iter_chunked(_CHUNK):
            total += len(chunk)
            if total > self.max_bytes:
                raise _FetchError(
                    "size",
                    f"the body goes past the limit of {self.max_bytes} bytes "
                    "(--manifest-url-max-bytes)",
                )
            chunks.append(chunk)
        return _Answer(
            b"".join(chunks), resp.headers.get("ETag"), resp.headers.get("Last-Modified")
        )


def _one_line(text: str) -> str:
    # aiohttp's parser errors span lines; a log line must not.
    return " ".join(text.split())
