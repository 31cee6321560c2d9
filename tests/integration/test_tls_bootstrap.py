"""A node joining the way nodes join: only a bootstrap kubeconfig (a bootstrap token) against the
fixture API server over HTTPS; its client certificate from an auto-approved CSR, renewed before
it expires without a restart (a short --cluster-signing-duration); its serving certificate from
a kubernetes.io/kubelet-serving CSR; a denied CSR reported with its name and reason. As
system:node:<name> the joined node runs a pod, and its certificate may not label its Node
node-role.kubernetes.io/control-plane (the fixture's NodeRestriction)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import NODE, Agent, wait_for
from tests.integration.kubelet_node import https_apiserver
from tests.integration.test_cluster import pod_body
from tests.integration.test_kubelet_api import kubectl

TOKEN_ID, TOKEN_SECRET = "abcdef", "0123456789abcdef"


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


def _bootstrap_flags(apiserver: ApiServer, tmp_path: Path, auto_approve: bool = True) -> list[str]:
    token = apiserver.add_bootstrap_token(TOKEN_ID, TOKEN_SECRET, auto_approve=auto_approve)
    boot = apiserver.write_bootstrap_kubeconfig(tmp_path / "bootstrap-kubelet.conf", token)
    return [
        "--bootstrap-kubeconfig",
        str(boot),
        "--kubeconfig",
        str(tmp_path / "kubelet.conf"),
        "--cert-dir",
        str(tmp_path / "pki"),
        "--node-ip",
        "127.0.0.1",
    ]


def _csrs(apiserver: ApiServer, signer: str) -> list[dict[str, object]]:
    return [
        c
        for c in apiserver.list("certificatesigningrequests")
        if c["spec"]["signerName"] == signer  # type: ignore[index]
    ]


def test_a_node_joins_with_a_bootstrap_token(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    agent = start_agent(*_bootstrap_flags(apiserver, tmp_path))
    node = wait_for("the Node", lambda: apiserver.get("nodes", NODE), timeout=30)
    assert node["metadata"]["name"] == NODE
    [csr] = apiserver.list("certificatesigningrequests")
    assert csr["spec"]["username"] == f"system:bootstrap:{TOKEN_ID}"
    assert csr["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
    assert [c["reason"] for c in csr["status"]["conditions"]] == ["AutoApproved"]
    # The Node was registered by the node's own identity, not the token.
    writers = {r.user for r in apiserver.requests() if r.path == "/api/v1/nodes"}
    assert writers == {f"system:node:{NODE}"}
    cert_dir = tmp_path / "pki"
    current = cert_dir / "kubelet-client-current.pem"
    assert current.is_symlink()
    assert stat.S_IMODE(current.resolve().stat().st_mode) == 0o600
    kubeconfig = yaml.safe_load((tmp_path / "kubelet.conf").read_text())
    assert kubeconfig["users"][0]["user"]["client-certificate"] == str(current)
    assert stat.S_IMODE((tmp_path / "kubelet.conf").stat().st_mode) == 0o600
    log = agent.log()
    assert "PRIVATE KEY" not in log
    # A restart uses the certificate it has: no second CSR.
    agent.stop()
    agent.start(timeout=30)
    wait_for(
        "the restarted node's Lease",
        lambda: any(
            r.user == f"system:node:{NODE}" and "leases" in r.path and r.at > time.monotonic() - 5
            for r in apiserver.requests()
        ),
        timeout=30,
    )
    assert len(apiserver.list("certificatesigningrequests")) == 1
    # As system:node:<name> (Node authorizer + NodeRestriction) it still runs a pod.
    apiserver.create("pods", pod_body("joined", NODE, "echo up; sleep 3600"))
    wait_for(
        "the pod Running",
        lambda: (
            (p := apiserver.get("pods", "joined")) and p.get("status", {}).get("phase") == "Running"
        ),
        timeout=60,
    )
    # ...and its own certificate may not give its Node a control-plane label.
    context = ssl.create_default_context(cafile=str(apiserver.pki.ca_file))
    context.load_cert_chain(str(current))
    patch = urllib.request.Request(
        f"{apiserver.url}/api/v1/nodes/{NODE}",
        data=json.dumps(
            {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}
        ).encode(),
        headers={"Content-Type": "application/merge-patch+json"},
        method="PATCH",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(patch, context=context, timeout=10)
    assert refused.value.code == 403
    assert json.loads(refused.value.read())["message"] == (
        f'nodes "{NODE}" is forbidden: is not allowed to modify labels: '
        "node-role.kubernetes.io/control-plane"
    )
    assert "node-role.kubernetes.io/control-plane" not in (
        (apiserver.get("nodes", NODE) or {})["metadata"].get("labels") or {}
    )


def test_the_client_certificate_rotates_without_a_restart(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    apiserver.set_cluster_signing_duration(20)  # a test's --cluster-signing-duration
    agent = start_agent(*_bootstrap_flags(apiserver, tmp_path), "--rotate-certificates")
    assert agent.proc is not None
    pid = agent.proc.pid
    [bootstrap] = wait_for(
        "the bootstrap CSR", lambda: _csrs(apiserver, "kubernetes.io/kube-apiserver-client-kubelet")
    )
    first = x509.load_pem_x509_certificate(
        base64.b64decode(bootstrap["status"]["certificate"])  # type: ignore[index]
    )
    renewal = wait_for(
        "a renewal CSR issued",
        lambda: [
            c
            for c in _csrs(apiserver, "kubernetes.io/kube-apiserver-client-kubelet")
            if c["spec"]["username"] == f"system:node:{NODE}"  # type: ignore[index]
            and c.get("status", {}).get("certificate")  # type: ignore[attr-defined]
        ],
        timeout=40,
    )[0]
    assert renewal["metadata"]["name"].startswith("csr-")  # type: ignore[index]
    # Past the first certificate's end the node still talks to the API server as itself.
    expired_at = time.monotonic() + (first.not_valid_after_utc.timestamp() - time.time())
    wait_for(
        "a request of the node after its first certificate expired",
        lambda: any(
            r.user == f"system:node:{NODE}" and r.at > expired_at + 1 for r in apiserver.requests()
        ),
        timeout=60,
    )
    assert agent.proc.poll() is None and agent.proc.pid == pid
    pems = sorted(p.name for p in (tmp_path / "pki").glob("kubelet-client-2*.pem"))
    assert len(pems) >= 2
    assert "certificate kubernetes.io/kube-apiserver-client-kubelet rotated" in agent.log()


def _serving_issuer(secure_url: str) -> x509.Certificate:
    parsed = urllib.parse.urlsplit(secure_url)
    pem = ssl.get_server_certificate((parsed.hostname or "127.0.0.1", parsed.port or 0))
    return x509.load_pem_x509_certificate(pem.encode())


def test_the_serving_certificate_comes_from_a_kubelet_serving_csr(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    agent = start_agent(*_bootstrap_flags(apiserver, tmp_path), "--rotate-server-certificates")
    [csr] = wait_for("the serving CSR", lambda: _csrs(apiserver, "kubernetes.io/kubelet-serving"))
    assert csr["spec"]["username"] == f"system:node:{NODE}"  # type: ignore[index]
    request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))  # type: ignore[index]
    sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert NODE in sans.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    # Not auto-approved (csrapproving leaves serving certificates to the cluster's admin).
    assert "conditions" not in (csr.get("status") or {})  # type: ignore[operator]
    name = csr["metadata"]["name"]  # type: ignore[index]
    admin = apiserver.write_kubeconfig(tmp_path / "admin.conf")
    approved = kubectl(admin, "certificate", "approve", name)
    assert approved.returncode == 0, approved.stderr
    assert f"certificatesigningrequest.certificates.k8s.io/{name} approved" in approved.stdout
    cert = wait_for(
        "the issued serving certificate on the kubelet port",
        lambda: (
            (c := _serving_issuer(agent.secure_url)).issuer.rfc4514_string() == "CN=fixture-ca"
            and c
        ),
    )
    assert cert.subject.rfc4514_string() == f"CN=system:node:{NODE},O=system:nodes"
    current = tmp_path / "pki" / "kubelet-server-current.pem"
    assert stat.S_IMODE(current.resolve().stat().st_mode) == 0o600


def test_a_denied_csr_ends_the_start_with_its_name_and_reason(
    apiserver: ApiServer, tmp_path: Path
) -> None:
    flags = _bootstrap_flags(apiserver, tmp_path, auto_approve=False)
    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pykubelet", "--root-dir", str(tmp_path / "root"),
             "--read-only-port", "0", "--port", "0", "--node-name", NODE, *flags],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env={**os.environ},
        )  # fmt: skip
    try:
        [csr] = wait_for(
            "the CSR", lambda: apiserver.list("certificatesigningrequests"), timeout=30
        )
        name = csr["metadata"]["name"]
        apiserver.deny_csr(name, "UnknownMachine", "this machine is not in the inventory")
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert (
        f"certificate signing request {name} is denied, reason: UnknownMachine, "
        "message: this machine is not in the inventory"
    ) in text
    assert not (tmp_path / "kubelet.conf").exists()
    assert apiserver.get("nodes", NODE) is None
