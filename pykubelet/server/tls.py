"""TLS for the kubelet API: the serving certificate and the SSL context of port 10250.

- With --tls-cert-file and --tls-private-key-file, those are served as they are.
- Otherwise, as the kubelet does, a self-signed certificate for the node is kept under --cert-dir
  (`kubelet.crt`, `kubelet.key`, the key 0600): made once, for the node's name, the host's name and
  the node's addresses (and localhost), and made again when it expires within a day or no longer
  names them.
- Client certificates are asked for and, when --client-ca-file is given, verified against it in
  the handshake: a certificate from another CA ends the connection there. A client may also come
  without one (a bearer token, or anonymous where allowed).

Everything here reads or writes files: call it off the event loop.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# The kubelet's --tls-min-version names.
TLS_VERSIONS = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}
SELF_SIGNED_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=1)


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


def _self_signed_is_current(cert_path: Path, dns: list[str], ips: list[str]) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc - RENEW_BEFORE < now:
        return False
    have_dns = set(sans.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return set(dns) <= have_dns and {str(ipaddress.ip_address(i)) for i in ips} <= have_ips


def ensure_self_signed(config: ServingConfig) -> tuple[Path, Path]:
    """The self-signed serving certificate and key under cert_dir, made if missing or stale."""
    cert_path = config.cert_dir / "kubelet.crt"
    key_path = config.cert_dir / "kubelet.key"
    dns, ips = _names(config)
    if key_path.exists() and _self_signed_is_current(cert_path, dns, ips):
        return cert_path, key_path
    try:
        config.cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise TlsError(f"--cert-dir {config.cert_dir}: {exc.strerror}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{config.node_name}@pykubelet")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name) for name in dns]
                + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_private(key_path, key_pem)
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return cert_path, key_path


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def server_context(config: ServingConfig) -> ssl.SSLContext:
    """The SSL context of the secure port; raises TlsError naming the file at fault."""
    if config.cert_file is not None and config.key_file is not None:
        cert_path, key_path = config.cert_file, config.key_file
    else:
        cert_path, key_path = ensure_self_signed(config)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[config.min_version]
    try:
        ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as exc:
        raise TlsError(
            f"--tls-cert-file {cert_path} / --tls-private-key-file {key_path}: "
            f"cannot be used: {exc}"
        ) from None
    if config.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=config.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(
                f"--client-ca-file {config.client_ca_file}: not a readable PEM CA bundle ({exc})"
            ) from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx
