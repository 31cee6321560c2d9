"""The node's certificates from the cluster: what a CSR asks for, the rotation deadline, the store
under --cert-dir, the bootstrap against the fixture API server (HTTPS, a bootstrap token), and
the fixture's CSR API as kube-apiserver validates it."""

from __future__ import annotations

import asyncio
import base64
import datetime
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pykubelet.client.kubeapi import ApiError, KubeApi
from pykubelet.cluster.bootstrap import (
    BootstrapError,
    client_config_still_valid,
    load_client_cert,
    uses_store,
)
from pykubelet.cluster.certificates import (
    CertificateError,
    CertificateManager,
    client_template,
    csr_object,
    csr_pem,
    digested_name,
    issued_certificate,
    load_current,
    new_key,
    rotation_deadline,
    serving_template,
    store_pair,
)
from tests.fixtures.apiserver import ApiServer, wait_until
from tests.fixtures.apiserver.pki import make_ca, make_client_cert

NODE = "n1"
CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


def _csr(pem: bytes) -> x509.CertificateSigningRequest:
    return x509.load_pem_x509_csr(pem)


def test_client_csr_asks_for_the_node_identity_and_client_usages() -> None:
    key = new_key()
    template = client_template("worker-1")
    request = _csr(csr_pem(key, template))
    subject = request.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:worker-1"
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:nodes"
    ]
    assert request.is_signature_valid
    body = csr_object(key, template, None)
    assert body["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert body["spec"]["usages"] == ["digital signature", "client auth"]
    assert body["metadata"] == {"generateName": "csr-"}
    assert base64.b64decode(body["spec"]["request"]).startswith(b"-----BEGIN CERTIFICATE REQUEST")
    with pytest.raises(x509.ExtensionNotFound):
        request.extensions.get_extension_for_class(x509.SubjectAlternativeName)


def test_serving_csr_names_the_node() -> None:
    template = serving_template("worker-1", ["worker-1", "host.example"], ["10.0.0.5", "::1"])
    request = _csr(csr_pem(new_key(), template))
    sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == ["host.example", "worker-1"]
    assert sorted(str(ip) for ip in sans.get_values_for_type(x509.IPAddress)) == [
        "10.0.0.5",
        "::1",
    ]
    assert template.signer == "kubernetes.io/kubelet-serving"
    assert template.usages == ("digital signature", "server auth")


def test_bootstrap_csr_name_is_stable_for_one_key() -> None:
    key = new_key()
    template = client_template("n1")
    name = digested_name(key, template)
    assert name.startswith("node-csr-")
    assert name == digested_name(key, template)
    assert name != digested_name(new_key(), template)


def test_rotation_deadline_is_70_to_90_percent_of_the_life() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    end = start + datetime.timedelta(hours=100)
    assert rotation_deadline(start, end, lambda: 0.0) == start + datetime.timedelta(hours=70)
    assert rotation_deadline(start, end, lambda: 1.0) == start + datetime.timedelta(hours=90)
    seen = {rotation_deadline(start, end) for _ in range(200)}
    assert all(start + datetime.timedelta(hours=70) <= d <= start + datetime.timedelta(hours=90)
               for d in seen)  # fmt: skip
    assert len(seen) > 100  # jittered, not one fixed point


def _signed(key_cn: str = "system:node:n1") -> tuple[object, bytes]:
    from cryptography.hazmat.primitives import serialization

    ca = make_ca("test-ca")
    key, cert = make_client_cert(ca, key_cn, "system:nodes")
    return key, cert.public_bytes(serialization.Encoding.PEM)


def test_store_layout_and_modes(tmp_path: Path) -> None:
    key, pem = _signed()
    cert_dir = tmp_path / "pki"
    current = store_pair(cert_dir, "kubelet-client", pem, key)  # type: ignore[arg-type]
    assert current == cert_dir / "kubelet-client-current.pem"
    assert current.is_symlink()
    target = current.resolve()
    assert target.name.startswith("kubelet-client-") and target.name != current.name
    datetime.datetime.strptime(target.name[len("kubelet-client-") : -4], "%Y-%m-%d-%H-%M-%S")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(cert_dir.stat().st_mode) == 0o700
    text = target.read_text()
    assert text.index("BEGIN CERTIFICATE") < text.index("BEGIN EC PRIVATE KEY")
    stored = load_current(cert_dir, "kubelet-client")
    assert stored is not None and stored.path == current
    # A second pair replaces the link; the first file stays.
    key2, pem2 = _signed()
    store_pair(cert_dir, "kubelet-client", pem2, key2)  # type: ignore[arg-type]
    pems = sorted(p.name for p in cert_dir.iterdir())
    assert "kubelet-client-current.pem" in pems and len(pems) >= 2
    assert current.read_bytes().startswith(pem2.rstrip(b"\n"))


def test_denied_and_failed_csrs_say_so_with_name_and_reason() -> None:
    obj = {
        "metadata": {"name": "node-csr-x"},
        "status": {"conditions": [{"type": "Denied", "status": "True", "reason": "NotOurs",
                                   "message": "unknown node"}]},
    }  # fmt: skip
    with pytest.raises(CertificateError) as err:
        issued_certificate(obj)
    assert str(err.value) == (
        "certificate signing request node-csr-x is denied, reason: NotOurs, message: unknown node"
    )
    obj["status"]["conditions"][0]["type"] = "Failed"
    with pytest.raises(CertificateError, match="node-csr-x is failed, reason: NotOurs"):
        issued_certificate(obj)
    pending = {"metadata": {"name": "a"}, "status": {"conditions": [{"type": "Approved"}]}}
    assert issued_certificate(pending) is None  # approved, not yet issued


def _kubeconfig(path: Path, cert: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"client-certificate": str(cert),
                                                 "client-key": str(cert)}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )  # fmt: skip
    return path


