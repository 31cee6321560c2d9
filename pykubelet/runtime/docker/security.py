"""The restricted profile's fields on the Docker Engine API (Docker, or Podman's compatible
service), as the kubelet's Docker integration set them:

- capabilities: HostConfig.CapAdd / CapDrop, bare names ("NET_ADMIN", "ALL");
- allowPrivilegeEscalation false: SecurityOpt "no-new-privileges";
- seccompProfile: RuntimeDefault is the engine's default profile; Unconfined, and no profile
  at all (the kubelet's default without SeccompDefault), "seccomp=unconfined"; Localhost, the
  JSON file <root-dir>/seccomp/<localhostProfile>, sent as "seccomp=<its content>" as the
  docker CLI does, or as its path to Podman, which reads it itself (the file is checked in
  create, off the event loop: `read_seccomp`);
- procMount Unmasked: Podman's SecurityOpt "unmask=ALL"; Docker has no such option, refused;
- sysctls: HostConfig.Sysctls of the sandbox (infra) container, whose namespaces the pod's
  containers join;
- runAsNonRoot without runAsUser: the image's Config.User, checked before the create
  (`image_user_of`), with the kubelet's messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pykubelet.api.model import Pod
from pykubelet.runtime.base import ContainerConfig, StartError

SECCOMP_DIR = "seccomp"


def container_security(config: ContainerConfig, *, podman: bool) -> dict[str, Any]:
    """HostConfig fields for capabilities, no_new_privs, seccomp (but a Localhost profile's
    content) and procMount."""
    out: dict[str, Any] = {}
    opts: list[str] = []
    if not config.privileged:
        # A privileged container has every capability and no seccomp filter anyway.
        if config.capabilities_add:
            out["CapAdd"] = list(config.capabilities_add)
        if config.capabilities_drop:
            out["CapDrop"] = list(config.capabilities_drop)
        if config.seccomp in ("", "Unconfined"):
            opts.append("seccomp=unconfined")
    if config.no_new_privileges:
        opts.append("no-new-privileges")
    if config.proc_mount_unmasked:
        if not podman:
            raise StartError(
                "CreateContainerConfigError",
                "securityContext.procMount: Unmasked is not supported by this Docker engine "
                "(only Podman's unmask=ALL)",
            )
        opts.append("unmask=ALL")
    if opts:
        out["SecurityOpt"] = opts
    return out


def seccomp_file(config: ContainerConfig, root_dir: Path) -> Path | None:
    """The Localhost profile's file, if the container has one."""
    if config.seccomp != "Localhost" or config.privileged:
        return None
    return root_dir / SECCOMP_DIR / config.seccomp_localhost_profile


def read_seccomp(path: Path, podman: bool) -> str:
    """The SecurityOpt of a Localhost profile: its content for Docker (as the docker CLI sends
    it), its path for Podman (which reads the file itself, on this host);
    CreateContainerConfigError naming the field if the file cannot be read or is not JSON
    (blocking: call it in a thread)."""
    where = "securityContext.seccompProfile.localhostProfile"
    try:
        text = path.read_text()
        json.loads(text)
    except OSError as e:
        raise StartError(
            "CreateContainerConfigError", f"{where}: cannot read {path}: {e.strerror}"
        ) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise StartError(
            "CreateContainerConfigError", f"{where}: {path} is not a JSON seccomp profile: {e}"
        ) from None
    return f"seccomp={path}" if podman else f"seccomp={text}"


def sandbox_sysctls(pod: Pod) -> dict[str, str]:
    ctx = pod.spec.security_context
    return {s.name: s.value for s in (ctx.sysctls or [])} if ctx else {}


def image_user_of(inspect: dict[str, Any]) -> str:
    """An image inspect result's configured user ("" when it has none)."""
    config = inspect.get("Config") or {}
    return str(config.get("User") or "")
