"""Container environment: `$(VAR)` expansion and `valueFrom.fieldRef`, as Kubernetes does them."""

from __future__ import annotations

import re
from collections.abc import Mapping

from pykubelet.api.model import Container, Pod


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion: `$(VAR)` from env, `$$` is `$`, anything else is kept literally.

    An undefined `$(VAR)` stays as written, so a typo is visible rather than silently empty.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


def field_ref_value(pod: Pod, field_path: str, host_ip: str, pod_ip: str) -> str:
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name or "",
        "status.podIP": pod_ip,
        "status.hostIP": host_ip,
    }
    if field_path in simple:
        return simple[field_path]
    match = _LABEL_REF.fullmatch(field_path)
    if match:
        source = pod.metadata.labels if match.group(1) == "labels" else pod.metadata.annotations
        return source.get(match.group(2), "")
    # Validation rejects every other path before a pod gets here.
    raise ValueError(f"unsupported fieldRef {field_path!r}")


def container_env(
    pod: Pod, container: Container, host_ip: str, pod_ip: str
) -> list[tuple[str, str]]:
    """The container's variables in order, each expanded against the ones before it."""
    resolved: dict[str, str] = {}
    for var in container.env:
        if var.value_from is not None:
            value = field_ref_value(pod, var.value_from.field_ref.field_path, host_ip, pod_ip)
        else:
            value = expand(var.value or "", resolved)
        resolved[var.name] = value
    return list(resolved.items())
