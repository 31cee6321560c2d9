"""The stats collector (pykubelet/stats), its endpoints (server/stats.py) and the fixture's
metrics-server (tests/fixtures/apiserver/metrics.py).

The collector is run over fake cgroup trees (v1 and v2, laid out as cgroupfs and /proc would
be: the file names and formats are checked, not the kernel's semantics) and, where the machine
allows (root, cgroup v1), over real processes the process runtime put in real cgroups.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from pykubelet.runtime.base import (
    ContainerRunState,
    RuntimeContainer,
    RuntimePod,
    RuntimeSandbox,
)
from pykubelet.server.stats import add_stats_routes, go_float, resource_metrics, summary
from pykubelet.stats.cgroupfs import FULL_TREE_EVERY, CgroupFs
from pykubelet.stats.collector import HISTORY_SAMPLES, StatsCollector
from pykubelet.stats.types import NodeStats, StatsView, UsagePoint
from tests.fixtures.apiserver.metrics import (
    Point,
    _pair,
    cpu_quantity,
    decode,
    go_duration,
    memory_quantity,
    usage,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
MiB = 1 << 20


def container(
    pid: int | None, name: str = "main", cid: str = "c1", **kw: object
) -> RuntimeContainer:
    fields: dict[str, object] = {
        "id": cid,
        "runtime": "process",
        "pod_uid": "u1",
        "pod_name": "web",
        "pod_namespace": "default",
        "name": name,
        "attempt": 0,
        "spec_hash": "h",
        "image": "busybox",
        "state": ContainerRunState.RUNNING,
        "created_at": T0,
        "started_at": T0,
        "pid": pid,
    }
    fields.update(kw)
    return RuntimeContainer(**fields)  # type: ignore[arg-type]


def runtime_pod(*containers: RuntimeContainer, uid: str = "u1", name: str = "web") -> RuntimePod:
    sandbox = RuntimeSandbox("s1", uid, name, "default", True, "10.0.0.2", T0)
    return RuntimePod(uid, name, "default", sandbox, list(containers))


class Lister:
    def __init__(self, *pods: RuntimePod) -> None:
        self.pods = list(pods)
        self.fail: Exception | None = None

    async def list_pods(self) -> list[RuntimePod]:
        if self.fail is not None:
            raise self.fail
        return self.pods


# --- fake trees ----------------------------------------------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def proc_stat(pid: int, ppid: int, ticks: tuple[int, int, int, int], rss_pages: int) -> str:
    """A /proc/<pid>/stat line (52 fields), with a command name holding a space and a ")"."""
    fields = ["0"] * 50
    fields[0] = "S"  # state
    fields[1] = str(ppid)
    fields[7] = "100"  # minflt
    fields[9] = "2"  # majflt
    fields[11:15] = [str(t) for t in ticks]
    fields[21] = str(rss_pages)
    return f"{pid} (my cmd) x) " + " ".join(fields) + "\n"


def gone(proc: Path, pid: int) -> None:
    """The process ends: it leaves the listing, with its files."""
    shutil.rmtree(proc / str(pid))


MEMINFO = "MemTotal:  8000000 kB\nMemFree:  3000000 kB\nMemAvailable: 6000000 kB\n"
MEMINFO += "Inactive(file):  1000000 kB\n"


def v1_tree(tmp: Path) -> tuple[Path, Path]:
    """/proc and /sys/fs/cgroup of a v1 machine with cpu and cpuacct mounted apart (as here)."""
    proc, cg = tmp / "proc", tmp / "cgroup"
    mounts = "".join(
        f"cgroup {cg / c} cgroup rw,nosuid,{c} 0 0\n" for c in ("cpu", "cpuacct", "memory", "pids")
    )
    write(proc / "self" / "mounts", f"proc /proc proc rw 0 0\n{mounts}")
    write(proc / "self" / "cgroup", "4:memory:/agent\n3:pids:/agent\n2:cpuacct:/\n1:cpu:/\n")
    write(proc / "meminfo", MEMINFO)
    write(proc / "stat", "cpu  100 0 50 900 0 0 0 0 0 0\nbtime 1700000000\n")
    # The root: the node.
    write(cg / "cpuacct" / "cpuacct.usage", "5000000000\n")
    write(cg / "memory" / "memory.usage_in_bytes", str(3000 * MiB))
    write(
        cg / "memory" / "memory.stat", f"total_inactive_file {1000 * MiB}\ntotal_rss {800 * MiB}\n"
    )
    write(cg / "memory" / "memory.limit_in_bytes", str(2**63 - 4096))
    return proc, cg


def v1_container(proc: Path, cg: Path, pid: int, cpuacct: str, memory: str) -> None:
    write(proc / str(pid) / "cgroup", f"4:memory:{memory}\n2:cpuacct:{cpuacct}\n1:cpu:/\n")
    write(proc / str(pid) / "stat", proc_stat(pid, 1, (10, 5, 0, 0), 100))
    if cpuacct != "/":
        write(cg / "cpuacct" / cpuacct.lstrip("/") / "cpuacct.usage", "2000000000\n")
    mem = cg / "memory" / memory.lstrip("/")
    write(mem / "memory.usage_in_bytes", str(80 * MiB))
    write(
        mem / "memory.stat",
        f"inactive_file 1\ntotal_inactive_file {30 * MiB}\ntotal_rss {45 * MiB}\n",
    )
    write(mem / "memory.limit_in_bytes", str(128 * MiB))
    write(mem / "cgroup.procs", f"{pid}\n{pid + 1}\n")


async def test_v1_container_and_node_from_their_cgroups(tmp_path: Path) -> None:
    proc, cg = v1_tree(tmp_path)
    v1_container(proc, cg, 42, "/kubepods/c1", "/kubepods/c1")
    collector = StatsCollector(Lister(runtime_pod(container(42))), "n1", fs=CgroupFs(proc))
    assert collector.latest() is None
    first = await collector.sample()
    assert collector.latest() is first
    assert first.node_name == "n1" and first.errors == ()
    assert first.start_time == datetime.fromtimestamp(1700000000, UTC)
    assert first.cpu is not None and first.cpu.usage_core_nanoseconds == 5_000_000_000
    assert first.cpu.usage_nano_cores is None  # no window yet
    assert first.memory is not None
    assert first.memory.working_set_bytes == 2000 * MiB  # usage - total_inactive_file
    assert first.memory.available_bytes == 8000000 * 1024 - 2000 * MiB  # MemTotal - working set
    (pod,) = first.pods
    (c,) = pod.containers
    assert (pod.name, pod.namespace, pod.uid, c.name, c.id) == (
        "web",
        "default",
        "u1",
        "main",
        "c1",
    )
    assert c.cpu is not None and c.cpu.usage_core_nanoseconds == 2_000_000_000
    assert c.memory is not None and c.memory.working_set_bytes == 50 * MiB
    assert c.memory.available_bytes == 78 * MiB and c.memory.rss_bytes == 45 * MiB
    assert pod.cpu == c.cpu and pod.memory is not None
    assert pod.memory.working_set_bytes == 50 * MiB

    write(cg / "cpuacct" / "kubepods" / "c1" / "cpuacct.usage", "2500000000\n")
    # A window of at least 50 ms: its times are whole microseconds, so a window of a few
    # hundred (two samples back to back on a fast machine) was off by more than the 0.1 % below.
    await asyncio.sleep(0.05)
    second = await collector.sample()
    (c2,) = second.pods[0].containers
    assert c2.cpu is not None and c2.cpu.usage_nano_cores is not None
    window = (c2.cpu.time - c.cpu.time).total_seconds()
    assert c2.cpu.usage_nano_cores == pytest.approx(500_000_000 / window, rel=1e-3)


async def test_a_containers_cgroups_are_read_once_while_it_is_sampled(tmp_path: Path) -> None:
    """As cAdvisor follows a container's cgroup: its process's cgroups are read at its first
    sample, not again while it is sampled; again for a new container with the process's pid, or
    once the agent's own cgroups change (which of them are the container's own may differ)."""
    proc, cg = v1_tree(tmp_path)
    v1_container(proc, cg, 42, "/kubepods/c1", "/kubepods/c1")
    write(cg / "cpuacct" / "kubepods" / "c2" / "cpuacct.usage", "7000000000\n")
    write(cg / "cpuacct" / "kubepods" / "c3" / "cpuacct.usage", "9000000000\n")
    lister = Lister(runtime_pod(container(42)))
    collector = StatsCollector(lister, "n1", fs=CgroupFs(proc))

    async def cpu_ns() -> int:
        (c,) = (await collector.sample()).pods[0].containers
        assert c.cpu is not None
        return c.cpu.usage_core_nanoseconds

    assert await cpu_ns() == 2_000_000_000
    # Moved (nothing moves a container's process; the read shows whether it was read again).
    cgroups = proc / "42" / "cgroup"
    cgroups.write_text(cgroups.read_text().replace("cpuacct:/kubepods/c1", "cpuacct:/kubepods/c2"))
    assert await cpu_ns() == 2_000_000_000
    # The same pid as another container: its cgroups are its own.
    lister.pods = [runtime_pod(container(42, cid="c2"))]
    assert await cpu_ns() == 7_000_000_000
    cgroups.write_text(cgroups.read_text().replace("cpuacct:/kubepods/c2", "cpuacct:/kubepods/c3"))
    assert await cpu_ns() == 7_000_000_000
    # The agent's own cgroups changed: every container's are read again.
    write(proc / "self" / "cgroup", "4:memory:/agent2\n3:pids:/agent\n2:cpuacct:/\n1:cpu:/\n")
    assert await cpu_ns() == 9_000_000_000


async def test_a_shared_cgroup_falls_back_to_the_containers_processes(tmp_path: Path) -> None:
    """cpuacct is the root's (the process runtime joins no cpuacct cgroup here), memory is the
    container's: CPU is the sum over the processes of its memory cgroup."""
    proc, cg = v1_tree(tmp_path)
    v1_container(proc, cg, 42, "/", "/agent/pykubelet/podu1/c1")
    write(proc / "43" / "stat", proc_stat(43, 42, (100, 50, 20, 30), 10))
    collector = StatsCollector(Lister(runtime_pod(container(42))), "n1", fs=CgroupFs(proc))
    (c,) = (await collector.sample()).pods[0].containers
    ticks = (10 + 5) + (100 + 50 + 20 + 30)
    assert c.cpu is not None
    assert c.cpu.usage_core_nanoseconds == ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    assert c.memory is not None and c.memory.working_set_bytes == 50 * MiB  # its own cgroup


