"""Image pull secrets → registry credentials (pod/pullsecrets.py), as the kubelet's keyring
matches them; the pulls tried with each credential in order (runtime/base.py's SharedPulls);
and a pod's sync reading its pull secrets (pod/sync.py) over the fake runtime."""

from __future__ import annotations

import base64
import fnmatch
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykubelet.api.decode import decode_pod
from pykubelet.api.errors import ManifestError
from pykubelet.api.model import Pod
from pykubelet.common.events import EventRecorder
from pykubelet.pod.envvars import Allocatable, container_env
from pykubelet.pod.pullsecrets import (
    Credential,
    Keyring,
    PullSecret,
    PullSecretError,
    glob_match,
    keyring_from_secrets,
    pull_credentials,
    registry_key,
    repository,
    urls_match,
)
from pykubelet.pod.sync import PodSync
from pykubelet.pod.tokens import IssuedToken, TokenRequest
from pykubelet.pod.volumes import NoApiServer, VolumeManager
from pykubelet.pod.workers import UpdateType
from pykubelet.probes.handlers import ActionRunner
from pykubelet.probes.prober import ProbeManager
from pykubelet.runtime.base import PullCredentials, RegistryAuth, SharedPulls, StartError
from pykubelet.status.manager import StatusManager
from tests.fakes.runtime import FakeRuntime

JSON_TYPE = "kubernetes.io/dockerconfigjson"
CFG_TYPE = "kubernetes.io/dockercfg"


def json_secret(name: str, auths: dict[str, dict[str, str]]) -> PullSecret:
    return PullSecret(name, JSON_TYPE, {".dockerconfigjson": json.dumps({"auths": auths}).encode()})


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- the field -------------------------------------------------------------------------------

MANIFEST = b"""
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  imagePullSecrets: REFS
  containers: [{name: c, image: registry.example.com/app:1}]
"""


def test_image_pull_secrets_decode_as_local_object_references() -> None:
    pod = decode_pod(MANIFEST.replace(b"REFS", b"[{name: regcred}, {}]"), "p.yaml")
    assert [r.name for r in pod.spec.image_pull_secrets or []] == ["regcred", ""]
    with pytest.raises(ManifestError) as info:
        decode_pod(MANIFEST.replace(b"REFS", b"[{name: a, optional: true}]"), "p.yaml")
    assert info.value.lines() == ["p.yaml: spec.imagePullSecrets[0].optional: unknown field"]


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "repo"),
    [
        ("busybox", "docker.io/library/busybox"),
        ("busybox:1.36", "docker.io/library/busybox"),
        ("library/busybox@sha256:" + "a" * 64, "docker.io/library/busybox"),
        ("user/app:v1", "docker.io/user/app"),
        ("docker.io/busybox", "docker.io/library/busybox"),
        ("index.docker.io/user/app", "docker.io/user/app"),
        ("localhost/app", "localhost/app"),
        ("localhost:5000/app:tag", "localhost:5000/app"),
        ("registry.example.com/team/app:1", "registry.example.com/team/app"),
        ("127.0.0.1:5000/private/busybox:test", "127.0.0.1:5000/private/busybox"),
        ("Upper/app", "Upper/app"),  # an upper-case first component is a host, as Docker's
    ],
)
def test_image_names_are_normalised_as_dockers_reference_library(image: str, repo: str) -> None:
    assert repository(image) == repo


@pytest.mark.parametrize(
    ("location", "key"),
    [
        ("https://index.docker.io/v1/", "index.docker.io"),
        ("registry.example.com", "registry.example.com"),
        ("http://registry.example.com:5000", "registry.example.com:5000"),
        ("https://registry.example.com/v2/team", "registry.example.com/team"),
        ("registry.example.com/team/", "registry.example.com/team/"),
        ("quay.io/", "quay.io"),
    ],
)
def test_registry_keys_drop_the_scheme_and_the_api_version(location: str, key: str) -> None:
    assert registry_key(location) == key


