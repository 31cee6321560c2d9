"""The HTTP source against real aiohttp servers on 127.0.0.1: bodies, conditional requests,
errors and their reporting, limits, redirects, headers and TLS."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pykubelet.common.events import EventRecorder
from pykubelet.common.metrics import REGISTRY
from pykubelet.config.http import FAILED_FETCH, HttpSource, ManifestBody, redact
from pykubelet.config.types import HTTP_SOURCE, Op, PodUpdate
from tests.tls import make_tls

NODE = "n1"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def pod_doc(name: str, image: str = "busybox", namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": image, "command": ["sleep", "9"]}]},
    }


def pod_yaml(name: str, image: str = "busybox") -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\n"
        f"spec:\n  containers: [{{name: c, image: {image}, command: [sleep, '9']}}]\n"
    )


def pod_list(*docs: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "PodList", "items": list(docs)}).encode()


def names(pods: list[Any]) -> list[str]:
    return [p.metadata.name for p in pods]


def errors_total(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "pykubelet_source_errors_total", {"source": HTTP_SOURCE, "reason": reason}
    )
    return value or 0.0


# --- the body, without HTTP ---------------------------------------------------------------------


def test_body_forms() -> None:
    url = "http://h/pods"
    single = ManifestBody(url, NODE).load(pod_yaml("a").encode())
    assert single is not None and single.usable and names(single.pods) == ["a-n1"]
    pod = single.pods[0]
    assert pod.metadata.annotations["kubernetes.io/config.source"] == "http"
    assert pod.metadata.namespace == "default" and pod.spec.node_name == NODE

    as_json = ManifestBody(url, NODE).load(json.dumps(pod_doc("a")).encode())
    assert as_json is not None and names(as_json.pods) == ["a-n1"]
    listed = ManifestBody(url, NODE).load(pod_list(pod_doc("a"), pod_doc("b")))
    assert listed is not None and names(listed.pods) == ["a-n1", "b-n1"]
    stream = ManifestBody(url, NODE).load(
        (pod_yaml("a") + "---\n" + pod_yaml("b") + "---\n" + pod_yaml("c")).encode()
    )
    assert stream is not None and names(stream.pods) == ["a-n1", "b-n1", "c-n1"]
    # The same pod gets the same UID whichever form carries it: the UID names the pod, not its
    # place in the body.
    assert single.pods[0].uid == as_json.pods[0].uid == listed.pods[0].uid == stream.pods[0].uid


def test_uids_distinct_per_pod_and_stable_across_reordering() -> None:
    body = ManifestBody("http://h/pods", NODE)
    first = body.load(pod_list(pod_doc("a"), pod_doc("b")))
    assert first is not None
    a, b = first.pods
    assert a.uid != b.uid  # identical but for the name
    again = ManifestBody("http://h/pods", NODE).load(
        pod_list(pod_doc("x"), pod_doc("b"), pod_doc("a"))
    )
    assert again is not None
    assert {p.metadata.name: p.uid for p in again.pods}["a-n1"] == a.uid
    other_url = ManifestBody("http://other/pods", NODE).load(pod_list(pod_doc("a")))
    assert other_url is not None and other_url.pods[0].uid != a.uid
    # Same name, other namespace: another pod.
    ns = ManifestBody("http://h/pods", NODE).load(pod_list(pod_doc("a", namespace="kube")))
    assert ns is not None and ns.pods[0].uid != a.uid


def test_password_in_url_is_not_shown_or_hashed() -> None:
    recorder = EventRecorder()
    one = HttpSource("http://u:secret1@h/pods", [], 1, lambda _: None, recorder, NODE)
    two = HttpSource("http://u:secret2@h/pods", [], 1, lambda _: None, recorder, NODE)
    assert one.display_url == two.display_url == "http://h/pods"
    assert one._body.location == "http://h/pods"


def test_identical_body_is_not_parsed_again() -> None:
    body = ManifestBody("http://h/pods", NODE)
    data = pod_yaml("a").encode()
    assert body.load(data) is not None
    assert body.load(data) is None
    assert body.load(b"garbage: [") is not None
    assert body.load(b"garbage: [") is None  # the same bad body: not reported again


def test_bad_pod_in_body_keeps_its_last_good_version_only() -> None:
    body = ManifestBody("http://h/pods", NODE)
    first = body.load(pod_list(pod_doc("a"), pod_doc("b")))
    assert first is not None
    old_b = first.pods[1]

    broken_b = pod_doc("b")
    del broken_b["spec"]["containers"][0]["name"]
    never = pod_doc("c")
    never["spec"]["containers"][0]["image"] = ""
    turned = body.load(pod_list(pod_doc("a", image="v2"), broken_b, never))
    assert turned is not None and turned.usable
    assert names(turned.pods) == ["a-n1", "b-n1"]  # c never was good: not run
    assert turned.pods[1] is old_b
    messages = [line for e in turned.errors for line in e.lines()]
    assert any(
        m.startswith("http://h/pods#default/b: items[1].spec.containers[0].name: required")
        for m in messages
    ), messages
    assert any(
        m.startswith("http://h/pods#default/c: items[2].spec.containers[0].image") for m in messages
    )
    assert turned.kept_stale == {"http://h/pods#default/b"}

    gone = body.load(pod_list(pod_doc("a", image="v2")))
    assert gone is not None and names(gone.pods) == ["a-n1"]  # dropped from the body: removed


def test_undecodable_body_changes_nothing() -> None:
    body = ManifestBody("http://h/pods", NODE)
    assert body.load(pod_yaml("a").encode()) is not None
    for garbage in (b"\xff\xfe\x00junk", b"key: [unclosed", b"{not json", b"just a string"):
        result = body.load(garbage)
        assert result is not None
        if garbage == b"just a string":
            # A document, but not a Pod: this pod is bad; a was not matched, so it goes.
            assert result.usable and result.pods == [] and result.errors
        else:
            assert not result.usable, garbage
            assert names(result.pods) == ["a-n1"]
            assert result.errors[0].location == "http://h/pods"


def test_empty_body_is_no_pods() -> None:
    body = ManifestBody("http://h/pods", NODE)
    assert body.load(pod_yaml("a").encode()) is not None
    for empty in (b"", b"\n  \n"):
        result = body.load(empty)
        assert result is not None and result.usable and result.pods == [] and not result.errors


# --- HTTP ---------------------------------------------------------------------------------------


class Server:
    """An aiohttp server on 127.0.0.1 whose answer the test sets; it logs every request."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.headers: dict[str, str] = {}
        self.etag: str | None = None  # answer If-None-Match with 304
        self.last_modified: str | None = None  # answer If-Modified-Since with 304
        self.handler: Handler | None = None
        self.requests: list[dict[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"path": request.path_qs, **dict(request.headers)})
        self.headers_seen = request.headers
        if self.handler is not None:
            return await self.handler(request)
        headers = dict(self.headers)
        if self.etag is not None:
            headers["ETag"] = self.etag
            if request.headers.get("If-None-Match") == self.etag:
                return web.Response(status=304, headers=headers)
        if self.last_modified is not None:
            headers["Last-Modified"] = self.last_modified
            if request.headers.get("If-Modified-Since") == self.last_modified:
                return web.Response(status=304, headers=headers)
        return web.Response(status=self.status, body=self.body, headers=headers)

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> Server:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    srv = await Server().start()
    yield srv
    await srv.stop()


