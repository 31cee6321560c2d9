"""Node allocatable on the real agent: reservations and the hard eviction threshold taken off
capacity, counted by admission, shown on the status page and reported on the Node."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pykubelet.api.quantity import to_bytes
from tests.fixtures.apiserver import ApiServer
from tests.integration.agent import Agent, pod_yaml, wait_for, write_pod
from tests.integration.test_cluster import KubeClient, apiserver, cluster  # noqa: F401

MIB = 1 << 20
GIB = 1 << 30


def memory_capacity() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def test_a_pod_asking_more_than_allocatable_is_rejected_out_of_memory(
    start_agent: Callable[..., Agent], manifests: Path
) -> None:
    capacity = memory_capacity()
    allocatable = capacity - GIB - 100 * MIB  # --system-reserved, the default memory.available
    asked = capacity - 512 * MIB  # more than allocatable, less than the machine has
    write_pod(
        manifests,
        "big",
        pod_yaml("big", "exec sleep 600") + f"    resources: {{requests: {{memory: '{asked}'}}}}\n",
    )
    # The downward API: a limit the container does not set is the node's allocatable.
    write_pod(
        manifests,
        "env",
        pod_yaml("env", 'echo "memory=$MEM"; exec sleep 600')
        + "    env:\n    - name: MEM\n"
        + "      valueFrom: {resourceFieldRef: {resource: limits.memory}}\n",
    )
    agent = start_agent("--system-reserved=memory=1Gi")
    wait_for("env's log", lambda: f"memory={allocatable}" in agent.logs("env", "main"))
    big = wait_for(
        "big rejected",
        lambda: (p := agent.pod("big")) and p["status"].get("reason") == "OutOfmemory" and p,
    )
    assert big["status"]["phase"] == "Failed"
    assert big["status"]["message"] == (
        "Pod was rejected: Node didn't have enough resource: memory, "
        f"requested: {asked}, used: 0, capacity: {allocatable}"
    )
    status, page = agent.get("/")
    assert status == 200
    assert b"<h2>Node resources</h2>" in page
    assert b"<tr><td>memory</td>" in page


def test_reserving_more_than_the_node_has_refuses_the_start(
    start_agent: Callable[..., Agent],
) -> None:
    cpus = len(os.sched_getaffinity(0))
    with pytest.raises(AssertionError, match="agent exited with 1") as info:
        start_agent("--kube-reserved=cpu=1000")
    assert (
        'cannot start: invalid Node Allocatable configuration. Resource "cpu" has an allocatable '
        f"of 1000, capacity of {cpus - 1000}" in str(info.value)
    )


def test_an_enforced_reservation_needs_its_cgroup_to_exist(
    start_agent: Callable[..., Agent],
) -> None:
    flags = ["--enforce-node-allocatable=pods,kube-reserved", "--kube-reserved=memory=256Mi"]
    with pytest.raises(AssertionError, match="agent exited with 1") as info:
        start_agent(*flags, "--kube-reserved-cgroup=/no-such-kube-cgroup")
    assert (
        'cannot start: Failed to enforce Kube Reserved Cgroup Limits on "/no-such-kube-cgroup": '
        '"/no-such-kube-cgroup" cgroup does not exist' in str(info.value)
    )


def test_the_node_reports_allocatable_in_the_api_server(
    start_agent: Callable[..., Agent],
    cluster: tuple[ApiServer, Path, KubeClient],  # noqa: F811
    tmp_path: Path,
) -> None:
    _, kubeconfig, client = cluster
    agent = start_agent(
        "--kubeconfig",
        str(kubeconfig),
        "--node-name",
        "alloc-node",
        "--kube-reserved=cpu=100m,memory=256Mi",
        "--system-reserved=ephemeral-storage=1Gi",
        "--eviction-hard=memory.available<200Mi,nodefs.available<1Gi",
    )
    node = wait_for("the node", lambda: client.node("alloc-node"))
    capacity, allocatable = node["status"]["capacity"], node["status"]["allocatable"]
    cpus = int(capacity["cpu"])
    assert allocatable["cpu"] == f"{cpus * 1000 - 100}m"
    memory = memory_capacity() - 256 * MIB - 200 * MIB
    assert to_bytes(allocatable["memory"]) == memory
    storage = shutil.disk_usage(tmp_path / "root").total
    assert capacity["ephemeral-storage"] == str(storage)
    assert allocatable["ephemeral-storage"] == str(storage - 2 * GIB)
    assert allocatable["pods"] == "110"
    assert agent.proc is not None and agent.proc.poll() is None


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup/memory/cgroup.procs").exists(),
    reason="needs root and the cgroup v1 memory controller",
)
def test_kubepods_is_sized_to_allocatable_and_holds_the_pods_by_qos_class(
    start_agent: Callable[..., Agent], manifests: Path
) -> None:
    cpus = len(os.sched_getaffinity(0))
    write_pod(
        manifests,
        "guaranteed",
        pod_yaml("guaranteed", "exec sleep 600")
        + "    resources: {limits: {memory: 64Mi, cpu: 100m}}\n",
    )
    write_pod(
        manifests,
        "burstable",
        pod_yaml("burstable", "exec sleep 600") + "    resources: {limits: {memory: 64Mi}}\n",
    )
    # --pod-max-pids gives every container cgroups, BestEffort ones too.
    write_pod(manifests, "besteffort", pod_yaml("besteffort", "exec sleep 600"))
    # A cgroup root of its own: agents of other tests (running at once) size the default one.
    root = f"/pykubelet-test-{uuid.uuid4().hex[:8]}"
    agent = start_agent(
        "--system-reserved=memory=1Gi,pid=1000", "--pod-max-pids=100", f"--cgroup-root={root}"
    )
    try:
        _check_kubepods(agent, root, cpus)
    finally:
        agent.stop()
        _remove_cgroups(root)


def _remove_cgroups(root: str) -> None:
    for controller in ("memory", "cpu", "pids", "cpu,cpuacct"):
        top = Path("/sys/fs/cgroup") / controller / root.lstrip("/")
        if not top.is_dir() or top.is_symlink():
            continue
        for directory in sorted(top.rglob("*"), key=lambda d: -len(d.parts)):
            if directory.is_dir():
                with contextlib.suppress(OSError):
                    directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _check_kubepods(agent: Agent, root: str, cpus: int) -> None:
    for name in ("guaranteed", "burstable", "besteffort"):
        wait_for(
            f"{name} running",
            lambda n=name: (
                (p := agent.pod(n))
                and p["status"].get("containerStatuses")
                and "running" in p["status"]["containerStatuses"][0]["state"]
            ),
        )
    memory, cpu, pids = (
        Path("/sys/fs/cgroup") / c / root.lstrip("/") / "kubepods"
        for c in ("memory", "cpu", "pids")
    )
    # The reservations, not the eviction threshold (eviction acts before the OOM killer).
    limit = int((memory / "memory.limit_in_bytes").read_text())
    assert limit == memory_capacity() - GIB
    assert (cpu / "cpu.shares").read_text().strip() == str(cpus * 1024)
    assert (cpu / "besteffort" / "cpu.shares").read_text().strip() == "2"
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert (pids / "pids.max").read_text().strip() == str(pid_max - 1000)
    for name, qos, where in (
        ("guaranteed", "Guaranteed", memory),
        ("burstable", "Burstable", memory / "burstable"),
        ("besteffort", "BestEffort", memory / "besteffort"),
    ):
        pod = agent.pod(name)
        assert pod is not None and pod["status"]["qosClass"] == qos
        cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("process://")
        procs = where / f"pod{pod['metadata']['uid']}" / cid / "cgroup.procs"
        assert procs.read_text().split(), procs
