"""The kubeconfig user's credentials kept fresh without a restart, against the fixture API server
accepting only the current credential: an exec plugin (a real script counting its runs, each
ExecCredential short-lived) re-run before expiry while the node renews its Lease and patches its
status, and re-run on a 401; a tokenFile re-read on a 401 and periodically; client certificate
files rewritten in place picked up; bad plugin output refused with the field named."""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykubelet.client.kubeapi import ConfigError, KubeApi, env_proxy, read_credentials
from pykubelet.cluster.node import NodeAgent
from pykubelet.common.machine import read_machine_facts
from tests.fixtures.apiserver import ApiServer
from tests.fixtures.apiserver.authn import User
from tests.fixtures.apiserver.pki import make_client_cert, write_pem

NODE = "n1"
NODE_USER = User(f"system:node:{NODE}", groups=("system:nodes",))

# Each run appends "<token> <expiry, Unix time; 0: none>" to the issued file (argv[1]) and prints
# an ExecCredential for it; argv[2] is the credential's life in seconds (0: no expiry).
PLUGIN = """#!{python}
import datetime, json, os, sys, time
issued, life = sys.argv[1], float(sys.argv[2])
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and info["spec"]["interactive"] is False, info
with open(issued, "a+") as f:
    f.seek(0)
    n = sum(1 for line in f if not line.startswith("revoked")) + 1
    token = "exec-token-%d" % n
    expires = time.time() + life if life else 0
    f.write("%s %r\\n" % (token, expires))
status = {{"token": token}}
if life:
    at = datetime.datetime.fromtimestamp(expires, datetime.UTC)
    status["expirationTimestamp"] = at.isoformat().replace("+00:00", "Z")
print(json.dumps({{"apiVersion": os.environ["API_VERSION"], "kind": "ExecCredential",
                  "status": status}}))
"""


def write_plugin(tmp_path: Path, body: str | None = None) -> Path:
    plugin = tmp_path / "credential-plugin"
    plugin.write_text(PLUGIN.format(python=sys.executable) if body is None else body)
    plugin.chmod(0o755)
    return plugin


def kubeconfig_with(server: ApiServer, tmp_path: Path, user: dict[str, Any]) -> Path:
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = user
    path.write_text(yaml.safe_dump(config))
    return path


def exec_user(plugin: Path, issued: Path, life: float, **extra: Any) -> dict[str, Any]:
    version = "client.authentication.k8s.io/v1"
    return {
        "exec": {
            "apiVersion": version,
            "command": str(plugin),
            "args": [str(issued), str(life)],
            "env": [{"name": "API_VERSION", "value": version}],
            "interactiveMode": "Never",
            **extra,
        }
    }


def only_the_last_issued(issued: Path, user: str = NODE_USER.name) -> Any:
    """The fixture's resolver: the last token the plugin issued, until it expires or is
    revoked; it is `user`, a node."""

    def resolve(token: str) -> User | None:
        lines = issued.read_text().splitlines() if issued.exists() else []
        if not lines or lines[-1].startswith("revoked"):
            return None
        current, expires = lines[-1].split()
        if token != current or (float(expires) and time.time() >= float(expires)):
            return None
        return User(user, groups=("system:nodes",))

    return resolve


def unauthorized(server: ApiServer) -> int:
    """Requests the server could not authenticate (answered 401)."""
    return sum(1 for r in server.requests() if not r.user)


def runs(issued: Path) -> int:
    return sum(1 for line in issued.read_text().splitlines() if not line.startswith("revoked"))


async def test_the_node_keeps_working_across_several_exec_credential_expiries(
    server: ApiServer, tmp_path: Path
) -> None:
    issued = tmp_path / "issued"
    server.set_token_resolver(only_the_last_issued(issued))
    plugin = write_plugin(tmp_path)
    kubeconfig = kubeconfig_with(server, tmp_path, exec_user(plugin, issued, 2.0))
    api = await KubeApi.connect(kubeconfig, NODE)
    agent = NodeAgent(
        NODE,
        host_ip="10.1.2.3",
        max_pods=10,
        runtime_name="process",
        facts=read_machine_facts(tmp_path),
        health_problems=list,
        lease_period=0.2,
        status_period=0.2,
        report_period=0.2,
    )
    task = asyncio.create_task(agent.run(api))
    try:
        await asyncio.wait_for(agent.registered.wait(), 10)
        renewed = [agent.lease_renewals]
        for _ in range(400):  # four credentials: three expiries lived through
            if runs(issued) >= 4:
                break
            await asyncio.sleep(0.05)
            if renewed[-1] != agent.lease_renewals:
                renewed.append(agent.lease_renewals)
        assert runs(issued) >= 4
        await asyncio.sleep(0.5)
        assert agent.lease_renewals > renewed[-1]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    # Re-run before each expiry: no request was ever refused, and all were the node's.
    assert unauthorized(server) == 0
    assert {r.user for r in server.requests()} == {NODE_USER.name}
    assert len(renewed) >= 15
    statuses = [r for r in server.requests() if r.method == "PATCH" and r.path.endswith("/status")]
    assert len(statuses) >= 10


