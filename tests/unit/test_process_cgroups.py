"""cgroups of the process runtime, with real processes and the machine's real cgroups."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pykubelet.api.qos import BEST_EFFORT, BURSTABLE, GUARANTEED
from pykubelet.api.quantity import parse_quantity
from pykubelet.runtime.base import ContainerConfig, ContainerRunState
from pykubelet.runtime.process.cgroups import (
    CONTROLLERS,
    KUBEPODS,
    PARENT,
    Cgroups,
    PodsLimits,
    ReservedCgroup,
    Settings,
)
from pykubelet.runtime.process.runtime import UNKNOWN_REASON, ProcessRuntime
from pykubelet.runtime.resources import cpu_weight
from tests.unit.test_process_runtime import (
    config,
    current,
    gone,
    kill_quietly,
    new_pod,
    sh,
    wait_exited,
    wait_until,
)


def _hierarchies() -> dict[str, Path]:
    """Where this machine's v1 controllers put our containers (this suite runs on v1)."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(","):
            own[name] = path
    out = {}
    for name in CONTROLLERS:
        mount = Path("/sys/fs/cgroup") / name
        if name in own and (mount / "cgroup.procs").exists():
            out[name] = mount / own[name].lstrip("/") / PARENT
    return out


HIERARCHIES = _hierarchies()
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or set(HIERARCHIES) != set(CONTROLLERS),
    reason="needs root and the memory, cpu and pids controllers on cgroup v1",
)


def cg(controller: str, pod_uid: str, container_id: str | None = None) -> Path:
    """The pod's (or container's) cgroup, below whichever QoS class's directory holds it."""
    kubepods = HIERARCHIES[controller] / KUBEPODS
    candidates = [d / f"pod{pod_uid}" for d in (kubepods / "besteffort", kubepods / "burstable")]
    path = next((c for c in [*candidates, kubepods / f"pod{pod_uid}"] if c.exists()), candidates[0])
    return path if container_id is None else path / container_id


def remove_tree(path: Path) -> None:
    """A test's own cgroup tree, removed bottom-up (cgroupfs removes directories only)."""
    if path.is_dir():
        for child in path.iterdir():
            if child.is_dir():
                remove_tree(child)
        path.rmdir()


def read(path: Path) -> str:
    return path.read_text().strip()


def limited(c: ContainerConfig, **resources: dict[str, str]) -> ContainerConfig:
    return dataclasses.replace(c, **resources)  # type: ignore[arg-type]


def hog(megabytes: int, wait_for: Path | None = None) -> list[str]:
    """A Python that touches `megabytes` of memory (after `wait_for` exists, if given)."""
    code = f"x = b'x' * ({megabytes} << 20); print('survived', len(x))"
    if wait_for is not None:
        wait = f"while not os.path.exists({str(wait_for)!r}): time.sleep(0.05)"
        code = f"import os, time\n{wait}\n{code}"
    return [sys.executable, "-c", code]


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    runtime = ProcessRuntime(tmp_path, pod_pids_limit=-1)
    await runtime.start()
    yield runtime
    for pod in await runtime.list_pods():
        await runtime.remove_pod(pod.uid)
    await runtime.close()


async def test_memory_limit_is_enforced_and_reported_as_oom_killed(
    rt: ProcessRuntime,
) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(
        pod, sb, limited(config(command=hog(256)), limits={"memory": "64Mi"})
    )
    done = await wait_exited(rt, c)
    assert (done.exit_code, done.reason) == (137, "OOMKilled"), await rt.read_log(c)
    assert b"survived" not in await rt.read_log(c)
    for name in CONTROLLERS:  # removed once the exit was recorded
        assert not cg(name, pod.uid, c.id).exists()

    # Under its limit the same program completes: the OOM came from the limit.
    ok = await rt.start_container(
        pod, sb, limited(config(command=hog(16), name="ok"), limits={"memory": "256Mi"})
    )
    done = await wait_exited(rt, ok)
    assert (done.exit_code, done.reason) == (0, "Completed")


