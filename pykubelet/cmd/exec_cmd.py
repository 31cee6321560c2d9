"""`pykubelet exec [-i] [-t] POD [-c CONTAINER] [-n NAMESPACE] -- COMMAND...`: a command in a
pod's container, through a node's kubelet API, as `kubectl exec` runs it.

- The pod is looked up on the node (`/pods`): a static pod answers to its manifest's name too.
  Without `-c`, the container is the one the `kubectl.kubernetes.io/default-container`
  annotation names, else the first ("Defaulted container ..." said on stderr when there are
  several, as kubectl says it).
- `-t` without `-i` gives no terminal, and `-t` with a stdin that is not a terminal says
  "Unable to use a TTY - input is not a terminal or the right kind of file" and goes on
  without one: both as kubectl (its SetupTTY).
- The exit code is the command's; a failure of the command itself prints "command terminated
  with exit code N" on stderr, anything else `error: ...`, exit 1.

The session is `remote.py`'s; `attach_cmd.py` is the same on `/attach/...`, with no
command.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.parse
from typing import Any

from pykubelet.cmd.nodeclient import (
    CtlError,
    NodeClient,
    add_connection_flags,
    credentials_from,
    get_pod,
    quote,
)
from pykubelet.cmd.remote import Outcome, SessionOptions, run_session
from pykubelet.cmd.terminal import is_terminal

Obj = dict[str, Any]
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

EXAMPLES = """\
examples:
  pykubelet exec web -- sh -c 'echo hello from $(hostname)'
  printf 'a\\nb\\n' | pykubelet exec -i web -- wc -l
  pykubelet exec -it web -c main -- sh
  pykubelet exec --kubeconfig node.kubeconfig web -- date
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "exec",
        help="run a command in a container (kubectl exec), over the node's kubelet API",
        description="Run a command in a container of a pod on the node, as kubectl exec does. "
        "The exit code is the command's.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pod", metavar="POD")
    p.add_argument("command_line", nargs="*", metavar="-- COMMAND")
    p.add_argument("-c", "--container", help="the container (default: the pod's default one)")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-i", "--stdin", action="store_true", help="pass stdin to the command")
    p.add_argument("-t", "--tty", action="store_true", help="give the command a terminal")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the command's output")
    add_connection_flags(p)


def choose_container(pod: Obj, wanted: str | None, quiet: bool = False) -> str:
    """The container named, or the pod's default one (told on stderr if it had a choice)."""
    names: list[str] = [str(c["name"]) for c in pod.get("spec", {}).get("containers") or []]
    init = [str(c["name"]) for c in pod.get("spec", {}).get("initContainers") or []]
    pod_name = pod["metadata"]["name"]
    if wanted is not None:
        if wanted not in names + init:
            raise CtlError(f"container {wanted} is not valid for pod {pod_name}")
        return wanted
    annotated = (pod["metadata"].get("annotations") or {}).get(DEFAULT_CONTAINER_ANNOTATION)
    if annotated in names:
        return str(annotated)
    if not names:
        raise CtlError(f"pod {pod_name} has no containers")
    if len(names) > 1 and not quiet:
        sys.stderr.write(f'Defaulted container "{names[0]}" out of: {", ".join(names + init)}\n')
    return names[0]


def exec_path(
    namespace: str, pod: str, container: str, command: list[str], *, stdin: bool, tty: bool
) -> str:
    """The kubelet API's exec URL, with the query the API server forwards to kubelets."""
    query: list[tuple[str, str]] = [("command", part) for part in command]
    if stdin:
        query.append(("input", "1"))
    query.append(("output", "1"))
    if not tty:
        query.append(("error", "1"))  # a terminal carries stderr on its one stream
    else:
        query.append(("tty", "1"))
    return f"/exec/{quote(namespace)}/{quote(pod)}/{quote(container)}?" + urllib.parse.urlencode(
        query
    )


def session_options(
    stdin: bool, tty: bool, quiet: bool = False, stdin_fd: int = 0
) -> SessionOptions:
    """kubectl's SetupTTY: a terminal only with stdin, and only if stdin is one."""
    if tty and stdin and not is_terminal(stdin_fd):
        if not quiet:
            sys.stderr.write(
                "Unable to use a TTY - input is not a terminal or the right kind of file\n"
            )
        tty = False
    return SessionOptions(stdin=stdin, tty=tty and stdin)


async def _exec(ns: argparse.Namespace) -> Outcome:
    if not ns.command_line:
        raise CtlError(
            "you must specify at least one command for the container: "
            "pykubelet exec POD -- COMMAND [args...]"
        )
    creds = credentials_from(ns)
    opts = session_options(ns.stdin, ns.tty, ns.quiet)
    async with NodeClient(creds) as client:
        pod = await get_pod(client, ns.pod, ns.namespace)
        phase = pod.get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            raise CtlError(
                f"cannot exec into a container in a completed pod; current phase is {phase}"
            )
        container = choose_container(pod, ns.container, ns.quiet)
        path = exec_path(
            ns.namespace,
            pod["metadata"]["name"],
            container,
            ns.command_line,
            stdin=opts.stdin,
            tty=opts.tty,
        )
        return await run_session(client, path, opts)


def run(ns: argparse.Namespace) -> int:
    result = asyncio.run(_exec(ns))
    if result.message is not None:
        # kubectl's words: "command terminated with exit code N" alone, other failures as errors.
        prefix = "" if result.message.startswith("command terminated") else "error: "
        sys.stderr.write(f"{prefix}{result.message}\n")
    return result.code
