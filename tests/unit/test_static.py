from __future__ import annotations

import pytest

from pykubelet.api.decode import decode_pod
from pykubelet.api.errors import ManifestError
from pykubelet.api.static import CONFIG_HASH, CONFIG_SOURCE, apply_static_defaults

DOC = b"""apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers: [{name: c, image: i}]
"""


def test_defaults() -> None:
    pod = apply_static_defaults(decode_pod(DOC, "a.yaml"), "Node-1", "file", "/m/a.yaml")
    assert pod.metadata.name == "web-node-1"
    assert pod.metadata.namespace == "default"
    assert pod.spec.node_name == "Node-1"
    assert pod.metadata.annotations[CONFIG_HASH] == pod.uid
    assert pod.metadata.annotations[CONFIG_SOURCE] == "file"
    assert pod.status.phase == "Pending"
    assert len(pod.uid) == 32


def test_uid_depends_on_node_location_and_content() -> None:
    base = decode_pod(DOC, "a.yaml")
    uid = apply_static_defaults(base, "n1", "file", "/m/a.yaml").uid
    assert apply_static_defaults(base, "n1", "file", "/m/a.yaml").uid == uid  # stable
    # Identical files in two places do not collide (the kubelet's bug #43420).
    assert apply_static_defaults(base, "n1", "file", "/m/b.yaml").uid != uid
    assert apply_static_defaults(base, "n2", "file", "/m/a.yaml").uid != uid
    changed = decode_pod(DOC.replace(b"image: i", b"image: j"), "a.yaml")
    assert apply_static_defaults(changed, "n1", "file", "/m/a.yaml").uid != uid
    # Formatting and comments are not content.
    reformatted = decode_pod(b"# hi\n" + DOC.replace(b"{name: web}", b"\n  name: web"), "a.yaml")
    assert apply_static_defaults(reformatted, "n1", "file", "/m/a.yaml").uid == uid


def test_explicit_uid_kept_and_input_not_mutated() -> None:
    pod = decode_pod(DOC.replace(b"{name: web}", b"{name: web, uid: abc}"), "a.yaml")
    out = apply_static_defaults(pod, "n1", "file", "/m/a.yaml")
    assert out.uid == "abc" and pod.metadata.name == "web"


def test_name_too_long_with_node() -> None:
    pod = decode_pod(DOC.replace(b"web", b"w" * 250), "a.yaml")
    with pytest.raises(ManifestError, match=r"metadata\.name: with the node name appended"):
        apply_static_defaults(pod, "node", "file", "/m/a.yaml")
