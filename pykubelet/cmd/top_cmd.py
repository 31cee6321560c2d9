"""`pykubelet top pods [NAME]`: the CPU and memory of a node's pods, as `kubectl top pod` shows
them, read from the node's `/stats/summary` (no metrics-server needed).

- CPU is the rate the node's sample carries (`usageNanoCores`, over the 10 s between its
  samples). The node's first sample has no rate yet, and a pod started after a sample is not
  in it (the node's `/pods` says which should be): then the summary is read again until the
  next sample comes (up to 10 s); a counter that still has no rate is taken as the difference
  of `usageCoreNanoSeconds` between the two samples, or, for a container new in the second,
  as its counter over its life (its `startTime` to the sample: at most the 10 s window). A pod
  without figures even then is "Metrics not available for pod ns/name", as kubectl says it.
- A pod's usage is the sum of its containers' (what metrics-server gives kubectl), the pod's own
  figures where it lists no containers.
- Columns and units are kubectl's: `NAME  CPU(cores)  MEMORY(bytes)`, millicores rounded up
  (`467m`), memory in whole MiB (`54Mi`); `-A` adds NAMESPACE, `--containers` one row per
  container (`POD  NAME  ...`), `--sort-by cpu|memory`, `--no-headers`.
- `top node`: `NAME  CPU(cores)  CPU(%)  MEMORY(bytes)  MEMORY(%)`, the node's usage from its
  summary over its allocatable (kubectl divides by the Node's `status.allocatable`; the node
  serves it at `/resources`), the percents truncated as kubectl's.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from pykubelet.api.quantity import parse_quantity
from pykubelet.cmd.nodeclient import CtlError, NodeClient, add_connection_flags, credentials_from

Obj = dict[str, Any]
MiB = 1 << 20
# How long to wait for the node's next sample when the first has no CPU rate (it samples
# every 10 s).
NEXT_SAMPLE_TIMEOUT = 25.0
POLL = 1.0
POD_WORDS = ("pods", "pod", "po")
NODE_WORDS = ("nodes", "node", "no")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="CPU and memory of the node or its pods (kubectl top), from its /stats/summary",
        description="Show the CPU and memory of the node or its pods, as kubectl top does.",
    )
    p.add_argument("resource", choices=[*POD_WORDS, *NODE_WORDS])
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("--containers", action="store_true", help="a row per container")
    p.add_argument("--sort-by", choices=["cpu", "memory"])
    p.add_argument("--no-headers", action="store_true")
    add_connection_flags(p)


@dataclass(frozen=True)
class Usage:
    namespace: str
    pod: str
    container: str  # "" for a pod's total
    nano_cores: float | None
    working_set: int | None


def _time(obj: Obj | None) -> datetime | None:
    if not obj or not obj.get("time"):
        return None
    try:
        return datetime.fromisoformat(str(obj["time"]).replace("Z", "+00:00"))
    except ValueError:
        return None


def _rate(now: Obj | None, before: Obj | None, started: str | None = None) -> float | None:
    """nanocores of a cpu object: its rate, else the counter's difference since `before`, else
    (a container's first sample) its counter over its life since `started`."""
    if not now:
        return None
    if now.get("usageNanoCores") is not None:
        return float(now["usageNanoCores"])
    t1 = _time(now)
    t0 = _time(before) if before else _time({"time": started}) if started else None
    if t1 and t0 and t1 > t0:
        used = float(now.get("usageCoreNanoSeconds", 0)) - float(
            (before or {}).get("usageCoreNanoSeconds", 0)
        )
        return max(0.0, used / (t1 - t0).total_seconds())
    return None


def usages(summary: Obj, before: Obj | None = None, containers: bool = False) -> list[Usage]:
    """Each pod's usage (or each container's) in a Summary; `before`, an earlier Summary,
    gives rates where this one has only counters."""
    earlier: dict[tuple[str, str, str], Obj] = {}
    for pod in (before or {}).get("pods") or []:
        ref = pod.get("podRef") or {}
        key = (ref.get("namespace", ""), ref.get("name", ""))
        earlier[(*key, "")] = pod.get("cpu") or {}
        for c in pod.get("containers") or []:
            earlier[(*key, c.get("name", ""))] = c.get("cpu") or {}
    rows: list[Usage] = []
    for pod in summary.get("pods") or []:
        ref = pod.get("podRef") or {}
        ns, name = ref.get("namespace", ""), ref.get("name", "")
        parts = [
            Usage(
                ns,
                name,
                c.get("name", ""),
                _rate(
                    c.get("cpu"),
                    earlier.get((ns, name, c.get("name", ""))),
                    c.get("startTime") if before is not None else None,
                ),
                (c.get("memory") or {}).get("workingSetBytes"),
            )
            for c in pod.get("containers") or []
        ]
        if containers:
            rows += parts
        elif parts:
            cpus = [u.nano_cores for u in parts]
            mems = [u.working_set for u in parts]
            rows.append(
                Usage(
                    ns,
                    name,
                    "",
                    None if any(c is None for c in cpus) else sum(c or 0.0 for c in cpus),
                    None if any(m is None for m in mems) else sum(m or 0 for m in mems),
                )
            )
        else:
            rows.append(
                Usage(
                    ns,
                    name,
                    "",
                    _rate(
                        pod.get("cpu"),
                        earlier.get((ns, name, "")),
                        pod.get("startTime") if before is not None else None,
                    ),
                    (pod.get("memory") or {}).get("workingSetBytes"),
                )
            )
    return rows


def cpu_text(nano_cores: float) -> str:
    """Millicores as kubectl prints a CPU quantity (MilliValue: rounded up)."""
    return f"{math.ceil(nano_cores / 1e6 - 1e-9)}m"


def memory_text(working_set: int) -> str:
    return f"{working_set // MiB}Mi"


def table(rows: list[list[str]], out: TextIO) -> None:
    """kubectl's tabwriter: cells of at least 6, 3 spaces of padding."""
    widths = [max(6, max(len(row[i]) for row in rows) + 3) for i in range(len(rows[0]))]
    for row in rows:
        line = "".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + row[-1]
        out.write(line.rstrip() + "\n")


def _select(rows: list[Usage], ns: argparse.Namespace, node_name: str) -> list[Usage]:
    if not ns.all_namespaces:
        rows = [r for r in rows if r.namespace == ns.namespace]
    if ns.name:
        # A static pod answers to its manifest's name too.
        names = {ns.name, f"{ns.name}-{node_name.lower()}"}
        exact = [r for r in rows if r.pod == ns.name]
        rows = exact or [r for r in rows if r.pod in names]
    return rows


def print_usages(rows: list[Usage], ns: argparse.Namespace, out: TextIO) -> None:
    if ns.sort_by == "cpu":
        rows = sorted(rows, key=lambda r: -(r.nano_cores or 0.0))
    elif ns.sort_by == "memory":
        rows = sorted(rows, key=lambda r: -(r.working_set or 0))
    header = ["NAMESPACE"] if ns.all_namespaces else []
    header += ["POD", "NAME"] if ns.containers else ["NAME"]
    header += ["CPU(cores)", "MEMORY(bytes)"]
    lines = [] if ns.no_headers else [header]
    for r in rows:
        line = [r.namespace] if ns.all_namespaces else []
        line += [r.pod, r.container] if ns.containers else [r.pod]
        line += [cpu_text(r.nano_cores or 0.0), memory_text(r.working_set or 0)]
        lines.append(line)
    if lines:
        table(lines, out)


def _running_pods(pods: Obj, ns: argparse.Namespace, node_name: str) -> set[tuple[str, str]]:
    """The selected pods the node says are running: those a sample should have."""
    found = set()
    for pod in pods.get("items") or []:
        meta = pod.get("metadata") or {}
        if pod.get("status", {}).get("phase") != "Running":
            continue
        row = Usage(meta.get("namespace", ""), meta.get("name", ""), "", 0.0, 0)
        if _select([row], ns, node_name):
            found.add((row.namespace, row.pod))
    return found


def _complete(rows: list[Usage], expected: set[tuple[str, str]]) -> bool:
    have = {(r.namespace, r.pod) for r in rows}
    return expected <= have and all(r.nano_cores is not None for r in rows)


async def _top(ns: argparse.Namespace, out: TextIO) -> int:
    creds = credentials_from(ns)
    async with NodeClient(creds) as client:
        first: Obj = await client.get_json("/stats/summary")
        node_name = str((first.get("node") or {}).get("nodeName", ""))
        rows = _select(usages(first, containers=ns.containers), ns, node_name)
        expected = _running_pods(await client.get_json("/pods"), ns, node_name)
        if not _complete(rows, expected):
            # A pod started after the sample, or the node's first sample (no rate yet): the
            # next sample has them.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + NEXT_SAMPLE_TIMEOUT
            sampled = _time((first.get("node") or {}).get("cpu"))
            while loop.time() < deadline:
                await asyncio.sleep(POLL)
                summary: Obj = await client.get_json("/stats/summary")
                if _time((summary.get("node") or {}).get("cpu")) != sampled:
                    rows = _select(usages(summary, first, ns.containers), ns, node_name)
                    break
    missing = sorted(expected - {(r.namespace, r.pod) for r in rows})
    missing += sorted({(r.namespace, r.pod) for r in rows if r.nano_cores is None})
    if ns.name and missing:
        raise CtlError(f"Metrics not available for pod {missing[0][0]}/{missing[0][1]}")
    shown = [r for r in rows if (r.namespace, r.pod) not in missing]
    if not shown and not missing:
        if ns.name:
            raise CtlError(f'pod "{ns.name}" not found in namespace "{ns.namespace}"')
        where = "any namespace" if ns.all_namespaces else f"{ns.namespace} namespace"
        sys.stderr.write(f"No resources found in {where}.\n")
        return 0
    if shown:
        print_usages(shown, ns, out)
    for namespace, pod in missing:
        sys.stderr.write(f"Metrics not available for pod {namespace}/{pod}\n")
    return 0


def node_row(name: str, nano_cores: float, working_set: int, allocatable: Obj) -> list[str]:
    """kubectl top node's row: usage and its percent of allocatable (truncated)."""
    cpu_milli = math.ceil(nano_cores / 1e6 - 1e-9)
    row = [name, f"{cpu_milli}m"]
    cpu_alloc = float(parse_quantity(allocatable.get("cpu", 0))) * 1000
    row.append(f"{int(cpu_milli / cpu_alloc * 100)}%" if cpu_alloc > 0 else "<unknown>")
    row.append(memory_text(working_set))
    mem_alloc = float(parse_quantity(allocatable.get("memory", 0)))
    row.append(f"{int(working_set / mem_alloc * 100)}%" if mem_alloc > 0 else "<unknown>")
    return row


async def _top_node(ns: argparse.Namespace, out: TextIO) -> int:
    creds = credentials_from(ns)
    async with NodeClient(creds) as client:
        first: Obj = await client.get_json("/stats/summary")
        node: Obj = first.get("node") or {}
        name = str(node.get("nodeName", ""))
        if ns.name and ns.name != name:
            raise CtlError(f'nodes "{ns.name}" not found')
        cpu = _rate(node.get("cpu"), None)
        if cpu is None:  # the node's first sample: the next one has the rate
            loop = asyncio.get_running_loop()
            deadline = loop.time() + NEXT_SAMPLE_TIMEOUT
            while cpu is None and loop.time() < deadline:
                await asyncio.sleep(POLL)
                later: Obj = (await client.get_json("/stats/summary")).get("node") or {}
                if _time(later.get("cpu")) != _time(node.get("cpu")):
                    cpu = _rate(later.get("cpu"), node.get("cpu"))
                    node = later
        memory = (node.get("memory") or {}).get("workingSetBytes")
        if cpu is None or memory is None:
            raise CtlError(f"Metrics not available for node {name}")
        allocatable: Obj = (await client.get_json("/resources")).get("allocatable") or {}
    header = ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"]
    rows = [] if ns.no_headers else [header]
    table([*rows, node_row(name, cpu, int(memory), allocatable)], out)
    return 0


def run(ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    if ns.resource in NODE_WORDS:
        return asyncio.run(_top_node(ns, out))
    return asyncio.run(_top(ns, out))