async def test_a_container_in_the_agents_cgroups_is_its_process_tree(tmp_path: Path) -> None:
    proc, _ = v1_tree(tmp_path)
    write(proc / "42" / "cgroup", "4:memory:/agent\n2:cpuacct:/\n")
    write(proc / "42" / "stat", proc_stat(42, 1, (10, 0, 0, 0), 100))
    write(proc / "43" / "stat", proc_stat(43, 42, (20, 0, 0, 0), 50))
    write(proc / "44" / "stat", proc_stat(44, 43, (30, 0, 0, 0), 25))
    write(proc / "45" / "stat", proc_stat(45, 1, (1000, 0, 0, 0), 1000))  # not its own
    lister = Lister(runtime_pod(container(42)))
    collector = StatsCollector(lister, "n1", fs=CgroupFs(proc))
    (c,) = (await collector.sample()).pods[0].containers
    hz, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    assert c.cpu is not None and c.cpu.usage_core_nanoseconds == 60 * 1_000_000_000 // hz
    assert c.memory is not None and c.memory.working_set_bytes == 175 * page

    # A process reaped outside the container takes its CPU time away: the counter stays.
    gone(proc, 44)
    (c,) = (await collector.sample()).pods[0].containers
    assert c.cpu is not None and c.cpu.usage_core_nanoseconds == 60 * 1_000_000_000 // hz
    assert c.cpu.usage_nano_cores == 0
    write(proc / "42" / "stat", proc_stat(42, 1, (40, 0, 0, 0), 100))
    (c,) = (await collector.sample()).pods[0].containers
    assert c.cpu is not None and c.cpu.usage_core_nanoseconds == 90 * 1_000_000_000 // hz


