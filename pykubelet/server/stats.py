"""The kubelet's resource endpoints, over the stats collector's latest sample (`StatsView`):

GET /metrics/resource   Prometheus text, as the kubelet writes it (what metrics-server scrapes):
                        node_cpu_usage_seconds_total, node_memory_working_set_bytes,
                        container_cpu_usage_seconds_total, container_memory_working_set_bytes,
                        container_start_time_seconds (labels container, namespace, pod),
                        pod_cpu_usage_seconds_total, pod_memory_working_set_bytes (namespace,
                        pod), resource_scrape_error and scrape_error; each sample carries the
                        time it was read (milliseconds), the start times none
GET /stats/summary      the Summary API (stats/v1alpha1): the node's and each pod's and
                        container's CPU and memory; the node's `fs` and `runtime.imageFs`, each
                        pod's `volume` list and `ephemeral-storage`, each container's `rootfs`
                        and `logs` (`only_cpu_and_memory=true` leaves the file systems out)

As the kubelet's: families sorted by name, labels by name, values as Go formats a float64
(`1.5407e+09`), HELP texts with the stability level; a sample that failed (the runtime could not
list its pods) is `scrape_error 1` and nothing else. Before the first sample: 503 for the
summary, `scrape_error 1` for the metrics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

from aiohttp import web

from pykubelet.server.errors import status_response
from pykubelet.stats.types import (
    ContainerStats,
    CpuUsage,
    FsStats,
    MemoryUsage,
    NodeStats,
    PodStats,
    StatsView,
)

Obj = dict[str, Any]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name -> (type, HELP as the kubelet's component-base writes it)
_FAMILIES: dict[str, tuple[str, str]] = {
    "container_cpu_usage_seconds_total": (
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    ),
    "container_memory_working_set_bytes": (
        "gauge",
        "[STABLE] Current working set of the container in bytes",
    ),
    "container_start_time_seconds": (
        "gauge",
        "[STABLE] Start time of the container since unix epoch in seconds",
    ),
    "node_cpu_usage_seconds_total": (
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    ),
    "node_memory_working_set_bytes": ("gauge", "[STABLE] Current working set of the node in bytes"),
    "pod_cpu_usage_seconds_total": (
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    ),
    "pod_memory_working_set_bytes": ("gauge", "[STABLE] Current working set of the pod in bytes"),
    "resource_scrape_error": (
        "gauge",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    ),
    "scrape_error": (
        "gauge",
        "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container "
        "metrics, 0 otherwise",
    ),
}


def go_float(value: float) -> str:
    """`value` as Go's strconv.FormatFloat(v, 'g', -1, 64): the shortest digits that round-trip,
    in exponent form when the exponent is below -4 or at least 6 (Prometheus's Go client)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    exp = len(text) + exponent - 1  # of the first digit
    neg = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{neg}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{neg}0.{'0' * (-exp - 1)}{text}"
    if len(text) <= exp + 1:
        return f"{neg}{text}{'0' * (exp + 1 - len(text))}"
    return f"{neg}{text[: exp + 1]}.{text[exp + 1 :]}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


Sample = tuple[str, tuple[tuple[str, str], ...], float, int | None]


def _samples(stats: NodeStats) -> Iterator[Sample]:
    if stats.cpu is not None:
        yield "node_cpu_usage_seconds_total", (), stats.cpu.seconds, _ms(stats.cpu.time)
    if stats.memory is not None:
        yield (
            "node_memory_working_set_bytes",
            (),
            float(stats.memory.working_set_bytes),
            _ms(stats.memory.time),
        )
    for pod in stats.pods:
        pod_labels = (("namespace", pod.namespace), ("pod", pod.name))
        for c in pod.containers:
            labels = (("container", c.name), *pod_labels)
            if c.start_time.timestamp() > 0:
                yield "container_start_time_seconds", labels, c.start_time.timestamp(), None
            if c.cpu is not None:
                yield "container_cpu_usage_seconds_total", labels, c.cpu.seconds, _ms(c.cpu.time)
            if c.memory is not None:
                yield (
                    "container_memory_working_set_bytes",
                    labels,
                    float(c.memory.working_set_bytes),
                    _ms(c.memory.time),
                )
        if pod.cpu is not None:
            yield "pod_cpu_usage_seconds_total", pod_labels, pod.cpu.seconds, _ms(pod.cpu.time)
        if pod.memory is not None:
            yield (
                "pod_memory_working_set_bytes",
                pod_labels,
                float(pod.memory.working_set_bytes),
                _ms(pod.memory.time),
            )


def resource_metrics(stats: NodeStats | None) -> str:
    """The /metrics/resource text for a sample (None: none yet)."""
    failed = stats is None or bool(stats.errors)
    families: dict[str, list[Sample]] = {}
    if stats is not None and not failed:
        for sample in _samples(stats):
            families.setdefault(sample[0], []).append(sample)
    error = 1.0 if failed else 0.0
    families["resource_scrape_error"] = [("resource_scrape_error", (), error, None)]
    families["scrape_error"] = [("scrape_error", (), error, None)]
    lines: list[str] = []
    for name in sorted(families):
        kind, help_text = _FAMILIES[name]
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for _, labels, value, ms in sorted(families[name], key=lambda s: s[1]):
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            series = f"{name}{{{label_text}}}" if labels else name
            stamp = f" {ms}" if ms is not None else ""
            lines.append(f"{series} {go_float(value)}{stamp}")
    return "\n".join(lines) + "\n"


# --- the Summary API -------------------------------------------------------------------------


def _rfc3339(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _drop_none(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if v is not None}


def _cpu(cpu: CpuUsage | None) -> Obj | None:
    if cpu is None:
        return None
    return _drop_none(
        {
            "time": _rfc3339(cpu.time),
            "usageNanoCores": cpu.usage_nano_cores,
            "usageCoreNanoSeconds": cpu.usage_core_nanoseconds,
        }
    )


def _memory(memory: MemoryUsage | None) -> Obj | None:
    if memory is None:
        return None
    return _drop_none(
        {
            "time": _rfc3339(memory.time),
            "availableBytes": memory.available_bytes,
            "usageBytes": memory.usage_bytes,
            "workingSetBytes": memory.working_set_bytes,
            "rssBytes": memory.rss_bytes,
            "pageFaults": memory.page_faults,
            "majorPageFaults": memory.major_page_faults,
        }
    )


def _fs(fs: FsStats | None) -> Obj | None:
    if fs is None:
        return None
    return _drop_none(
        {
            "time": _rfc3339(fs.time),
            "availableBytes": fs.available_bytes,
            "capacityBytes": fs.capacity_bytes,
            "usedBytes": fs.used_bytes,
            "inodesFree": fs.inodes_free,
            "inodes": fs.inodes,
            "inodesUsed": fs.inodes_used,
        }
    )


def _container(c: ContainerStats, with_fs: bool) -> Obj:
    return _drop_none(
        {
            "name": c.name,
            "startTime": _rfc3339(c.start_time),
            "cpu": _cpu(c.cpu),
            "memory": _memory(c.memory),
            "rootfs": _fs(c.rootfs) if with_fs else None,
            "logs": _fs(c.logs) if with_fs else None,
        }
    )


def _pod(pod: PodStats, with_fs: bool) -> Obj:
    # VolumeStats embeds FsStats (inline), then the volume's name.
    volumes = [{**(_fs(v.fs) or {}), "name": v.name} for v in pod.volumes]
    return _drop_none(
        {
            "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "startTime": _rfc3339(pod.start_time),
            "containers": [_container(c, with_fs) for c in pod.containers],
            "cpu": _cpu(pod.cpu),
            "memory": _memory(pod.memory),
            "volume": volumes if with_fs and volumes else None,
            "ephemeral-storage": _fs(pod.ephemeral_storage) if with_fs else None,
        }
    )


def summary(stats: NodeStats, only_cpu_and_memory: bool = False) -> Obj:
    """The Summary API object (stats/v1alpha1 `Summary`) of a sample; `only_cpu_and_memory`
    leaves out what is not CPU or memory, as the kubelet's `only_cpu_and_memory=true`."""
    with_fs = not only_cpu_and_memory
    image_fs = _fs(stats.image_fs) if with_fs else None
    node = _drop_none(
        {
            "nodeName": stats.node_name,
            "startTime": _rfc3339(stats.start_time),
            "cpu": _cpu(stats.cpu),
            "memory": _memory(stats.memory),
            "fs": _fs(stats.fs) if with_fs else None,
            "runtime": {"imageFs": image_fs} if image_fs is not None else None,
        }
    )
    return {"node": node, "pods": [_pod(p, with_fs) for p in stats.pods]}


def add_stats_routes(app: web.Application, stats: StatsView) -> None:
    """/metrics/resource and /stats/summary on `app` (either port), read from `stats`."""

    async def metrics_resource(request: web.Request) -> web.Response:
        return web.Response(
            body=resource_metrics(stats.latest()).encode(),
            headers={"Content-Type": CONTENT_TYPE},
        )

    async def stats_summary(request: web.Request) -> web.Response:
        latest = stats.latest()
        if latest is None:
            return status_response(503, "ServiceUnavailable", "no resource usage sampled yet")
        if latest.errors:
            return status_response(
                500, "InternalError", "failed to get stats: " + "; ".join(latest.errors)
            )
        only = request.query.get("only_cpu_and_memory", "").lower() == "true"
        return web.Response(
            text=json.dumps(summary(latest, only), separators=(",", ":")),
            content_type="application/json",
        )

    app.router.add_get("/metrics/resource", metrics_resource)
    app.router.add_get("/stats/summary", stats_summary)
