"""Eviction: the thresholds (grace periods, minimum reclaim, the transition period of the
conditions), the kubelet's ranking and messages, admission under pressure, the manager over the
fake runtime (reclaim first, one pod, its status and event, the grace it gets), the flags and
KubeletConfiguration fields, and the Node's conditions and taints."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pykubelet.api.model import Pod, PodStatus
from pykubelet.cluster.node import node_status, with_pressure_taints
from pykubelet.cmd.cli import parse_options
from pykubelet.cmd.config_file import dump
from pykubelet.common import metrics
from pykubelet.common.allocatable import Threshold, percentage
from pykubelet.common.events import EventRecorder
from pykubelet.common.machine import MachineFacts
from pykubelet.kubelet.admission import NodeUsage
from pykubelet.kubelet.eviction import EvictionAdmit, EvictionManager
from pykubelet.kubelet.eviction_policy import (
    Observation,
    PodUsage,
    PressureState,
    eviction_message,
    format_amount,
    rank,
    rules,
    thresholds_met,
)
from pykubelet.kubelet.eviction_signals import disk_usage, pid_observation, process_counts
from pykubelet.kubelet.pod_store import PodStore
from pykubelet.pod.workers import UpdateType
from pykubelet.runtime.base import ContainerConfig, ContainerRunState
from pykubelet.stats.types import ContainerStats, MemoryUsage, NodeStats, PodStats
from pykubelet.status.manager import StatusManager
from tests.fakes.runtime import FakeRuntime

MI = 1 << 20


def make_pod(
    name: str,
    *,
    memory_request: str | None = None,
    priority: int | None = None,
    grace: int = 30,
    static: bool = False,
    tolerations: list[dict[str, str]] | None = None,
) -> Pod:
    resources = {"requests": {"memory": memory_request}} if memory_request else {}
    annotations = {"kubernetes.io/config.source": "file" if static else "api"}
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "i", "resources": resources}],
        "terminationGracePeriodSeconds": grace,
    }
    if priority is not None:
        spec["priority"] = priority
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return Pod.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": f"uid-{name}",
                "annotations": annotations,
            },
            "spec": spec,
        }
    )


def hard(signal: str, given: str) -> Threshold:
    if given.endswith("%"):
        return Threshold(signal, given, percentage=percentage(given))
    from pykubelet.api.quantity import to_bytes

    return Threshold(signal, given, quantity=to_bytes(given))


# --- thresholds -------------------------------------------------------------------------------


def test_a_threshold_is_met_below_its_quantity_or_percentage_of_capacity() -> None:
    memory = rules([hard("memory.available", "100Mi")])
    assert thresholds_met(memory, {"memory.available": Observation(99 * MI, 1000 * MI)}, False)
    assert not thresholds_met(memory, {"memory.available": Observation(100 * MI, 1000 * MI)}, False)
    disk = rules([hard("nodefs.available", "10%")])
    assert thresholds_met(disk, {"nodefs.available": Observation(99, 1000)}, False)
    assert not thresholds_met(disk, {"nodefs.available": Observation(101, 1000)}, False)
    assert not thresholds_met(disk, {}, False)  # not observed: nothing met


def test_a_met_threshold_stays_met_until_its_minimum_reclaim_is_reclaimed() -> None:
    reclaim = {"memory.available": hard("memory.available", "50Mi")}
    state = PressureState(transition_period=0)
    all_rules = rules([hard("memory.available", "100Mi")], minimum_reclaim=reclaim)
    assert state.update(all_rules, {"memory.available": Observation(90 * MI, 1 << 40)}, 0)
    # Above the threshold but not above threshold + minimum reclaim: still acted on.
    assert state.update(all_rules, {"memory.available": Observation(120 * MI, 1 << 40)}, 1)
    assert not state.update(all_rules, {"memory.available": Observation(151 * MI, 1 << 40)}, 2)


def test_a_soft_threshold_acts_only_after_its_grace_period_but_the_condition_is_at_once() -> None:
    state = PressureState(transition_period=0)
    soft = rules([], [hard("memory.available", "1Gi")], grace_periods={"memory.available": 30.0})
    low = {"memory.available": Observation(500 * MI, 1 << 40)}
    assert state.update(soft, low, 100) == []
    assert state.conditions == {"MemoryPressure"}
    assert state.update(soft, low, 129) == []
    assert [r.signal for r in state.update(soft, low, 130)] == ["memory.available"]
    # Resolved in between: the grace period starts again.
    assert state.update(soft, {"memory.available": Observation(2 << 30, 1 << 40)}, 131) == []
    assert state.update(soft, low, 140) == []


def test_a_condition_stays_for_the_transition_period_after_it_was_last_seen() -> None:
    state = PressureState(transition_period=60)
    disk = rules([hard("nodefs.available", "10%")])
    state.update(disk, {"nodefs.available": Observation(5, 100)}, 0)
    assert state.conditions == {"DiskPressure"}
    fine = {"nodefs.available": Observation(50, 100)}
    assert state.update(disk, fine, 30) == []
    assert state.conditions == {"DiskPressure"}
    state.update(disk, fine, 60)
    assert state.conditions == frozenset()


def test_memory_is_acted_on_before_the_other_signals() -> None:
    state = PressureState(transition_period=0)
    both = rules([hard("pid.available", "100"), hard("memory.available", "1Gi")])
    due = state.update(
        both,
        {"pid.available": Observation(5, 1000), "memory.available": Observation(1, 1 << 40)},
        0,
    )
    assert [r.signal for r in due] == ["memory.available", "pid.available"]
    assert state.conditions == {"MemoryPressure", "PIDPressure"}


# --- ranking and messages ------------------------------------------------------------------


def test_memory_ranking_puts_usage_above_requests_first_then_priority_then_usage() -> None:
    within = make_pod("within", memory_request="500Mi")  # uses 300Mi of its 500Mi
    low_prio = make_pod("low-prio", memory_request="10Mi", priority=-10)
    big = make_pod("big")
    small = make_pod("small")
    usage = {
        "uid-within": PodUsage(memory=300 * MI),
        "uid-low-prio": PodUsage(memory=20 * MI),
        "uid-big": PodUsage(memory=200 * MI),
        "uid-small": PodUsage(memory=100 * MI),
    }
    ranked = rank("memory", [within, small, big, low_prio], usage)
    assert [p.metadata.name for p in ranked] == ["low-prio", "big", "small", "within"]


def test_a_pod_without_stats_ranks_first_for_memory_and_disk() -> None:
    measured, unmeasured = make_pod("measured"), make_pod("unmeasured")
    usage = {"uid-measured": PodUsage(memory=1, disk=1)}
    for resource in ("memory", "ephemeral-storage"):
        assert rank(resource, [measured, unmeasured], usage)[0].metadata.name == "unmeasured"


def test_pid_ranking_is_priority_then_process_count() -> None:
    few, many, important = make_pod("few"), make_pod("many"), make_pod("important", priority=100)
    usage = {
        "uid-few": PodUsage(processes=2),
        "uid-many": PodUsage(processes=300),
        "uid-important": PodUsage(processes=1000),
    }
    ranked = rank("pids", [important, few, many], usage)
    assert [p.metadata.name for p in ranked] == ["many", "few", "important"]


def test_the_eviction_message_is_the_kubelets() -> None:
    rule = rules([hard("memory.available", "100Mi")])[0]
    pod = make_pod("hog", memory_request="64Mi")
    message = eviction_message(
        rule,
        Observation(42 * MI, 1 << 33),
        pod,
        PodUsage(memory=200 * MI, containers_memory={"main": 200 * MI}),
    )
    assert message == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. "
        "Container main was using 200Mi, request is 64Mi, has larger consumption of memory. "
    )
    disk = rules([hard("nodefs.available", "10%")])[0]
    assert eviction_message(disk, Observation(3 * MI, 64 * MI), pod, None) == (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 6710886, "
        "available: 3Mi. "
    )


def test_amounts_print_as_the_kubelets_quantities() -> None:
    assert format_amount("memory", 42 * MI) == "42Mi"
    assert format_amount("memory", 42 * MI + 1) == str(42 * MI + 1)
    assert format_amount("pids", 2000) == "2k"
    assert format_amount("pids", 2001) == "2001"
    assert format_amount("inodes", 0) == "0"


# --- admission -----------------------------------------------------------------------------


class Pressure:
    def __init__(self, *conditions: str) -> None:
        self.conditions = frozenset(conditions)

    def pressure_conditions(self) -> frozenset[str]:
        return self.conditions


def admits(conditions: tuple[str, ...], pod: Pod) -> tuple[bool, str, str]:
    result = EvictionAdmit(Pressure(*conditions)).admit(pod, {}, NodeUsage())
    return result.admit, result.reason, result.message


def test_under_memory_pressure_only_best_effort_pods_are_refused() -> None:
    assert admits(("MemoryPressure",), make_pod("be")) == (
        False,
        "Evicted",
        "The node had condition: [MemoryPressure]. ",
    )
    assert admits(("MemoryPressure",), make_pod("burstable", memory_request="1Mi"))[0]
    tolerant = make_pod(
        "tolerant",
        tolerations=[{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists"}],
    )
    assert admits(("MemoryPressure",), tolerant)[0]
    assert admits((), make_pod("be"))[0]


def test_under_disk_or_pid_pressure_every_pod_but_critical_ones_is_refused() -> None:
    burstable = make_pod("burstable", memory_request="1Mi")
    assert admits(("DiskPressure",), burstable) == (
        False,
        "Evicted",
        "The node had condition: [DiskPressure]. ",
    )
    assert admits(("MemoryPressure", "PIDPressure"), burstable)[2] == (
        "The node had condition: [MemoryPressure PIDPressure]. "
    )
    assert admits(("DiskPressure",), make_pod("critical", priority=2_000_000_000))[0]
    assert admits(("DiskPressure",), make_pod("static", static=True))[0]


# --- the manager ---------------------------------------------------------------------------


class Killer:
    def __init__(self) -> None:
        self.kills: list[tuple[str, float | None]] = []

    def update_pod(
        self,
        update: UpdateType,
        pod: Pod | None,
        uid: str | None = None,
        *,
        grace: float | None = None,
        removed: bool = False,
    ) -> None:
        assert update is UpdateType.KILL and pod is not None
        self.kills.append((pod.metadata.name, grace))


class Sampler:
    """The stats collector's sample, as the test sets it."""

    def __init__(self) -> None:
        self.working_set = 0
        self.pods: dict[str, int] = {}

    def latest(self) -> NodeStats | None:
        return None  # never fresh enough: every observation samples

    async def sample(self, *, storage: bool | None = None) -> NodeStats:
        now = datetime.now(UTC)

        def memory(value: int) -> MemoryUsage:
            return MemoryUsage(now, value)

        pods = tuple(
            PodStats(
                uid,
                uid,
                "default",
                now,
                (ContainerStats("main", uid, now, None, memory(used)),),
                None,
                memory(used),
            )
            for uid, used in self.pods.items()
        )
        return NodeStats("n", now, now, None, memory(self.working_set), pods)


