"""The kubelet's self-signed serving certificate, checked and made in a process of its own.

`python -I -m pykubelet.server.selfsigned` reads {"cert_file", "key_file", "node_name", "dns",
"ips"} as JSON on stdin and leaves the certificate and its key (0600) at those paths (their
directory, --cert-dir, made 0700 if missing): kept if the certificate is valid for more than a
day and names every DNS name and IP address, made again otherwise (ECDSA P-256, a year, for the
node). It exits 0, or 1 with the reason on stderr.

A helper process rather than a call: the cryptography library is 16 MiB of the agent's memory
for as long as it runs, and a node that is not in a cluster needs it for this alone
(server/tls.py runs it; the cluster layer, which rotates certificates, loads it anyway).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SELF_SIGNED_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=1)


class CertificateError(Exception):
    """The certificate cannot be made; the message names the file or directory."""


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


def ensure(cert_path: Path, key_path: Path, node_name: str, dns: list[str], ips: list[str]) -> None:
    """The self-signed serving certificate and key at those paths, made if missing or stale."""
    cert_dir = cert_path.parent
    if key_path.exists() and _self_signed_is_current(cert_path, dns, ips):
        return
    try:
        cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise CertificateError(f"--cert-dir {cert_dir}: {exc.strerror}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{node_name}@pykubelet")])
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


def main() -> int:
    try:
        request = json.load(sys.stdin)
        ensure(
            Path(request["cert_file"]),
            Path(request["key_file"]),
            str(request["node_name"]),
            [str(n) for n in request["dns"]],
            [str(i) for i in request["ips"]],
        )
    except CertificateError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{exc.filename or 'the serving certificate'}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