@pytest.mark.parametrize(
    ("glob", "target", "matches"),
    [
        ("*.example.com", "registry.example.com/app", True),
        ("*.example.com", "example.com/app", False),  # as many parts
        ("*.example.com", "a.b.example.com/app", False),
        ("registry.example.com:5000", "registry.example.com:5000/app", True),
        ("registry.example.com:5000", "registry.example.com/app", False),  # the port too
        ("registry.example.com", "registry.example.com:5000/app", False),
        ("registry.example.com/team", "registry.example.com/team/app", True),
        ("registry.example.com/team", "registry.example.com/other/app", False),
        ("registry.example.com/team", "registry.example.com/teamwork/app", True),  # a prefix
        ("registry.[a-e]xample.com", "registry.example.com/x", True),
        ("registry.[^e]xample.com", "registry.example.com/x", False),
        ("registry.[]xample.com", "registry.example.com/x", False),  # a bad pattern
        # As Go's url.Parse: "?" starts the query, a leading "[" an IPv6 literal.
        ("reg?stry.example.com", "registry.example.com/x", False),
        ("[a-r]egistry.example.com", "registry.example.com/x", False),
        ("[::1]:5000", "[::1]:5000/app", True),
        ("127.0.0.1:5000", "127.0.0.1:5000/private/busybox", True),
    ],
)
def test_urls_match_as_the_keyring_does(glob: str, target: str, matches: bool) -> None:
    assert urls_match(glob, target) is matches


LABEL = st.text(alphabet="abc-", min_size=1, max_size=6)
PATTERN = st.text(alphabet="abc-*?", min_size=1, max_size=6)


@given(PATTERN, LABEL)
def test_globs_without_classes_match_as_fnmatch_does(pattern: str, name: str) -> None:
    # No "/" in a host label: Go's "*" and fnmatch's then agree.
    assert glob_match(pattern, name) is fnmatch.fnmatchcase(name, pattern)


@given(
    st.lists(LABEL, min_size=1, max_size=4),
    st.one_of(st.none(), st.integers(1, 65535)),
    st.lists(LABEL, max_size=3),
    st.lists(LABEL, max_size=3),
)
def test_a_key_matches_every_image_below_it_and_no_other_host(
    labels: list[str], port: int | None, path: list[str], below: list[str]
) -> None:
    host = ".".join(labels) + (f":{port}" if port else "")
    key = host + "".join(f"/{p}" for p in path)
    image = key + "".join(f"/{p}" for p in below) + "/app"
    assert urls_match(key, image)
    assert not urls_match(key, "x" + image)  # another first label
    assert not urls_match(key, "extra." + image)  # one more part
    if port:
        assert not urls_match(key, ".".join(labels) + "/app")


# --- the keyring --------------------------------------------------------------------------------


def test_the_most_specific_key_comes_first_and_every_match_is_returned() -> None:
    keyring = Keyring()
    keyring.add(
        {
            "registry.example.com": Credential("host", "1"),
            "registry.example.com/team": Credential("team", "2"),
            "*.example.com": Credential("glob", "3"),
            "other.example.org": Credential("other", "4"),
        }
    )
    keyring.add({"https://registry.example.com/v2/": Credential("host-again", "5")})
    found = [c.username for _, c in keyring.lookup("registry.example.com/team/app")]
    assert found == ["team", "host", "host-again", "glob"]
    assert keyring.lookup("quay.io/app") == []


def test_docker_hub_images_use_the_index_key() -> None:
    keyring = Keyring()
    keyring.add({"https://index.docker.io/v1/": Credential("hub", "pw")})
    for image in ("busybox", "user/app", "docker.io/user/app", "index.docker.io/user/app"):
        assert [c.username for _, c in keyring.lookup(repository(image))] == ["hub"], image
    assert keyring.lookup(repository("registry.example.com/app")) == []