class Harness:
    def __init__(self, url: str, **kwargs: Any) -> None:
        self.pushed: list[PodUpdate] = []
        self.recorder = EventRecorder()
        headers = kwargs.pop("headers", [])
        self.source = HttpSource(
            url, headers, 1.0, self.pushed.append, self.recorder, NODE, **kwargs
        )

    def failures(self) -> list[tuple[str, int]]:
        return [(e.message, e.count) for e in self.recorder.events() if e.reason == FAILED_FETCH]

    def validation(self) -> list[str]:
        return [e.message for e in self.recorder.events() if e.reason == "FailedValidation"]


async def test_first_answer_sets_then_etag_gives_304_and_no_parse(server: Server) -> None:
    server.body = pod_yaml("a").encode()
    server.etag = '"v1"'
    h = Harness(server.url + "/pods")
    async with h.source:
        assert not h.source.ready
        await h.source.check()
        assert [(u.op, names(u.pods)) for u in h.pushed] == [(Op.SET, ["a-n1"])]
        assert h.source.ready
        await h.source.check()
        await h.source.check()
    assert len(h.pushed) == 1
    assert "If-None-Match" not in server.requests[0]
    assert [r.get("If-None-Match") for r in server.requests[1:]] == ['"v1"', '"v1"']
    assert REGISTRY.get_sample_value(
        "pykubelet_source_last_success_timestamp_seconds", {"source": HTTP_SOURCE}
    )

    server.body = pod_yaml("a", image="v2").encode()
    server.etag = '"v2"'
    async with h.source:
        await h.source.check()
    assert len(h.pushed) == 2 and h.pushed[1].pods[0].spec.containers[0].image == "v2"


async def test_last_modified_gives_304(server: Server) -> None:
    server.body = pod_yaml("a").encode()
    server.last_modified = "Wed, 21 Oct 2015 07:28:00 GMT"
    h = Harness(server.url)
    async with h.source:
        await h.source.check()
        await h.source.check()
    assert server.requests[1]["If-Modified-Since"] == server.last_modified
    assert len(h.pushed) == 1


