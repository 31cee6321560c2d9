"""The kubelet's certificates from the cluster: CertificateSigningRequests, the certificate store
under --cert-dir, and rotation (client-go's certificate manager, as the kubelet uses it).

- A key is ECDSA P-256; the CSR's subject is `CN=system:node:<node>`, `O=system:nodes`; the
  client certificate's usages are digital signature and client auth
  (`kubernetes.io/kube-apiserver-client-kubelet`), the serving one's digital signature and server
  auth with the node's DNS names and IPs (`kubernetes.io/kubelet-serving`).
- The store keeps `<prefix>-<timestamp>.pem` (the certificate and its key, 0600) and the symlink
  `<prefix>-current.pem` pointing at the newest, replaced atomically: `kubelet-client` and
  `kubelet-server`, the kubelet's names.
- `rotation_deadline`: the certificate manager's jittered 70-90 % of the certificate's life,
  counted from its notBefore.
- `CertificateManager` renews at that deadline with a new key and a new CSR, sent with the current
  credentials, then tells its listener (the client is rebuilt, or the serving certificate
  reloaded); a denied or failed CSR is logged with its name and reason and retried with back-off;
  a client certificate expired for 5 minutes without a new one calls `on_expired` (the agent
  exits, as the kubelet, so that its restart bootstraps again).

Keys never reach a log line. File work runs in threads (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import ipaddress
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pykubelet.client.kubeapi import ApiError
from pykubelet.client.throttle import Retry

log = logging.getLogger(__name__)

Obj = dict[str, Any]

CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
CLIENT_USAGES = ("digital signature", "client auth")
SERVING_USAGES = ("digital signature", "server auth")
CLIENT_PREFIX = "kubelet-client"
SERVING_PREFIX = "kubelet-server"
TIMESTAMP = "%Y-%m-%d-%H-%M-%S"  # Go's "2006-01-02-15-04-05", client-go's store
POLL_SECONDS = 1.0
# How long the bootstrap waits for its CSR to be issued (the kubelet's hour).
BOOTSTRAP_WAIT_SECONDS = 3600.0
ROTATION_WAIT_SECONDS = 900.0
EXIT_AFTER_SECONDS = 300.0  # the kubelet's exitAfter of its client transport


class CertificateError(Exception):
    """A CSR denied, failed or never issued, or a certificate that cannot be stored or read."""


class CsrApi(Protocol):
    """What a CSR needs of the API client (KubeApi has it)."""

    async def create(self, path: str, body: Obj) -> Obj: ...

    async def get(self, path: str) -> Obj: ...


@dataclass(frozen=True)
class CsrTemplate:
    """What a CSR asks for: its signer, usages and subject alternative names."""

    node_name: str
    signer: str
    usages: tuple[str, ...]
    prefix: str  # the store's file names
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()

    @property
    def common_name(self) -> str:
        return f"system:node:{self.node_name}"


def client_template(node_name: str) -> CsrTemplate:
    return CsrTemplate(node_name, CLIENT_SIGNER, CLIENT_USAGES, CLIENT_PREFIX)


def serving_template(node_name: str, dns: list[str], ips: list[str]) -> CsrTemplate:
    names = tuple(sorted({n for n in dns if n}))
    addrs = tuple(sorted({str(ipaddress.ip_address(i)) for i in ips if i}))
    return CsrTemplate(node_name, SERVING_SIGNER, SERVING_USAGES, SERVING_PREFIX, names, addrs)


# --- keys, requests, names ------------------------------------------------------------------------


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # "EC PRIVATE KEY", as client-go
        serialization.NoEncryption(),
    )


def csr_pem(key: ec.EllipticCurvePrivateKey, template: CsrTemplate) -> bytes:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, template.common_name),
        ]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in template.dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in template.ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def digested_name(key: ec.EllipticCurvePrivateKey, template: CsrTemplate) -> str:
    """The bootstrap CSR's name, `node-csr-<digest>`: the same key and request give the same
    name, so a restarted bootstrap finds its CSR again instead of making another."""
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashlib.sha512(usedforsecurity=False)
    for part in (public, template.common_name.encode(), b"system:nodes", *map(str.encode,
                 template.usages)):  # fmt: skip
        digest.update(part + b"|")
    return "node-csr-" + base64.urlsafe_b64encode(digest.digest()[:32]).decode().rstrip("=")


def csr_object(key: ec.EllipticCurvePrivateKey, template: CsrTemplate, name: str | None) -> Obj:
    meta: Obj = {"name": name} if name else {"generateName": "csr-"}
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": meta,
        "spec": {
            "request": base64.b64encode(csr_pem(key, template)).decode(),
            "signerName": template.signer,
            "usages": list(template.usages),
        },
    }


# --- the CSR's life ---------------------------------------------------------------------------


def _condition(obj: Obj, kind: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status", "True") == "True":
            return dict(cond)
    return None


def issued_certificate(obj: Obj) -> bytes | None:
    """The CSR's certificate (PEM) once approved and issued; raises CertificateError when it was
    denied or failed."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    for kind, word in (("Denied", "denied"), ("Failed", "failed")):
        cond = _condition(obj, kind)
        if cond is not None:
            raise CertificateError(
                f"certificate signing request {name} is {word}, reason: "
                f"{cond.get('reason', '')}, message: {cond.get('message', '')}"
            )
    cert = (obj.get("status") or {}).get("certificate")
    if _condition(obj, "Approved") is None or not cert:
        return None
    return base64.b64decode(cert)


