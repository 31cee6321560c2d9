"""Sysctl admission, as the kubelet's sysctl allowlist (pkg/kubelet/sysctl/allowlist.go): a pod
may set the safe sysctls and those --allowed-unsafe-sysctls names (a name, or a prefix ending in
"*"); anything else is rejected with `SysctlForbidden`. A namespaced sysctl of the safe set is
refused for a pod sharing that namespace with the host (hostNetwork for net.*)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pykubelet.api.model import Pod
from pykubelet.api.security import SAFE_SYSCTLS, namespaced_by, to_dots
from pykubelet.kubelet.admission import ADMIT, AdmitResult, NodeUsage

FORBIDDEN_REASON = "SysctlForbidden"


class SysctlAllowlist:
    """The safe sysctls plus the allowed unsafe ones; the patterns were checked at start-up
    (cmd/cli.py refuses one that is not namespaced)."""

    def __init__(self, allowed_unsafe: Sequence[str]) -> None:
        self._names: dict[str, str | None] = {}
        self._prefixes: dict[str, str | None] = {}
        for pattern in (*SAFE_SYSCTLS, *allowed_unsafe):
            name = to_dots(pattern)
            if name.endswith("*"):
                self._prefixes[name[:-1]] = namespaced_by(name[:-1])
            else:
                self._names[name] = namespaced_by(name)

    def _error(self, sysctl: str, host_network: bool) -> str | None:
        name = to_dots(sysctl)
        namespace: str | None
        if name in self._names:
            namespace = self._names[name]
        else:
            found = [ns for prefix, ns in self._prefixes.items() if name.startswith(prefix)]
            if not found:
                return f'"{name}" not allowlisted'
            namespace = found[0]
        if namespace == "net" and host_network:
            return f'"{name}" not allowed with host net enabled'
        return None

    def admit(self, pod: Pod, requests: Mapping[str, int], usage: NodeUsage) -> AdmitResult:
        ctx = pod.spec.security_context
        for sysctl in (ctx.sysctls or []) if ctx else []:
            err = self._error(sysctl.name, bool(pod.spec.host_network))
            if err is not None:
                return AdmitResult(False, FORBIDDEN_REASON, f"forbidden sysctl: {err}")
        return ADMIT
