"""Projected volumes (the service-account token volume every API-server pod carries) and the
token manager's refresh rule: files on the real filesystem, tokens from an in-memory issuer that
stands for the API server's TokenRequest."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.decode import pod_from_object
from pykubelet.api.errors import ManifestError
from pykubelet.pod.envvars import Allocatable, ApiObjects
from pykubelet.pod.tokens import IssuedToken, TokenError, TokenManager, TokenRequest
from pykubelet.pod.volumes import VolumeError, VolumeManager
from tests.fixtures.apiserver.admission import token_volume_source

NODE = Allocatable(cpu=Fraction(2), memory=4 << 30, ephemeral_storage=10 << 30)
ROOT = os.geteuid() == 0

# The volume the ServiceAccount admission plugin adds to every pod (kube-apiserver 1.32).
KUBE_API_ACCESS = {"name": "kube-api-access-x7k2p", "projected": token_volume_source()}


def pod_object(volumes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"},
        "spec": {
            "serviceAccountName": "robot",
            "volumes": volumes,
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "volumeMounts": [
                        {
                            "name": volumes[0]["name"],
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            **spec,
        },
    }


class Issuer:
    """The API server's TokenRequest: a new token per call, with the life asked for."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.requests: list[TokenRequest] = []
        self.fail: str | None = None

    async def request_token(self, request: TokenRequest) -> IssuedToken:
        if self.fail:
            raise RuntimeError(self.fail)
        self.requests.append(request)
        now = self.clock[0]
        return IssuedToken(
            f"token-{len(self.requests)}",
            now + request.expiration_seconds,
            request.expiration_seconds,
        )


def manager_for(tmp_path: Path, issuer: Issuer, clock: list[float]) -> VolumeManager:
    tokens = TokenManager(issuer, clock=lambda: clock[0], jitter=lambda: 0.0)
    return VolumeManager(tmp_path / "root", NODE, (), tokens)


async def test_the_service_account_volume_holds_token_ca_and_namespace(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    issuer = Issuer(clock)
    manager = manager_for(tmp_path, issuer, clock)
    pod = pod_from_object(pod_object([KUBE_API_ACCESS]), "web")
    objects = ApiObjects(
        config_maps={"kube-root-ca.crt": {"ca.crt": "-----BEGIN CERTIFICATE-----"}}
    )
    paths = await manager.setup(pod, objects)
    path = Path(paths["kube-api-access-x7k2p"])
    assert (
        path == tmp_path / "root/pods/uid-web/volumes/kubernetes.io~projected/kube-api-access-x7k2p"
    )
    assert sorted(p for p in os.listdir(path) if not p.startswith("..")) == [
        "ca.crt",
        "namespace",
        "token",
    ]
    assert (path / "token").read_text() == "token-1"
    assert (path / "ca.crt").read_text() == "-----BEGIN CERTIFICATE-----"
    assert (path / "namespace").read_text() == "shop"
    assert (path / "..data/token").stat().st_mode & 0o777 == 0o644
    if ROOT:
        assert os.path.ismount(path)  # a tmpfs: the token never touches the disk
    (request,) = issuer.requests
    assert request == TokenRequest("shop", "robot", None, 3607, "web", "uid-web")
    mounts = await manager.container_mounts(pod, pod.spec.containers[0], paths)
    assert mounts[0].read_only

    # A sync before 80 % of the life has passed keeps the token; one after gets a new one,
    # written atomically through ..data.
    clock[0] += 3607 * 0.79
    await manager.setup(pod, objects)
    assert (path / "token").read_text() == "token-1"
    clock[0] += 3607 * 0.02
    await manager.setup(pod, objects)
    assert (path / "token").read_text() == "token-2"
    assert os.readlink(path / "token") == "..data/token"

    await manager.teardown(pod.uid)
    assert not path.exists()


async def test_a_failed_refresh_keeps_a_valid_token_and_never_an_expired_one(
    tmp_path: Path,
) -> None:
    clock = [0.0]
    issuer = Issuer(clock)
    tokens = TokenManager(issuer, clock=lambda: clock[0], jitter=lambda: 0.0)
    request = TokenRequest("shop", "robot", "vault", 600, "web", "uid-web")
    assert await tokens.token(request) == "token-1"
    issuer.fail = 'serviceaccounts "robot" not found'
    clock[0] = 590.0  # due for a refresh, still valid
    assert await tokens.token(request) == "token-1"
    clock[0] = 600.0
    with pytest.raises(TokenError, match='service account "shop/robot": serviceaccounts "robot"'):
        await tokens.token(request)
    issuer.fail = None
    assert await tokens.token(request) == "token-2"


async def test_a_day_old_token_is_refreshed_whatever_its_life(tmp_path: Path) -> None:
    clock = [0.0]
    issuer = Issuer(clock)
    tokens = TokenManager(issuer, clock=lambda: clock[0], jitter=lambda: 0.0)
    year = TokenRequest("shop", "robot", None, 365 * 24 * 3600, "web", "uid-web")
    await tokens.token(year)
    clock[0] = 24 * 3600 - 1
    assert await tokens.token(year) == "token-1"
    clock[0] = 24 * 3600 + 1
    assert await tokens.token(year) == "token-2"


async def test_projected_config_map_secret_and_modes(tmp_path: Path) -> None:
    clock = [0.0]
    manager = manager_for(tmp_path, Issuer(clock), clock)
    volume = {
        "name": "all",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {
                    "secret": {
                        "name": "db",
                        "items": [{"key": "pw", "path": "db/pw", "mode": 0o400}],
                    }
                },
                {"configMap": {"name": "app"}},
                {"configMap": {"name": "gone", "optional": True}},
            ],
        },
    }
    pod = pod_from_object(pod_object([volume]), "web")
    objects = ApiObjects(
        config_maps={"app": {"mode": "fast"}, "gone": None}, secrets={"db": {"pw": b"s3"}}
    )
    path = Path((await manager.setup(pod, objects))["all"])
    assert (path / "db/pw").read_bytes() == b"s3"
    assert (path / "db/pw").stat().st_mode & 0o777 == 0o400
    assert (path / "mode").stat().st_mode & 0o777 == 0o440
    try:
        with pytest.raises(VolumeError, match='volume "all": secret "db" not found'):
            await manager.setup(
                pod, ApiObjects(config_maps={"app": {}, "gone": None}, secrets={"db": None})
            )
    finally:
        await manager.teardown(pod.uid)  # the tmpfs, when root