async def test_the_process_tree_follows_new_processes_orphans_and_reused_pids(
    tmp_path: Path,
) -> None:
    """Between two samples a process's parent is kept, not read again: new processes, orphans
    and pids used again by another process are still found as the kernel has them."""
    proc, _ = v1_tree(tmp_path)
    hz = os.sysconf("SC_CLK_TCK")
    write(proc / "42" / "cgroup", "4:memory:/agent\n2:cpuacct:/\n")
    write(proc / "42" / "stat", proc_stat(42, 1, (10, 0, 0, 0), 100))
    write(proc / "45" / "stat", proc_stat(45, 1, (1000, 0, 0, 0), 1000))  # not its own
    write(proc / "1" / "stat", proc_stat(1, 0, (0, 0, 0, 0), 1))  # init
    collector = StatsCollector(Lister(runtime_pod(container(42))), "n1", fs=CgroupFs(proc))

    async def cpu_ticks() -> int:
        (c,) = (await collector.sample()).pods[0].containers
        assert c.cpu is not None
        return c.cpu.usage_core_nanoseconds * hz // 1_000_000_000

    assert await cpu_ticks() == 10
    write(proc / "43" / "stat", proc_stat(43, 42, (20, 0, 0, 0), 50))  # a child: counted
    write(proc / "44" / "stat", proc_stat(44, 43, (30, 0, 0, 0), 25))
    assert await cpu_ticks() == 60
    # 43 ends; its child 44 goes to init: no longer the container's. The counter keeps the
    # 45 ticks no longer counted (42's own 15 are all that is read now).
    gone(proc, 43)
    write(proc / "44" / "stat", proc_stat(44, 1, (30, 0, 0, 0), 25))
    write(proc / "42" / "stat", proc_stat(42, 1, (15, 0, 0, 0), 100))
    assert await cpu_ticks() == 60
    # Pid 44 is used again, at once, by a child of 42: the listing did not change, so its
    # parent is not read again until the tree is read whole (a minute at the default period).
    write(proc / "44" / "stat", proc_stat(44, 42, (2, 0, 0, 0), 25))
    counted = [await cpu_ticks() for _ in range(FULL_TREE_EVERY)]
    assert counted[0] == 60 and counted[-1] == 62, counted
    # And the other way: its pid used again by a process outside the container, which is
    # left out at once (its parent, read with its usage, is not 42).
    write(proc / "44" / "stat", proc_stat(44, 1, (0, 0, 0, 0), 25))
    write(proc / "42" / "stat", proc_stat(42, 1, (20, 0, 0, 0), 100))
    assert await cpu_ticks() == 65  # 42's 5 more; 44's 2 gone (kept by the counter)


