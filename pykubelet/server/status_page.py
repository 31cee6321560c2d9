"""The status page at `/`: the node's pods, their containers and recent events, as HTML.

Plain server-side HTML that reloads itself every few seconds: nothing to build, no script.
Each pod's CPU and memory over the collector's history are inline SVG sparklines
(`sparkline.py`) with the latest value as text; the node's pressure conditions sit beside its
resources.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from html import escape
from typing import Any

from pykubelet import __version__
from pykubelet.common.allocatable import NodeResources, format_quantity
from pykubelet.server import sparkline
from pykubelet.server.present import age, human_duration, parse_time, pod_status_reason, restarts
from pykubelet.stats.types import UsageHistory, UsagePoint

REFRESH_SECONDS = 5
# The node conditions the eviction manager sets (the kubelet's names), in the kubelet's order.
PRESSURE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure")
MiB = 1 << 20

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #1d2330; background: #fafbfc; }
h1 { font-size: 20px; margin: 0 0 .2em; } h2 { font-size: 16px; margin: 1.6em 0 .4em; }
.sub { color: #667; margin-bottom: 1em; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e3e6ea; }
td { vertical-align: top; }
th { background: #f0f2f5; font-weight: 600; }
.ok { color: #137333; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; }
.wait { color: #8a5a00; font-weight: 600; } .dim { color: #778; }
code { font-size: 12px; }
.usage { white-space: nowrap; }
.usage svg { vertical-align: middle; margin-right: 6px; background: #f0f2f5; }
.cpu { color: #1a73e8; } .mem { color: #8e24aa; }
.side { display: flex; gap: 2em; align-items: flex-start; } .side > table { width: auto; }
"""

_GOOD = {"Running", "Completed", "Succeeded"}
_BAD_HINTS = ("Error", "BackOff", "Failed", "Out", "Err", "Unknown", "Signal", "ExitCode")


def _status_class(status: str) -> str:
    if status in _GOOD:
        return "ok"
    if any(hint in status for hint in _BAD_HINTS):
        return "bad"
    return "wait"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _container_state(cs: dict[str, Any]) -> str:
    state = cs.get("state", {})
    if "running" in state:
        return "running"
    if "terminated" in state:
        t = state["terminated"]
        return f"terminated: {t.get('reason', '')} (exit {t.get('exitCode')})"
    if "waiting" in state:
        return f"waiting: {state['waiting'].get('reason', '')}"
    return "unknown"


def _resource_table(resources: NodeResources) -> str:
    """Capacity, what is reserved (kube-reserved + system-reserved + hard eviction threshold)
    and allocatable, as the Node reports them."""
    rows = "".join(
        f"<tr><td>{escape(name)}</td><td>{escape(format_quantity(name, capacity))}</td>"
        f"<td>{escape(format_quantity(name, resources.reserved.get(name, 0)))}</td>"
        f"<td>{escape(format_quantity(name, resources.allocatable[name]))}</td></tr>"
        for name, capacity in resources.capacity.items()
    )
    return (
        "<table><tr><th>Resource</th><th>Capacity</th><th>Reserved</th><th>Allocatable</th></tr>"
        + rows
        + "</table>"
    )


def _node_section(resources: NodeResources | None, pressure: frozenset[str] | None) -> str:
    parts = []
    if resources:
        parts.append(_resource_table(resources))
    if pressure is not None:
        parts.append(_pressure_table(pressure))
    if not parts:
        return ""
    return f'<h2>Node resources</h2><div class="side">{"".join(parts)}</div>'


def _cpu_text(cores: float | None) -> str:
    return "-" if cores is None else f"{max(0, round(cores * 1000))}m"


def _memory_text(value: int | None) -> str:
    return "-" if value is None else f"{value // MiB}Mi"


def _usage(points: tuple[UsagePoint, ...]) -> str:
    """The pod's CPU and memory sparklines, each with its latest value."""
    if not points:
        return '<span class="dim">no samples yet</span>'
    cpu = [p.cpu_cores for p in points]
    memory = [None if p.memory_bytes is None else float(p.memory_bytes) for p in points]
    latest_cpu = _cpu_text(points[-1].cpu_cores)
    latest_memory = _memory_text(points[-1].memory_bytes)
    span = f"last {_plural(len(points), 'sample')}"
    return (
        '<div class="usage cpu">'
        + sparkline.svg(cpu, f"CPU (cores), {span}", "spark cpu")
        + f"CPU {escape(latest_cpu)}</div>"
        '<div class="usage mem">'
        + sparkline.svg(memory, f"memory working set, {span}", "spark mem")
        + f"memory {escape(latest_memory)}</div>"
    )