async def test_a_token_without_an_api_server_fails_the_mount(tmp_path: Path) -> None:
    manager = VolumeManager(tmp_path / "root", NODE)
    pod = pod_from_object(pod_object([KUBE_API_ACCESS]), "web")
    with pytest.raises(
        VolumeError,
        match='volume "kube-api-access-x7k2p": no API server to request a token from',
    ):
        await manager.setup(pod, ApiObjects(config_maps={"kube-root-ca.crt": {"ca.crt": "x"}}))


@pytest.mark.parametrize(
    ("sources", "path", "reason"),
    [
        (
            [{"serviceAccountToken": {"path": "token", "expirationSeconds": 599}}],
            "spec.volumes[0].projected.sources[0].serviceAccountToken.expirationSeconds",
            "may not specify a duration less than 10 minutes",
        ),
        (
            [{"serviceAccountToken": {"path": "/token"}}],
            "spec.volumes[0].projected.sources[0].serviceAccountToken.path",
            "must be a relative path",
        ),
        (
            [
                {"serviceAccountToken": {"path": "token"}},
                {"secret": {"name": "s", "items": [{"key": "k", "path": "token"}]}},
            ],
            "spec.volumes[0].projected.sources[1].secret.items[0].path",
            "conflicting duplicate paths 'token'",
        ),
        (
            [{"secret": {"name": "s"}, "configMap": {"name": "c"}}],
            "spec.volumes[0].projected.sources[0]",
            "must have exactly one of configMap, secret, downwardAPI",
        ),
        (
            [{"clusterTrustBundle": {"signerName": "example.com/x", "path": "ca.pem"}}],
            "spec.volumes[0].projected.sources[0].clusterTrustBundle",
            "not supported by pykubelet yet",
        ),
        (
            [{"configMap": {"name": "Bad_Name"}}],
            "spec.volumes[0].projected.sources[0].configMap.name",
            "",
        ),
    ],
)
def test_projected_sources_are_validated_as_the_api_server_does(
    sources: list[dict[str, Any]], path: str, reason: str
) -> None:
    volume = {"name": "v", "projected": {"sources": sources}}
    with pytest.raises(ManifestError) as caught:
        pod_from_object(pod_object([volume]), "web.yaml")
    found = [e for e in caught.value.errors if e.path == path]
    assert found and reason in found[0].reason, caught.value.errors
