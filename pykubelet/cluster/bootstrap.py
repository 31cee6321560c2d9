"""TLS bootstrap (`--bootstrap-kubeconfig`), as the kubelet's `LoadClientCert`.

When `--kubeconfig` does not exist, cannot be read, or holds no client certificate or an expired
one: a valid certificate already in the store (`<cert-dir>/kubelet-client-current.pem`) is used
as it is; otherwise a key is made (kept in `kubelet-client.key.tmp`, 0600, so that a restart
while waiting sends the same request again), a `kubernetes.io/kube-apiserver-client-kubelet` CSR
named after it is sent with the bootstrap credentials, and once approved and issued the pair goes
to the store. Then `--kubeconfig` is written: the bootstrap kubeconfig's cluster, and as the user
the current pem (certificate and key). A denied or failed CSR ends the bootstrap with its name
and reason.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pykubelet.cluster.certificates import (
    BOOTSTRAP_WAIT_SECONDS,
    CLIENT_PREFIX,
    CertificateError,
    CsrApi,
    client_template,
    current_path,
    digested_name,
    key_pem,
    load_current,
    new_key,
    request_certificate,
    store_pair,
    write_private,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]

BOOTSTRAP_KEY = "kubelet-client.key.tmp"


class BootstrapError(Exception):
    """The bootstrap cannot give the node a client certificate; the message says why."""


def _read_yaml(path: Path) -> Obj:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("not a kubeconfig")
    return data


def _named(config: Obj, kind: str, name: str) -> Obj:
    for item in config.get(f"{kind}s") or []:
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get(kind)
            return value if isinstance(value, dict) else {}
    raise ValueError(f"no {kind} {name!r}")


def _context(config: Obj) -> Obj:
    current = str(config.get("current-context") or "")
    if current:
        return _named(config, "context", current)
    contexts = config.get("contexts") or []
    if len(contexts) == 1 and isinstance(contexts[0], dict):
        return dict(contexts[0].get("context") or {})
    raise ValueError("no current-context")


def client_config_still_valid(kubeconfig: Path) -> bool:
    """The kubelet's isClientConfigStillValid: the kubeconfig's client certificate is readable
    and none of its certificates has expired."""
    if not kubeconfig.exists():
        return False
    try:
        config = _read_yaml(kubeconfig)
        user = _named(config, "user", str(_context(config).get("user", "")))
        if user.get("client-certificate-data"):
            data = base64.b64decode(str(user["client-certificate-data"]))
        elif user.get("client-certificate"):
            path = Path(str(user["client-certificate"]))
            data = (path if path.is_absolute() else kubeconfig.parent / path).read_bytes()
        else:
            log.info("--kubeconfig %s holds no client certificate: bootstrapping", kubeconfig)
            return False
        certs = x509.load_pem_x509_certificates(data)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        log.info("--kubeconfig %s cannot be used (%s): bootstrapping", kubeconfig, exc)
        return False
    now = datetime.datetime.now(datetime.UTC)
    if any(now >= cert.not_valid_after_utc for cert in certs):
        log.info("the client certificate of --kubeconfig %s has expired: bootstrapping", kubeconfig)
        return False
    return True


def write_kubeconfig(kubeconfig: Path, bootstrap: Path, pem: Path) -> None:
    """--kubeconfig: the bootstrap kubeconfig's cluster, the node's certificate as the user."""
    try:
        config = _read_yaml(bootstrap)
        cluster = dict(_named(config, "cluster", str(_context(config).get("cluster", ""))))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise BootstrapError(f"--bootstrap-kubeconfig {bootstrap}: {exc}") from None
    ca = cluster.get("certificate-authority")
    if ca and not Path(str(ca)).is_absolute():
        cluster["certificate-authority"] = str((bootstrap.parent / str(ca)).absolute())
    out = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "contexts": [
            {
                "name": "default-context",
                "context": {
                    "cluster": "default-cluster",
                    "namespace": "default",
                    "user": "default-auth",
                },
            }
        ],
        "current-context": "default-context",
        "users": [
            {
                "name": "default-auth",
                "user": {"client-certificate": str(pem), "client-key": str(pem)},
            }
        ],
    }
    try:
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        write_private(kubeconfig, yaml.safe_dump(out, sort_keys=False).encode())
    except OSError as exc:
        raise BootstrapError(f"--kubeconfig {kubeconfig}: cannot write: {exc}") from None


def _bootstrap_key(cert_dir: Path) -> ec.EllipticCurvePrivateKey:
    path = cert_dir / BOOTSTRAP_KEY
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), None)
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key
    except (OSError, ValueError, TypeError):
        pass
    key = new_key()
    cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(path, key_pem(key))
    return key


async def load_client_cert(
    kubeconfig: Path,
    bootstrap: Path,
    cert_dir: Path,
    node_name: str,
    connect: Callable[[Path], Awaitable[Any]],
    wait_seconds: float = BOOTSTRAP_WAIT_SECONDS,
) -> None:
    """Make --kubeconfig usable, through a CSR if need be. `connect(path)` gives a client of a
    kubeconfig (a CsrApi with `close()`)."""
    if await asyncio.to_thread(client_config_still_valid, kubeconfig):
        return
    stored = await asyncio.to_thread(load_current, cert_dir, CLIENT_PREFIX)
    now = datetime.datetime.now(datetime.UTC)
    if stored is not None and stored.not_before <= now < stored.not_after:
        log.info("using the client certificate in %s", stored.path)
        await asyncio.to_thread(write_kubeconfig, kubeconfig, bootstrap, stored.path)
        return
    if not await asyncio.to_thread(bootstrap.is_file):
        raise BootstrapError(f"--bootstrap-kubeconfig {bootstrap}: no such file")
    log.info("no valid client certificate in --kubeconfig %s: bootstrapping with %s",
             kubeconfig, bootstrap)  # fmt: skip
    try:
        key = await asyncio.to_thread(_bootstrap_key, cert_dir)
    except OSError as exc:
        raise BootstrapError(f"--cert-dir {cert_dir}: {exc}") from None
    template = client_template(node_name)
    try:
        api: Any = await connect(bootstrap)
    except Exception as exc:
        raise BootstrapError(f"--bootstrap-kubeconfig {bootstrap}: {exc}") from None
    client: CsrApi = api
    try:
        pem = await request_certificate(
            client, key, template, digested_name(key, template), wait_seconds
        )
        path = await asyncio.to_thread(store_pair, cert_dir, CLIENT_PREFIX, pem, key)
    except CertificateError as exc:
        raise BootstrapError(str(exc)) from None
    finally:
        await api.close()
    await asyncio.to_thread((cert_dir / BOOTSTRAP_KEY).unlink, True)
    await asyncio.to_thread(write_kubeconfig, kubeconfig, bootstrap, current_path(cert_dir,
                            CLIENT_PREFIX))  # fmt: skip
    log.info("client certificate stored in %s, --kubeconfig %s written", path, kubeconfig)


def uses_store(kubeconfig: Path, cert_dir: Path) -> bool:
    """Whether --kubeconfig's client certificate is the store's current pem (rotatable)."""
    try:
        config = _read_yaml(kubeconfig)
        user = _named(config, "user", str(_context(config).get("user", "")))
    except (OSError, ValueError, yaml.YAMLError):
        return False
    cert = Path(str(user.get("client-certificate") or ""))
    return cert.absolute() == current_path(cert_dir, CLIENT_PREFIX).absolute()
