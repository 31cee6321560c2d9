"""Eviction on the real agent (process runtime, cluster mode: the kubelet never evicts static
pods): a pod filling a small tmpfs --root-dir, a pod allocating memory past a memory.available
threshold and a pod forking past a pid.available threshold are each evicted (Failed, Evicted,
the kubelet's message and event) while the other pod runs on; the Node shows the pressure
condition and its taint, refuses new pods meanwhile, and clears both after the transition
period."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pykubelet.kubelet.eviction_signals import pid_observation
from pykubelet.stats.cgroupfs import CgroupFs
from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, wait_for
from tests.integration.test_cluster import KubeClient, apiserver, cluster  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs, cgroups)")

Obj = dict[str, Any]
MIB = 1 << 20
FAST = ("--eviction-monitoring-interval=1s", "--eviction-pressure-transition-period=15s")


def pod(name: str, node: str, command: list[str], **extra: Any) -> Obj:
    container: Obj = {"name": "main", "image": "busybox:test", "command": command}
    container.update(extra.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            **extra,
        },
    }


def quiet(node: str) -> Obj:
    # Burstable, within its request: the last the kubelet would pick.
    resources = {"requests": {"memory": "50Mi", "cpu": "10m"}}
    return pod("quiet", node, ["/bin/sleep", "600"], container={"resources": resources})


def phase(client: KubeClient, name: str) -> str:
    found = client.pod(name)
    return str((found or {}).get("status", {}).get("phase", ""))


def evicted(client: KubeClient, name: str) -> Obj | None:
    status = (client.pod(name) or {}).get("status") or {}
    return status if status.get("reason") == "Evicted" else None


def condition(client: KubeClient, node: str, type_: str) -> Obj:
    found = client.node(node) or {}
    for cond in found.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return cond  # type: ignore[no-any-return]
    raise AssertionError(f"no {type_} condition on node {node}")


def taint_keys(client: KubeClient, node: str) -> list[str]:
    found = client.node(node) or {}
    return [t["key"] for t in (found.get("spec") or {}).get("taints") or []]


def evicted_events(client: KubeClient, name: str) -> list[str]:
    return [
        e["message"]
        for e in client.events()
        if e.get("reason") == "Evicted" and e["involvedObject"]["name"] == name
    ]


def check_pressure_cycle(
    client: KubeClient, node: str, type_: str, reason: str, taint: str, victim: str
) -> None:
    """The victim evicted, the condition and taint on the Node, a new pod refused, the other
    pod running; then condition and taint gone after the transition period."""
    status = wait_for(f"{victim} evicted", lambda: evicted(client, victim), timeout=90)
    assert status["phase"] == "Failed"
    wait_for(
        f"{type_} True",
        lambda: condition(client, node, type_)["status"] == "True",
        timeout=30,
    )
    pressured = condition(client, node, type_)
    assert pressured["reason"] == reason
    # The taint comes in its own request after the status (as the node lifecycle controller's
    # does in a cluster): waited for, not expected in the same instant.
    wait_for(f"the {taint} taint", lambda: taint in taint_keys(client, node), timeout=15)
    # Admitted while the condition holds: refused, in the eviction admit handler's words.
    late = pod(f"late-{uuid.uuid4().hex[:4]}", node, ["/bin/sleep", "600"])
    client.create_pod(late)
    name = late["metadata"]["name"]
    refused = wait_for(f"{name} refused", lambda: evicted(client, name), timeout=30)
    assert refused["message"] == f"Pod was rejected: The node had condition: [{type_}]. "
    wait_for(
        f"the Evicted event of {victim}",
        lambda: evicted_events(client, victim) == [status["message"]],
    )
    assert phase(client, "quiet") == "Running"
    wait_for(
        f"{type_} False again",
        lambda: condition(client, node, type_)["status"] == "False",
        timeout=60,
    )
    wait_for(f"the {taint} taint removed", lambda: taint not in taint_keys(client, node))
    assert phase(client, "quiet") == "Running"


@pytest.fixture
def tmpfs_root(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs as the agent's --root-dir (set up before the agent, gone after it)."""
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(root)], check=True)
    yield root
    subprocess.run(["umount", "-l", str(root)], check=False)