class Harness:
    def __init__(self, tmp_path: Path, *thresholds: Threshold, **kwargs: Any) -> None:
        self.runtime = FakeRuntime(started=True)
        self.store = PodStore()
        self.statuses = StatusManager()
        self.recorder = EventRecorder()
        self.killer = Killer()
        self.sampler = Sampler()
        self.fs: dict[str, Observation] = {}
        self.now = 0.0
        self.static_rules = kwargs.pop("rules", None)
        self.manager = EvictionManager(
            self.static_rules or rules(thresholds),
            node_name="n",
            root_dir=tmp_path,
            memory_capacity=1000 * MI,
            sampler=self.sampler,
            runtime=self.runtime,
            pods=self.store,
            is_active=lambda uid: True,
            killer=self.killer,
            statuses=self.statuses,
            recorder=self.recorder,
            clock=lambda: self.now,
            observe_fs=lambda root: dict(self.fs),
            observe_pids=lambda: Observation(10_000, 10_000),
            **kwargs,
        )

    def add(self, pod: Pod) -> Pod:
        self.store.put(pod)
        self.statuses.set(pod.uid, PodStatus(phase="Running"))
        return pod

    def events(self, reason: str) -> list[str]:
        return [e.message for e in self.recorder.events() if e.reason == reason]


