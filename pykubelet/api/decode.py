"""Decoding manifests (YAML or JSON; a Pod, a PodList or a stream of Pods) into validated Pods."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from pykubelet.api.dns_validation import validate_pod_dns
from pykubelet.api.errors import FieldError, ManifestError
from pykubelet.api.model import Pod
from pykubelet.api.validation import validate_pod

# The C loader is 8x faster on large manifests; PyYAML wheels ship it, a source build may not.
YAML_IS_FAST: bool = yaml.__with_libyaml__
_Loader: Any = yaml.CSafeLoader if YAML_IS_FAST else yaml.SafeLoader

# Fields of the Kubernetes API we know but do not implement yet: rejected with a clearer word than
# "unknown field", so the user knows the manifest is right and pykubelet is behind.
KNOWN_UNSUPPORTED = frozenset(
    {
        "volumeDevices", "resizePolicy", "stdinOnce", "hostPID",
        "hostIPC", "runtimeClassName",
        "shareProcessNamespace", "overhead",
        "resourceClaims",
        "hostUsers",
        # Container restart rules (KEP-5307, alpha after 1.32): refused by name, not guessed.
        "restartPolicyRules",
        # securityContext fields beyond those of the restricted profile (see the README)
        "seLinuxOptions", "appArmorProfile", "windowsOptions", "supplementalGroupsPolicy",
        "seLinuxChangePolicy",
        # volumeMounts fields and volume types beyond emptyDir, hostPath, configMap, secret,
        # downwardAPI, projected
        "mountPropagation", "subPathExpr", "recursiveReadOnly", "persistentVolumeClaim",
        "nfs", "csi", "ephemeral", "image", "gitRepo", "iscsi", "rbd", "cephfs",
        "glusterfs", "fc", "azureDisk", "azureFile", "awsElasticBlockStore",
        "gcePersistentDisk", "vsphereVolume", "portworxVolume", "scaleIO", "storageos",
        "quobyte", "flocker", "flexVolume", "cinder", "photonPersistentDisk",
    }
)  # fmt: skip


def format_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _pydantic_errors(exc: ValidationError, prefix: Sequence[int | str] = ()) -> list[FieldError]:
    errors: list[FieldError] = []
    for err in exc.errors(include_url=False):
        loc = [*prefix, *err["loc"]]
        # Unions report which member failed ("str", "int"); the user wants the field.
        loc = [p for p in loc if not (isinstance(p, str) and p in {"str", "int", "float"})]
        field = loc[-1] if loc else ""
        kind = err["type"]
        if kind == "extra_forbidden":
            if field in KNOWN_UNSUPPORTED:
                reason = "not supported by pykubelet yet (see the README's table of Pod fields)"
            else:
                reason = "unknown field"
        elif kind == "missing":
            reason = "required"
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            reason = f"unsupported value {err['input']!r}: must be {expected}"
        else:
            reason = err["msg"][0].lower() + err["msg"][1:]
        errors.append(FieldError(format_path(loc), reason))
    return errors


def load_documents(data: bytes, location: str) -> list[Any]:
    """The YAML or JSON documents of a manifest; raises ManifestError if it does not parse."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            location, [FieldError("", f"not UTF-8 text (byte {exc.start})")]
        ) from None
    if "\x00" in text:
        raise ManifestError(location, [FieldError("", "contains a NUL byte")])
    stripped = text.lstrip()
    if location.endswith(".json") or stripped.startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except RecursionError:
            raise ManifestError(
                location, [FieldError("", "invalid JSON: nested too deeply")]
            ) from None
        except json.JSONDecodeError as exc:
            if location.endswith(".json"):
                raise ManifestError(
                    location,
                    [
                        FieldError(
                            "", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
                        )
                    ],
                ) from None
            # Flow-style YAML also starts with '{': let the YAML parser have it.
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ManifestError(
            location, [FieldError("", f"invalid YAML{where}: {exc.problem}")]
        ) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ManifestError(location, [FieldError("", f"invalid YAML: {exc}")]) from None


