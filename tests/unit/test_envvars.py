from __future__ import annotations

from pykubelet.api.decode import decode_pod
from pykubelet.envvars import container_env, expand


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
