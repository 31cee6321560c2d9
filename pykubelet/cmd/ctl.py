"""`pykubelet get|logs|describe|version`: look at a running agent through its read-only API;
and the dispatcher of the verbs that work through a node's authenticated kubelet API
(`exec_cmd.py`, `attach_cmd.py`, `portforward_cmd.py`, `top_cmd.py`, over `nodeclient.py`).

Tables and texts follow kubectl's, so what a Kubernetes user reads here looks familiar.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TextIO

import yaml

from pykubelet import __version__
from pykubelet.cmd import attach_cmd, exec_cmd, portforward_cmd, top_cmd
from pykubelet.cmd.nodeclient import CtlError, find_pod
from pykubelet.common.options import parse_duration
from pykubelet.runtime.logfiles import parse_time as record_time
from pykubelet.server.present import age, human_duration, parse_time, pod_status_reason, restarts

DEFAULT_SERVER = "http://127.0.0.1:10255"
# The verbs over the kubelet API (--port), each a module: name -> (add_parser, run).
NODE_VERBS = {
    "exec": (exec_cmd.add_parser, exec_cmd.run),
    "attach": (attach_cmd.add_parser, attach_cmd.run),
    "port-forward": (portforward_cmd.add_parser, portforward_cmd.run),
    "top": (top_cmd.add_parser, top_cmd.run),
}
COMMANDS = ("get", "logs", "describe", "version", *NODE_VERBS)
__all__ = ["COMMANDS", "CtlError", "build_parser", "describe_pod", "main", "print_pods"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# --- talking to the agent ------------------------------------------------------------------------


def _open(server: str, path: str, timeout: float | None = 10.0) -> Any:
    url = server.rstrip("/") + path
    try:
        return urllib.request.urlopen(url, timeout=timeout)
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            body = json.loads(body).get("message", body)
        raise CtlError(f"{body.strip()} (HTTP {err.code} from {url})") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise CtlError(
            f"cannot reach the agent at {server}: {reason} (is pykubelet running? see --server)"
        ) from None


def _get_json(server: str, path: str) -> Any:
    with _open(server, path) as resp:
        return json.loads(resp.read())


# --- formatting ----------------------------------------------------------------------------------


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        out.write("   ".join(cells).rstrip() + "\n")


def print_pods(pods: list[dict[str, Any]], wide: bool, out: TextIO, now: datetime) -> None:
    if not pods:
        sys.stderr.write("No resources found.\n")
        return
    header = ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    if wide:
        header += ["IP", "NODE"]
    rows = [header]
    for pod in pods:
        statuses = pod.get("status", {}).get("containerStatuses") or []
        ready = sum(1 for cs in statuses if cs.get("ready"))
        total = len(pod.get("spec", {}).get("containers") or [])
        row = [
            pod["metadata"]["name"],
            f"{ready}/{total}",
            pod_status_reason(pod),
            restarts(pod, now),
            age(pod, now),
        ]
        if wide:
            row += [pod.get("status", {}).get("podIP") or "<none>", pod["spec"].get("nodeName", "")]
        rows.append(row)
    _table(rows, out)


def _state_text(state: dict[str, Any], indent: str) -> list[str]:
    if "running" in state:
        return ["Running", f"{indent}Started:      {state['running'].get('startedAt', '')}"]
    if "terminated" in state:
        t = state["terminated"]
        lines = ["Terminated", f"{indent}Reason:       {t.get('reason', '')}"]
        if t.get("message"):
            lines.append(f"{indent}Message:      {t['message']}")
        lines += [
            f"{indent}Exit Code:    {t.get('exitCode')}",
            f"{indent}Started:      {t.get('startedAt', '')}",
            f"{indent}Finished:     {t.get('finishedAt', '')}",
        ]
        return lines
    if "waiting" in state:
        w = state["waiting"]
        lines = ["Waiting", f"{indent}Reason:       {w.get('reason', '')}"]
        if w.get("message"):
            lines.append(f"{indent}Message:      {w['message']}")
        return lines
    return ["<none>"]


def describe_pod(
    pod: dict[str, Any], events: list[dict[str, Any]], out: TextIO, now: datetime
) -> None:
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    w = out.write

    def mapping(title: str, values: dict[str, str]) -> None:
        items = [f"{k}={v}" for k, v in sorted(values.items())] or ["<none>"]
        w(f"{title:<14}{items[0]}\n")
        for item in items[1:]:
            w(f"{'':<14}{item}\n")

    w(f"{'Name:':<14}{meta['name']}\n{'Namespace:':<14}{meta.get('namespace', '')}\n")
    w(f"{'Node:':<14}{spec.get('nodeName', '')}/{status.get('hostIP', '')}\n")
    w(f"{'Start Time:':<14}{status.get('startTime', '<none>')}\n")
    mapping("Labels:", meta.get("labels") or {})
    mapping("Annotations:", meta.get("annotations") or {})
    w(f"{'Status:':<14}{status.get('phase', 'Unknown')}\n{'IP:':<14}{status.get('podIP', '')}\n")
    by_name = {cs["name"]: cs for cs in status.get("containerStatuses") or []}
    by_name.update({cs["name"]: cs for cs in status.get("initContainerStatuses") or []})
    for title, containers in (
        ("Init Containers:", spec.get("initContainers") or []),
        ("Containers:", spec.get("containers") or []),
    ):
        if not containers:
            continue
        w(f"{title}\n")
        for c in containers:
            cs = by_name.get(c["name"], {})
            ind = " " * 6
            w(f"  {c['name']}:\n")
            w(f"    Container ID:  {cs.get('containerID', '')}\n    Image:         {c['image']}\n")
            if c.get("command"):
                w("    Command:\n" + "".join(f"{ind}{x}\n" for x in c["command"]))
            if c.get("args"):
                w("    Args:\n" + "".join(f"{ind}{x}\n" for x in c["args"]))
            state = _state_text(cs.get("state", {}), ind)
            w(f"    State:         {state[0]}\n" + "".join(f"{x}\n" for x in state[1:]))
            if cs.get("lastState"):
                last = _state_text(cs["lastState"], ind)
                w(f"    Last State:    {last[0]}\n" + "".join(f"{x}\n" for x in last[1:]))
            w(f"    Ready:         {cs.get('ready', False)}\n")
            w(f"    Restart Count: {cs.get('restartCount', 0)}\n")
            env = c.get("env") or []
            w("    Environment:" + (" <none>\n" if not env else "\n"))
            for e in env:
                ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                value = f"({ref})" if ref else e.get("value", "")
                w(f"{ind}{e['name']}:  {value}\n")
    w("Conditions:\n")
    rows = [["  Type", "Status"]] + [
        [f"  {c['type']}", c["status"]] for c in status.get("conditions") or []
    ]
    _table(rows, out)
    w("Events:")
    if not events:
        w("  <none>\n")
        return
    w("\n")
    rows = [["  Type", "Reason", "Age", "From", "Message"]]
    for e in events:
        seen = parse_time(e.get("lastTimestamp"))
        age = human_duration((now - seen).total_seconds()) if seen else "<unknown>"
        if e.get("count", 1) > 1:
            age += f" (x{e['count']})"
        rows.append(
            [
                f"  {e['type']}",
                e["reason"],
                age,
                e.get("source", {}).get("component", ""),
                e["message"],
            ]
        )
    _table(rows, out)


# --- commands ------------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        help=f"the agent's read-only API (default {DEFAULT_SERVER})",
    )
    p.add_argument("-n", "--namespace", default="default")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pykubelet", description="Look at a running pykubelet.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    get = sub.add_parser("get", help="list pods (kubectl get pods)")
    get.add_argument("resource", choices=["pods", "pod", "po"])
    get.add_argument("name", nargs="?")
    get.add_argument("-o", "--output", choices=["wide", "json", "yaml"])
    get.add_argument("-A", "--all-namespaces", action="store_true")
    _common(get)
    logs = sub.add_parser("logs", help="print a container's log (kubectl logs)")
    logs.add_argument("pod")
    logs.add_argument("-c", "--container")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("-p", "--previous", action="store_true")
    logs.add_argument("--tail", type=int, default=None)
    logs.add_argument("--limit-bytes", type=int, default=None)
    logs.add_argument("--since", help="only lines newer than a relative duration like 5s, 2m or 3h")
    logs.add_argument("--since-time", help="only lines at or after an RFC3339 time")
    logs.add_argument(
        "--timestamps", action="store_true", help="each line prefixed with its time (RFC3339)"
    )
    _common(logs)
    describe = sub.add_parser("describe", help="show a pod in detail, with its events")
    describe.add_argument("resource", choices=["pod", "pods", "po"])
    describe.add_argument("name")
    _common(describe)
    sub.add_parser("version", help="print the version")
    for add_parser, _ in NODE_VERBS.values():
        add_parser(sub)
    return p


def _cmd_get(ns: argparse.Namespace, out: TextIO) -> int:
    pods: list[dict[str, Any]] = _get_json(ns.server, "/pods")["items"]
    if not ns.all_namespaces:
        pods = [p for p in pods if p["metadata"].get("namespace") == ns.namespace]
    if ns.name:
        pods = [find_pod(pods, ns.name, ns.namespace)]
    if ns.output == "json":
        doc: Any = pods[0] if ns.name else {"apiVersion": "v1", "kind": "List", "items": pods}
        out.write(json.dumps(doc, indent=4) + "\n")
    elif ns.output == "yaml":
        doc = pods[0] if ns.name else {"apiVersion": "v1", "kind": "List", "items": pods}
        out.write(yaml.safe_dump(doc, sort_keys=False))
    else:
        print_pods(pods, ns.output == "wide", out, datetime.now(UTC))
    return 0


def _cmd_logs(ns: argparse.Namespace, out: TextIO) -> int:
    pod = find_pod(_get_json(ns.server, "/pods")["items"], ns.pod, ns.namespace)
    names = [c["name"] for c in pod["spec"]["containers"]]
    container = ns.container
    if container is None:
        container = names[0]
        if len(names) > 1:
            sys.stderr.write(f'Defaulted container "{container}" out of: {", ".join(names)}\n')
    query: dict[str, str] = {}
    if ns.follow:
        query["follow"] = "true"
    if ns.previous:
        query["previous"] = "true"
    if ns.tail is not None:
        query["tailLines"] = str(ns.tail)
    query.update(_log_query(ns))
    name = urllib.parse.quote(pod["metadata"]["name"])
    path = (
        f"/containerLogs/{urllib.parse.quote(ns.namespace)}/{name}/{urllib.parse.quote(container)}"
    )
    if query:
        path += "?" + urllib.parse.urlencode(query)
    with _open(ns.server, path, timeout=None if ns.follow else 10.0) as resp:
        while chunk := resp.read1(65536):
            out.write(chunk.decode(errors="replace"))
            out.flush()
    return 0


def _log_query(ns: argparse.Namespace) -> dict[str, str]:
    """--limit-bytes, --since, --since-time and --timestamps as kubectl sends them (--since
    rounded up to whole seconds), checked as kubectl checks them."""
    query: dict[str, str] = {}
    if ns.limit_bytes is not None:
        if ns.limit_bytes < 1:
            raise CtlError("--limit-bytes must be greater than 0")
        query["limitBytes"] = str(ns.limit_bytes)
    if ns.since is not None and ns.since_time is not None:
        raise CtlError("at most one of `sinceTime` or `sinceSeconds` may be specified")
    if ns.since is not None:
        try:
            seconds = parse_duration(ns.since)
        except ValueError as e:
            raise CtlError(f"--since: {e}") from None
        if seconds <= 0:
            raise CtlError("--since must be greater than 0")
        query["sinceSeconds"] = str(math.ceil(seconds))
    if ns.since_time is not None:
        if record_time(ns.since_time.encode()) is None:
            raise CtlError(
                f"--since-time: {ns.since_time!r} is not an RFC3339 time (2006-01-02T15:04:05Z)"
            )
        query["sinceTime"] = ns.since_time
    if ns.timestamps:
        query["timestamps"] = "true"
    return query


def _cmd_describe(ns: argparse.Namespace, out: TextIO) -> int:
    pod = find_pod(_get_json(ns.server, "/pods")["items"], ns.name, ns.namespace)
    events = [
        e
        for e in _get_json(ns.server, "/events")["items"]
        if e["involvedObject"].get("kind") == "Pod"
        and e["involvedObject"].get("name") == pod["metadata"]["name"]
        and e["involvedObject"].get("namespace") == pod["metadata"].get("namespace")
    ]
    describe_pod(pod, events, out, datetime.now(UTC))
    return 0


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`exec ... -- COMMAND...`: what follows the first `--` is the command, untouched
    (argparse's subparsers do not take `--` apart reliably)."""
    if argv[:1] == ["exec"] and "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, None


def main(argv: Sequence[str], out: TextIO = sys.stdout) -> int:
    args, command = _split_command(list(argv))
    ns = build_parser().parse_args(args)
    if command is not None:
        ns.command_line = [*ns.command_line, *command]
    if ns.command == "version":
        out.write(f"pykubelet {__version__}\n")
        return 0
    handlers = {"get": _cmd_get, "logs": _cmd_logs, "describe": _cmd_describe}
    try:
        if ns.command in NODE_VERBS:
            return NODE_VERBS[ns.command][1](ns)
        return handlers[ns.command](ns, out)
    except CtlError as err:
        sys.stderr.write(f"error: {err}\n")
        return 1
    except KeyboardInterrupt:
        return 130
