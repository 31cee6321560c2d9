"""What the layers above see of the status cache: RuntimePod, RuntimeSandbox, RuntimeContainer.

Pure functions. The same for every sandbox backend: which sandbox a pod has (the ready one,
else the latest attempt), the order of its containers (by name, then attempt), and the reason
of an exited container as the kubelet gives it (OOMKilled, else Completed for exit code 0,
else Error).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from pykubelet.runtime.base import ContainerRunState, RuntimeContainer, RuntimePod, RuntimeSandbox
from pykubelet.runtime.sandbox.engine import ContainerEntry, SandboxEntry


def pick_sandbox(sandboxes: Iterable[SandboxEntry]) -> SandboxEntry | None:
    """The ready sandbox if there is one, else the latest attempt."""
    return max(sandboxes, key=lambda s: (s.ready, s.attempt, s.created_at), default=None)


def sandbox_view(entry: SandboxEntry) -> RuntimeSandbox:
    return RuntimeSandbox(
        id=entry.id,
        pod_uid=entry.pod_uid,
        pod_name=entry.pod_name,
        pod_namespace=entry.pod_namespace,
        ready=entry.ready,
        ip=entry.ip,
        created_at=entry.created_at,
    )


def exit_reason(entry: ContainerEntry) -> str | None:
    if entry.state is not ContainerRunState.EXITED:
        return None
    if entry.oom_killed:
        return "OOMKilled"
    return "Completed" if entry.exit_code == 0 else "Error"


def container_view(entry: ContainerEntry, runtime: str) -> RuntimeContainer:
    exited = entry.state is ContainerRunState.EXITED
    return RuntimeContainer(
        id=entry.id,
        runtime=runtime,
        pod_uid=entry.pod_uid,
        pod_name=entry.pod_name,
        pod_namespace=entry.pod_namespace,
        name=entry.name,
        attempt=entry.attempt,
        spec_hash=entry.spec_hash,
        image=entry.image,
        state=entry.state,
        created_at=entry.created_at,
        started_at=entry.started_at,
        finished_at=entry.finished_at,
        exit_code=entry.exit_code,
        reason=exit_reason(entry),
        message=(entry.message or None) if exited else None,
        pid=entry.pid,
        image_id=entry.image_id,
    )


def pods(
    sandboxes: Iterable[SandboxEntry],
    containers: Iterable[ContainerEntry],
    runtime: str,
    only: Collection[str] | None = None,
) -> dict[str, RuntimePod]:
    """The pods (of the UIDs in `only`, if given) by UID."""
    by_uid: dict[str, tuple[list[SandboxEntry], list[ContainerEntry]]] = {}
    for s in sandboxes:
        if only is None or s.pod_uid in only:
            by_uid.setdefault(s.pod_uid, ([], []))[0].append(s)
    for c in containers:
        if only is None or c.pod_uid in only:
            by_uid.setdefault(c.pod_uid, ([], []))[1].append(c)
    out: dict[str, RuntimePod] = {}
    for uid, (own_sandboxes, own_containers) in by_uid.items():
        sandbox = pick_sandbox(own_sandboxes)
        members = sorted(own_containers, key=lambda c: (c.name, c.attempt, c.created_at))
        # Not empty: the pod is here because it has a sandbox or a container.
        named: SandboxEntry | ContainerEntry = sandbox if sandbox is not None else members[-1]
        out[uid] = RuntimePod(
            uid=uid,
            name=named.pod_name,
            namespace=named.pod_namespace,
            sandbox=None if sandbox is None else sandbox_view(sandbox),
            containers=[container_view(c, runtime) for c in members],
        )
    return out
