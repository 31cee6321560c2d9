"""The parts of `pykubelet exec|port-forward|top` that need no node: kubeconfig and credential
parsing (`cmd/nodeclient.py`), the outcome of a remote command as an exit code (`cmd/remote.py`),
the port mappings (`cmd/portforward_cmd.py`), the summary's figures (`cmd/top_cmd.py`) and the
command lines (`cmd/ctl.py`)."""

from __future__ import annotations

import argparse
import base64
import errno
import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from pykubelet.cmd import ctl
from pykubelet.cmd.attach_cmd import attach_path, wants_tty
from pykubelet.cmd.exec_cmd import choose_container, exec_path
from pykubelet.cmd.nodeclient import (
    DEFAULT_NODE_SERVER,
    Credentials,
    CtlError,
    Pem,
    connection_error,
    credentials_from,
    load_kubeconfig,
    ssl_context,
    status_error,
)
from pykubelet.cmd.portforward_cmd import PortMapping, parse_port_mapping
from pykubelet.cmd.remote import V4, V5, Outcome, outcome
from pykubelet.cmd.top_cmd import usages
from tests.fixtures.apiserver.pki import make_ca, make_client_cert, write_pem

Obj = dict[str, Any]


def parse(*argv: str) -> argparse.Namespace:
    args, command = ctl._split_command(list(argv))
    ns = ctl.build_parser().parse_args(args)
    if command is not None:
        ns.command_line = [*ns.command_line, *command]
    return ns


def kubeconfig(path: Path, *, cluster: Obj, user: Obj, current: str = "node") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "node", "context": {"cluster": "c", "user": "u"}},
            {"name": "other", "context": {"cluster": "c"}},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


# --- kubeconfig and credentials ------------------------------------------------------------------


def test_kubeconfig_files_relative_to_it_and_data(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = kubeconfig(
        tmp_path / "sub" / "config",
        cluster={"server": "https://10.0.0.5:10250", "certificate-authority": "ca.crt"},
        user={
            "client-certificate-data": base64.b64encode(b"CERT").decode(),
            "client-key": "/abs/key.pem",
            "token": "t0k",
        },
    )
    creds = load_kubeconfig(path)
    assert creds.server == "https://10.0.0.5:10250"
    assert creds.certificate_authority == Pem(
        str(tmp_path / "sub" / "ca.crt"), path=tmp_path / "sub" / "ca.crt"
    )
    assert creds.client_certificate is not None and creds.client_certificate.data == b"CERT"
    assert "client-certificate-data of kubeconfig" in creds.client_certificate.origin
    assert creds.client_key == Pem("/abs/key.pem", path=Path("/abs/key.pem"))
    assert creds.token == "t0k"
    # Another context: its cluster, no user.
    other = load_kubeconfig(path, "other")
    assert other.token is None and other.client_certificate is None


def test_kubeconfig_token_file_and_insecure(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://n:1", "insecure-skip-tls-verify": True},
        user={"tokenFile": "token"},
    )
    creds = load_kubeconfig(path)
    assert (creds.token, creds.insecure_skip_tls_verify) == ("from-file", True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[unclosed", "is not valid YAML (line 1)"),
        ("just a string", "is not a kubeconfig"),
        ("clusters: []", "has no current-context: give --context"),
        ("current-context: x\ncontexts: []", 'context "x" not found'),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: gone}}]",
            'cluster "gone" not found',
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {user: u}}]\n"
            "users: [{name: u, user: {client-key-data: '!!notbase64'}}]",
            "client-key-data of kubeconfig",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {user: u}}]\n"
            "users: [{name: u, user: {exec: {command: aws}}}]",
            "uses a credential plugin",
        ),
    ],
)
def test_kubeconfig_errors_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(CtlError) as caught:
        load_kubeconfig(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(CtlError, match=r"cannot read kubeconfig .*/nope: No such file"):
        load_kubeconfig(tmp_path / "nope")


def test_flags_override_the_kubeconfig(tmp_path: Path) -> None:
    path = kubeconfig(
        tmp_path / "config",
        cluster={"server": "https://from-config:10250", "certificate-authority": "ca.crt"},
        user={"token": "config-token"},
    )
    ns = parse(
        "top", "pods", "--kubeconfig", str(path), "--token", "flag-token", "-s", "https://x:1"
    )
    creds = credentials_from(ns)
    assert (creds.server, creds.token) == ("https://x:1", "flag-token")
    assert creds.certificate_authority is not None  # kept from the kubeconfig
    # Nothing given: the node on this machine.
    assert credentials_from(parse("top", "pods")).server == DEFAULT_NODE_SERVER


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--server", "http://127.0.0.1:10255"], "the kubelet API is HTTPS"),
        (["--server", "https://h:port"], "the port is not a number"),
        (["--client-certificate", "c.crt"], "give --client-key"),
        (["--client-key", "c.key"], "give --client-certificate"),
        (["--context", "x"], "--context needs --kubeconfig"),
        (
            ["--insecure-skip-tls-verify", "--certificate-authority", "ca.crt"],
            "root certificates file with the insecure flag is not allowed",
        ),
    ],
)
def test_bad_flag_combinations(argv: list[str], message: str) -> None:
    with pytest.raises(CtlError, match=message):
        credentials_from(parse("top", "pods", *argv))


