"""server/tls.py ServingContext: a serving certificate replaced while a real TLS server on
127.0.0.1 takes handshakes. Every handshake completes, new ones get the new certificate, and
client certificates are still verified against --client-ca-file after the switch."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from pykubelet.server.tls import ServingConfig, ServingContext, TlsError
from tests.fixtures.apiserver.pki import make_ca, make_client_cert, make_serving_cert, write_pem

CA = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def _chain(directory: Path, stem: str, ca: CA) -> Path:
    """A PEM with the certificate and its key, as the certificate manager stores them."""
    cert, key = write_pem(directory, stem, *make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    chain = directory / f"{stem}.pem"
    chain.write_bytes(cert.read_bytes() + key.read_bytes())
    return chain


def _config(tmp_path: Path, client_ca: Path | None) -> ServingConfig:
    return ServingConfig(
        cert_file=None,
        key_file=None,
        cert_dir=tmp_path / "pki",
        client_ca_file=client_ca,
        min_version="VersionTLS12",
        node_name="node-a",
        hostname="host-a",
        addresses=("127.0.0.1",),
    )


@asynccontextmanager
async def _server(serving: ServingContext) -> AsyncIterator[tuple[int, list[object]]]:
    """A TLS server answering each connection with one line; it records each peer certificate."""
    peers: list[object] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peercert"))
        writer.write(b"hello\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=serving.listener())
    try:
        yield server.sockets[0].getsockname()[1], peers
    finally:
        server.close()
        await server.wait_closed()


def _client() -> ssl.SSLContext:
    """A client that takes any certificate (the tests look at it themselves)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _served(port: int, client: ssl.SSLContext | None = None) -> x509.Certificate:
    """The certificate the server presents (the handshake completed, a line was read)."""
    if client is None:
        client = _client()
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with raw, client.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
        assert tls.recv(6) == b"hello\n"
    assert der is not None
    return x509.load_der_x509_certificate(der)


async def test_handshakes_during_reloads_all_complete_and_new_ones_get_the_new_certificate(
    tmp_path: Path,
) -> None:
    ca = make_ca("cluster-ca")
    chains = [_chain(tmp_path, f"serving-{i}", ca) for i in range(2)]
    serving = await asyncio.to_thread(ServingContext, _config(tmp_path, None))
    async with _server(serving) as (port, _):
        first = await asyncio.to_thread(_served, port)
        assert first.issuer.rfc4514_string().startswith("CN=node-a@")  # self-signed until then
        failures: list[BaseException] = []
        completed = 0
        stop = threading.Event()

        def hammer() -> None:
            nonlocal completed
            client = _client()
            while not stop.is_set():
                try:
                    _served(port, client)
                    completed += 1
                except (OSError, AssertionError) as exc:
                    failures.append(exc)

        clients = [threading.Thread(target=hammer) for _ in range(2)]
        for thread in clients:
            thread.start()
        try:
            # Loading into the listener's own context cut about 1 handshake in 20 here.
            for i in range(200):
                await asyncio.to_thread(serving.load, chains[i % 2])
                await asyncio.sleep(0.002)
        finally:
            stop.set()
            for thread in clients:
                await asyncio.to_thread(thread.join)
        assert failures == []
        assert completed > 50
        last = x509.load_pem_x509_certificate(chains[1].read_bytes())
        assert await asyncio.to_thread(_served, port) == last


async def test_client_certificates_are_verified_after_the_switch(tmp_path: Path) -> None:
    clients_ca = make_ca("clients-ca")
    ca_file, _ = write_pem(tmp_path, "clients-ca", *clients_ca)
    serving = await asyncio.to_thread(ServingContext, _config(tmp_path, ca_file))
    await asyncio.to_thread(serving.load, _chain(tmp_path, "issued", make_ca("cluster-ca")))

    def client(ca: CA, stem: str) -> ssl.SSLContext:
        cert, key = write_pem(tmp_path, stem, *make_client_cert(ca, "system:node:node-b", None))
        ctx = _client()
        ctx.load_cert_chain(cert, key)
        return ctx

    async with _server(serving) as (port, peers):
        served = await asyncio.to_thread(_served, port, client(clients_ca, "good"))
        assert served.issuer.rfc4514_string() == "CN=cluster-ca"
        subject = dict(pair for rdn in peers[-1]["subject"] for pair in rdn)  # type: ignore[index]
        assert subject == {"commonName": "system:node:node-b"}
        # A certificate of another CA ends the connection in the handshake, as before the
        # switch (under TLS 1.3 the client learns it at its first read).
        with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
            await asyncio.to_thread(_served, port, client(make_ca("other-ca"), "bad"))
        assert len(peers) == 1


async def test_a_chain_that_cannot_be_used_is_named_and_the_old_one_stays(tmp_path: Path) -> None:
    serving = await asyncio.to_thread(ServingContext, _config(tmp_path, None))
    broken = tmp_path / "broken.pem"
    broken.write_text("not a certificate\n")
    with pytest.raises(TlsError, match=f"serving certificate {broken}: cannot be used"):
        await asyncio.to_thread(serving.load, broken)
    async with _server(serving) as (port, _):
        served = await asyncio.to_thread(_served, port)
        assert served.issuer.rfc4514_string().startswith("CN=node-a@")
