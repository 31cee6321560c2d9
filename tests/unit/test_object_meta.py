"""Metadata validated as the API server's ValidateObjectMeta, so that a static pod the API
server would refuse (its mirror could never be created) is refused here with the same reason."""

from __future__ import annotations

import json

import pytest

from pykubelet.api.decode import decode_pod
from pykubelet.api.errors import ManifestError


def manifest(annotations: dict[str, str]) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
    ).encode()


def test_annotations_up_to_256_kib_are_fine_and_more_are_refused() -> None:
    key = "example.com/blob"
    decode_pod(manifest({key: "x" * (256 * 1024 - len(key))}), "web.json")
    with pytest.raises(ManifestError) as caught:
        decode_pod(manifest({key: "x" * (256 * 1024 - len(key) + 1)}), "web.json")
    (error,) = caught.value.errors
    assert error.path == "metadata.annotations"
    assert error.reason.startswith("Too long: may not be more than 262144 bytes")


@pytest.mark.parametrize("key", ["-starts-with-dash", "a/b/c", "Bad_Prefix.com/x", "x" * 64])
def test_annotation_keys_are_qualified_names(key: str) -> None:
    with pytest.raises(ManifestError) as caught:
        decode_pod(manifest({key: "v"}), "web.json")
    assert [e.path for e in caught.value.errors] == [f"metadata.annotations[{key}]"]


def test_annotation_keys_are_case_folded_as_the_api_server_does() -> None:
    decode_pod(
        manifest({"Example.COM/Checksum": "v", "kubectl.kubernetes.io/restartedAt": "t"}), "w"
    )


def test_container_restart_rules_are_refused_naming_the_field() -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "i", "restartPolicy": "Always"}]},
    }
    with pytest.raises(ManifestError) as caught:
        decode_pod(json.dumps(doc).encode(), "web.json")
    (error,) = caught.value.errors
    assert error.path == "spec.containers[0].restartPolicy"
    assert error.reason.startswith("may not be set for non-init containers")
    rules = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    doc["spec"]["containers"][0] = {"name": "c", "image": "i", "restartPolicyRules": rules}
    with pytest.raises(ManifestError) as caught:
        decode_pod(json.dumps(doc).encode(), "web.json")
    (error,) = caught.value.errors
    assert error.path == "spec.containers[0].restartPolicyRules"
    assert "not supported by pykubelet yet" in error.reason
