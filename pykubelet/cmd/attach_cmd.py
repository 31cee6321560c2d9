"""`pykubelet attach POD [-c CONTAINER] [-n NAMESPACE] [-i] [-t] [-q]`: a container's own
stdio, through a node's kubelet API, as `kubectl attach` joins it.

- The pod and its container are found as by `pykubelet exec` (the default-container
  annotation, else the first; "Defaulted container ..." on stderr when there was a choice); a
  pod that has completed is refused with kubectl's words.
- The terminal follows the container's spec, as kubectl decides it: `-t` for a container that
  has none says "error: Unable to use a TTY - container C did not allocate one" and goes on
  without; a container with one gets a terminal even without `-t`. A terminal needs `-i` and a
  stdin that is one (else kubectl's "Unable to use a TTY - input is not a terminal ..."); with
  it the local terminal is raw for the session (Ctrl-C goes to the container), its size
  followed, and the container's stderr is its terminal's.
- "If you don't see a command prompt, try pressing enter." on stderr first, and after a session
  with a terminal of a pod that restarts its containers, how to resume it: both unless `-q`.
- The session ends when the container's output ends (it exited) or at the end of our stdin
  (with `stdinOnce` the node then closes the container's stdin); the container runs on. The
  exit code is 0, or 1 with `error: ...` when the node refused or failed the attach.

The session is `remote.py`'s, as exec's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.parse
from typing import Any

from pykubelet.cmd.exec_cmd import choose_container, session_options
from pykubelet.cmd.nodeclient import (
    CtlError,
    NodeClient,
    add_connection_flags,
    credentials_from,
    get_pod,
    quote,
)
from pykubelet.cmd.remote import Outcome, run_session

Obj = dict[str, Any]

EXAMPLES = """\
examples:
  pykubelet attach web                 # its output from now on, until it exits or Ctrl-C
  pykubelet attach -it web -c shell    # its terminal, raw: Ctrl-C goes to the container
  echo hello | pykubelet attach -i web # to its stdin (a container with stdin: true)
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attach",
        help="attach to a running container's own stdio (kubectl attach), over the node's "
        "kubelet API",
        description="Attach to the process already running in a container of a pod on the "
        "node, as kubectl attach does. Detaching leaves it running.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pod", metavar="POD")
    p.add_argument("-c", "--container", help="the container (default: the pod's default one)")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-i", "--stdin", action="store_true", help="pass stdin to the container")
    p.add_argument("-t", "--tty", action="store_true", help="stdin is a TTY")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="only print output from the remote session"
    )
    add_connection_flags(p)


def attach_path(namespace: str, pod: str, container: str, *, stdin: bool, tty: bool) -> str:
    """The kubelet API's attach URL, with the query the API server forwards to kubelets."""
    query: list[tuple[str, str]] = []
    if stdin:
        query.append(("input", "1"))
    query.append(("output", "1"))
    # With a terminal, stderr is the terminal's (kubectl's DisableStderr).
    query.append(("tty", "1") if tty else ("error", "1"))
    return f"/attach/{quote(namespace)}/{quote(pod)}/{quote(container)}?" + urllib.parse.urlencode(
        query
    )


def container_spec(pod: Obj, name: str) -> Obj:
    spec = pod.get("spec", {})
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if container.get("name") == name:
            return dict(container)
    return {}


def wants_tty(asked: bool, container: Obj, quiet: bool) -> bool:
    """kubectl attach's choice: the container's spec decides whether there is a terminal."""
    has = bool(container.get("tty"))
    if asked and not has:
        if not quiet:
            sys.stderr.write(
                f"error: Unable to use a TTY - container {container.get('name')} did not "
                "allocate one\n"
            )
        return False
    return has


async def _attach(ns: argparse.Namespace) -> tuple[Outcome, str | None]:
    """The outcome, and what to say after a session with a terminal (how to resume it)."""
    creds = credentials_from(ns)
    async with NodeClient(creds) as client:
        pod = await get_pod(client, ns.pod, ns.namespace)
        phase = pod.get("status", {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            raise CtlError(
                f"cannot attach a container in a completed pod; current phase is {phase}"
            )
        name = pod["metadata"]["name"]
        container = choose_container(pod, ns.container, ns.quiet)
        tty = wants_tty(ns.tty, container_spec(pod, container), ns.quiet)
        opts = session_options(ns.stdin, tty, ns.quiet)
        if not ns.quiet:
            sys.stderr.write("If you don't see a command prompt, try pressing enter.\n")
            sys.stderr.flush()
        path = attach_path(ns.namespace, name, container, stdin=opts.stdin, tty=opts.tty)
        result = await run_session(client, path, opts)
        resume = None
        if (
            not ns.quiet
            and opts.tty
            and pod.get("spec", {}).get("restartPolicy", "Always") == "Always"
        ):
            resume = (
                f"Session ended, resume using 'pykubelet attach {name} -c {container} -i -t' "
                "command when the pod is running"
            )
        return result, resume


def run(ns: argparse.Namespace) -> int:
    result, resume = asyncio.run(_attach(ns))
    if result.message is not None:
        prefix = "" if result.message.startswith("command terminated") else "error: "
        sys.stderr.write(f"{prefix}{result.message}\n")
    if resume is not None and result.code == 0:
        sys.stdout.write(resume + "\n")
    return result.code
