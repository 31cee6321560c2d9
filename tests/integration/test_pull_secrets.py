"""Image pull secrets against a real registry (tests/fixtures/registry.py: docker-registry with
htpasswd authentication on 127.0.0.1), on the docker runtime (the private Podman) and the CRI
runtime (the private containerd), in cluster mode through the fixture API server: a pod with
the right secret pulls and runs; a wrong password, no secret, or a secret that does not exist
give ErrImagePull with the registry's reason, then ImagePullBackOff; the missing secret also
gives the kubelet's warning event."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.apiserver import ApiServer
from tests.fixtures.registry import Registry
from tests.integration.agent import Agent, Backend, wait_for
from tests.integration.test_cluster import KubeClient, container, pod_body, running_in_api

Obj = dict[str, Any]


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    server = ApiServer(bookmark_interval=0.5)
    server.start()
    yield server
    server.close()


@pytest.fixture(
    params=[
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("remote", marks=pytest.mark.cri),
    ]
)
def engine_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield request.getfixturevalue(
        {"docker": "docker_backend", "remote": "cri_backend"}[request.param]
    )


def _secret(client: KubeClient, name: str, type_: str, key: str, config: Obj) -> None:
    data = base64.b64encode(json.dumps(config).encode()).decode()
    status, body = client.request(
        "POST",
        "/api/v1/namespaces/default/secrets",
        {"metadata": {"name": name}, "type": type_, "data": {key: data}},
    )
    assert status == 201, body


def _private_pod(name: str, image: str, secrets: list[str], script: str) -> Obj:
    pod = pod_body(name, "testnode", script)
    pod["spec"]["containers"][0]["image"] = image
    # Always: the image an earlier pod pulled must not let this one start without a pull.
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    if secrets:
        pod["spec"]["imagePullSecrets"] = [{"name": s} for s in secrets]
    return pod


def _reasons_until_backoff(client: KubeClient, name: str) -> tuple[set[str], Obj]:
    """The waiting reasons seen until ImagePullBackOff, and the last ErrImagePull state."""
    seen: set[str] = set()
    pulled: Obj = {}

    def check() -> bool:
        pod = client.pod(name)
        waiting = container(pod)["state"].get("waiting") or {}
        if waiting.get("reason"):
            seen.add(waiting["reason"])
        if waiting.get("reason") == "ErrImagePull":
            pulled.update(waiting)
        return "ImagePullBackOff" in seen and "ErrImagePull" in seen

    wait_for(f"{name}: ErrImagePull, then ImagePullBackOff", check, timeout=60)
    return seen, pulled


def test_pull_secrets_with_a_real_registry(
    apiserver: ApiServer,
    tmp_path: Path,
    registry: Registry,
    engine_backend: Backend,
    start_agent: Callable[..., Agent],
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    client = KubeClient(kubeconfig)
    user, password = registry.username, registry.password
    # The right credentials as `kubectl create secret docker-registry` writes them (a scheme,
    # the host and port, and the auth field too); the wrong ones in the older .dockercfg
    # format, with the auth field alone.
    _secret(
        client,
        "regcred",
        "kubernetes.io/dockerconfigjson",
        ".dockerconfigjson",
        {
            "auths": {
                f"http://{registry.host}": {
                    "username": user,
                    "password": password,
                    "auth": base64.b64encode(f"{user}:{password}".encode()).decode(),
                }
            }
        },
    )
    _secret(
        client,
        "wrongcred",
        "kubernetes.io/dockercfg",
        ".dockercfg",
        {registry.host: {"auth": base64.b64encode(f"{user}:not-{password}".encode()).decode()}},
    )
    marker = uuid.uuid4().hex[:8]
    script = f"echo pulled-{marker}; " + engine_backend.forever()
    client.create_pod(_private_pod("good", registry.image, ["regcred"], script))
    client.create_pod(_private_pod("wrong", registry.image, ["wrongcred"], script))
    client.create_pod(_private_pod("none", registry.image, [], script))
    client.create_pod(_private_pod("missing", registry.image, ["nope"], script))
    agent = start_agent(*engine_backend.flags, "--kubeconfig", str(kubeconfig))

    wait_for("the pod with the right secret running", lambda: running_in_api(client, "good"), 90)
    output = wait_for(
        "its output", lambda: agent.get("/containerLogs/default/good/main")[1].decode().strip()
    )
    assert output == f"pulled-{marker}"

    for name in ("wrong", "none", "missing"):
        seen, failed = _reasons_until_backoff(client, name)
        assert seen <= {"ErrImagePull", "ImagePullBackOff", "ContainerCreating"}, seen
        message = failed["message"]
        assert message.startswith(f'failed to pull image "{registry.image}": '), message
        assert "unauthorized" in message.lower(), message  # the registry's reason

    def missing_secret_event() -> Obj | None:
        for event in client.events():
            if event.get("reason") == "FailedToRetrieveImagePullSecret":
                return event
        return None

    event = wait_for("the missing secret's warning event", missing_secret_event)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "missing"
    assert event["message"] == (
        "Unable to retrieve some image pull secrets (nope); attempting to pull the image may "
        "not succeed."
    )
    # The password is given to the engine only: never in what the agent serves, sends or logs.
    for path in ("/pods", "/events", "/"):
        assert password not in agent.get(path)[1].decode()
    assert password not in json.dumps(client.pods())
    assert password not in agent.log()
