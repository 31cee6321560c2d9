"""A private CA and a server certificate for the https tests, made with openssl."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate it signed for 127.0.0.1: (ca.pem, server.pem, server.key)."""
    ca_key, ca, key, csr, cert, ext = (
        directory / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem", "x")
    )
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE"]
    ca_ext += ["-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    sign = ["-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-extfile", ext]
    for args in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-subj", "/CN=pykubelet CA", *ca_ext],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-out", cert, "-days", "2", *sign],
    ):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    return ca, cert, key