async def test_v2_container_and_node(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "unified"
    write(proc / "self" / "mounts", f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n")
    write(proc / "self" / "cgroup", "0::/system.slice/pykubelet.service\n")
    write(proc / "meminfo", MEMINFO)
    write(proc / "stat", "cpu  100 0 50 900 0 0 0 0 0 0\nbtime 1700000000\n")
    write(root / "cpu.stat", "usage_usec 7000000\nuser_usec 5000000\n")
    write(root / "memory.stat", f"anon {100 * MiB}\ninactive_file {500 * MiB}\n")
    write(proc / "42" / "cgroup", "0::/pykubelet/podu1/c1\n")
    cdir = root / "pykubelet" / "podu1" / "c1"
    write(cdir / "cpu.stat", "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    write(cdir / "memory.current", str(90 * MiB))
    write(cdir / "memory.stat", f"anon {60 * MiB}\ninactive_file {20 * MiB}\npgfault 7\n")
    write(cdir / "memory.max", "max\n")
    # A second container without a pid is not measured; an exited one neither.
    lister = Lister(
        runtime_pod(
            container(42),
            container(None, name="nopid", cid="c2"),
            container(43, name="done", cid="c3", state=ContainerRunState.EXITED),
        )
    )
    stats = await StatsCollector(lister, "n1", fs=CgroupFs(proc)).sample()
    assert stats.cpu is not None and stats.cpu.usage_core_nanoseconds == 7_000_000_000
    assert stats.memory is not None
    # The v2 root has no memory.current: usage is MemTotal - MemFree, less inactive_file.
    assert stats.memory.working_set_bytes == 5000000 * 1024 - 500 * MiB
    (c,) = stats.pods[0].containers
    assert c.cpu is not None and c.cpu.usage_core_nanoseconds == 1_500_000_000
    assert c.memory is not None and c.memory.working_set_bytes == 70 * MiB
    assert c.memory.available_bytes is None and c.memory.page_faults == 7


async def test_a_runtime_failure_is_a_scrape_error(tmp_path: Path) -> None:
    proc, _ = v1_tree(tmp_path)
    lister = Lister()
    lister.fail = RuntimeError("engine down")
    stats = await StatsCollector(lister, "n1", fs=CgroupFs(proc)).sample()
    assert stats.errors == ("cannot list the runtime's pods: engine down",)
    families = {f.name: f for f in text_string_to_metric_families(resource_metrics(stats))}
    assert set(families) == {"scrape_error", "resource_scrape_error"}
    assert families["scrape_error"].samples[0].value == 1
    assert resource_metrics(None).count(" 1\n") == 2  # nothing sampled yet


# --- what the endpoints write --------------------------------------------------------------


def sample_stats() -> NodeStats:
    from pykubelet.stats.types import ContainerStats, CpuUsage, MemoryUsage, PodStats

    at = datetime(2025, 1, 2, 3, 4, 5, 250000, tzinfo=UTC)
    cpu = CpuUsage(at, 1_250_000_000, 300_000_000)
    mem = MemoryUsage(at, 52 * MiB, usage_bytes=60 * MiB, available_bytes=76 * MiB)
    c = ContainerStats("main", "c1", T0, cpu, mem)
    side = ContainerStats('si"de', "c2", T0, cpu._replace(usage_nano_cores=None), mem)
    pod = PodStats("u1", "web", "default", T0, (c, side), cpu, mem)
    node_cpu = CpuUsage(at, 2_734_149_794_044, 1_000_000_000)
    node_mem = MemoryUsage(at, 1_540_796_416, usage_bytes=2 << 30)
    return NodeStats("n1", T0, at, node_cpu, node_mem, (pod,))


def test_resource_metrics_as_the_kubelet_writes_them() -> None:
    text = resource_metrics(sample_stats())
    lines = text.splitlines()
    assert (
        "# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes"
        in lines
    )
    assert "# TYPE node_cpu_usage_seconds_total counter" in lines
    assert "node_memory_working_set_bytes 1.540796416e+09 1735787045250" in lines
    assert "node_cpu_usage_seconds_total 2734.149794044 1735787045250" in lines
    assert (
        'container_cpu_usage_seconds_total{container="main",namespace="default",pod="web"} '
        "1.25 1735787045250"
    ) in lines
    # Start times carry no timestamp; families come sorted by name.
    assert (
        'container_start_time_seconds{container="main",namespace="default",pod="web"} '
        "1.735787045e+09"
    ) in lines
    names = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    assert names == sorted(names) and "scrape_error" in names

    families = {f.name: f for f in text_string_to_metric_families(text)}
    series = {
        (s.name, tuple(sorted(s.labels.items()))): (s.value, s.timestamp)
        for f in families.values()
        for s in f.samples
    }
    labels = (("container", "main"), ("namespace", "default"), ("pod", "web"))
    assert series[("container_memory_working_set_bytes", labels)] == (52 * MiB, 1735787045.25)
    odd = (("container", 'si"de'), ("namespace", "default"), ("pod", "web"))
    assert series[("container_cpu_usage_seconds_total", odd)][0] == 1.25  # escaped, read back
    pod = (("namespace", "default"), ("pod", "web"))
    assert series[("pod_cpu_usage_seconds_total", pod)] == (1.25, 1735787045.25)
    assert series[("pod_memory_working_set_bytes", pod)][0] == 52 * MiB
    assert series[("scrape_error", ())] == (0, None)
    assert series[("resource_scrape_error", ())] == (0, None)


def test_go_float() -> None:
    cases = {
        0.0: "0",
        1.0: "1",
        1.25: "1.25",
        123456.0: "123456",
        1234567.0: "1.234567e+06",
        1540796416.0: "1.540796416e+09",
        0.0001: "0.0001",
        0.00001: "1e-05",
        -2.5e-7: "-2.5e-07",
        1e21: "1e+21",
    }
    assert {v: go_float(v) for v in cases} == cases


def test_summary_has_the_shape_of_stats_v1alpha1() -> None:
    body = summary(sample_stats())
    assert set(body) == {"node", "pods"}
    node = body["node"]
    assert node["nodeName"] == "n1" and node["startTime"] == "2025-01-02T03:04:05Z"
    assert node["cpu"] == {
        "time": "2025-01-02T03:04:05Z",
        "usageNanoCores": 1_000_000_000,
        "usageCoreNanoSeconds": 2_734_149_794_044,
    }
    assert node["memory"] == {
        "time": "2025-01-02T03:04:05Z",
        "usageBytes": 2 << 30,
        "workingSetBytes": 1_540_796_416,
    }
    (pod,) = body["pods"]
    assert pod["podRef"] == {"name": "web", "namespace": "default", "uid": "u1"}
    assert [c["name"] for c in pod["containers"]] == ["main", 'si"de']
    main = pod["containers"][0]
    assert set(main) == {"name", "startTime", "cpu", "memory"}
    assert main["memory"]["availableBytes"] == 76 * MiB
    assert "usageNanoCores" not in pod["containers"][1]["cpu"]  # no window yet: omitted
    assert pod["cpu"]["usageCoreNanoSeconds"] == 1_250_000_000


async def test_each_pod_keeps_a_bounded_history_dropped_with_the_pod(tmp_path: Path) -> None:
    proc, cg = v1_tree(tmp_path)
    v1_container(proc, cg, 42, "/kubepods/c1", "/kubepods/c1")
    lister = Lister(runtime_pod(container(42)))
    collector = StatsCollector(lister, "n1", fs=CgroupFs(proc))
    assert collector.history("u1") == ()
    await collector.sample()
    (first,) = collector.history("u1")
    assert first.cpu_cores is None  # no rate on the first sample
    assert first.memory_bytes == 50 * MiB
    usage = cg / "cpuacct" / "kubepods" / "c1" / "cpuacct.usage"
    for i in range(HISTORY_SAMPLES + 5):
        write(usage, f"{2_000_000_000 + (i + 1) * 100_000_000}\n")
        await collector.sample()
    points = collector.history("u1")
    assert len(points) == HISTORY_SAMPLES  # bounded: the oldest went first
    assert all(p.cpu_cores is not None and p.cpu_cores > 0 for p in points)
    assert [p.time for p in points] == sorted(p.time for p in points)
    lister.pods = []
    await collector.sample()
    assert collector.history("u1") == ()


async def test_a_sample_another_reader_took_counts_as_the_periods(tmp_path: Path) -> None:
    """The eviction manager samples when the latest is a period old, moments before the
    collector would: the collector then waits a period from that sample, not sampling twice."""
    proc, _ = v1_tree(tmp_path)
    period = 2.0
    listed: list[float] = []  # when each sample began

    class Counting(Lister):
        async def list_pods(self) -> list[RuntimePod]:
            listed.append(asyncio.get_running_loop().time())
            return await super().list_pods()

    collector = StatsCollector(Counting(), "n1", period=period, fs=CgroupFs(proc))
    running = asyncio.create_task(collector.run())
    try:
        await asyncio.sleep(0.75 * period)
        await collector.sample()  # another reader's, a quarter period before the collector's
        for _ in range(int(3 * period / 0.05)):
            if len(listed) == 3:
                break
            await asyncio.sleep(0.05)
    finally:
        running.cancel()
    collectors, other, next_one = listed
    assert other - collectors >= period / 2  # as the test meant (no stall of half a period)
    assert next_one - other >= 0.9 * period, listed  # not at `period`, a period after `other`


async def test_a_sample_asked_for_while_one_is_taken_is_that_one(tmp_path: Path) -> None:
    proc, _ = v1_tree(tmp_path)
    listing = asyncio.Event()
    listed: list[int] = []

    class Slow(Lister):
        async def list_pods(self) -> list[RuntimePod]:
            listed.append(1)
            await listing.wait()
            return await super().list_pods()

    collector = StatsCollector(Slow(), "n1", fs=CgroupFs(proc))
    first = asyncio.create_task(collector.sample())
    await asyncio.sleep(0.01)  # under way, listing the runtime's pods
    second = asyncio.create_task(collector.sample())
    await asyncio.sleep(0.01)
    listing.set()
    one, other = await asyncio.gather(first, second)
    assert one is other and len(listed) == 1
    assert collector.latest() is one
    # Storage measured now is never an older sample's.
    await asyncio.gather(collector.sample(), collector.sample(storage=True))
    assert len(listed) == 3


class View:
    def __init__(self, stats: NodeStats | None) -> None:
        self.stats = stats

    def latest(self) -> NodeStats | None:
        return self.stats

    def history(self, uid: str) -> tuple[UsagePoint, ...]:
        return ()


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], View]]:
    view = View(None)
    checked: StatsView = view  # the handlers need only the read-only protocol
    app = web.Application()
    add_stats_routes(app, checked)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        yield c, view


