from __future__ import annotations

from fractions import Fraction

import pytest

from pykubelet.api.decode import decode_pod
from pykubelet.pod.envvars import (
    Allocatable,
    ApiObjects,
    EnvError,
    container_env,
    expand,
    skipped_env_names,
)


def test_expand() -> None:
    env = {"A": "1", "B": "x y"}
    assert expand("$(A)-$(B)", env) == "1-x y"
    assert expand("$$(A)", env) == "$(A)"  # escaped
    assert expand("$(MISSING)", env) == "$(MISSING)"  # kept visible
    assert expand("$A $", env) == "$A $"
    assert expand("$(A", env) == "$(A"
    assert expand("$((1+2))", env) == "$((1+2))"


def test_env_in_order_with_field_refs() -> None:
    pod = decode_pod(
        b"""apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: u1, labels: {tier: web}}
spec:
  nodeName: n1
  containers:
  - name: c
    image: i
    env:
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: GREETING, value: "hi $(NAME) in $(NS)"}
    - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: TIER, valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}}
    - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
""",
        "p.yaml",
    )
    env = container_env(pod, pod.spec.containers[0], "10.0.0.1", "10.0.0.2")
    assert env == [
        ("NAME", "p"),
        ("GREETING", "hi p in $(NS)"),  # NS comes later: not expanded, as in Kubernetes
        ("NS", "ns"),
        ("TIER", "web"),
        ("IP", "10.0.0.2"),
        ("NODE", "n1"),
    ]


API_POD = b"""apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns, uid: u1}
spec:
  containers:
  - name: main
    image: i
    resources: {requests: {cpu: 250m}, limits: {memory: 128Mi}}
    envFrom:
    - configMapRef: {name: settings}
    - {prefix: DB_, secretRef: {name: db}}
    env:
    - {name: MODE, value: "override $(LEVEL)"}
    - {name: USER, valueFrom: {secretKeyRef: {name: db, key: user}}}
    - {name: COLOR, valueFrom: {configMapKeyRef: {name: settings, key: color}}}
    - {name: GONE, valueFrom: {configMapKeyRef: {name: settings, key: nope, optional: true}}}
    - {name: CPU_M, valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}}
    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: CPUS, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}
"""


def test_env_from_config_maps_secrets_and_resources() -> None:
    pod = decode_pod(API_POD, "p.yaml")
    objects = ApiObjects(
        config_maps={"settings": {"LEVEL": "debug", "MODE": "a", "color": "blue", "bad key": "x"}},
        secrets={"db": {"user": b"admin", "password": b"pw"}},
    )
    node = Allocatable(cpu=Fraction(3), memory=1 << 30, ephemeral_storage=0)
    env = dict(container_env(pod, pod.spec.containers[0], "h", "p", objects, node))
    assert env["LEVEL"] == "debug" and env["DB_password"] == "pw" and env["DB_user"] == "admin"
    assert env["MODE"] == "override debug"  # env wins over envFrom, and expands from it
    assert env["USER"] == "admin" and env["COLOR"] == "blue" and "GONE" not in env
    assert env["CPU_M"] == "250" and env["MEM_MI"] == "128" and env["CPUS"] == "3"
    assert "bad key" not in env
    assert skipped_env_names(pod.spec.containers[0], objects) == ["bad key"]


def test_missing_objects_and_keys_are_errors_naming_them() -> None:
    pod = decode_pod(API_POD, "p.yaml")
    node = Allocatable(cpu=Fraction(1), memory=1, ephemeral_storage=0)
    container = pod.spec.containers[0]
    cases = [
        (ApiObjects(config_maps={"settings": None}, secrets={"db": {}}), 'configmap "settings"'),
        (ApiObjects(config_maps={"settings": {}}, secrets={"db": None}), 'secret "db" not found'),
        (
            ApiObjects(config_maps={"settings": {}}, secrets={"db": {}}),
            "couldn't find key user in Secret ns/db",
        ),
    ]
    for objects, message in cases:
        with pytest.raises(EnvError, match=message):
            container_env(pod, container, "h", "p", objects, node)


def test_binary_data_is_not_in_the_environment() -> None:
    pod = decode_pod(API_POD, "p.yaml")
    objects = ApiObjects(
        config_maps={"settings": {"color": "red", "blob": b"\x00\x01"}},
        secrets={"db": {"user": b"u"}},
    )
    node = Allocatable(cpu=Fraction(1), memory=1, ephemeral_storage=0)
    env = dict(container_env(pod, pod.spec.containers[0], "h", "p", objects, node))
    assert env["COLOR"] == "red" and "blob" not in env
