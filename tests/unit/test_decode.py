"""Decoding and validation: every problem reported as `file: field.path: reason`."""

from __future__ import annotations

import pytest

from pykubelet.api.decode import decode_pod, decode_pods
from pykubelet.api.errors import ManifestError

GOOD = b"""
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: server
    image: nginx:1.27
    command: [nginx]
    args: ["-g", "daemon off;"]
    env: [{name: A, value: "1"}]
    ports: [{containerPort: 80, name: http}]
    resources: {limits: {memory: 64Mi, cpu: 500m}}
"""


def errors_of(data: bytes, location: str = "web.yaml") -> list[str]:
    with pytest.raises(ManifestError) as info:
        decode_pod(data, location)
    return info.value.lines()


def test_good_pod_decodes_with_typed_fields() -> None:
    pod = decode_pod(GOOD, "web.yaml")
    c = pod.spec.containers[0]
    assert pod.metadata.name == "web" and pod.metadata.labels == {"app": "web"}
    assert c.command == ["nginx"] and c.args == ["-g", "daemon off;"]
    assert c.ports[0].container_port == 80 and c.resources.limits["memory"] == "64Mi"
    assert pod.spec.restart_policy == "Always" and pod.spec.termination_grace_period_seconds == 30


def test_json_decodes_too() -> None:
    data = (
        b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},'
        b'"spec":{"containers":[{"name":"c","image":"i"}]}}'
    )
    assert decode_pod(data, "j.json").metadata.name == "j"


def test_missing_container_name_names_file_and_field() -> None:
    data = GOOD.replace(b"  - name: server\n    image", b"  - image")
    assert errors_of(data) == ["web.yaml: spec.containers[0].name: required"]


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        ((b"name: web\n", b"name: Web_1\n"), "metadata.name: invalid value 'Web_1'"),
        (
            (b"containerPort: 80", b"containerPort: 70000"),
            "ports[0].containerPort: must be between",
        ),
        ((b"memory: 64Mi", b"memory: lots"), "resources.limits[memory]: invalid quantity 'lots'"),
        ((b"name: A,", b"name: 'A=B',"), "env[0].name: invalid value 'A=B'"),
        (
            (b"    command: [nginx]\n", b"    volumeMounts: [{name: nope, mountPath: /d}]\n"),
            "volumeMounts[0].name: no volume named 'nope' in spec.volumes",
        ),
        (
            (b"    command: [nginx]\n", b"    securityContext: {appArmorProfile: {type: X}}\n"),
            "securityContext.appArmorProfile: not supported by pykubelet yet",
        ),
        (
            (b"    command: [nginx]\n", b"    livenessProbe: {httpGet: {port: web}}\n"),
            "livenessProbe.httpGet.port: port name 'web' is not a named port",
        ),
        (
            (
                b"    command: [nginx]\n",
                b"    readinessProbe: {periodSeconds: 0, exec: {command: [a]}}\n",
            ),
            "readinessProbe.periodSeconds: must be >= 1",
        ),
        (
            (
                b"    command: [nginx]\n",
                b"    startupProbe: {tcpSocket: {port: 1}, httpGet: {port: 2}}\n",
            ),
            "startupProbe: must have exactly one of exec, httpGet, tcpSocket, grpc",
        ),
        (
            (b"    command: [nginx]\n", b"    comand: [nginx]\n"),
            "spec.containers[0].comand: unknown field",
        ),
        ((b"kind: Pod", b"kind: Deployment"), "kind: expected Pod, got 'Deployment'"),
        ((b"apiVersion: v1\n", b""), "apiVersion: required"),
        (
            (b"spec:\n", b"spec:\n  restartPolicy: Sometimes\n"),
            "spec.restartPolicy: unsupported value 'Sometimes'",
        ),
    ],
)
def test_invalid_fields(mutation: tuple[bytes, bytes], expected: str) -> None:
    old, new = mutation
    assert old in GOOD
    lines = errors_of(GOOD.replace(old, new, 1))
    assert any(expected in line for line in lines), lines
    assert all(line.startswith("web.yaml: ") for line in lines)


def test_all_problems_reported_at_once() -> None:
    data = GOOD.replace(b"    command: [nginx]\n", b"    comand: [nginx]\n    extra: 1\n")
    assert len(errors_of(data)) == 2


def test_duplicate_container_names() -> None:
    data = GOOD + b"  - name: server\n    image: other\n"
    assert any("spec.containers[1].name: duplicate name 'server'" in e for e in errors_of(data))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "empty manifest"),
        (b"a: [", "invalid YAML at line"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b"kind: Pod\x00", "NUL byte"),
        (b"- 1\n- 2\n", "expected a Pod object, got list"),
        (b"{bad json", "invalid JSON"),
        (GOOD + b"---\n" + GOOD, "expected one Pod per file, found 2"),
        (b"apiVersion: v1\nkind: PodList\nitems: []\n", "a PodList is not allowed"),
        (b"[" * 5000, "invalid"),
    ],
)
def test_undecodable(data: bytes, expected: str) -> None:
    location = "bad.json" if data.startswith(b"{") else "bad.yaml"
    lines = errors_of(data, location)
    assert any(expected in line for line in lines), lines


def test_decode_pods_accepts_list_and_stream_and_keeps_good_ones() -> None:
    bad = GOOD.replace(b"name: web", b"name: BAD")
    stream = GOOD + b"---\n" + bad
    pods, errors = decode_pods(stream, "http://x/pods")
    assert [p.metadata.name for p in pods] == ["web"]
    assert len(errors) == 1 and "document[1].metadata.name" in errors[0].describe()

    podlist = (
        b'{"apiVersion":"v1","kind":"PodList","items":[{"apiVersion":"v1","kind":"Pod",'
        b'"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}}]}'
    )
    pods, errors = decode_pods(podlist, "http://x/pods")
    assert [p.metadata.name for p in pods] == ["a"] and not errors


def test_a_huge_exponent_is_refused_at_once() -> None:
    data = GOOD.replace(b"memory: 64Mi", b"memory: 1e10000000")
    assert any("out of range" in e for e in errors_of(data))
