"""aiohttp imported by the commands without the CA bundle in its default contexts
(common/tlsdefaults.py): what verifies with them fails closed, our own contexts still trust the
bundle, and the environment is left as it was. Each case runs in a fresh interpreter (aiohttp is
imported once per process), against a real TLS server on 127.0.0.1."""

from __future__ import annotations

import http.server
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tls import make_tls

CLIENT = """
import asyncio, os, ssl, sys
before = os.environ.get("SSL_CERT_FILE")
import pykubelet.cmd  # what every command imports first
import aiohttp
assert os.environ.get("SSL_CERT_FILE") == before, "the environment was not put back"

async def get(url, context):
    async with aiohttp.ClientSession() as session:
        try:
            async with session.get(url, ssl=context) as resp:
                return str(resp.status)
        except aiohttp.ClientConnectorCertificateError:
            return "certificate refused"

url = sys.argv[1]
print(asyncio.run(get(url, True)))  # aiohttp's default context
print(asyncio.run(get(url, ssl.create_default_context())))  # a context of our own
"""


@pytest.fixture
def https_url(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    ca, cert, key = make_tls(tmp_path)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/", ca
    finally:
        server.shutdown()
        server.server_close()


def run_client(url: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:2]


@pytest.mark.parametrize("ca_file_was_set", [True, False])
def test_aiohttp_default_context_fails_closed_and_our_own_trusts_the_bundle(
    https_url: tuple[str, Path], tmp_path: Path, ca_file_was_set: bool
) -> None:
    url, ca = https_url
    # The private CA as the only CA of the bundle file; the CA directory has none.
    env = {**os.environ, "SSL_CERT_DIR": str(tmp_path / "no-ca-dir")}
    if ca_file_was_set:
        env["SSL_CERT_FILE"] = str(ca)
        assert run_client(url, env) == ["certificate refused", "200"]
    else:
        env.pop("SSL_CERT_FILE", None)
        # Neither trusts a private CA the system does not know; the client checked that the
        # variable stayed unset.
        assert run_client(url, env) == ["certificate refused", "certificate refused"]
