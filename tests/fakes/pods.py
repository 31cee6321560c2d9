"""Pods as a source delivers them: a name and the source's annotation, one container."""

from __future__ import annotations

from pykubelet.api.model import Pod
from pykubelet.api.static import CONFIG_SOURCE


def sourced_pod(name: str, source: str) -> Pod:
    """Pod `name` in default (uid `uid-<name>`) from `source` (file, http or api), one container
    `c` running `sleep`."""
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": f"uid-{name}",
                "annotations": {CONFIG_SOURCE: source},
            },
            "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep"]}]},
        }
    )