async def request_certificate(
    api: CsrApi,
    key: ec.EllipticCurvePrivateKey,
    template: CsrTemplate,
    name: str | None,
    wait_seconds: float,
) -> bytes:
    """Submit a CSR (or find ours again by name) and wait for its certificate (PEM)."""
    body = csr_object(key, template, name)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    retry = Retry(1.0, 30.0)
    while True:
        try:
            created = await _create(api, body, name)
            break
        except ApiError as exc:
            # An API server away or failing is waited for, as the kubelet's bootstrap does.
            if not (exc.unreachable or exc.status >= 500) or loop.time() >= deadline:
                raise CertificateError(
                    f"cannot create a certificate signing request: {exc}"
                ) from None
            log.warning("creating a certificate signing request: %s (retrying)", exc)
            await asyncio.sleep(retry.delay())
    name = str(created["metadata"]["name"])
    log.info("certificate signing request %s sent (%s), waiting for it", name, template.signer)
    obj = created
    while True:
        pem = issued_certificate(obj)
        if pem is not None:
            _check_matches(pem, key, name)
            log.info("certificate signing request %s approved and issued", name)
            return pem
        if loop.time() >= deadline:
            raise CertificateError(
                f"timed out after {wait_seconds:g}s waiting for certificate signing request "
                f"{name} to be approved and issued"
            )
        await asyncio.sleep(POLL_SECONDS)
        try:
            obj = await api.get(f"{CSR_PATH}/{name}")
        except ApiError as exc:
            if exc.status == 404:
                raise CertificateError(f"certificate signing request {name} was deleted") from None
            log.debug("reading certificate signing request %s: %s", name, exc)


async def _create(api: CsrApi, body: Obj, name: str | None) -> Obj:
    """The CSR created, or ours found again by its name (a restarted bootstrap)."""
    try:
        return await api.create(CSR_PATH, body)
    except ApiError as exc:
        if exc.status != 409 or name is None:
            raise
    found = await api.get(f"{CSR_PATH}/{name}")
    if (found.get("spec") or {}).get("request") != body["spec"]["request"]:
        raise CertificateError(f"certificate signing request {name} exists with another request")
    return found


def _check_matches(pem: bytes, key: ec.EllipticCurvePrivateKey, name: str) -> None:
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertificateError(f"certificate signing request {name}: {exc}") from None
    if cert.public_key() != key.public_key():
        raise CertificateError(
            f"certificate signing request {name}: the certificate is not for the key requested"
        )


# --- the store ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    path: Path  # the current pem (the symlink)
    not_before: datetime.datetime
    not_after: datetime.datetime


def current_path(cert_dir: Path, prefix: str) -> Path:
    return cert_dir / f"{prefix}-current.pem"