def test_client_config_validity(tmp_path: Path) -> None:
    assert not client_config_still_valid(tmp_path / "missing")
    key, pem = _signed()
    current = store_pair(tmp_path / "pki", "kubelet-client", pem, key)  # type: ignore[arg-type]
    kubeconfig = _kubeconfig(tmp_path / "kc", current)
    assert client_config_still_valid(kubeconfig)
    assert uses_store(kubeconfig, tmp_path / "pki")
    assert not uses_store(kubeconfig, tmp_path / "elsewhere")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    assert not client_config_still_valid(_kubeconfig(tmp_path / "kc2", garbage))


# --- against the fixture API server (HTTPS) ---------------------------------------------------


@pytest.fixture
def https_server() -> Iterator[ApiServer]:
    srv = ApiServer(tls=True)
    srv.start()
    yield srv
    srv.close()


async def _connect(path: Path) -> KubeApi:
    return await KubeApi.connect(path, NODE)


async def test_bootstrap_writes_the_certificate_and_the_kubeconfig(
    https_server: ApiServer, tmp_path: Path
) -> None:
    token = https_server.add_bootstrap_token("abcdef", "0123456789abcdef")
    boot = https_server.write_bootstrap_kubeconfig(tmp_path / "bootstrap.conf", token)
    kubeconfig, cert_dir = tmp_path / "kubelet.conf", tmp_path / "pki"
    await load_client_cert(kubeconfig, boot, cert_dir, NODE, _connect)
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    user = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    assert user == {
        "client-certificate": str(cert_dir / "kubelet-client-current.pem"),
        "client-key": str(cert_dir / "kubelet-client-current.pem"),
    }
    assert not (cert_dir / "kubelet-client.key.tmp").exists()
    [csr] = https_server.list("certificatesigningrequests")
    assert csr["metadata"]["name"].startswith("node-csr-")
    assert csr["spec"]["username"] == "system:bootstrap:abcdef"
    assert "system:bootstrappers" in csr["spec"]["groups"]
    assert [c["reason"] for c in csr["status"]["conditions"]] == ["AutoApproved"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(csr["status"]["certificate"]))
    assert cert.subject.rfc4514_string() == "CN=system:node:n1,O=system:nodes"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # The node's own credentials now: its requests are system:node:n1's.
    api = await KubeApi.connect(kubeconfig, NODE)
    try:
        await api.get("/api/v1/nodes")  # what the node may read (no namespaces)
    finally:
        await api.close()
    assert https_server.requests()[-1].user == "system:node:n1"
    # Valid now: a second start sends no CSR.
    await load_client_cert(kubeconfig, boot, cert_dir, NODE, _connect)
    assert len(https_server.list("certificatesigningrequests")) == 1