async def test_a_401_runs_the_plugin_again_and_the_request_goes_through(
    server: ApiServer, tmp_path: Path
) -> None:
    issued = tmp_path / "issued"
    server.set_token_resolver(only_the_last_issued(issued))
    plugin = write_plugin(tmp_path)
    kubeconfig = kubeconfig_with(server, tmp_path, exec_user(plugin, issued, 0))  # no expiry
    api = await KubeApi.connect(kubeconfig, NODE)
    try:
        await api.get("/api/v1/nodes")
        await api.get("/api/v1/nodes")
        assert runs(issued) == 1  # kept: it never expires
        with issued.open("a") as f:
            f.write("revoked 0\n")  # the server no longer takes it
        await api.get("/api/v1/nodes")
        assert runs(issued) == 2 and unauthorized(server) == 1
        # A watch refused with 401 gets the plugin run for the next try.
        with issued.open("a") as f:
            f.write("revoked 0\n")
        with pytest.raises(Exception) as info:
            async for _ in api.watch_pods(f"spec.nodeName={NODE}", "0", 5):
                break
        assert getattr(info.value, "status", None) == 401
        assert runs(issued) == 3
        await api.get("/api/v1/nodes")
        assert unauthorized(server) == 2
    finally:
        await api.close()


async def test_a_token_file_is_re_read_on_a_401_and_every_period(
    server: ApiServer, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-token-1\n")

    def resolve(token: str) -> User | None:
        return NODE_USER if token == token_file.read_text().strip() else None

    server.set_token_resolver(resolve)
    kubeconfig = kubeconfig_with(server, tmp_path, {"tokenFile": "token"})  # relative
    creds = await asyncio.to_thread(read_credentials, kubeconfig)
    creds.token_file_period = 0.3
    api = await KubeApi.connect(kubeconfig, NODE, creds)
    try:
        await api.get("/api/v1/nodes")
        token_file.write_text("file-token-2\n")  # rotated: the old one is refused now
        await api.get("/api/v1/nodes")
        assert unauthorized(server) == 1
        token_file.write_text("file-token-3\n")
        await asyncio.sleep(0.5)
        await api.get("/api/v1/nodes")  # re-read before it is sent: no 401
        assert unauthorized(server) == 1
    finally:
        await api.close()


async def test_a_kubeconfig_rewritten_with_another_credential_is_picked_up(
    server: ApiServer, tmp_path: Path
) -> None:
    server.add_token("token-a", "alice")
    server.add_token("token-b", "bob")
    kubeconfig = kubeconfig_with(server, tmp_path, {"token": "token-a"})
    creds = await asyncio.to_thread(read_credentials, kubeconfig)
    creds.file_check_period = 0.2
    api = await KubeApi.connect(kubeconfig, NODE, creds)
    try:
        await api.get("/api/v1/namespaces")
        kubeconfig_with(server, tmp_path, {"token": "token-b"})
        await asyncio.sleep(0.4)
        await api.get("/api/v1/namespaces")
    finally:
        await api.close()
    users = [r.user for r in server.requests() if r.path == "/api/v1/namespaces"]
    assert users == ["alice", "bob"]


async def test_client_certificate_files_rewritten_in_place_are_picked_up(
    tmp_path: Path,
) -> None:
    server = ApiServer(tls=True, token=None)
    server.start()
    try:
        pki = tmp_path / "pki"
        cert, key = write_pem(pki, "client", *make_client_cert(server.pki.ca, "first", "admins"))
        user = {"client-certificate": str(cert), "client-key": str(key)}
        kubeconfig = kubeconfig_with(server, tmp_path, user)
        creds = await asyncio.to_thread(read_credentials, kubeconfig)
        creds.file_check_period = 0.2
        api = await KubeApi.connect(kubeconfig, NODE, creds)
        try:
            await api.get("/api/v1/nodes")
            write_pem(pki, "client", *make_client_cert(server.pki.ca, "second", "admins"))
            await asyncio.sleep(0.4)
            await api.get("/api/v1/nodes")
        finally:
            await api.close()
        users = [r.user for r in server.requests() if r.path == "/api/v1/nodes"]
        assert users == ["first", "second"]
    finally:
        server.close()


async def test_a_plugin_certificate_is_used_and_replaced_when_it_expires(tmp_path: Path) -> None:
    server = ApiServer(tls=True, token=None)
    server.start()
    credential = tmp_path / "credential.json"

    def issue(cn: str, life: float) -> float:
        key, cert = make_client_cert(server.pki.ca, cn, "admins")
        cert_pem, key_pem = write_pem(tmp_path / "pki", cn, key, cert)
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=life)
        status = {
            "clientCertificateData": cert_pem.read_text(),
            "clientKeyData": key_pem.read_text(),
            "expirationTimestamp": at.isoformat().replace("+00:00", "Z"),
        }
        version = "client.authentication.k8s.io/v1"
        credential.write_text(
            json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status})
        )
        return at.timestamp()

    try:
        expires = issue("exec-cert-1", 3.0)
        plugin = write_plugin(tmp_path, f"#!/bin/sh\nexec cat {credential}\n")
        kubeconfig = kubeconfig_with(server, tmp_path, exec_user(plugin, tmp_path / "x", 0))
        api = await KubeApi.connect(kubeconfig, NODE)
        try:
            await api.get("/api/v1/nodes")
            issue("exec-cert-2", 60.0)
            await asyncio.sleep(max(0.0, expires - time.time()))  # the first one has expired
            await api.get("/api/v1/nodes")
            await api.get("/api/v1/nodes")
            creds = api.credentials
            assert creds is not None and creds.exec_runs >= 2
            assert "BEGIN" not in repr(creds)  # no key nor token in a repr
            [tmp] = {p.parent for p in creds.exec_cert or ()}
            assert oct(tmp.stat().st_mode & 0o777) == "0o700"
        finally:
            await api.close()
        assert not tmp.exists()  # the key is not left behind
        users = [r.user for r in server.requests() if r.path == "/api/v1/nodes"]
        assert users == ["exec-cert-1", "exec-cert-2", "exec-cert-2"]
    finally:
        server.close()