async def test_the_routes(client: tuple[TestClient[web.Request, web.Application], View]) -> None:
    http, view = client
    resp = await http.get("/stats/summary")
    assert resp.status == 503 and (await resp.json())["kind"] == "Status"
    view.stats = sample_stats()
    resp = await http.get("/stats/summary?only_cpu_and_memory=true")
    assert resp.status == 200 and resp.content_type == "application/json"
    assert (await resp.json())["node"]["nodeName"] == "n1"
    resp = await http.get("/metrics/resource")
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "node_cpu_usage_seconds_total 2734.149794044" in await resp.text()
    view.stats = sample_stats()._replace(errors=("engine down",))
    resp = await http.get("/stats/summary")
    assert resp.status == 500 and "engine down" in (await resp.json())["message"]


# --- the fixture's metrics-server ----------------------------------------------------------


def test_the_fixture_decodes_the_kubelets_text_as_metrics_server() -> None:
    stats = sample_stats()
    node, pods = decode(resource_metrics(stats), scraped_at=0.0)
    assert node == Point(1735787045.25, 2_734_149_794_044, 1_540_796_416)
    main = pods[("default", "web")]["main"]
    assert main == Point(1735787045.25, 1_250_000_000, 52 * MiB, T0.timestamp())
    # A container with no memory figure drops its pod; a node without CPU is no node.
    broken = stats.pods[0].containers[1]._replace(memory=None)
    pod = stats.pods[0]._replace(containers=(stats.pods[0].containers[0], broken))
    node, pods = decode(resource_metrics(stats._replace(pods=(pod,), cpu=None)), 0.0)
    assert node is None and pods == {}