def test_tls_files_are_named_when_they_do_not_load(tmp_path: Path) -> None:
    ca = make_ca("c")
    cert, key = write_pem(tmp_path, "alice", *make_client_cert(ca, "alice", None))
    other_cert, other_key = write_pem(tmp_path, "bob", *make_client_cert(ca, "bob", None))
    ca_file, _ = write_pem(tmp_path, "ca", *ca)
    # Good: files, and the same as data.
    ctx = ssl_context(
        Credentials(
            certificate_authority=Pem(str(ca_file), path=ca_file),
            client_certificate=Pem(str(cert), path=cert),
            client_key=Pem(str(key), path=key),
        )
    )
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    ssl_context(
        Credentials(
            certificate_authority=Pem("ca-data", data=ca_file.read_bytes()),
            client_certificate=Pem("cert-data", data=cert.read_bytes()),
            client_key=Pem("key-data", data=key.read_bytes()),
        )
    )
    insecure = ssl_context(Credentials(insecure_skip_tls_verify=True))
    assert insecure.verify_mode == ssl.CERT_NONE
    with pytest.raises(CtlError, match=f"cannot load the certificate authority {key}: "):
        ssl_context(Credentials(certificate_authority=Pem(str(key), path=key)))
    missing = tmp_path / "missing.crt"
    with pytest.raises(CtlError, match=f"cannot load {missing}: no such file"):
        ssl_context(
            Credentials(
                client_certificate=Pem(str(missing), path=missing),
                client_key=Pem(str(key), path=key),
            )
        )
    with pytest.raises(CtlError, match=f"client certificate {cert} with the key {other_key}"):
        ssl_context(
            Credentials(
                client_certificate=Pem(str(cert), path=cert),
                client_key=Pem(str(other_key), path=other_key),
            )
        )
    assert other_cert.exists()


def test_connection_errors_say_what_to_change() -> None:
    creds = Credentials(server="https://n:10250")
    refused = OSError(errno.ECONNREFUSED, "Connect call failed ('1.2.3.4', 10250)")
    assert str(connection_error(refused, creds)) == (
        "cannot connect to the node at https://n:10250: connection refused "
        "(is pykubelet running there? see --server)"
    )
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "self-signed certificate"
    assert "is not trusted (self-signed certificate): give --certificate-authority" in str(
        connection_error(untrusted, creds)
    )
    with_ca = Credentials(certificate_authority=Pem("/etc/ca.crt", path=Path("/etc/ca.crt")))
    assert "checked against /etc/ca.crt" in str(connection_error(untrusted, with_ca))
    with_cert = Credentials(
        client_certificate=Pem("/c.crt", path=Path("/c.crt")),
        client_key=Pem("/c.key", path=Path("/c.key")),
    )
    for cut in (aiohttp.ServerDisconnectedError(), OSError(errno.ECONNRESET, "reset")):
        assert "refused the client certificate /c.crt" in str(connection_error(cut, with_cert))


def test_status_errors_carry_the_nodes_message() -> None:
    body = json.dumps(
        {"kind": "Status", "status": "Failure", "message": "Forbidden (user=bob, verb=create)"}
    ).encode()
    assert str(status_error(403, body, "the upgrade of /exec/x")) == (
        "Forbidden (user=bob, verb=create): the upgrade of /exec/x"
    )
    assert str(status_error(401, b'{"message": "Unauthorized"}', "GET /pods")) == (
        "You must be logged in to the node (Unauthorized): GET /pods"
    )
    assert (
        str(status_error(502, b"bad gateway", "GET /pods")) == "bad gateway (HTTP 502): GET /pods"
    )


# --- the outcome of a remote command -------------------------------------------------------------