async def test_limits_are_written_and_the_process_joined_its_cgroups(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(
        pod,
        sb,
        limited(
            sh("exec sleep 60"),
            limits={"memory": "100Mi", "cpu": "250m"},
            requests={"cpu": "100m"},
        ),
    )
    mem, cpu = cg("memory", pod.uid, c.id), cg("cpu", pod.uid, c.id)
    assert int(read(mem / "memory.limit_in_bytes")) == 100 << 20
    assert int(read(mem / "memory.memsw.limit_in_bytes")) == 100 << 20  # no swap beyond it
    assert (read(cpu / "cpu.cfs_period_us"), read(cpu / "cpu.cfs_quota_us")) == ("100000", "25000")
    assert read(cpu / "cpu.shares") == "102"  # 100m * 1024 / 1000
    assert read(cg("pids", pod.uid) / "pids.max") == "max"  # --pod-max-pids -1
    assert c.pid is not None
    lines = read(Path(f"/proc/{c.pid}/cgroup")).splitlines()
    joined = {line.split(":")[1]: line.split(":")[2] for line in lines}
    for name in CONTROLLERS:  # the pod asks nothing in its spec: BestEffort
        assert joined[name].endswith(f"/{PARENT}/{KUBEPODS}/besteffort/pod{pod.uid}/{c.id}")
    await rt.stop_container(c, grace_seconds=5)
    assert not mem.exists() and not cpu.exists()

    # A limit alone is also the request, as the API server defaults it.
    only = await rt.start_container(
        pod, sb, limited(sh("exec sleep 60", name="l"), limits={"cpu": "2"})
    )
    assert read(cg("cpu", pod.uid, only.id) / "cpu.shares") == "2048"
    assert read(cg("cpu", pod.uid, only.id) / "cpu.cfs_quota_us") == "200000"
    await rt.stop_container(only, grace_seconds=5)

    await rt.remove_pod(pod.uid)
    for name in CONTROLLERS:
        assert not cg(name, pod.uid).exists()


async def test_plain_containers_get_no_cgroup(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(pod, sb, sh("exec sleep 60"))
    assert not cg("memory", pod.uid, c.id).exists()
    await rt.stop_container(c, grace_seconds=5)


def tagged(container_id: str) -> list[int]:
    """The live processes carrying the container's ID in their environment."""
    needle = f"PYKUBELET_CONTAINER_ID={container_id}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0") and not gone(int(entry)):
                        out.append(int(entry))
            except OSError:
                continue
    return out


async def test_pod_pids_limit_bounds_a_fork_loop(tmp_path: Path) -> None:
    rt = ProcessRuntime(tmp_path, pod_pids_limit=10)
    await rt.start()
    try:
        pod, sb = await new_pod(rt)
        # Bounded even if the limit did not hold: at most 50 sleeps.
        script = "i=0; while [ $i -lt 50 ]; do i=$((i+1)); sleep 120 & done; echo all-started"
        c = await rt.start_container(pod, sb, sh(script))
        done = await wait_exited(rt, c)
        log = await rt.read_log(c)
        assert done.exit_code != 0 and b"all-started" not in log, log
        assert b"fork" in log.lower()  # dash: "Cannot fork"
        pids = cg("pids", pod.uid)
        assert read(pids / "pids.max") == "10"
        await wait_until(lambda: not tagged(c.id), "the sleeps to be killed with the container")
    finally:
        for pod_ in await rt.list_pods():
            await rt.remove_pod(pod_.uid)
        await rt.close()


async def test_processes_that_left_the_group_die_with_the_container(rt: ProcessRuntime) -> None:
    pod, sb = await new_pod(rt)
    c = await rt.start_container(
        pod,
        sb,
        limited(sh("setsid sleep 300 & echo $!; sleep 0.2"), limits={"memory": "64Mi"}),
    )
    await wait_exited(rt, c)
    escaped = int((await rt.read_log(c)).split()[0])
    try:
        await wait_until(lambda: gone(escaped), "the setsid'd sleep to be killed")
    finally:
        kill_quietly(escaped)


async def test_cleanup_and_oom_after_an_agent_restart(tmp_path: Path) -> None:
    a = ProcessRuntime(tmp_path)
    await a.start()
    pod, sb = await new_pod(a)
    mem = {"memory": "64Mi"}
    # OOM-killed while adopted, OOM-killed while no agent runs, killed by hand meanwhile.
    adopted = await a.start_container(
        pod, sb, limited(config(command=hog(256, tmp_path / "go-1"), name="adopted"), limits=mem)
    )
    away = await a.start_container(
        pod, sb, limited(config(command=hog(256, tmp_path / "go-2"), name="away"), limits=mem)
    )
    killed = await a.start_container(
        pod, sb, limited(sh("exec sleep 300", name="killed"), limits=mem)
    )
    pids = [c.pid or 0 for c in (adopted, away, killed)]
    await a.close()  # as a SIGKILLed agent: the processes run on
    b = ProcessRuntime(tmp_path)
    try:
        kill_quietly(pids[2], reap=True)
        (tmp_path / "go-2").touch()
        await wait_until(lambda: gone(pids[1]), "the unwatched container to be OOM-killed")

        await b.start()
        got = await wait_exited(b, away)
        assert (got.exit_code, got.reason) == (137, "OOMKilled")
        # Gone, or a zombie that no init here reaps (its exit is seen once b watches it).
        got = await wait_exited(b, killed)
        assert (got.state, got.reason) == (ContainerRunState.EXITED, UNKNOWN_REASON)
        for c in (away, killed):
            for name in CONTROLLERS:
                assert not cg(name, pod.uid, c.id).exists()

        assert (await current(b, adopted)).state is ContainerRunState.RUNNING
        assert cg("memory", pod.uid, adopted.id).exists()
        (tmp_path / "go-1").touch()
        got = await wait_exited(b, adopted)
        assert (got.exit_code, got.reason) == (137, "OOMKilled")
        assert not cg("memory", pod.uid, adopted.id).exists()
        await b.remove_pod(pod.uid)
        assert not cg("pids", pod.uid).exists()
    finally:
        for pid in pids:
            kill_quietly(pid, reap=True)
        await b.close()


async def test_without_usable_cgroups_containers_start_and_one_warning_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rt = ProcessRuntime(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(os, "geteuid", lambda: 1000)  # detection sees an unprivileged agent
        await rt.start()
    try:
        pod, sb = await new_pod(rt)
        with caplog.at_level(logging.WARNING, logger="pykubelet.runtime.process.cgroups"):
            for name in ("a", "b"):
                c = await rt.start_container(
                    pod, sb, limited(sh("exit 0", name=name), limits={"memory": "64Mi"})
                )
                assert (await wait_exited(rt, c)).reason == "Completed"
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "resource limits of the process runtime are not enforced: the agent does not run "
            "as root (containers run anyway)"
        ]
    finally:
        for pod_ in await rt.list_pods():
            await rt.remove_pod(pod_.uid)
        await rt.close()


def test_quantities() -> None:
    assert parse_quantity("64Mi") == 64 << 20
    assert parse_quantity("1G") == 10**9
    assert parse_quantity("500m") * 1000 == 500
    assert parse_quantity("1e3") == 1000
    assert cpu_weight(2) == 1 and cpu_weight(1024) == 39 and cpu_weight(262144) == 10000


def test_cgroup_v2_files_on_a_fake_unified_hierarchy(tmp_path: Path) -> None:
    """This machine has no v2 controllers: the v2 file names and formats are checked on a
    directory tree laid out as cgroupfs would be (the kernel's semantics are not)."""
    proc, root = tmp_path / "proc", tmp_path / "unified"
    proc.mkdir()
    root.mkdir()
    (proc / "mounts").write_text(f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n")
    (proc / "cgroup").write_text("0::/system.slice/pykubelet.service\n")
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cgroups = Cgroups(pod_pids_limit=50, proc=proc)
    cgroups.detect()
    assert [(h.controller, h.version, h.parent) for h in cgroups.hierarchies] == [
        (name, 2, root / PARENT) for name in CONTROLLERS
    ]
    kubepods = root / PARENT / KUBEPODS
    for directory in (root / PARENT, kubepods, kubepods / "burstable", kubepods / "besteffort"):
        assert (directory / "cgroup.subtree_control").read_text() == "+pids"  # the last written
    assert (kubepods / "besteffort" / "cpu.weight").read_text() == str(cpu_weight(2))
    settings = Settings.of({"memory": "64Mi", "cpu": "1500m"}, {"cpu": "500m"})
    procs = cgroups.create("u1", "c1", settings, BURSTABLE)
    cdir = kubepods / "burstable" / "podu1" / "c1"
    assert procs == [str(cdir / "cgroup.procs")]  # one directory for every v2 controller
    assert (cdir / "memory.max").read_text() == str(64 << 20)
    assert (cdir / "cpu.max").read_text() == "150000 100000"
    assert (cdir / "cpu.weight").read_text() == str(cpu_weight(512))
    assert (kubepods / "burstable" / "podu1" / "pids.max").read_text() == "50"
    (cdir / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert cgroups.oom_killed("u1", "c1")
    (cdir / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    assert not cgroups.oom_killed("u1", "c1")


def test_kubepods_limits_on_a_fake_unified_hierarchy(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "unified"
    proc.mkdir()
    root.mkdir()
    (proc / "mounts").write_text(f"cgroup2 {root} cgroup2 rw,nosuid 0 0\n")
    (proc / "cgroup").write_text("0::/\n")
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    limits = PodsLimits(memory=3 << 30, cpu_milli=1500, pids=5000)
    Cgroups(proc=proc, pods_limits=limits).detect()
    kubepods = root / PARENT / KUBEPODS
    assert (kubepods / "memory.max").read_text() == str(3 << 30)
    assert (kubepods / "cpu.weight").read_text() == str(cpu_weight(1536))
    assert (kubepods / "pids.max").read_text() == "5000"


def test_kubepods_holds_the_pods_by_qos_class_and_gets_allocatable(tmp_path: Path) -> None:
    """On the machine's v1 controllers, in a tree of this test's own (not the agents')."""
    parent = f"pykubelet-test-{os.getpid()}"
    limits = PodsLimits(memory=3 << 30, cpu_milli=1500, pids=5000)
    cgroups = Cgroups(parent=parent, pods_limits=limits)
    roots = {name: path.parent / parent for name, path in HIERARCHIES.items()}
    try:
        cgroups.detect()
        assert cgroups.hierarchies
        kubepods = {name: root / KUBEPODS for name, root in roots.items()}
        assert read(kubepods["memory"] / "memory.limit_in_bytes") == str(3 << 30)
        assert read(kubepods["cpu"] / "cpu.shares") == "1536"  # 1500m * 1024 / 1000
        assert read(kubepods["cpu"] / "besteffort" / "cpu.shares") == "2"
        assert read(kubepods["pids"] / "pids.max") == "5000"
        assert cgroups.pods_cgroup("memory") == kubepods["memory"]
        settings = Settings.of({"memory": "64Mi"}, {})
        for uid, qos, where in (
            ("g", GUARANTEED, ""),
            ("b", BURSTABLE, "burstable/"),
            ("e", BEST_EFFORT, "besteffort/"),
        ):
            cgroups.create(uid, "c1", settings, qos)
            assert (kubepods["memory"] / f"{where}pod{uid}" / "c1").is_dir()
            assert cgroups.exists(uid, "c1")  # found again without its class (adoption)
            cgroups.remove_pod(uid)
            assert not (kubepods["memory"] / f"{where}pod{uid}").exists()
        # A container of the layout before kubepods (an agent upgraded while it ran).
        old = roots["memory"] / "podold" / "c1"
        old.mkdir(parents=True)
        assert cgroups.exists("old", "c1")
        cgroups.remove_pod("old")
        assert not old.parent.exists()
        # A restart with other reservations writes the new limits.
        Cgroups(parent=parent, pods_limits=PodsLimits(memory=2 << 30)).detect()
        assert read(kubepods["memory"] / "memory.limit_in_bytes") == str(2 << 30)
    finally:
        for root in roots.values():
            remove_tree(root)


def test_an_enforced_reservation_limits_its_existing_cgroup_or_refuses() -> None:
    name = f"/pykubelet-test-system-{os.getpid()}"
    parent = f"pykubelet-test-{os.getpid()}"
    cgroups = Cgroups(parent=parent)
    roots = {n: path.parent / parent for n, path in HIERARCHIES.items()}
    mounts = {n: Path("/sys/fs/cgroup") / n for n in CONTROLLERS}
    system = ReservedCgroup("System Reserved", name, PodsLimits(1 << 30, 500, 1000))
    try:
        cgroups.detect()
        with pytest.raises(ValueError) as info:
            cgroups.enforce_reserved((system,))
        assert str(info.value) == (
            f'Failed to enforce System Reserved Cgroup Limits on "{name}": '
            f'"{name}" cgroup does not exist'
        )
        for mount in mounts.values():
            (mount / name.lstrip("/")).mkdir()
        cgroups.enforce_reserved((system,))
        assert read(mounts["memory"] / name.lstrip("/") / "memory.limit_in_bytes") == str(1 << 30)
        assert read(mounts["cpu"] / name.lstrip("/") / "cpu.shares") == "512"
        assert read(mounts["pids"] / name.lstrip("/") / "pids.max") == "1000"
    finally:
        for mount in mounts.values():
            remove_tree(mount / name.lstrip("/"))
        for root in roots.values():
            remove_tree(root)