async def test_identical_body_sends_nothing_a_changed_one_a_set(server: Server) -> None:
    server.body = pod_yaml("a").encode()
    h = Harness(server.url)
    async with h.source:
        await h.source.check()
        await h.source.check()
        assert len(h.pushed) == 1
        # New bytes, same pods (a comment): nothing to tell the merger either.
        server.body = b"# a comment\n" + pod_yaml("a").encode()
        await h.source.check()
        assert len(h.pushed) == 1
        server.body = pod_yaml("b").encode()
        await h.source.check()
    assert [names(u.pods) for u in h.pushed] == [["a-n1"], ["b-n1"]]


async def test_empty_body_is_an_empty_set(server: Server) -> None:
    h = Harness(server.url)
    async with h.source:
        await h.source.check()
    assert [(u.op, u.pods) for u in h.pushed] == [(Op.SET, [])]
    assert h.source.ready


async def test_not_ready_until_the_first_good_answer(server: Server) -> None:
    h = Harness(server.url)
    server.status = 500
    async with h.source:
        await h.source.check()
        server.status, server.body = 200, b"{broken"
        await h.source.check()
        await h.source.check()  # the same bad body: not parsed, not reported again
        assert h.pushed == [] and not h.source.ready
        assert len(h.validation()) == 1 and "invalid YAML" in h.validation()[0]
        server.body = pod_yaml("a").encode()
        await h.source.check()
    assert [names(u.pods) for u in h.pushed] == [["a-n1"]]
    message = h.failures()[0][0]
    assert "HTTP 500 Internal Server Error" in message and "not ready" in message


async def test_errors_keep_state_and_are_logged_once_per_change(server: Server) -> None:
    server.body = pod_yaml("a").encode()
    h = Harness(server.url + "/m")
    now = [1000.0]
    h.source._clock = lambda: now[0]
    before_status = errors_total("status")
    async with h.source:
        await h.source.check()
        server.status = 500
        await h.source.check()
        await h.source.check()
        server.status = 404
        await h.source.check()
        await h.source.check()
        now[0] += 301  # a reminder after 5 minutes
        await h.source.check()
        server.status = 200
        await h.source.check()  # same body as before the failures: nothing to send
        server.status = 500
        await h.source.check()  # after an answer, the same error is news again
    assert len(h.pushed) == 1
    keep = " (the pods of its last good answer keep running)"
    assert h.failures() == [
        (f"{server.url}/m: HTTP 500 Internal Server Error{keep}", 2),
        (f"{server.url}/m: HTTP 404 Not Found{keep}", 2),
    ]
    assert errors_total("status") - before_status == 6  # every failed check counts


async def test_status_other_than_200_is_an_error(server: Server) -> None:
    server.status = 204
    h = Harness(server.url)
    async with h.source:
        await h.source.check()
    assert h.pushed == [] and "HTTP 204" in h.failures()[0][0]


async def test_body_size_limit(server: Server) -> None:
    server.body = pod_yaml("a").encode()
    h = Harness(server.url, max_bytes=len(server.body))
    async with h.source:
        await h.source.check()
        assert len(h.pushed) == 1
        server.body += b"# one byte too many\n"
        await h.source.check()
        assert "the body is" in h.failures()[-1][0] and "limit of" in h.failures()[-1][0]

        async def chunked(request: web.Request) -> web.StreamResponse:
            # No Content-Length: the cap must hold while streaming.
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(100):
                await resp.write(b"#" * 1000 + b"\n")
            await resp.write_eof()
            return resp

        server.handler = chunked
        await h.source.check()
    assert len(h.pushed) == 1
    assert "goes past the limit" in h.failures()[-1][0]


async def test_timeout(server: Server) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.6)
        return web.Response(body=pod_yaml("a").encode())

    server.handler = slow
    h = Harness(server.url, timeout=0.2)
    loop = asyncio.get_running_loop()
    async with h.source:
        started = loop.time()
        await h.source.check()
        assert loop.time() - started < 1
    assert h.pushed == [] and "no complete answer within 0.2s" in h.failures()[0][0]


async def test_slow_body_counts_against_the_timeout(server: Server) -> None:
    async def dribble(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(20):
            await resp.write(b"# ...\n")
            await asyncio.sleep(0.05)
        return resp

    server.handler = dribble
    h = Harness(server.url, timeout=0.3)
    async with h.source:
        await h.source.check()
    assert "no complete answer" in h.failures()[0][0]


async def test_truncated_body() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\napiVersion: v1\n")
        await writer.drain()
        writer.close()

    raw = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    h = Harness(f"http://127.0.0.1:{port}/")
    try:
        async with h.source:
            await h.source.check()
    finally:
        raw.close()
        await raw.wait_closed()
    assert h.pushed == []
    assert "the body was cut off" in h.failures()[0][0], h.failures()


async def test_not_http_is_one_line() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"\x00\x01 not http\r\n\r\n")
        await writer.drain()
        writer.close()

    raw = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    h = Harness(f"http://127.0.0.1:{port}/")
    try:
        async with h.source:
            await h.source.check()
    finally:
        raw.close()
        await raw.wait_closed()
    [(message, _)] = h.failures()
    assert "not a valid HTTP answer" in message and "\n" not in message, message