def test_a_hard_memory_threshold_evicts_the_top_ranked_pod_failed_evicted(tmp_path: Path) -> None:
    h = Harness(tmp_path, hard("memory.available", "100Mi"))
    h.add(make_pod("quiet", memory_request="100Mi"))
    h.add(make_pod("hog"))
    h.sampler.pods = {"uid-quiet": 50 * MI, "uid-hog": 800 * MI}
    h.sampler.working_set = 958 * MI  # 42Mi available
    evicted = asyncio.run(h.manager.synchronize())
    assert evicted is not None and evicted.metadata.name == "hog"
    assert h.killer.kills == [("hog", 1.0)]  # a hard threshold: the kubelet's 1 s
    status = h.statuses.get("uid-hog")
    assert status is not None
    assert (status.phase, status.reason) == ("Failed", "Evicted")
    assert status.message == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. "
        "Container main was using 800Mi, request is 0, has larger consumption of memory. "
    )
    assert h.events("Evicted") == [status.message]
    assert h.events("EvictionThresholdMet") == ["Attempting to reclaim memory"]
    counted = metrics.REGISTRY.get_sample_value(
        "kubelet_evictions_total", {"eviction_signal": "memory.available"}
    )
    assert counted is not None and counted >= 1
    assert h.manager.pressure_conditions() == {"MemoryPressure"}
    quiet = h.statuses.get("uid-quiet")
    assert quiet is not None and quiet.phase == "Running"


