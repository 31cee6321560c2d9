"""How pods look to a person: kubectl's STATUS, RESTARTS and AGE columns, from v1 Pod dicts.

Shared by the `pykubelet get/describe` commands and the agent's status page.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any


def human_duration(seconds: float) -> str:
    """kubectl's HumanDuration: 45s, 3m20s, 15m, 2h30m, 20h, 3d4h, 200d, 2y."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(pod: dict[str, Any], now: datetime) -> str:
    meta = pod["metadata"]
    since = parse_time(meta.get("creationTimestamp")) or parse_time(
        meta.get("annotations", {}).get("kubernetes.io/config.seen")
    )
    since = since or parse_time(pod.get("status", {}).get("startTime"))
    return human_duration((now - since).total_seconds()) if since else "<unknown>"


def pod_status_reason(pod: dict[str, Any]) -> str:
    """The STATUS column, computed as kubectl does."""
    status = pod.get("status", {})
    reason = status.get("reason") or status.get("phase") or "Unknown"
    inits = status.get("initContainerStatuses") or []
    spec_inits = pod.get("spec", {}).get("initContainers") or []
    initializing = False
    for i, cs in enumerate(inits):
        state = cs.get("state", {})
        term = state.get("terminated")
        if term and term.get("exitCode") == 0:
            continue
        sidecar = (spec_inits[i].get("restartPolicy") if i < len(spec_inits) else None) == "Always"
        if sidecar and cs.get("started"):
            continue
        if term:
            reason = "Init:" + (
                term.get("reason") or f"ExitCode:{term.get('exitCode')}"
                if not term.get("signal")
                else f"Signal:{term['signal']}"
            )
        elif state.get("waiting", {}).get("reason") not in (None, "PodInitializing"):
            reason = "Init:" + state["waiting"]["reason"]
        else:
            reason = f"Init:{i}/{len(spec_inits)}"
        initializing = True
        break
    if not initializing:
        has_running = False
        for cs in reversed(status.get("containerStatuses") or []):
            state = cs.get("state", {})
            if state.get("waiting", {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif state.get("terminated"):
                term = state["terminated"]
                if term.get("reason"):
                    reason = term["reason"]
                elif term.get("signal"):
                    reason = f"Signal:{term['signal']}"
                else:
                    reason = f"ExitCode:{term.get('exitCode')}"
            elif state.get("running") and cs.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return str(reason)


def restarts(pod: dict[str, Any], now: datetime) -> str:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    total = sum(int(cs.get("restartCount", 0)) for cs in statuses)
    last: datetime | None = None
    for cs in statuses:
        finished = parse_time(cs.get("lastState", {}).get("terminated", {}).get("finishedAt"))
        if finished and (last is None or finished > last):
            last = finished
    if total and last is not None:
        return f"{total} ({human_duration((now - last).total_seconds())} ago)"
    return str(total)