async def test_connection_refused() -> None:
    raw = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = raw.sockets[0].getsockname()[1]
    raw.close()
    await raw.wait_closed()
    before = errors_total("connection")
    h = Harness(f"http://127.0.0.1:{port}/pods")
    async with h.source:
        await h.source.check()
        await h.source.check()
    assert h.pushed == []
    [(message, count)] = h.failures()
    assert message.startswith(f"http://127.0.0.1:{port}/pods: cannot connect to 127.0.0.1:{port}")
    assert count == 1
    assert errors_total("connection") - before == 2


async def test_headers_arrive_as_given(server: Server) -> None:
    h = Harness(
        server.url,
        headers=[
            ("Authorization", "Bearer abc:def:ghi"),
            ("X-Node", "n1"),
            ("X-Multi", "one"),
            ("X-Multi", "two"),
        ],
    )
    async with h.source:
        await h.source.check()
    seen = server.headers_seen
    assert seen["Authorization"] == "Bearer abc:def:ghi" and seen["X-Node"] == "n1"
    assert seen.getall("X-Multi") == ["one", "two"]
    assert seen["User-Agent"].startswith("pykubelet/")


async def test_redirects(server: Server) -> None:
    other = await Server().start()
    try:
        other.body = pod_yaml("moved").encode()
        hops = {"/a": "/b", "/b": f"{other.url}/c", "/loop": "/loop"}

        async def redirect(request: web.Request) -> web.StreamResponse:
            if request.path == "/tls":
                raise web.HTTPFound(server.url.replace("http://", "https://") + "/x")
            raise web.HTTPFound(hops[request.path])

        server.handler = redirect
        h = Harness(server.url + "/a", headers=[("Authorization", "Bearer t")])
        async with h.source:
            await h.source.check()
        assert [names(u.pods) for u in h.pushed] == [["moved-n1"]]
        assert [r["path"] for r in server.requests] == ["/a", "/b"]
        assert server.requests[1]["Authorization"] == "Bearer t"
        assert "Authorization" not in other.requests[0]  # another origin: no token

        for path, needle in (
            ("/tls", "refused, a redirect may not change the scheme"),
            ("/loop", "more than 5 redirects"),
        ):
            h = Harness(server.url + path)
            async with h.source:
                await h.source.check()
            assert h.pushed == [] and needle in h.failures()[0][0], h.failures()
    finally:
        await other.stop()


async def test_run_checks_at_once_then_every_period(server: Server) -> None:
    server.body = pod_yaml("a").encode()
    pushed: list[PodUpdate] = []
    first = asyncio.Event()

    def push(update: PodUpdate) -> None:
        pushed.append(update)
        first.set()

    source = HttpSource(server.url, [], 0.2, push, EventRecorder(), NODE)
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(first.wait(), 5)
        assert loop.time() - started < 0.15  # no waiting one period first
        await asyncio.sleep(0.5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert 3 <= len(server.requests) <= 5
    assert len(pushed) == 1


# --- TLS ----------------------------------------------------------------------------------------


async def test_https_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key = make_tls(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    srv = await Server().start(ssl_context=context)
    srv.body = pod_yaml("secure").encode()
    try:
        trusted = Harness(srv.url + "/pods", ca_file=ca)
        async with trusted.source:
            await trusted.source.check()
        assert [names(u.pods) for u in trusted.pushed] == [["secure-n1"]]

        system = Harness(srv.url + "/pods")  # the system store does not know our CA
        async with system.source:
            await system.source.check()
        assert system.pushed == []
        assert "server certificate not trusted" in system.failures()[0][0], system.failures()

        not_pem = tmp_path / "not-a-ca.pem"
        not_pem.write_text("nothing here\n")
        broken = Harness(srv.url + "/pods", ca_file=not_pem)
        async with broken.source:
            await broken.source.check()
        assert broken.pushed == []
        assert "cannot load --manifest-url-ca-file" in broken.failures()[0][0]
    finally:
        await srv.stop()


def test_redact() -> None:
    from yarl import URL

    assert redact(URL("https://user:pw@h:8443/p?q=1")) == "https://h:8443/p?q=1"
    assert redact(URL("http://h/p")) == "http://h/p"
