"""A pod as the API server hands it to a node carries the ServiceAccount's projected token
volume: on the process runtime, a Python pod runs the official client's
`load_incluster_config()` against the fixture API server with the token, the CA and the
namespace the kubelet mounted, and sees its token refreshed before it expires."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.kubelet_node import https_apiserver, start_kubelet_node

NODE = "sa-node"
MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

# In the pod: the in-cluster configuration from the mounted files, a list through the API
# server, then the token file watched until the kubelet writes a new token.
IN_CLUSTER = f"""
import base64, json, time
from kubernetes import client, config
config.load_incluster_config()
pods = client.CoreV1Api().list_namespaced_pod("default")
print("listed", ",".join(sorted(p.metadata.name for p in pods.items)), flush=True)
print("namespace", open("{MOUNT}/namespace").read(), flush=True)
first = open("{MOUNT}/token").read()
payload = first.split(".")[1]
expires = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["exp"]
while open("{MOUNT}/token").read() == first:
    time.sleep(0.2)
print("refreshed", "before-expiry" if time.time() < expires else "after-expiry", flush=True)
time.sleep(600)
"""


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    yield from https_apiserver()


def test_a_pod_lists_pods_with_its_mounted_token_and_sees_it_refreshed(
    apiserver: ApiServer, start_agent: Callable[..., Agent], tmp_path: Path
) -> None:
    # As kube-apiserver's --service-account-max-token-expiration: the 3607 s the ServiceAccount
    # plugin asks for becomes 20 s, so the kubelet's refresh at 80 % of the life shows in a test.
    apiserver.set_max_token_expiration(20)
    agent, client, _ = start_kubelet_node(
        apiserver, start_agent, tmp_path, NODE, "--sync-frequency", "1s"
    )
    api = urlsplit(apiserver.url)
    client.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "operator"},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "main",
                        "image": "python:3.11",
                        "command": [sys.executable, "-c", IN_CLUSTER],
                        # No kube-proxy here: the pod reaches the API server where it listens.
                        "env": [
                            {"name": "KUBERNETES_SERVICE_HOST", "value": str(api.hostname)},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
                        ],
                    }
                ],
            },
        }
    )
    served = client.pod("operator")
    assert served is not None
    (volume,) = served["spec"]["volumes"]
    assert volume["name"].startswith("kube-api-access-")

    def logs() -> str:
        status, body = agent.get("/containerLogs/default/operator/main")
        return body.decode() if status == 200 else ""

    out = wait_for(
        "the pod's list through the API server", lambda: "namespace" in logs() and logs()
    )
    assert "listed operator" in out and "namespace default" in out, out
    out = wait_for("the token refreshed", lambda: "refreshed" in logs() and logs(), timeout=40)
    assert "refreshed before-expiry" in out, out

    # Each token was asked for the pod, bound to it, as the kubelet's token manager asks.
    uid = served["metadata"]["uid"]
    claims = [c for c in apiserver.issued_tokens() if c["kubernetes.io"].get("pod")]
    assert len(claims) >= 2
    assert all(c["kubernetes.io"]["pod"] == {"name": "operator", "uid": uid} for c in claims)
    assert {c["sub"] for c in claims} == {"system:serviceaccount:default:default"}
    assert all(c["exp"] - c["iat"] == 20 for c in claims)


def test_a_pod_of_a_missing_service_account_is_refused_by_admission(
    apiserver: ApiServer,
) -> None:
    from tests.integration.test_cluster import KubeClient

    client = KubeClient(apiserver.write_kubeconfig(Path(apiserver.pki.ca_file).parent / "kc"))
    status, body = client.request(
        "POST",
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "robot-pod"},
            "spec": {
                "serviceAccountName": "robot",
                "containers": [{"name": "c", "image": "busybox"}],
            },
        },
    )
    assert status == 403, body
    assert body["message"] == (
        'pods "robot-pod" is forbidden: error looking up service account default/robot: '
        'serviceaccount "robot" not found'
    )
