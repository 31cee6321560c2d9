"""Defaults the kubelet gives pods that come from files and URLs (static pods)."""

from __future__ import annotations

import hashlib
import json

from pykubelet.api.errors import FieldError, ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.validation import dns_subdomain_error

CONFIG_SOURCE = "kubernetes.io/config.source"
CONFIG_HASH = "kubernetes.io/config.hash"
CONFIG_SEEN = "kubernetes.io/config.seen"
CONFIG_MIRROR = "kubernetes.io/config.mirror"
# Annotations the agent writes itself: a change in them is no change of the pod.
LOCAL_ANNOTATIONS = frozenset({CONFIG_SOURCE, CONFIG_SEEN, CONFIG_MIRROR})


def static_pod_uid(pod: Pod, node_name: str, location: str) -> str:
    """A stable UID for a manifest: the node, where it came from and what it says.

    The kubelet resets its hasher before hashing the pod, so two identical files collide
    (kubernetes/kubernetes#43420); we hash all three so they do not.
    """
    digest = hashlib.md5(usedforsecurity=False)
    digest.update(node_name.encode())
    digest.update(b"\x00")
    digest.update(location.encode())
    digest.update(b"\x00")
    digest.update(json.dumps(pod.to_api(), sort_keys=True, separators=(",", ":")).encode())
    return digest.hexdigest()


def api_object_refs(pod: Pod) -> list[str]:
    """The fields of a pod that name a ConfigMap or Secret of the API server."""
    paths: list[str] = []
    for i, volume in enumerate(pod.spec.volumes or []):
        if volume.config_map is not None:
            paths.append(f"spec.volumes[{i}].configMap")
        if volume.secret is not None:
            paths.append(f"spec.volumes[{i}].secret")
    for kind, containers in (
        ("initContainers", pod.spec.init_containers),
        ("containers", pod.spec.containers),
    ):
        for i, container in enumerate(containers):
            for k, var in enumerate(container.env):
                source = var.value_from
                if source is not None and source.config_map_key_ref is not None:
                    paths.append(f"spec.{kind}[{i}].env[{k}].valueFrom.configMapKeyRef")
                if source is not None and source.secret_key_ref is not None:
                    paths.append(f"spec.{kind}[{i}].env[{k}].valueFrom.secretKeyRef")
            for k, _ in enumerate(container.env_from or []):
                paths.append(f"spec.{kind}[{i}].envFrom[{k}]")
    return paths


def apply_static_defaults(pod: Pod, node_name: str, source: str, location: str) -> Pod:
    """Namespace, node-suffixed name, nodeName, UID and config annotations, as the kubelet does.

    Raises ManifestError if the generated name is not a valid pod name.
    """
    refs = api_object_refs(pod)
    if refs:
        raise ManifestError(
            location,
            [
                FieldError(
                    path,
                    "a static pod may not reference a ConfigMap or Secret (as the "
                    "kubelet's mirror pods may not): use a hostPath or downwardAPI volume",
                )
                for path in refs
            ],
        )
    node = node_name.lower()
    # Copies of only what changes: a deep copy of a pod (pydantic's, through copy.deepcopy)
    # costs more than decoding it, and the parts left shared are not changed here.
    meta = pod.metadata.model_copy(update={"annotations": dict(pod.metadata.annotations)})
    result = pod.model_copy(
        update={
            "metadata": meta,
            "spec": pod.spec.model_copy(update={"node_name": node_name}),
            "status": pod.status.model_copy(update={"phase": "Pending"}),
        }
    )
    if not meta.uid:
        meta.uid = static_pod_uid(pod, node, location)
    meta.name = f"{meta.name}-{node}"
    if err := dns_subdomain_error(meta.name):
        raise ManifestError(
            location, [FieldError("metadata.name", f"with the node name appended: {err}")]
        )
    if not meta.namespace:
        meta.namespace = "default"
    meta.annotations[CONFIG_HASH] = meta.uid
    meta.annotations[CONFIG_SOURCE] = source
    return result