def _pressure_table(pressure: frozenset[str]) -> str:
    """The eviction manager's node conditions, True or False."""
    rows = "".join(
        f"<tr><td>{escape(name)}</td>"
        + ('<td class="bad">True</td>' if name in pressure else '<td class="ok">False</td>')
        + "</tr>"
        for name in PRESSURE_CONDITIONS
    )
    return '<table class="pressure"><tr><th>Condition</th><th>Status</th></tr>' + rows + "</table>"


def render(
    node_name: str,
    pods: list[dict[str, Any]],
    events: list[dict[str, Any]],
    now: datetime,
    resources: NodeResources | None = None,
    history: UsageHistory | None = None,
    pressure: Callable[[], frozenset[str]] | None = None,
) -> str:
    rows = []
    for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        meta, status = pod["metadata"], pod.get("status", {})
        statuses = status.get("containerStatuses") or []
        ready = sum(1 for cs in statuses if cs.get("ready"))
        reason = pod_status_reason(pod)
        containers = (
            "<br>".join(
                f"<code>{escape(cs['name'])}</code> {escape(_container_state(cs))}, "
                f"{_plural(cs.get('restartCount', 0), 'restart')}"
                for cs in statuses
            )
            or '<span class="dim">none yet</span>'
        )
        rows.append(
            "<tr>"
            f"<td>{escape(meta['namespace'])}/{escape(meta['name'])}</td>"
            f"<td>{ready}/{len(pod.get('spec', {}).get('containers') or [])}</td>"
            f'<td class="{_status_class(reason)}">{escape(reason)}</td>'
            f"<td>{escape(restarts(pod, now))}</td>"
            f"<td>{escape(age(pod, now))}</td>"
            f"<td>{escape(status.get('podIP') or '')}</td>"
            f"<td>{containers}</td>"
            + (f"<td>{_usage(history.history(meta.get('uid', '')))}</td>" if history else "")
            + "</tr>"
        )
    pod_table = (
        "<table><tr><th>Pod</th><th>Ready</th><th>Status</th><th>Restarts</th><th>Age</th>"
        "<th>IP</th><th>Containers</th>"
        + ("<th>Usage</th>" if history else "")
        + "</tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else '<p class="dim">No pods.</p>'
    )
    event_rows = []
    for e in sorted(events, key=lambda e: e.get("lastTimestamp", ""), reverse=True)[:50]:
        seen = parse_time(e.get("lastTimestamp"))
        when = human_duration((now - seen).total_seconds()) if seen else ""
        obj = e["involvedObject"]
        target = (
            f"{obj.get('namespace', '')}/{obj['name']}" if obj.get("namespace") else obj["name"]
        )
        kind = "bad" if e["type"] == "Warning" else "dim"
        count = f" (x{e['count']})" if e.get("count", 1) > 1 else ""
        event_rows.append(
            f'<tr><td>{escape(when)}{count}</td><td class="{kind}">{escape(e["type"])}</td>'
            f"<td>{escape(e['reason'])}</td><td>{escape(obj['kind'])} {escape(target)}</td>"
            f"<td>{escape(e['message'])}</td></tr>"
        )
    event_table = (
        "<table><tr><th>Age</th><th>Type</th><th>Reason</th><th>Object</th><th>Message</th></tr>"
        + "".join(event_rows)
        + "</table>"
        if event_rows
        else '<p class="dim">No events.</p>'
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        f"<title>pykubelet: {escape(node_name)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Node {escape(node_name)}</h1>"
        f'<div class="sub">pykubelet {__version__} · {len(pods)} pods · refreshes every '
        f'{REFRESH_SECONDS}s · <a href="/pods">/pods</a> · <a href="/events">/events</a> · '
        '<a href="/metrics">/metrics</a></div>'
        f"<h2>Pods</h2>{pod_table}"
        + _node_section(resources, pressure() if pressure else None)
        + f"<h2>Recent events</h2>{event_table}</body></html>"
    )