def _status(**fields: Any) -> bytes:
    return json.dumps({"metadata": {}, **fields}).encode()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", Outcome(0)),
        (_status(status="Success"), Outcome(0)),
        (
            _status(
                status="Failure",
                reason="NonZeroExitCode",
                details={"causes": [{"reason": "ExitCode", "message": "3"}]},
            ),
            Outcome(3, "command terminated with exit code 3"),
        ),
        (
            _status(
                status="Failure",
                reason="NonZeroExitCode",
                details={"causes": [{"reason": "Other"}, {"reason": "ExitCode", "message": "255"}]},
            ),
            Outcome(255, "command terminated with exit code 255"),
        ),
        (
            _status(
                status="Failure",
                reason="NonZeroExitCode",
                details={"causes": [{"reason": "ExitCode", "message": "256"}]},
            ),
            Outcome(1, "error stream protocol error: invalid exit code value '256'"),
        ),
        (
            _status(status="Failure", reason="NonZeroExitCode"),
            Outcome(1, "error stream protocol error: details must be set"),
        ),
        (
            _status(status="Failure", reason="NonZeroExitCode", details={"causes": []}),
            Outcome(1, "error stream protocol error: no ExitCode cause given"),
        ),
        (
            _status(status="Failure", reason="InternalError", message="no such file: nope"),
            Outcome(1, "no such file: nope"),
        ),
        (_status(status="Weird"), Outcome(1, "error stream protocol error: unknown error")),
        (b"not json", Outcome(1, "error stream protocol error: 'not json'")),
    ],
)
def test_outcome_as_kubectl_decodes_it(data: bytes, expected: Outcome) -> None:
    assert outcome(data, V5) == expected
    assert outcome(data, V4) == expected


def test_outcome_before_v4_is_the_text() -> None:
    assert outcome(b"", "channel.k8s.io") == Outcome(0)
    assert outcome(b"it broke", "channel.k8s.io") == Outcome(1, "it broke")


def test_exec_exits_with_the_commands_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pykubelet.cmd import exec_cmd

    async def fake(ns: argparse.Namespace) -> Outcome:
        return Outcome(7, "command terminated with exit code 7")

    monkeypatch.setattr(exec_cmd, "_exec", fake)
    assert ctl.main(["exec", "web", "--", "false"]) == 7
    assert capsys.readouterr().err == "command terminated with exit code 7\n"

    async def failed(ns: argparse.Namespace) -> Outcome:
        return Outcome(1, "no such file: nope")

    monkeypatch.setattr(exec_cmd, "_exec", failed)
    assert ctl.main(["exec", "web", "--", "nope"]) == 1
    assert capsys.readouterr().err == "error: no such file: nope\n"


# --- command lines -------------------------------------------------------------------------------


def test_exec_command_line_after_the_double_dash() -> None:
    ns = parse("exec", "-it", "web", "-c", "main", "-n", "ns", "--", "sh", "-c", "ls -l -- x")
    assert (ns.pod, ns.container, ns.namespace, ns.stdin, ns.tty) == (
        "web",
        "main",
        "ns",
        True,
        True,
    )
    assert ns.command_line == ["sh", "-c", "ls -l -- x"]
    assert parse("exec", "web", "--", "--help").command_line == ["--help"]


def test_exec_path_is_what_the_api_server_forwards() -> None:
    path = exec_path("default", "web-node", "main", ["sh", "-c", "echo a&b"], stdin=True, tty=False)
    assert path == (
        "/exec/default/web-node/main?command=sh&command=-c&command=echo+a%26b"
        "&input=1&output=1&error=1"
    )
    tty = exec_path("default", "web", "main", ["sh"], stdin=True, tty=True)
    assert tty.endswith("?command=sh&input=1&output=1&tty=1")  # a terminal has no stderr


def test_attach_path_is_what_the_api_server_forwards() -> None:
    path = attach_path("default", "web-node", "main", stdin=True, tty=False)
    assert path == "/attach/default/web-node/main?input=1&output=1&error=1"
    assert attach_path("ns", "p", "c", stdin=False, tty=True) == "/attach/ns/p/c?output=1&tty=1"


def test_attach_takes_the_terminal_from_the_containers_spec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As kubectl attach: -t for a container without one is said and dropped; a container with
    # one gets it without -t.
    assert wants_tty(True, {"name": "main"}, quiet=False) is False
    assert capsys.readouterr().err == (
        "error: Unable to use a TTY - container main did not allocate one\n"
    )
    assert wants_tty(True, {"name": "main"}, quiet=True) is False
    assert capsys.readouterr().err == ""
    assert wants_tty(False, {"name": "main", "tty": True}, quiet=False) is True
    assert parse("attach", "web", "-it", "-c", "main", "-q").tty is True