class Volumes:
    def __init__(self) -> None:
        self.removed: list[str] = []

    async def teardown(self, uid: str) -> None:
        self.removed.append(uid)


def test_an_evicted_pods_volumes_go_once_it_has_terminated(tmp_path: Path) -> None:
    volumes = Volumes()
    h = Harness(tmp_path, hard("memory.available", "100Mi"), volumes=volumes)
    h.add(make_pod("hog"))
    h.add(make_pod("other"))
    h.sampler.pods = {"uid-hog": 900 * MI, "uid-other": 1}
    h.sampler.working_set = 990 * MI

    async def scenario() -> None:
        await h.manager.synchronize()
        await h.manager.on_terminated("uid-other", None)  # not evicted: its volumes stay
        assert volumes.removed == []
        await h.manager.on_terminated("uid-hog", None)

    asyncio.run(scenario())
    assert volumes.removed == ["uid-hog"]


def test_the_collectors_fresh_sample_is_reused_but_never_one_from_before_an_eviction(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, hard("memory.available", "100Mi"))
    h.add(make_pod("hog"))
    samples: list[NodeStats] = []
    take = h.sampler.sample

    async def sample(*, storage: bool | None = None) -> NodeStats:
        samples.append(await take())
        return samples[-1]

    h.sampler.sample = sample  # type: ignore[method-assign]
    h.sampler.latest = lambda: samples[-1] if samples else None  # type: ignore[method-assign]
    h.sampler.pods = {"uid-hog": 900 * MI}
    h.sampler.working_set = 500 * MI

    async def scenario() -> None:
        await h.manager.synchronize()  # nothing sampled yet: a sample
        await h.manager.synchronize()  # the collector's, younger than the interval
        assert len(samples) == 1
        h.sampler.working_set = 990 * MI
        samples.clear()
        await h.manager.synchronize()
        assert h.killer.kills == [("hog", 1.0)]
        await h.manager.on_terminated("uid-hog", None)
        h.sampler.working_set = 500 * MI
        await h.manager.synchronize()  # the pre-eviction sample is not reused
        assert len(samples) == 2

    asyncio.run(scenario())
    assert h.killer.kills == [("hog", 1.0)]