def test_the_fixture_rates_need_two_samples_of_the_kubelet() -> None:
    a = Point(100.0, 1_000_000_000, 10, 50.0)
    same = Point(100.0, 1_000_000_000, 10, 50.0)  # the kubelet's same sample, scraped again
    b = Point(110.0, 6_000_000_000, 20, 50.0)
    assert _pair(a, None, None) is None
    assert _pair(same, a, None) is None  # no window yet
    assert _pair(b, same, None) == same
    assert _pair(b, b, same) == same  # a repeated scrape keeps the window
    u = usage(b, a)
    assert u is not None and (u.cpu_nano, u.window, u.memory) == (500_000_000, 10.0, 20)
    assert usage(Point(120.0, 10, 1, 50.0), b) is None  # the counter went down
    restarted = Point(120.0, 9_000_000_000, 1, 115.0)
    assert _pair(restarted, b, a) is None  # started after the last point: a new series
    assert cpu_quantity(500_000_000) == "500m" and cpu_quantity(123_456) == "123456n"
    assert cpu_quantity(2_000_000_000) == "2" and cpu_quantity(0) == "0"
    assert memory_quantity(50 * MiB) == "50Mi" and memory_quantity(52_432_896) == "51204Ki"
    assert memory_quantity(1000) == "1000"
    assert go_duration(10.0) == "10s" and go_duration(10.0021) == "10.0021s"
    assert go_duration(90.5) == "1m30.5s" and go_duration(0.25) == "250ms"


