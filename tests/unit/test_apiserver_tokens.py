"""The fixture API server's ServiceAccounts and TokenRequest, through the agent's own client:
what the kubelet's projected token volume relies on, as kube-apiserver answers it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from pykubelet.client.kubeapi import ApiError, KubeApi
from tests.fixtures.apiserver import ApiServer
from tests.fixtures.apiserver.serviceaccounts import token_claims

Obj = dict[str, Any]


def token_request(pod: Obj | None, seconds: int = 3607, audience: str | None = None) -> Obj:
    spec: Obj = {"expirationSeconds": seconds, "audiences": [audience] if audience else []}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]
        }  # fmt: skip
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


async def test_every_namespace_has_its_default_account_and_root_ca(
    server: ApiServer, api: KubeApi
) -> None:
    await api.create("/api/v1/namespaces", {"metadata": {"name": "shop"}})
    account = await api.get("/api/v1/namespaces/shop/serviceaccounts/default")
    assert account["kind"] == "ServiceAccount"
    root_ca = await api.get("/api/v1/namespaces/shop/configmaps/kube-root-ca.crt")
    assert root_ca["data"]["ca.crt"] == server.pki.ca_file.read_text()
    assert root_ca["data"]["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")


async def test_a_bound_token_authenticates_until_it_expires(
    server: ApiServer, api: KubeApi, tmp_path: Path
) -> None:
    pod = await api.create(
        "/api/v1/namespaces/default/pods",
        {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    server.set_max_token_expiration(601)
    answer = await api.create(
        "/api/v1/namespaces/default/serviceaccounts/default/token",
        token_request(pod, 3607, "vault"),
    )
    assert answer["kind"] == "TokenRequest" and answer["spec"]["expirationSeconds"] == 601
    token = answer["status"]["token"]
    claims = token_claims(token)
    assert claims["aud"] == ["vault"] and claims["sub"] == "system:serviceaccount:default:default"
    assert claims["kubernetes.io"]["pod"] == {"name": "web", "uid": pod["metadata"]["uid"]}
    assert abs(claims["exp"] - time.time() - 601) < 5
    assert answer["status"]["expirationTimestamp"].endswith("Z")

    # The token is a user of this server (as a pod's in-cluster client uses it) ...
    kubeconfig = server.write_kubeconfig(tmp_path / "pod-kc")
    config = yaml.safe_load(kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token}
    kubeconfig.write_text(yaml.safe_dump(config))
    as_pod = await KubeApi.connect(kubeconfig, "n1")
    try:
        assert (await as_pod.get("/api/v1/namespaces/default/pods"))["kind"] == "PodList"
        # ... until it expires (here: its expiry moved into the past).
        server.authn.expiry[token] = time.time() - 1
        with pytest.raises(ApiError) as err:
            await as_pod.get("/api/v1/namespaces/default/pods")
        assert err.value.status == 401
    finally:
        await as_pod.close()


async def test_token_requests_are_validated_as_kube_apiserver_does(api: KubeApi) -> None:
    pod = await api.create(
        "/api/v1/namespaces/default/pods",
        {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    path = "/api/v1/namespaces/default/serviceaccounts/default/token"
    with pytest.raises(ApiError) as err:
        await api.create(path, token_request(pod, 599))
    assert err.value.status == 422 and "may not specify a duration less than 10 minutes" in str(
        err.value
    )
    with pytest.raises(ApiError) as err:
        await api.create(
            "/api/v1/namespaces/default/serviceaccounts/robot/token", token_request(pod)
        )
    assert err.value.status == 404
    stale = {**pod, "metadata": {**pod["metadata"], "uid": "an-older-pod"}}
    with pytest.raises(ApiError) as err:
        await api.create(path, token_request(stale))
    assert err.value.status == 409 and "does not match the UID in record" in str(err.value)