def test_a_pod_filling_the_root_dir_is_evicted_for_disk_pressure(
    tmpfs_root: Path,
    start_agent: Callable[..., Agent],
    cluster: tuple[ApiServer, Path, KubeClient],  # noqa: F811
) -> None:
    _, kubeconfig, client = cluster
    node = "disk-node"
    client.create_pod(quiet(node))
    fill = "sleep 2; dd if=/dev/zero of=/data/fill bs=1M count=44 2>/dev/null; sleep 600"
    client.create_pod(
        pod(
            "filler",
            node,
            ["/bin/sh", "-c", fill],
            container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            volumes=[{"name": "data", "emptyDir": {}}],
        )
    )
    start_agent(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        node,
        "--eviction-hard=nodefs.available<24Mi",
        *FAST,
    )
    check_pressure_cycle(
        client, node, "DiskPressure", "KubeletHasDiskPressure",
        "node.kubernetes.io/disk-pressure", "filler",
    )  # fmt: skip
    message = evicted(client, "filler")
    assert message is not None
    assert message["message"].startswith(
        "The node was low on resource: ephemeral-storage. Threshold quantity: 24Mi, available: "
    )
    # The evicted pod's emptyDir went with it: the space is back.
    assert os.statvfs(tmpfs_root).f_bavail * os.statvfs(tmpfs_root).f_frsize > 24 * MIB


def memory_available() -> int:
    """memory.available as the agent observes it: capacity - the node's working set."""
    fs = CgroupFs()
    fs.refresh()
    reading = fs.node()
    assert reading.limit is not None and reading.working_set is not None
    return reading.limit - reading.working_set


def test_a_pod_allocating_memory_past_the_threshold_is_evicted(
    start_agent: Callable[..., Agent],
    cluster: tuple[ApiServer, Path, KubeClient],  # noqa: F811
) -> None:
    _, kubeconfig, client = cluster
    node = "memory-node"
    client.create_pod(quiet(node))
    hog = "import time; time.sleep(2); b = b'x' * (600 << 20); time.sleep(600)"
    client.create_pod(pod("hog", node, [sys.executable, "-c", hog]))
    # Crossed once the hog holds its 600 MiB (200 MiB of margin for the machine's own moves).
    threshold = (memory_available() - 400 * MIB) // MIB
    start_agent(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        node,
        f"--eviction-hard=memory.available<{threshold}Mi",
        *FAST,
    )
    check_pressure_cycle(
        client, node, "MemoryPressure", "KubeletHasInsufficientMemory",
        "node.kubernetes.io/memory-pressure", "hog",
    )  # fmt: skip
    status = evicted(client, "hog")
    assert status is not None
    message = status["message"]
    assert message.startswith(
        f"The node was low on resource: memory. Threshold quantity: {threshold}Mi, available: "
    )
    assert "Container main was using " in message
    assert message.endswith(", request is 0, has larger consumption of memory. ")


def test_a_forking_pod_is_evicted_for_pid_pressure(
    start_agent: Callable[..., Agent],
    cluster: tuple[ApiServer, Path, KubeClient],  # noqa: F811
) -> None:
    _, kubeconfig, client = cluster
    node = "pid-node"
    client.create_pod(quiet(node))
    # Its children reaped by itself when it is stopped: an orphan's exit is counted until
    # whoever adopts it reaps it, which some container inits do late.
    fork = (
        "trap 'kill $(jobs -p); wait; exit 143' TERM; sleep 2; "
        "for i in $(seq 1000); do /bin/sleep 600 & done; wait"
    )
    client.create_pod(pod("forker", node, ["/bin/sh", "-c", fork]))
    # Crossed once the forker runs its 1,000 processes; 500 of margin either way for what the
    # machine (another test worker) forks meanwhile.
    threshold = pid_observation().available - 500
    start_agent(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        node,
        f"--eviction-hard=pid.available<{threshold}",
        *FAST,
    )
    check_pressure_cycle(
        client, node, "PIDPressure", "KubeletHasInsufficientPID",
        "node.kubernetes.io/pid-pressure", "forker",
    )  # fmt: skip
    status = evicted(client, "forker")
    assert status is not None
    assert status["message"].startswith("The node was low on resource: pids. Threshold quantity: ")