def _nul_paths(obj: Any, prefix: Sequence[int | str], depth: int = 0) -> list[list[int | str]]:
    """Where a string holds NUL: no process argument, name or variable can carry one."""
    if depth > 100:
        return []  # pydantic reports the nesting itself
    if isinstance(obj, str):
        return [list(prefix)] if "\x00" in obj else []
    found: list[list[int | str]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.extend(_nul_paths(value, [*prefix, str(key)], depth + 1))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found.extend(_nul_paths(value, [*prefix, i], depth + 1))
    return found


def pod_from_object(
    obj: Any,
    location: str,
    prefix: Sequence[int | str] = (),
    *,
    api_pod: bool = False,
    nul_free: bool = False,
) -> Pod:
    """One decoded document as a validated Pod; errors carry `prefix` before their paths.
    `api_pod`: it comes from the API server, which alone may add ephemeral containers.
    `nul_free`: the caller knows no string in it holds NUL (not looked for again)."""
    where = format_path(prefix)
    if not isinstance(obj, dict):
        raise ManifestError(
            location, [FieldError(where, f"expected a Pod object, got {type(obj).__name__}")]
        )
    head: list[FieldError] = []
    kind = obj.get("kind")
    if kind is None:
        head.append(FieldError(format_path([*prefix, "kind"]), "required (kind: Pod)"))
    elif kind != "Pod":
        head.append(FieldError(format_path([*prefix, "kind"]), f"expected Pod, got {kind!r}"))
    api_version = obj.get("apiVersion")
    if api_version is None:
        head.append(FieldError(format_path([*prefix, "apiVersion"]), "required (apiVersion: v1)"))
    elif api_version != "v1":
        head.append(
            FieldError(format_path([*prefix, "apiVersion"]), f"expected v1, got {api_version!r}")
        )
    if not nul_free:
        head.extend(
            FieldError(format_path(path), "contains a NUL character")
            for path in _nul_paths(obj, prefix)
        )
    if head:
        raise ManifestError(location, head)
    try:
        return _validated(obj, location, prefix, api_pod)
    except ManifestError as exc:
        if not api_pod:
            raise
        first = exc
    # Only ephemeral containers are wrong (a field pykubelet does not support, such as the
    # capabilities of kubectl debug's profiles)? Then the pod runs on, and each of those
    # containers waits with the reason instead of starting. The structural errors come before
    # the semantic ones: set aside, then look again, until the pod passes or something else
    # is wrong.
    bad: dict[int, list[FieldError]] = {}
    errors = first.errors
    while True:
        more = _ephemeral_errors(errors)
        if more is None or not more or any(i in bad for i in more):
            raise first
        bad.update(more)
        try:
            pod = _validated(_set_aside(obj, bad), location, prefix, api_pod)
            break
        except ManifestError as exc:
            errors = exc.errors
    containers = pod.ephemeral_containers()
    for i, reasons in bad.items():
        containers[i].refuse(
            "pykubelet cannot run this ephemeral container: " + "; ".join(map(str, reasons))
        )
    return pod


def _validated(obj: Any, location: str, prefix: Sequence[int | str], api_pod: bool) -> Pod:
    where = format_path(prefix)
    try:
        pod = Pod.model_validate(obj)
    except ValidationError as exc:
        raise ManifestError(location, _pydantic_errors(exc, prefix)) from None
    except RecursionError:
        raise ManifestError(location, [FieldError(where, "nested too deeply")]) from None
    errors = [*validate_pod(pod, api_pod=api_pod), *validate_pod_dns(pod.spec)]
    if errors:
        if prefix:
            errors = [
                FieldError(f"{where}.{e.path}" if e.path else where, e.reason) for e in errors
            ]
        raise ManifestError(location, errors)
    return pod


_EPHEMERAL_PATH = re.compile(r"^spec\.ephemeralContainers\[(\d+)\]")


def _ephemeral_errors(errors: list[FieldError]) -> dict[int, list[FieldError]] | None:
    """The errors by ephemeral container, if every one is inside one; else None."""
    by_index: dict[int, list[FieldError]] = {}
    for error in errors:
        match = _EPHEMERAL_PATH.match(error.path)
        if match is None:
            return None
        by_index.setdefault(int(match.group(1)), []).append(error)
    return by_index


def _set_aside(obj: dict[str, Any], bad: dict[int, list[FieldError]]) -> dict[str, Any]:
    """The pod with each bad ephemeral container reduced to its name and image."""
    spec = dict(obj["spec"])
    containers = list(spec["ephemeralContainers"])
    for i in bad:
        original = containers[i] if isinstance(containers[i], dict) else {}
        containers[i] = {k: original[k] for k in ("name", "image") if k in original}
    spec["ephemeralContainers"] = containers
    return {**obj, "spec": spec}


def decode_pod(data: bytes, location: str) -> Pod:
    """One file, one Pod (the kubelet's rule for manifest files)."""
    docs = load_documents(data, location)
    if not docs:
        raise ManifestError(location, [FieldError("", "empty manifest: expected one Pod")])
    if len(docs) > 1:
        raise ManifestError(
            location,
            [FieldError("", f"expected one Pod per file, found {len(docs)} YAML documents")],
        )
    doc = docs[0]
    if isinstance(doc, dict) and doc.get("kind") == "PodList":
        raise ManifestError(
            location,
            [FieldError("kind", "a PodList is not allowed in a manifest file: one Pod per file")],
        )
    # Text without a raw NUL (load_documents refuses one) and without a backslash has no escape
    # that could make one: the walk over every string is skipped (a tenth of a parse).
    return pod_from_object(doc, location, nul_free=b"\\" not in data)


def pod_items(docs: list[Any], location: str) -> list[tuple[Any, list[int | str]]]:
    """Each pod object of the documents (PodLists flattened) with its field-path prefix."""
    items: list[tuple[Any, list[int | str]]] = []
    for i, doc in enumerate(docs):
        prefix: list[int | str] = [f"document[{i}]"] if len(docs) > 1 else []
        if isinstance(doc, dict) and doc.get("kind") == "PodList":
            listed = doc.get("items")
            if listed is None:
                listed = []
            if not isinstance(listed, list):
                raise ManifestError(
                    location, [FieldError(format_path([*prefix, "items"]), "expected a list")]
                )
            items.extend((item, [*prefix, "items", j]) for j, item in enumerate(listed))
        else:
            items.append((doc, prefix))
    return items


def decode_pods(data: bytes, location: str) -> tuple[list[Pod], list[ManifestError]]:
    """A body holding a Pod, a v1 PodList, or a YAML stream of Pods (the HTTP source's rule).

    Returns the good pods and one error per bad one, so one bad pod does not hide the others.
    A document that cannot be parsed at all raises.
    """
    items = pod_items(load_documents(data, location), location)
    pods: list[Pod] = []
    errors: list[ManifestError] = []
    for obj, prefix in items:
        try:
            pods.append(pod_from_object(obj, location, prefix))
        except ManifestError as exc:
            errors.append(exc)
    return pods, errors
