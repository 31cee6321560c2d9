"""The fixture API server defaults and admits a created pod as kube-apiserver 1.32 does (what
every cluster-mode test's pods look like when the agent receives them)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.apiserver.admission import default_pod, qos_class

Obj = dict[str, Any]


def created(spec: Obj, **meta: Any) -> Obj:
    pod: Obj = {"metadata": {"name": "p", **meta}, "spec": spec}
    default_pod(pod, inject_service_account=True)
    return pod


def one(image: str = "nginx:1.27", **container: Any) -> Obj:
    return {"containers": [{"name": "c", "image": image, **container}]}


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("nginx", "Always"),
        ("nginx:latest", "Always"),
        ("nginx:1.27", "IfNotPresent"),
        ("registry.local:5000/team/app", "Always"),
        ("registry.local:5000/team/app:v2", "IfNotPresent"),
        ("nginx@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_image_pull_policy_follows_the_tag(image: str, policy: str) -> None:
    assert created(one(image))["spec"]["containers"][0]["imagePullPolicy"] == policy


def test_container_probe_port_and_env_defaults() -> None:
    pod = created(
        one(
            ports=[{"containerPort": 80}],
            env=[{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            readinessProbe={"httpGet": {"port": 80}},
            resources={"limits": {"cpu": "500m", "memory": "64Mi"}},
        )
    )
    c = pod["spec"]["containers"][0]
    assert c["ports"] == [{"containerPort": 80, "protocol": "TCP"}]
    assert c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"] == "v1"
    assert c["readinessProbe"] == {
        "httpGet": {"port": 80, "scheme": "HTTP", "path": "/"},
        "timeoutSeconds": 1,
        "periodSeconds": 10,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    assert c["resources"]["requests"] == {"cpu": "500m", "memory": "64Mi"}
    assert pod["status"] == {"phase": "Pending", "qosClass": "Guaranteed"}
    assert c["terminationMessagePath"] == "/dev/termination-log"


def test_qos_classes() -> None:
    assert qos_class(one()) == "BestEffort"
    assert qos_class(one(resources={"requests": {"cpu": "100m"}})) == "Burstable"
    assert qos_class(one(resources={"limits": {"memory": "1Gi"}})) == "Burstable"
    both = {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1000m", "memory": "1Gi"}}
    assert qos_class(one(resources=both)) == "Guaranteed"
    # An init container without limits makes the pod Burstable.
    spec = {**one(resources=both), "initContainers": [{"name": "i", "image": "x", "resources": {}}]}
    assert qos_class(spec) == "Burstable"


def test_tolerations_service_account_and_token_volume() -> None:
    mine = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}
    pod = created({**one(), "tolerations": [mine]})
    spec = pod["spec"]
    assert spec["tolerations"] == [
        mine,
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ]
    assert spec["serviceAccountName"] == spec["serviceAccount"] == "default"
    (volume,) = spec["volumes"]
    assert volume["name"].startswith("kube-api-access-") and len(volume["name"]) == 21
    assert spec["containers"][0]["volumeMounts"] == [
        {
            "name": volume["name"],
            "readOnly": True,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        }
    ]
    no_token = created({**one(), "automountServiceAccountToken": False})
    assert "volumes" not in no_token["spec"]
    mirror = created(one(), annotations={"kubernetes.io/config.mirror": "x"})
    assert "serviceAccountName" not in mirror["spec"] and "volumes" not in mirror["spec"]


def test_volume_defaults() -> None:
    pod = created(
        {
            **one(),
            "volumes": [
                {"name": "a"},
                {"name": "b", "configMap": {"name": "cm"}},
                {"name": "h", "hostPath": {"path": "/srv"}},
            ],
        }
    )
    a, b, h = pod["spec"]["volumes"][:3]
    assert a == {"name": "a", "emptyDir": {}}
    assert b["configMap"]["defaultMode"] == 420
    assert h["hostPath"]["type"] == ""