def test_secrets_of_both_types_in_the_pods_order_and_others_ignored() -> None:
    secrets = [
        PullSecret("opaque", "Opaque", {".dockerconfigjson": b"not even json"}),
        PullSecret("empty", JSON_TYPE, {".dockerconfigjson": b""}),
        PullSecret("wrong-key", CFG_TYPE, {".dockerconfigjson": b"{}"}),
        json_secret("new", {"https://reg.example.com:5000": {"username": "u1", "password": "p1"}}),
        PullSecret(
            "old",
            CFG_TYPE,
            {".dockercfg": json.dumps({"reg.example.com:5000": {"auth": b64("u2:p:2")}}).encode()},
        ),
    ]
    credentials = pull_credentials("reg.example.com:5000/app:1", secrets)
    assert credentials == PullCredentials(
        auths=(
            RegistryAuth("u1", "p1", "reg.example.com:5000"),
            RegistryAuth("u2", "p:2", "reg.example.com:5000"),
        )
    )
    assert "p1" not in repr(credentials)  # passwords stay out of logs and reprs
    assert pull_credentials("quay.io/app", secrets) == PullCredentials()


@pytest.mark.parametrize("auth", [b64("user:pw"), b64("user:pw").rstrip("=")])
def test_the_auth_field_replaces_username_and_password(auth: str) -> None:
    secret = json_secret("s", {"reg.example.com": {"username": "x", "password": "y", "auth": auth}})
    [(_, credential)] = keyring_from_secrets([secret]).lookup("reg.example.com/app")
    assert credential == Credential("user", "pw")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{", "not JSON"),
        (b'{"auths": {"r.example.com": {"auth": "!!!"}}}', "auth is not base64"),
        (
            json.dumps({"auths": {"r.example.com": {"auth": b64("nocolon")}}}).encode(),
            "must be formatted as base64(username:password)",
        ),
        (b'{"auths": {"r.example.com": {"username": 5}}}', "username must be a string"),
    ],
)
def test_a_bad_secret_fails_the_pull_naming_it(data: bytes, reason: str) -> None:
    secret = PullSecret("regcred", JSON_TYPE, {".dockerconfigjson": data})
    with pytest.raises(
        PullSecretError, match=re.escape('image pull secret "regcred": .dockerconfigjson: ')
    ):
        keyring_from_secrets([secret])
    credentials = pull_credentials("r.example.com/app", [secret])
    assert credentials.auths == () and credentials.error is not None
    assert reason in credentials.error


# --- pulls with credentials ---------------------------------------------------------------------


class Registry:
    """An in-memory registry that accepts one password."""

    def __init__(self, password: str) -> None:
        self.password = password
        self.tries: list[str | None] = []

    async def pull(self, image: str, auth: RegistryAuth | None) -> None:
        self.tries.append(auth.username if auth else None)
        if auth is None or auth.password != self.password:
            raise StartError("ErrImagePull", f'failed to pull image "{image}": unauthorized')


async def test_each_credential_is_tried_in_order_until_one_works() -> None:
    registry = Registry("right")
    auths = (RegistryAuth("a", "wrong"), RegistryAuth("b", "right"), RegistryAuth("c", "right"))
    await SharedPulls(registry.pull).pull("img", PullCredentials(auths))
    assert registry.tries == ["a", "b"]


async def test_without_credentials_the_pull_is_anonymous_and_all_failures_are_joined() -> None:
    registry = Registry("right")
    pulls = SharedPulls(registry.pull)
    with pytest.raises(StartError) as single:
        await pulls.pull("img")
    assert registry.tries == [None]
    assert single.value.message == 'failed to pull image "img": unauthorized'
    auths = (RegistryAuth("a", "x"), RegistryAuth("b", "y"))
    with pytest.raises(StartError) as joined:
        await pulls.pull("img", PullCredentials(auths))
    assert registry.tries == [None, "a", "b"]  # no anonymous try after them, as the kubelet
    assert joined.value.reason == "ErrImagePull"
    assert joined.value.message == (
        '[failed to pull image "img": unauthorized, failed to pull image "img": unauthorized]'
    )


# --- a pod's sync -------------------------------------------------------------------------------