async def test_a_bootstrap_token_may_only_ask_for_certificates(
    https_server: ApiServer, tmp_path: Path
) -> None:
    token = https_server.add_bootstrap_token("abcdef", "0123456789abcdef")
    api = await _connect(https_server.write_bootstrap_kubeconfig(tmp_path / "b", token))
    try:
        with pytest.raises(ApiError) as err:
            await api.create("/api/v1/nodes", {"metadata": {"name": NODE}})
        assert err.value.status == 403
        assert err.value.message == (
            'nodes is forbidden: User "system:bootstrap:abcdef" cannot create resource "nodes" '
            'in API group "" at the cluster scope'
        )
    finally:
        await api.close()
    wrong = https_server.write_bootstrap_kubeconfig(tmp_path / "w", "abcdef.ffffffffffffffff")
    api = await _connect(wrong)
    try:
        with pytest.raises(ApiError) as err:
            await api.get(CSRS)
        assert err.value.status == 401
    finally:
        await api.close()


async def test_a_denied_bootstrap_csr_is_an_error_naming_it(
    https_server: ApiServer, tmp_path: Path
) -> None:
    token = https_server.add_bootstrap_token("abcdef", "0123456789abcdef", auto_approve=False)
    boot = https_server.write_bootstrap_kubeconfig(tmp_path / "bootstrap.conf", token)
    task = asyncio.create_task(
        load_client_cert(tmp_path / "kc", boot, tmp_path / "pki", NODE, _connect)
    )
    csrs = await asyncio.to_thread(
        wait_until, "the CSR", lambda: https_server.list("certificatesigningrequests")
    )
    name = csrs[0]["metadata"]["name"]
    await asyncio.to_thread(https_server.deny_csr, name, "UnknownNode", "no such machine")
    with pytest.raises(BootstrapError) as err:
        await task
    assert str(err.value) == (
        f"certificate signing request {name} is denied, reason: UnknownNode, "
        "message: no such machine"
    )
    assert not (tmp_path / "kc").exists()