@pytest.mark.parametrize(
    ("output", "exec_extra", "error"),
    [
        ("not json", {}, "its output is not JSON"),
        (
            '{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", '
            '"status": {"token": "t"}}',
            {},
            "apiVersion: 'client.authentication.k8s.io/v1beta1', the kubeconfig asks for "
            "client.authentication.k8s.io/v1",
        ),
        (
            '{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", '
            '"status": {"token": "t", "expirationTimestamp": "tomorrow"}}',
            {},
            "status.expirationTimestamp: 'tomorrow' is not an RFC 3339 time",
        ),
        (
            '{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", '
            '"status": {}}',
            {},
            "status: neither a token nor a certificate and key",
        ),
        ("", {"interactiveMode": None}, "exec.interactiveMode: Required value"),
    ],
)
async def test_bad_plugin_output_is_refused_naming_the_field(
    server: ApiServer, tmp_path: Path, output: str, exec_extra: dict[str, Any], error: str
) -> None:
    plugin = write_plugin(tmp_path, f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    user = exec_user(plugin, tmp_path / "issued", 0, **exec_extra)
    user["exec"] = {k: v for k, v in user["exec"].items() if v is not None}
    kubeconfig = kubeconfig_with(server, tmp_path, user)
    with pytest.raises(ConfigError) as info:
        await KubeApi.connect(kubeconfig, NODE)
    message = str(info.value)
    assert message.startswith(f"kubeconfig {kubeconfig}, user 'node': "), message
    assert error in message, message


@pytest.mark.parametrize(
    ("url", "env", "expected"),
    [
        ("https://api.example:6443", {"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        ("https://api.example:6443", {"https_proxy": "http://p:1"}, "http://p:1"),
        ("http://api.example:8080", {"HTTPS_PROXY": "http://proxy:3128"}, None),
        ("http://api.example:8080", {"HTTP_PROXY": "http://proxy:3128"}, "http://proxy:3128"),
        (
            "https://api.internal.example",
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "internal.example"},
            None,
        ),
        ("https://127.0.0.1:6443", {"HTTPS_PROXY": "http://proxy:3128"}, None),
        ("https://localhost:6443", {"HTTPS_PROXY": "http://proxy:3128"}, None),
        ("https://[::1]:6443", {"HTTPS_PROXY": "http://proxy:3128"}, None),
        ("https://api.example:6443", {}, None),
    ],
)
def test_the_api_servers_proxy_comes_from_the_environment_as_client_gos(
    monkeypatch: pytest.MonkeyPatch, url: str, env: dict[str, str], expected: str | None
) -> None:
    """Decided once when the client is built (client-go's ProxyFromEnvironment: loopback is
    never proxied), not looked up again at every request."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxy(url) == expected