class Objects:
    """The API server's Secrets, in memory."""

    def __init__(self, secrets: dict[str, tuple[str, dict[str, bytes]]]) -> None:
        self.secrets = secrets

    async def config_map(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        return None

    async def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        typed = self.secrets.get(name)
        return typed[1] if typed else None

    async def typed_secret(self, namespace: str, name: str) -> tuple[str, dict[str, bytes]] | None:
        return self.secrets.get(name)

    async def request_token(self, request: TokenRequest) -> IssuedToken:
        raise AssertionError("no token is asked for")


@dataclass
class Node:
    runtime: FakeRuntime
    sync: PodSync
    statuses: StatusManager
    recorder: EventRecorder


@pytest.fixture(params=["cluster"])
async def node(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Node]:
    """A pod sync over the fake runtime (no image present) and Secrets in memory, or (param
    "standalone") without an API server."""
    runtime = FakeRuntime(images=set())
    await runtime.start()
    recorder = EventRecorder()
    actions = ActionRunner(
        runtime, "127.0.0.1", lambda pod, spec, ip: container_env(pod, spec, "127.0.0.1", ip)
    )
    allocatable = Allocatable(cpu=Fraction(2), memory=1 << 30, ephemeral_storage=1 << 34)
    config = json.dumps({"auths": {"reg.example.com": {"auth": b64("me:pw")}}}).encode()
    statuses = StatusManager()
    sync = PodSync(
        runtime,
        statuses,
        recorder,
        "127.0.0.1",
        actions,
        ProbeManager(actions, recorder, print),
        VolumeManager(tmp_path, allocatable),
        allocatable,
        objects=(
            Objects({"regcred": (JSON_TYPE, {".dockerconfigjson": config})})
            if request.param == "cluster"
            else NoApiServer()
        ),
    )
    yield Node(runtime, sync, statuses, recorder)
    await actions.close()
    await runtime.close()


def private_pod(secrets: list[str]) -> Pod:
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "uid-pull"},
            "spec": {
                "imagePullSecrets": [{"name": s} for s in secrets],
                "containers": [{"name": "c", "image": "reg.example.com/app:1"}],
            },
        }
    )


async def test_a_sync_gives_the_pull_the_pods_secrets_and_warns_of_a_missing_one(
    node: Node,
) -> None:
    await node.sync.sync_pod(UpdateType.CREATE, private_pod(["nope", "", "regcred"]))
    assert [c.detail for c in node.runtime.ops("pull_image")] == ["reg.example.com/app:1 as me"]
    warnings = [e for e in node.recorder.events() if e.reason == "FailedToRetrieveImagePullSecret"]
    assert [e.message for e in warnings] == [
        "Unable to retrieve some image pull secrets (nope); attempting to pull the image may "
        "not succeed."
    ]


async def test_a_failed_pull_shows_image_pull_back_off_until_the_next_pull(node: Node) -> None:
    node.runtime.pull_errors["reg.example.com/app:1"] = "unauthorized: authentication required"
    pod = private_pod([])
    result = await node.sync.sync_pod(UpdateType.CREATE, pod)

    def waiting() -> tuple[str | None, str | None]:
        status = node.statuses.get("uid-pull")
        assert status is not None and status.container_statuses
        state = status.container_statuses[0].state.waiting
        assert state is not None
        return state.reason, state.message

    assert waiting() == (
        "ErrImagePull",
        'failed to pull image "reg.example.com/app:1": unauthorized: authentication required',
    )
    # The next sync comes within the back-off (10 s), and shows it; no pull is tried then.
    assert result.requeue_after is not None and result.requeue_after <= 5
    await node.sync.sync_pod(UpdateType.SYNC, pod)
    assert waiting() == ("ImagePullBackOff", 'Back-off pulling image "reg.example.com/app:1"')
    assert len(node.runtime.ops("pull_image")) == 1


@pytest.mark.parametrize("node", ["standalone"], indirect=True)
async def test_without_an_api_server_the_secret_is_missing_and_the_pull_anonymous(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="pykubelet.pod.sync"):
        await node.sync.sync_pod(UpdateType.CREATE, private_pod(["regcred"]))
    assert [c.detail for c in node.runtime.ops("pull_image")] == ["reg.example.com/app:1"]
    # (MissingClusterDNS too: the fake runtime's pods have their own network and no
    # --cluster-dns is given.)
    warnings = [e.reason for e in node.recorder.events() if e.type == "Warning"]
    assert [r for r in warnings if r != "MissingClusterDNS"] == ["FailedToRetrieveImagePullSecret"]
    assert "no API server (pykubelet runs without --kubeconfig)" in caplog.text