async def test_rotation_renews_with_the_current_certificate(
    https_server: ApiServer, tmp_path: Path
) -> None:
    token = https_server.add_bootstrap_token("abcdef", "0123456789abcdef")
    boot = https_server.write_bootstrap_kubeconfig(tmp_path / "bootstrap.conf", token)
    https_server.set_cluster_signing_duration(4)
    kubeconfig, cert_dir = tmp_path / "kubelet.conf", tmp_path / "pki"
    await load_client_cert(kubeconfig, boot, cert_dir, NODE, _connect)
    first = load_current(cert_dir, "kubelet-client")
    assert first is not None
    assert (first.not_after - first.not_before).total_seconds() == pytest.approx(4, abs=1)
    api = await KubeApi.connect(kubeconfig, NODE)
    rotated: list[Path] = []
    twice = asyncio.Event()

    async def on_rotated(path: Path) -> None:
        rotated.append(path)
        await api.reload(kubeconfig, NODE)
        if len(rotated) >= 2:
            twice.set()

    manager = CertificateManager(client_template(NODE), cert_dir, on_rotated)
    task = asyncio.create_task(manager.run(api))
    try:
        await asyncio.wait_for(twice.wait(), 60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    csrs = https_server.list("certificatesigningrequests")
    renewals = [c for c in csrs if not c["metadata"]["name"].startswith("node-csr-")]
    assert len(renewals) >= 2
    # Renewed with the node's own certificate, approved as a renewal of its identity.
    assert {c["spec"]["username"] for c in renewals} == {"system:node:n1"}
    assert all(c["metadata"]["name"].startswith("csr-") for c in renewals)
    second = load_current(cert_dir, "kubelet-client")
    assert second is not None and second.not_after > first.not_after


async def test_fixture_csr_validation(https_server: ApiServer, tmp_path: Path) -> None:
    kc = https_server.write_kubeconfig(tmp_path / "kc")
    api = await _connect(kc)
    body = csr_object(new_key(), client_template(NODE), "bad")
    try:
        short = {**body, "spec": {**body["spec"], "expirationSeconds": 599}}
        with pytest.raises(ApiError) as err:
            await api.create(CSRS, short)
        assert err.value.status == 422
        assert "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than " \
               "600 seconds (10 minutes)" in err.value.message  # fmt: skip
        not_pem = {**body, "spec": {**body["spec"], "request": base64.b64encode(b"x").decode()}}
        with pytest.raises(ApiError, match="PEM block type must be CERTIFICATE REQUEST"):
            await api.create(CSRS, not_pem)
        no_signer = {**body, "spec": {**body["spec"], "signerName": "", "usages": ["nope"]}}
        with pytest.raises(ApiError) as err:
            await api.create(CSRS, no_signer)
        assert "spec.signerName: Required value" in err.value.message
        assert 'spec.usages[0]: Unsupported value: "nope"' in err.value.message
        # A CSR for another node's serving certificate with client usages: the signer fails it.
        wrong = csr_object(new_key(), serving_template(NODE, [NODE], []), "wrong-usages")
        wrong["spec"]["usages"] = ["digital signature", "client auth"]
        await api.create(CSRS, wrong)
        await asyncio.to_thread(https_server.approve_csr, "wrong-usages")
        failed = await asyncio.to_thread(
            wait_until,
            "the signer's verdict",
            lambda: [
                c
                for c in (https_server.get("certificatesigningrequests", "wrong-usages") or {})
                .get("status", {})
                .get("conditions", [])
                if c["type"] == "Failed"
            ],
        )
        assert failed[0]["reason"] == "SignerValidationFailure"
        assert "usages did not match" in failed[0]["message"]
    finally:
        await api.close()


def test_flags_and_config_fields(tmp_path: Path) -> None:
    from pykubelet.cmd.cli import parse_options

    config = tmp_path / "config.yaml"
    config.write_text(
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n"
        "rotateCertificates: true\nserverTLSBootstrap: true\n"
    )
    opts = parse_options(
        ["--config", str(config), "--kubeconfig", "kc", "--bootstrap-kubeconfig", "b"]
    )
    assert opts.rotate_certificates and opts.server_tls_bootstrap
    assert opts.bootstrap_kubeconfig == Path("b")
    configz = opts.kubelet_configuration()
    assert configz["rotateCertificates"] is True and configz["serverTLSBootstrap"] is True
    with pytest.raises(SystemExit):
        parse_options(["--bootstrap-kubeconfig", "b"])  # needs --kubeconfig


async def test_an_expired_client_certificate_without_a_renewal_ends_the_agent(
    https_server: ApiServer, tmp_path: Path
) -> None:
    token = https_server.add_bootstrap_token("abcdef", "0123456789abcdef")
    boot = https_server.write_bootstrap_kubeconfig(tmp_path / "bootstrap.conf", token)
    https_server.set_cluster_signing_duration(2)
    kubeconfig, cert_dir = tmp_path / "kubelet.conf", tmp_path / "pki"
    await load_client_cert(kubeconfig, boot, cert_dir, NODE, _connect)
    api = await KubeApi.connect(kubeconfig, NODE)
    await asyncio.to_thread(https_server.stop)  # no renewal can be had
    expired = asyncio.Event()

    async def on_rotated(path: Path) -> None:
        raise AssertionError("rotated without an API server")

    manager = CertificateManager(
        client_template(NODE),
        cert_dir,
        on_rotated,
        wait_seconds=0.5,
        on_expired=expired.set,
        exit_after=1.0,
    )
    task = asyncio.create_task(manager.run(api))
    try:
        await asyncio.wait_for(expired.wait(), 60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    stored = load_current(cert_dir, "kubelet-client")
    assert stored is not None
    assert datetime.datetime.now(datetime.UTC) >= stored.not_after + datetime.timedelta(seconds=1)