@pytest.mark.parametrize(
    ("argv", "query"),
    [
        ([], {}),
        (["--since", "90s", "--timestamps"], {"sinceSeconds": "90", "timestamps": "true"}),
        (["--since", "1500ms"], {"sinceSeconds": "2"}),  # kubectl rounds up to whole seconds
        (["--since-time", "2027-01-01T00:00:00Z"], {"sinceTime": "2027-01-01T00:00:00Z"}),
        (["--limit-bytes", "10"], {"limitBytes": "10"}),
    ],
)
def test_logs_flags_are_kubectls(argv: list[str], query: dict[str, str]) -> None:
    assert ctl._log_query(parse("logs", "web", *argv)) == query


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--since", "1h", "--since-time", "2027-01-01T00:00:00Z"], "at most one of"),
        (["--since", "0s"], "--since must be greater than 0"),
        (["--since", "soon"], "--since: invalid duration"),
        (["--since-time", "yesterday"], "--since-time: 'yesterday' is not an RFC3339 time"),
        (["--limit-bytes", "0"], "--limit-bytes must be greater than 0"),
    ],
)
def test_bad_logs_flags_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(CtlError, match=message):
        ctl._log_query(parse("logs", "web", *argv))


def test_default_container(capsys: pytest.CaptureFixture[str]) -> None:
    pod: Obj = {
        "metadata": {"name": "p", "annotations": {}},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]},
    }
    assert choose_container(pod, None) == "a"
    assert capsys.readouterr().err == 'Defaulted container "a" out of: a, b, i\n'
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] = "b"
    assert choose_container(pod, None) == "b"
    assert choose_container(pod, "i") == "i"
    with pytest.raises(CtlError, match="container c is not valid for pod p"):
        choose_container(pod, "c")


@pytest.mark.parametrize(
    ("text", "mapping"),
    [
        ("8080:80", PortMapping(8080, 80)),
        ("80", PortMapping(80, 80)),  # kubectl: the same port locally
        (":80", PortMapping(0, 80)),
        ("0:80", PortMapping(0, 80)),
    ],
)
def test_port_mappings(text: str, mapping: PortMapping) -> None:
    assert parse_port_mapping(text) == mapping


@pytest.mark.parametrize("text", ["", "x", "80:", "8080:0", "70000:80", "1:2:3", "-1:80"])
def test_bad_port_mappings(text: str) -> None:
    with pytest.raises(ValueError, match="invalid port mapping"):
        parse_port_mapping(text)


def test_verbs_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    for verb in ("exec", "port-forward", "top"):
        with pytest.raises(SystemExit) as exited:
            ctl.main([verb, "--help"])
        assert exited.value.code == 0
        text = capsys.readouterr().out
        assert "--kubeconfig" in text and "--insecure-skip-tls-verify" in text, verb
    assert {"exec", "port-forward", "top"} <= set(ctl.COMMANDS)


# --- top: the figures of a summary ---------------------------------------------------------------


def _summary(time: str, cpu: Obj, start: str = "2026-01-01T00:00:00Z") -> Obj:
    return {
        "node": {"nodeName": "n", "cpu": {"time": time}},
        "pods": [
            {
                "podRef": {"name": "web-n", "namespace": "default"},
                "containers": [
                    {
                        "name": "a",
                        "startTime": start,
                        "cpu": {"time": time, **cpu},
                        "memory": {"workingSetBytes": 3 << 20},
                    },
                    {
                        "name": "b",
                        "startTime": start,
                        "cpu": {"time": time, "usageNanoCores": 5e6, "usageCoreNanoSeconds": 1},
                        "memory": {"workingSetBytes": 1 << 20},
                    },
                ],
            }
        ],
    }


def test_top_sums_containers_and_takes_rates() -> None:
    rows = usages(_summary("2026-01-01T00:00:10Z", {"usageNanoCores": 2e6}))
    assert [(r.pod, r.nano_cores, r.working_set) for r in rows] == [("web-n", 7e6, 4 << 20)]
    per_container = usages(_summary("2026-01-01T00:00:10Z", {}), containers=True)
    assert [(r.container, r.nano_cores) for r in per_container] == [("a", None), ("b", 5e6)]


def test_top_rate_from_two_counters_or_the_containers_life() -> None:
    first = _summary("2026-01-01T00:00:10Z", {"usageCoreNanoSeconds": 1_000_000_000})
    second = _summary("2026-01-01T00:00:20Z", {"usageCoreNanoSeconds": 3_000_000_000})
    rows = usages(second, first, containers=True)
    assert rows[0].nano_cores == pytest.approx(2e8)  # 2 s of CPU over 10 s: 200m
    # New in the second sample: its counter over its life (20 s here).
    alone = usages(second, {"pods": []}, containers=True)
    assert alone[0].nano_cores == pytest.approx(1.5e8)