def write_private(path: Path, data: bytes) -> None:
    """A file only its owner reads (0600), written whole: a temporary file, fsync, rename."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def store_pair(
    cert_dir: Path, prefix: str, cert_pem: bytes, key: ec.EllipticCurvePrivateKey
) -> Path:
    """`<prefix>-<timestamp>.pem` (certificate, then key; 0600) and `<prefix>-current.pem`
    pointing at it, swapped in by a rename; returns the current path."""
    try:
        cert_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = datetime.datetime.now(datetime.UTC).strftime(TIMESTAMP)
        pem = cert_dir / f"{prefix}-{stamp}.pem"
        write_private(pem, cert_pem.rstrip(b"\n") + b"\n" + key_pem(key))
        current = current_path(cert_dir, prefix)
        updated = cert_dir / f"{prefix}-updated.pem"
        updated.unlink(missing_ok=True)
        updated.symlink_to(pem.absolute())
        os.replace(updated, current)
    except OSError as exc:
        raise CertificateError(
            f"--cert-dir {cert_dir}: cannot store the certificate: {exc}"
        ) from None
    return current


def load_current(cert_dir: Path, prefix: str) -> Stored | None:
    """The current certificate and its key, if both are there and readable."""
    return load_pair(current_path(cert_dir, prefix))


def load_pair(path: Path) -> Stored | None:
    try:
        data = path.read_bytes()
        cert = x509.load_pem_x509_certificate(data)
        serialization.load_pem_private_key(data, None)
    except (OSError, ValueError, TypeError):
        return None
    return Stored(path, cert.not_valid_before_utc, cert.not_valid_after_utc)


def rotation_deadline(
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    rand: Callable[[], float] = random.random,
) -> datetime.datetime:
    """The certificate manager's deadline: notBefore + a jittered 70-90 % of the life."""
    total = (not_after - not_before).total_seconds()
    return not_before + datetime.timedelta(seconds=total * (0.7 + 0.2 * rand()))


# --- rotation -------------------------------------------------------------------------------------


class CertificateManager:
    """Keeps one certificate of the store current: requested when missing or expired, renewed at
    the rotation deadline, `on_rotated(path)` called with the new current pem."""

    def __init__(
        self,
        template: CsrTemplate,
        cert_dir: Path,
        on_rotated: Callable[[Path], Awaitable[None]],
        wait_seconds: float = ROTATION_WAIT_SECONDS,
        on_expired: Callable[[], None] | None = None,
        exit_after: float = EXIT_AFTER_SECONDS,
    ) -> None:
        self._template = template
        self._cert_dir = cert_dir
        self._on_rotated = on_rotated
        self._wait = wait_seconds
        # The client's: its certificate expired this long ago and no new one came (the kubelet
        # exits then, so that a restart bootstraps again).
        self._on_expired = on_expired
        self._exit_after = exit_after
        self.rotations = 0

    def current(self) -> Stored | None:
        """The stored certificate, if valid now (reads files: call it off the loop)."""
        stored = load_current(self._cert_dir, self._template.prefix)
        now = datetime.datetime.now(datetime.UTC)
        if stored is None or not stored.not_before <= now < stored.not_after:
            return None
        return stored

    async def run(self, api: CsrApi) -> None:
        retry = Retry(2.0, 300.0)  # failures: 2 s doubling to 5 min
        what = self._template.signer
        while True:
            stored = await asyncio.to_thread(self.current)
            # The certificate held, even expired (it may have expired before this look, on a
            # slow start): what the exit after EXIT_AFTER_SECONDS counts from.
            held = stored or await asyncio.to_thread(
                load_current, self._cert_dir, self._template.prefix
            )
            if stored is not None:
                deadline = rotation_deadline(stored.not_before, stored.not_after)
                wait = (deadline - datetime.datetime.now(datetime.UTC)).total_seconds()
                log.info(
                    "certificate %s expires %s, rotation deadline %s",
                    what,
                    stored.not_after.isoformat(),
                    deadline.isoformat(),
                )
                if wait > 0:
                    await asyncio.sleep(wait)
            while True:  # past the deadline (or none held): until a new one is stored
                try:
                    path = await self._renew(api)
                    break
                except (CertificateError, ApiError) as exc:
                    delay = retry.delay()
                    log.error(
                        "rotating the %s certificate: %s (retrying in %.0fs)", what, exc, delay
                    )
                    self._check_expired(held)
                    await asyncio.sleep(delay)
            retry.reset()
            self.rotations += 1
            done = "rotated" if stored is not None else "issued"
            log.info("certificate %s %s: %s", what, done, path)
            await self._on_rotated(path)

    def _check_expired(self, stored: Stored | None) -> None:
        if self._on_expired is None or stored is None:
            return
        now = datetime.datetime.now(datetime.UTC)
        if now >= stored.not_after + datetime.timedelta(seconds=self._exit_after):
            log.error(
                "the client certificate expired at %s and no new one was issued within %gs",
                stored.not_after.isoformat(),
                self._exit_after,
            )
            self._on_expired()

    async def _renew(self, api: CsrApi) -> Path:
        key = await asyncio.to_thread(new_key)
        pem = await request_certificate(api, key, self._template, None, self._wait)
        return await asyncio.to_thread(store_pair, self._cert_dir, self._template.prefix, pem, key)
