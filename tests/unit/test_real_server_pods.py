"""The corpus of pods as a real kube-apiserver 1.32 serves them (tests/data/real_pods/: from
`kubectl run`, a Deployment, a DaemonSet, a Job, a StatefulSet, a chart under the restricted
profile): each decodes as the node's API source decodes it, or is refused naming the field of
the object as served."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pykubelet.api.errors import ManifestError
from pykubelet.config.apiserver import decode_api_pod

CORPUS = Path(__file__).parent.parent / "data" / "real_pods"

# What pykubelet cannot run yet, by file: the paths of the fields it names.
REFUSED = {
    "statefulset.yaml": ["spec.volumes[0].persistentVolumeClaim"],
}


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.yaml")))
def test_a_pod_as_a_real_server_serves_it(name: str) -> None:
    obj = yaml.safe_load((CORPUS / name).read_text())
    refused = REFUSED.get(name)
    if refused is None:
        pod = decode_api_pod(obj)
        assert pod.metadata.name == obj["metadata"]["name"]
        assert pod.uid == obj["metadata"]["uid"]
        # Every volume of the object, the token volume included, in the served order.
        served = [v["name"] for v in obj["spec"].get("volumes", [])]
        assert [v.name for v in pod.spec.volumes or []] == served
        token = [v for v in pod.spec.volumes or [] if v.name.startswith("kube-api-access-")]
        assert token and token[0].projected is not None
        return
    with pytest.raises(ManifestError) as caught:
        decode_api_pod(obj)
    paths = sorted(e.path for e in caught.value.errors)
    assert paths == sorted(refused), caught.value.errors
    assert all("not supported by pykubelet yet" in e.reason for e in caught.value.errors)
    assert (
        caught.value.location == f"api pod {obj['metadata']['namespace']}/{obj['metadata']['name']}"
    )