def test_one_pod_per_synchronize_and_critical_pods_are_never_evicted(tmp_path: Path) -> None:
    h = Harness(tmp_path, hard("memory.available", "100Mi"))
    h.add(make_pod("static-hog", static=True))
    h.add(make_pod("critical-hog", priority=2_000_000_000))
    h.add(make_pod("a"))
    h.add(make_pod("b"))
    h.sampler.pods = {"uid-static-hog": 900, "uid-critical-hog": 800, "uid-a": 20, "uid-b": 10}
    h.sampler.working_set = 990 * MI
    asyncio.run(h.manager.synchronize())
    assert [name for name, _ in h.killer.kills] == ["a"]


def test_a_soft_threshold_kills_with_the_smaller_of_max_and_the_pods_grace(
    tmp_path: Path,
) -> None:
    soft = rules([], [hard("memory.available", "500Mi")], grace_periods={"memory.available": 10.0})
    h = Harness(tmp_path, rules=soft, max_pod_grace_period=20)
    h.add(make_pod("patient", grace=60))
    h.sampler.pods = {"uid-patient": 100}
    h.sampler.working_set = 600 * MI
    assert asyncio.run(h.manager.synchronize()) is None  # the grace period has not passed
    assert h.manager.pressure_conditions() == {"MemoryPressure"}
    h.now = 10
    asyncio.run(h.manager.synchronize())
    assert h.killer.kills == [("patient", 20.0)]


def test_disk_pressure_removes_dead_containers_first(tmp_path: Path) -> None:
    h = Harness(tmp_path, hard("nodefs.available", "10%"))
    pod = h.add(make_pod("crashy"))

    async def scenario() -> Pod | None:
        sandbox = await h.runtime.run_sandbox(pod)
        h.runtime.behave("main", exit_code=1)
        for attempt in range(3):
            await h.runtime.start_container(pod, sandbox, _config(attempt))
        await asyncio.sleep(0)
        h.fs = {"nodefs.available": Observation(5, 100)}
        # The runtime's removal frees the space (as removing a dead container's files does).
        original = h.runtime.remove_container

        async def remove(container: Any) -> None:
            await original(container)
            h.fs = {"nodefs.available": Observation(50, 100)}

        h.runtime.remove_container = remove  # type: ignore[method-assign]
        return await h.manager.synchronize()

    assert asyncio.run(scenario()) is None
    assert h.killer.kills == []
    attempts = [c.attempt for c in h.runtime.containers(pod.uid, "main")]
    assert attempts == [2]  # the latest kept for --previous
    assert all(c.state is ContainerRunState.EXITED for c in h.runtime.containers(pod.uid, "main"))
    assert h.manager.pressure_conditions() == {"DiskPressure"}


def test_disk_pressure_evicts_the_pod_using_the_most_storage(tmp_path: Path) -> None:
    h = Harness(tmp_path, hard("nodefs.available", "10%"))
    h.add(make_pod("small"))
    h.add(make_pod("filler"))
    for name, size in (("small", 1), ("filler", 100)):
        volume = tmp_path / "pods" / f"uid-{name}" / "volumes" / "kubernetes.io~empty-dir" / "d"
        volume.mkdir(parents=True)
        (volume / "data").write_bytes(b"x" * size * 4096)
    h.fs = {"nodefs.available": Observation(5 * MI, 100 * MI)}
    evicted = asyncio.run(h.manager.synchronize())
    assert evicted is not None and evicted.metadata.name == "filler"
    status = h.statuses.get("uid-filler")
    assert status is not None and status.message == (
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Mi, "
        "available: 5Mi. "
    )


def _config(attempt: int) -> ContainerConfig:
    return ContainerConfig(
        name="main",
        image="i",
        command=["false"],
        args=[],
        env=[],
        working_dir=None,
        attempt=attempt,
        spec_hash="h",
        image_pull_policy="IfNotPresent",
    )


# --- the signals read from the machine -------------------------------------------------------


def test_disk_usage_counts_blocks_and_inodes_once(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 8192)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y")
    (tmp_path / "link").hardlink_to(tmp_path / "a")
    used = disk_usage([tmp_path])
    assert used.inodes == 4  # the directory, a (once), sub, b
    assert used.bytes >= 8192


def test_the_pid_signal_and_process_counts_read_proc() -> None:
    observed = pid_observation()
    assert 0 < observed.available < observed.capacity
    import os

    counts = process_counts({"me": [os.getpid()], "nobody": [], "gone": [1 << 30]})
    assert counts["me"] >= 1 and counts["nobody"] == 0 and counts["gone"] == 0