# --- real processes in real cgroups --------------------------------------------------------


def _v1_memory_usable() -> bool:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return False
    return os.geteuid() == 0 and any(":memory:" in line for line in text.splitlines())


@pytest.mark.skipif(not _v1_memory_usable(), reason="needs root and the v1 memory controller")
async def test_real_processes_in_real_cgroups(tmp_path: Path) -> None:
    from pykubelet.runtime.process.runtime import ProcessRuntime
    from tests.unit.test_process_runtime import config, new_pod

    rt = ProcessRuntime(tmp_path, pod_pids_limit=-1)
    await rt.start()
    ready = tmp_path / "ready"
    code = (
        "import time, pathlib\n"
        "x = bytearray(48 << 20)\n"
        "for i in range(0, len(x), 4096): x[i] = 1\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "end = time.monotonic() + 60\n"
        "while time.monotonic() < end: pass\n"
    )
    try:
        pod, sb = await new_pod(rt)
        spec = dataclasses.replace(
            config(command=[sys.executable, "-c", code], name="hog"),
            limits={"memory": "256Mi"},
        )
        c = await rt.start_container(pod, sb, spec)
        for _ in range(200):
            if ready.exists():
                break
            await asyncio.sleep(0.05)
        assert ready.exists()
        collector = StatsCollector(rt, "n1")
        await collector.sample()
        await asyncio.sleep(0.5)
        stats = await collector.sample()
        (pod_stats,) = [p for p in stats.pods if p.uid == pod.uid]
        (got,) = pod_stats.containers
        assert got.id == c.id
        assert got.memory is not None
        assert 48 * MiB <= got.memory.working_set_bytes <= 120 * MiB, got.memory
        assert got.memory.available_bytes is not None  # its limit, from its own memory cgroup
        assert got.cpu is not None and got.cpu.usage_nano_cores is not None
        assert got.cpu.usage_nano_cores > 300_000_000, got.cpu  # spinning: most of a core
        assert stats.cpu is not None and stats.memory is not None
        assert stats.memory.working_set_bytes > got.memory.working_set_bytes
    finally:
        for p in await rt.list_pods():
            await rt.remove_pod(p.uid)
        await rt.close()


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _rss_pages(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[21])


async def test_a_real_process_tree_is_read_until_its_process_is_gone() -> None:
    """Over the real /proc: a container's process and its child are its usage (the child's
    parent read once), and a container whose process ended is left out."""
    main = await asyncio.create_subprocess_exec(
        "sh", "-c", "sleep 60 & wait", start_new_session=True
    )
    collector = StatsCollector(Lister(runtime_pod(container(main.pid))), "n1")
    try:
        for _ in range(100):  # until the shell has its child
            if children := await asyncio.to_thread(_children, main.pid):
                break
            await asyncio.sleep(0.02)
        rss = []
        for _ in range(3):
            (pod,) = (await collector.sample()).pods
            memory = pod.containers[0].memory
            assert memory is not None
            rss.append(memory.rss_bytes)
        pages = [await asyncio.to_thread(_rss_pages, p) for p in (main.pid, *children)]
        assert rss[-1] == sum(pages) * os.sysconf("SC_PAGE_SIZE")
    finally:
        os.killpg(main.pid, 9)
        await main.wait()
    assert (await collector.sample()).pods == ()
