"""TLS for the kubelet API: the serving certificate and the SSL context of port 10250.

- With --tls-cert-file and --tls-private-key-file, those are served as they are.
- Otherwise, as the kubelet does, a self-signed certificate for the node is kept under --cert-dir
  (`kubelet.crt`, `kubelet.key`, the key 0600): made once, for the node's name, the host's name and
  the node's addresses (and localhost), and made again when it expires within a day or no longer
  names them (server/selfsigned.py, in a helper process).
- Client certificates are asked for and, when --client-ca-file is given, verified against it in
  the handshake: a certificate from another CA ends the connection there. A client may also come
  without one (a bearer token, or anonymous where allowed).
- A certificate issued later (serverTLSBootstrap) replaces the served one without a restart and
  without a handshake in between seeing half of it (ServingContext).

Everything here reads or writes files: call it off the event loop.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The kubelet's --tls-min-version names.
TLS_VERSIONS = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}
HELPER_TIMEOUT = 60.0


class TlsError(Exception):
    """A certificate or key that cannot be used; the message names the file."""


@dataclass(frozen=True)
class ServingConfig:
    cert_file: Path | None  # --tls-cert-file; None: the self-signed one under cert_dir
    key_file: Path | None
    cert_dir: Path
    client_ca_file: Path | None
    min_version: str
    node_name: str
    hostname: str
    addresses: tuple[str, ...]


def _names(config: ServingConfig) -> tuple[list[str], list[str]]:
    dns = sorted({config.node_name, config.hostname, "localhost"} - {""})
    ips = sorted({*config.addresses, "127.0.0.1", "::1"} - {""})
    return dns, ips


def ensure_self_signed(config: ServingConfig) -> tuple[Path, Path]:
    """The self-signed serving certificate and key under cert_dir, made if missing or stale,
    by the helper process of server/selfsigned.py (the cryptography library stays out of the
    agent)."""
    cert_path, key_path = config.cert_dir / "kubelet.crt", config.cert_dir / "kubelet.key"
    dns, ips = _names(config)
    request = {
        "cert_file": str(cert_path),
        "key_file": str(key_path),
        "node_name": config.node_name,
        "dns": dns,
        "ips": ips,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-m", "pykubelet.server.selfsigned"],
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TlsError(
            f"--cert-dir {config.cert_dir}: cannot make the certificate: {exc}"
        ) from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise TlsError(why[-1] if why else f"--cert-dir {config.cert_dir}: the helper failed")
    return cert_path, key_path


def _new_context(
    config: ServingConfig, cert_path: Path, key_path: Path | None, named: str
) -> ssl.SSLContext:
    """A server context serving that certificate; `named` says which files in an error."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[config.min_version]
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(f"{named}: cannot be used: {exc}") from None
    if config.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=config.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(
                f"--client-ca-file {config.client_ca_file}: not a readable PEM CA bundle ({exc})"
            ) from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def server_context(config: ServingConfig) -> ssl.SSLContext:
    """The SSL context of the secure port; raises TlsError naming the file at fault."""
    if config.cert_file is not None and config.key_file is not None:
        cert_path, key_path = config.cert_file, config.key_file
    else:
        cert_path, key_path = ensure_self_signed(config)
    named = f"--tls-cert-file {cert_path} / --tls-private-key-file {key_path}"
    return _new_context(config, cert_path, key_path, named)


class ServingContext:
    """The secure port's SSL context, whose certificate can be replaced while it serves.

    Loading a new chain into the context a listener uses is not atomic: OpenSSL drops the old
    key when it takes a certificate the key does not match, so a handshake between the two
    steps finds no key and the client sees the connection cut. Instead, each new certificate
    goes into a context of its own, built completely off to the side, and the listener's
    context hands every new handshake to the latest one as its ClientHello arrives (the
    server-name callback runs for every ClientHello, with or without SNI). Handshakes already
    under way keep the certificate they started with. OpenSSL then reads the rest of the
    handshake's settings (verification, ALPN) from the new context: every context is made by
    `_new_context`, and only this callback is the listener's own.
    """

    def __init__(self, config: ServingConfig) -> None:
        """Raises TlsError naming the file at fault. Reads files: call it off the event loop."""
        self._config = config
        self._listener = server_context(config)
        self._current = self._listener
        self._listener.sni_callback = self._select

    def listener(self) -> ssl.SSLContext:
        """The context to give the server socket."""
        return self._listener

    def load(self, chain: Path) -> None:
        """Serve the certificate, chain and key in the PEM file `chain` to every handshake from
        now on. Raises TlsError naming the file; reads files: call it off the event loop."""
        # One reference assignment: the callback sees the old context or the new one, whole.
        self._current = _new_context(self._config, chain, None, f"serving certificate {chain}")

    def _select(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        current = self._current
        if current is not self._listener:
            connection.context = current