# --- flags, configuration, the Node ----------------------------------------------------------


def test_the_soft_flags_parse_in_the_kubelets_words(capsys: pytest.CaptureFixture[str]) -> None:
    opts = parse_options(
        [
            "--eviction-soft=memory.available<1Gi",
            "--eviction-soft-grace-period=memory.available=1m30s",
            "--eviction-minimum-reclaim=memory.available=100Mi,nodefs.available=5%",
            "--eviction-max-pod-grace-period=20",
            "--eviction-pressure-transition-period=30s",
            "--eviction-monitoring-interval=1s",
        ]
    )
    assert [(t.signal, t.quantity) for t in opts.eviction_soft] == [("memory.available", 1 << 30)]
    assert opts.eviction_soft_grace_period == {"memory.available": 90.0}
    assert opts.eviction_minimum_reclaim["memory.available"].quantity == 100 * MI
    assert opts.eviction_max_pod_grace_period == 20
    assert opts.eviction_pressure_transition_period == 30.0
    assert opts.eviction_monitoring_interval == 1.0
    configz = opts.kubelet_configuration()
    assert configz["evictionSoft"] == {"memory.available": "1Gi"}
    assert configz["evictionSoftGracePeriod"] == {"memory.available": "1m30s"}
    assert configz["evictionPressureTransitionPeriod"] == "30s"
    defaults = parse_options([])
    assert defaults.eviction_pressure_transition_period == 300.0
    assert defaults.eviction_monitoring_interval == 10.0
    for argv, expected in (
        (
            ["--eviction-soft=memory.available<1Gi"],
            "grace period must be specified for the soft eviction threshold memory.available",
        ),
        (["--eviction-soft-grace-period=memory.free=1s"], "unsupported eviction signal"),
        (
            ["--eviction-minimum-reclaim=memory.available=-1Mi"],
            "negative eviction minimum reclaim specified for memory.available",
        ),
    ):
        with pytest.raises(SystemExit):
            parse_options(argv)
        assert expected in capsys.readouterr().err


def test_the_configuration_file_fields(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        dump(
            {
                "evictionSoft": {"nodefs.available": "20%"},
                "evictionSoftGracePeriod": {"nodefs.available": "2m"},
                "evictionMaxPodGracePeriod": 15,
                "evictionMinimumReclaim": {"nodefs.available": "1Gi"},
                "evictionPressureTransitionPeriod": "1m",
            }
        )
    )
    opts = parse_options(["--config", str(path)])
    assert [t.given for t in opts.eviction_soft] == ["20%"]
    assert opts.eviction_soft_grace_period == {"nodefs.available": 120.0}
    assert opts.eviction_max_pod_grace_period == 15
    assert opts.eviction_minimum_reclaim["nodefs.available"].quantity == 1 << 30
    assert opts.eviction_pressure_transition_period == 60.0


def test_the_node_reports_the_pressure_conditions_and_their_taints() -> None:
    facts = MachineFacts(
        cpus=2,
        memory_kib=1 << 20,
        storage_bytes=1 << 30,
        hostname="h",
        machine_id="m",
        system_uuid="s",
        boot_id="b",
        kernel="k",
        os_image="o",
        arch="amd64",
        pid_max=4096,
    )
    status = node_status(
        facts, "10.0.0.1", 110, "process", [], pressure=frozenset({"DiskPressure"})
    )
    conditions = {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}
    assert conditions["DiskPressure"] == (
        "True",
        "KubeletHasDiskPressure",
        "kubelet has disk pressure",
    )
    assert conditions["MemoryPressure"] == (
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    )
    taints = [{"key": "dedicated", "value": "x", "effect": "NoExecute"}]
    assert with_pressure_taints(taints, frozenset({"MemoryPressure", "PIDPressure"})) == [
        *taints,
        {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/pid-pressure", "effect": "NoSchedule"},
    ]
    tainted = with_pressure_taints(taints, frozenset({"DiskPressure"}))
    assert with_pressure_taints(tainted, frozenset()) == taints
