"""A container's effective security context: its own securityContext merged over the pod's, as
the kubelet's DetermineEffectiveSecurityContext, turned into the ContainerConfig fields every
runtime reads. What cannot be honoured raises SecurityError (CreateContainerConfigError).

runAsNonRoot without a runAsUser is left to the runtime (`run_as_non_root`), which knows the
image's user (api/security.py's `verify_run_as_non_root` has the kubelet's messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pykubelet.api.model import Container, Pod
from pykubelet.api.security import capability_errors, capability_name, pod_ref


class SecurityError(Exception):
    """The container's securityContext cannot be honoured (CreateContainerConfigError)."""


@dataclass(frozen=True)
class Security:
    run_as_user: int | None
    run_as_group: int | None
    supplemental_groups: list[int]
    read_only_root_filesystem: bool
    privileged: bool
    run_as_non_root: bool = False
    no_new_privileges: bool = False
    capabilities_add: list[str] = field(default_factory=list)
    capabilities_drop: list[str] = field(default_factory=list)
    seccomp: str = ""
    seccomp_localhost_profile: str = ""
    proc_mount_unmasked: bool = False


def _bare(names: list[str] | None) -> list[str]:
    out: list[str] = []
    for name in names or []:
        bare = capability_name(name)
        if bare is not None and bare not in out:
            out.append(bare)
    return out


def security_fields(pod: Pod, spec: Container) -> Security:
    """The container's securityContext merged over the pod's, as ContainerConfig fields."""
    pod_ctx = pod.spec.security_context
    ctx = spec.security_context
    user = ctx.run_as_user if ctx and ctx.run_as_user is not None else None
    group = ctx.run_as_group if ctx and ctx.run_as_group is not None else None
    non_root = ctx.run_as_non_root if ctx and ctx.run_as_non_root is not None else None
    seccomp = ctx.seccomp_profile if ctx else None
    if pod_ctx is not None:
        user = pod_ctx.run_as_user if user is None else user
        group = pod_ctx.run_as_group if group is None else group
        non_root = pod_ctx.run_as_non_root if non_root is None else non_root
        seccomp = pod_ctx.seccomp_profile if seccomp is None else seccomp
    if non_root and user == 0:
        raise SecurityError(
            f"container's runAsUser breaks non-root policy (pod: {pod_ref(pod)}, "
            f"container: {spec.name})"
        )
    caps = ctx.capabilities if ctx else None
    bad = capability_errors(caps.add if caps else None, "securityContext.capabilities.add")
    bad += capability_errors(caps.drop if caps else None, "securityContext.capabilities.drop")
    if bad:
        raise SecurityError("; ".join(bad))
    groups: list[int] = []
    if pod_ctx is not None:
        # The kubelet's order: fsGroup first, then supplementalGroups.
        if pod_ctx.fs_group is not None:
            groups.append(pod_ctx.fs_group)
        groups += [g for g in pod_ctx.supplemental_groups or [] if g not in groups]
    return Security(
        run_as_user=user,
        run_as_group=group,
        supplemental_groups=groups,
        read_only_root_filesystem=bool(ctx and ctx.read_only_root_filesystem),
        privileged=bool(ctx and ctx.privileged),
        run_as_non_root=bool(non_root),
        no_new_privileges=bool(ctx and ctx.allow_privilege_escalation is False),
        capabilities_add=_bare(caps.add if caps else None),
        capabilities_drop=_bare(caps.drop if caps else None),
        seccomp=seccomp.type if seccomp else "",
        seccomp_localhost_profile=(seccomp.localhost_profile or "") if seccomp else "",
        proc_mount_unmasked=bool(ctx and ctx.proc_mount == "Unmasked"),
    )
