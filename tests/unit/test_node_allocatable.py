"""Node allocatable: the flags and KubeletConfiguration fields parsed in the kubelet's words, the
arithmetic (capacity - kube-reserved - system-reserved - hard eviction threshold), the Node's
quantities and what /configz and the status page show."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from pykubelet.cluster.node import node_status
from pykubelet.cmd import config_file
from pykubelet.cmd.cli import parse_options
from pykubelet.cmd.node_resources import parse_map, parse_reserved, parse_thresholds
from pykubelet.common.allocatable import (
    DEFAULT_THRESHOLDS,
    Reserved,
    float32,
    format_quantity,
    node_resources,
)
from pykubelet.common.machine import MachineFacts
from pykubelet.server.status_page import render

GIB = 1 << 30
MIB = 1 << 20
FACTS = MachineFacts(
    cpus=4,
    memory_kib=8 * GIB // 1024,
    storage_bytes=100 * GIB,
    hostname="n1",
    machine_id="m",
    boot_id="b",
    system_uuid="s",
    kernel="6.1",
    os_image="Test",
    arch="amd64",
    pid_max=4194304,
)


def fail(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_options(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


# --- parsing ------------------------------------------------------------------------------------


def test_reservations_parse_every_resource_the_kubelet_reserves() -> None:
    reserved = parse_reserved(
        parse_map("cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000", "=")
    )
    assert reserved.amounts == {
        "cpu": 100,
        "memory": 256 * MIB,
        "ephemeral-storage": GIB,
        "pid": 1000,
    }
    assert reserved.given["memory"] == "256Mi"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--kube-reserved=gpu=1", 'cannot reserve "gpu" resource'),
        (
            "--system-reserved=memory=lots",
            'failed to parse quantity "lots" for "memory" resource: quantities must match the '
            "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ),
        ("--kube-reserved=cpu=-1", 'resource quantity for "cpu" cannot be negative: -1'),
        ("--kube-reserved=memory", "malformed pair, expect string=string"),
        ("--eviction-hard=memory.available=1Gi", "malformed pair, expect string<string"),
        ("--eviction-hard=swap.available<1Gi", "unsupported eviction signal swap.available"),
        (
            "--eviction-hard=memory.available<0",
            "eviction threshold memory.available must be positive: 0",
        ),
        (
            "--eviction-hard=nodefs.available<150%",
            "eviction percentage threshold nodefs.available must be <= 100%: 150%",
        ),
        (
            "--eviction-hard=nodefs.available<-5%",
            "eviction percentage threshold nodefs.available must be >= 0%: -5%",
        ),
        (
            "--eviction-hard=nodefs.available<ten%",
            'strconv.ParseFloat: parsing "ten": invalid syntax',
        ),
        (
            "--enforce-node-allocatable=pods,system-reserved",
            "invalid configuration: systemReservedCgroup (--system-reserved-cgroup) must be "
            'specified when "system-reserved" contained in enforceNodeAllocatable '
            "(--enforce-node-allocatable)",
        ),
        (
            "--enforce-node-allocatable=kube-reserved",
            "invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) must be "
            'specified when "kube-reserved" contained in enforceNodeAllocatable '
            "(--enforce-node-allocatable)",
        ),
        (
            "--enforce-node-allocatable=none,pods",
            "invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) may not "
            'contain additional enforcements when "none" is specified',
        ),
        (
            "--container-runtime=docker --enforce-node-allocatable=pods,system-reserved "
            "--system-reserved-cgroup=/system.slice",
            "--enforce-node-allocatable system-reserved: not supported with --container-runtime "
            "docker (the process runtime enforces it)",
        ),
        (
            "--container-runtime=remote --cgroup-root=/pods",
            "--cgroup-root: not supported with --container-runtime remote (the engine places the "
            "pods' cgroups; the process runtime places them under it)",
        ),
        ("--cgroup-root=pods", "--cgroup-root 'pods': must be an absolute cgroup path"),
        (
            "--enforce-node-allocatable=cpus",
            'invalid configuration: option "cpus" specified for enforceNodeAllocatable '
            '(--enforce-node-allocatable). Valid options are "pods", "system-reserved", '
            '"kube-reserved", or "none"',
        ),
    ],
)
def test_bad_flags_are_refused_in_the_kubelets_words(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in fail(flag.split(), capsys)


def test_every_signal_the_kubelet_knows_parses_and_0_or_100_percent_is_ignored() -> None:
    thresholds = parse_thresholds(
        {
            "memory.available": "1Gi",
            "allocatableMemory.available": "500Mi",
            "nodefs.available": "10%",
            "nodefs.inodesFree": "5%",
            "imagefs.available": "15%",
            "imagefs.inodesFree": "5%",
            "containerfs.available": "0%",
            "containerfs.inodesFree": "100%",
            "pid.available": "1000",
        }
    )
    by_signal = {t.signal: t for t in thresholds}
    assert "containerfs.available" not in by_signal
    assert "containerfs.inodesFree" not in by_signal
    assert by_signal["memory.available"].quantity == GIB
    assert by_signal["pid.available"].quantity == 1000
    assert by_signal["nodefs.available"].percentage == float32(0.1)


def test_the_defaults_are_the_kubelets_and_a_given_eviction_hard_replaces_them() -> None:
    assert {t.signal: t.given for t in parse_options([]).eviction_hard} == {
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%",
    }
    assert parse_options([]).enforce_node_allocatable == ["pods"]
    opts = parse_options(
        ["--eviction-hard=memory.available<1Gi", "--eviction-hard", "nodefs.available<5%"]
    )
    assert {t.signal: t.given for t in opts.eviction_hard} == {
        "memory.available": "1Gi",
        "nodefs.available": "5%",
    }


def test_the_configuration_file_fields_and_a_flag_replacing_one(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        config_file.dump(
            {
                "kubeReserved": {"cpu": "200m", "memory": "512Mi"},
                "systemReserved": {"memory": "1Gi", "pid": "1000"},
                "evictionHard": {"memory.available": "200Mi"},
                "enforceNodeAllocatable": ["pods", "system-reserved"],
                "systemReservedCgroup": "/system.slice",
                "kubeReservedCgroup": "/kube.slice",
            }
        )
    )
    opts = parse_options(["--config", str(path)])
    assert opts.kube_reserved.amounts == {"cpu": 200, "memory": 512 * MIB}
    assert opts.system_reserved.amounts == {"memory": GIB, "pid": 1000}
    assert [(t.signal, t.quantity) for t in opts.eviction_hard] == [("memory.available", 200 * MIB)]
    assert opts.enforce_node_allocatable == ["pods", "system-reserved"]
    assert opts.system_reserved_cgroup == "/system.slice"
    configz = opts.kubelet_configuration()
    assert configz["kubeReserved"] == {"cpu": "200m", "memory": "512Mi"}
    assert configz["systemReserved"] == {"memory": "1Gi", "pid": "1000"}
    assert configz["evictionHard"] == {"memory.available": "200Mi"}
    assert configz["enforceNodeAllocatable"] == ["pods", "system-reserved"]
    assert configz["systemReservedCgroup"] == "/system.slice"
    assert configz["kubeReservedCgroup"] == "/kube.slice"
    # A flag replaces the file's whole map, as the kubelet's flags do.
    flagged = parse_options(["--config", str(path), "--kube-reserved=memory=1Gi"])
    assert flagged.kube_reserved.amounts == {"memory": GIB}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kubeReserved": {"gpu": "1"}}, 'kubeReserved: cannot reserve "gpu" resource'),
        (
            {"evictionHard": {"memory.available": "-1Gi"}},
            "evictionHard: eviction threshold memory.available must be positive: -1Gi",
        ),
    ],
)
def test_bad_configuration_fields_name_the_field(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config_file.dump(fields))
    with pytest.raises(config_file.ConfigFileError, match=message):
        config_file.load(path)


# --- arithmetic ---------------------------------------------------------------------------------


def test_allocatable_is_capacity_less_both_reservations_and_the_hard_threshold() -> None:
    resources = node_resources(
        FACTS,
        110,
        parse_reserved({"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}),
        parse_reserved({"cpu": "500m", "memory": "1Gi", "pid": "1000"}),
        DEFAULT_THRESHOLDS,
    )
    nodefs_threshold = int(100 * GIB * float32(0.1))  # the kubelet's float32 10%
    assert resources.allocatable == {
        "cpu": 3400,
        "memory": 8 * GIB - 256 * MIB - GIB - 100 * MIB,
        "ephemeral-storage": 100 * GIB - GIB - nodefs_threshold,
        "pods": 110,
    }
    # Only memory.available and nodefs.available reserve; the inode and imagefs ones do not.
    assert resources.reserved["ephemeral-storage"] == GIB + nodefs_threshold
    # The pods' cgroup: the reservations only (eviction acts before the OOM killer does).
    assert resources.pods_cgroup["memory"] == 8 * GIB - 256 * MIB - GIB
    assert resources.pods_cgroup["cpu"] == 3400
    assert resources.pods_cgroup["pid"] == 4194304 - 1000
    assert resources.problems() == []


def test_a_percentage_memory_threshold_is_of_the_memory_capacity() -> None:
    resources = node_resources(
        FACTS, 110, Reserved(), Reserved(), parse_thresholds({"memory.available": "10%"})
    )
    assert resources.allocatable["memory"] == 8 * GIB - int(8 * GIB * float32(0.1))
    assert resources.allocatable["ephemeral-storage"] == 100 * GIB


def test_allocatable_never_goes_below_zero_and_the_start_is_refused() -> None:
    resources = node_resources(
        FACTS, 110, parse_reserved({"memory": "6Gi"}), parse_reserved({"memory": "4Gi"}), ()
    )
    assert resources.allocatable["memory"] == 0
    assert resources.problems() == [
        'Resource "memory" has an allocatable of 10Gi, capacity of -2Gi'
    ]


def test_quantities_as_the_node_reports_them() -> None:
    assert format_quantity("cpu", 4000) == "4"
    assert format_quantity("cpu", 3400) == "3400m"
    assert format_quantity("memory", 8 * GIB) == "8Gi"
    assert format_quantity("memory", 8 * GIB - 1024) == "8388607Ki"
    assert format_quantity("memory", 1000) == "1000"
    assert format_quantity("ephemeral-storage", 100 * GIB) == str(100 * GIB)


def test_the_node_status_reports_allocatable_beside_capacity() -> None:
    resources = node_resources(
        FACTS, 110, parse_reserved({"cpu": "500m"}), parse_reserved({"memory": "1Gi"}), ()
    )
    status = node_status(FACTS, "10.0.0.1", 110, "process", [], resources=resources)
    assert status["capacity"] == {
        "cpu": "4",
        "memory": "8Gi",
        "pods": "110",
        "ephemeral-storage": str(100 * GIB),
    }
    assert status["allocatable"] == {
        "cpu": "3500m",
        "memory": "7Gi",
        "pods": "110",
        "ephemeral-storage": str(100 * GIB),
    }


def test_the_status_page_shows_capacity_reserved_and_allocatable() -> None:
    resources = node_resources(FACTS, 110, parse_reserved({"cpu": "500m"}), Reserved(), ())
    page = render("n1", [], [], datetime.now(UTC), resources)
    assert "<h2>Node resources</h2>" in page
    assert "<tr><td>cpu</td><td>4</td><td>500m</td><td>3500m</td></tr>" in page
