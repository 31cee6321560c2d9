"""What a node registers itself with: `--node-labels` and `--register-with-taints`, checked as the
kubelet checks them, in its words.

- A label key or taint key is a qualified name (`[prefix/]name`), a value a label value
  (apimachinery's IsQualifiedName / IsValidLabelValue, with their messages).
- A node may not give itself labels in the `kubernetes.io` / `k8s.io` namespaces, except those
  under `kubelet.kubernetes.io` and `node.kubernetes.io` and the well-known set the kubelet sets
  itself (k8s.io/kubelet/pkg/apis well_known_labels.go); the NodeRestriction admission plugin
  refuses the same, so the kubelet refuses them at start (ValidateKubeletFlags).
- A taint is `key=value:Effect` or `key:Effect`, the effect one of NoSchedule, PreferNoSchedule,
  NoExecute (pkg/util/taints parseTaint).

Pure functions; each raises ValueError with the kubelet's message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME = re.compile(f"^{_QUALIFIED_NAME_FMT}$")
_LABEL_VALUE_FMT = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_LABEL_VALUE = re.compile(f"^{_LABEL_VALUE_FMT}$")
_DNS1123_SUBDOMAIN_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DNS1123_SUBDOMAIN = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}$")

# k8s.io/kubelet/pkg/apis: the labels a kubelet may set on its own Node.
KUBELET_LABELS = (
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
)
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # apimachinery's RegexError, spacing included.
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len(n: int) -> str:
    return f"must be no more than {n} characters"


def dns1123_subdomain_errors(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append(_max_len(253))
    if not _DNS1123_SUBDOMAIN.match(value):
        errs.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                "characters, '-' or '.', and must start and end with an alphanumeric character",
                _DNS1123_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errs


def qualified_name_errors(value: str) -> list[str]:
    """apimachinery's IsQualifiedName."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend(f"prefix part {e}" for e in dns1123_subdomain_errors(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                "end with an alphanumeric character",
                _QUALIFIED_NAME_FMT,
                "MyName",
                "my.name",
                "123-abc",
            )
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append(f"name part {_max_len(63)}")
    if name and not _QUALIFIED_NAME.match(name):
        errs.append(
            "name part "
            + _regex_error(
                "must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                "end with an alphanumeric character",
                _QUALIFIED_NAME_FMT,
                "MyName",
                "my.name",
                "123-abc",
            )
        )
    return errs


def label_value_errors(value: str) -> list[str]:
    """apimachinery's IsValidLabelValue."""
    errs = []
    if len(value) > 63:
        errs.append(_max_len(63))
    if not _LABEL_VALUE.match(value):
        errs.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character",
                _LABEL_VALUE_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errs


def _namespace(key: str) -> str:
    prefix, sep, _ = key.partition("/")
    return prefix if sep else ""


def _in_namespace(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def is_kubernetes_label(key: str) -> bool:
    namespace = _namespace(key)
    return _in_namespace(namespace, "kubernetes.io") or _in_namespace(namespace, "k8s.io")


def is_kubelet_label(key: str) -> bool:
    """A label the kubelet may set on its own Node (IsKubeletLabel)."""
    if key in KUBELET_LABELS:
        return True
    namespace = _namespace(key)
    return any(_in_namespace(namespace, allowed) for allowed in KUBELET_LABEL_NAMESPACES)


def parse_label_pairs(text: str) -> dict[str, str]:
    """One `--node-labels` value: `k=v,k2=v2` (cliflag's ConfigurationMap)."""
    out: dict[str, str] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"malformed pair {pair.strip()!r}, expect string=string")
        out[key.strip()] = value.strip()
    return out


def validate_node_labels(labels: dict[str, str]) -> None:
    """ValidateKubeletFlags on --node-labels: the reserved namespaces first, then the syntax."""
    unknown = sorted(k for k in labels if is_kubernetes_label(k) and not is_kubelet_label(k))
    if unknown:
        raise ValueError(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: "
            f"[{' '.join(unknown)}]\n--node-labels in the 'kubernetes.io' namespace must begin "
            f"with an allowed prefix ({', '.join(KUBELET_LABEL_NAMESPACES)}) or be in the "
            f"specifically allowed set ({', '.join(KUBELET_LABELS)})"
        )
    invalid: list[str] = []
    for key, value in labels.items():
        if errs := qualified_name_errors(key):
            invalid.append(f"'{key}' - {', '.join(errs)}")
        if errs := label_value_errors(value):
            invalid.append(f"'{value}' - {', '.join(errs)}")
    if invalid:
        raise ValueError(f"invalid node labels: {'; '.join(invalid)}")


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def as_api(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


def validate_taint_effect(effect: str) -> None:
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"invalid taint effect: {effect}, unsupported taint effect")


def make_taint(key: str, value: str, effect: str, spec: str) -> Taint:
    """A taint from its parts; `spec` is how it was written, for the message."""
    validate_taint_effect(effect)
    if value and (errs := label_value_errors(value)):
        raise ValueError(f"invalid taint spec: {spec}, {'; '.join(errs)}")
    if errs := qualified_name_errors(key):
        raise ValueError(f"invalid taint spec: {spec}, {'; '.join(errs)}")
    return Taint(key=key, effect=effect, value=value)


def parse_taint(spec: str) -> Taint:
    """`key=value:Effect` or `key:Effect` (a node's taint needs its effect)."""
    parts = spec.split(":")
    if len(parts) == 1:
        validate_taint_effect("")  # a taint on a node without an effect: the API refuses it
    if len(parts) != 2:
        raise ValueError(f"invalid taint spec: {spec}")
    key_value = parts[0].split("=")
    if len(key_value) > 2:
        raise ValueError(f"invalid taint spec: {spec}")
    value = key_value[1] if len(key_value) == 2 else ""
    return make_taint(key_value[0], value, parts[1], spec)


def parse_taints(text: str) -> list[Taint]:
    """One `--register-with-taints` value: `<key>=<value>:<effect>,...`."""
    return [parse_taint(part) for part in text.split(",") if part]


def check_duplicate_taints(taints: list[Taint]) -> None:
    seen: set[tuple[str, str]] = set()
    for t in taints:
        if (t.key, t.effect) in seen:
            raise ValueError(
                f"duplicate taint {t.key}:{t.effect}: a key and effect may be given once"
            )
        seen.add((t.key, t.effect))
