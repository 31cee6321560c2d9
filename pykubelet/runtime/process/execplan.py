"""How a command is run "in" a running process-runtime container (exec probes and hooks,
`kubectl exec`): read from the live process, so it holds for adopted containers too: its
working directory, its environment, and, where it has them, its mount namespace, user and
cgroups (entered through the launcher). A container whose context cannot be read is not
entered as the agent: that would run the command as root in the host's mounts.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from pykubelet.runtime.base import RuntimeContainer, RuntimeFailure
from pykubelet.runtime.process.records import ContainerRecord
from pykubelet.runtime.process.spawn import ExecPlan, container_env, exec_context


def check_running(rec: ContainerRecord | None, container: RuntimeContainer) -> ContainerRecord:
    """The record of a container that runs; RuntimeFailure if it does not. A finishing
    container has exited: its zombie has no mount namespace left to enter."""
    if rec is None or not rec.running or rec.finishing:
        raise RuntimeFailure(f"container {container.name} is not running")
    return rec


async def exec_plan(
    rec: ContainerRecord | None,
    container: RuntimeContainer,
    command: list[str],
    env: list[tuple[str, str]],
    *,
    pod_dir: Path,
    procs_files: Callable[[str, str], list[str]],
) -> tuple[ContainerRecord, ExecPlan]:
    """How to run `command` as in the running container; RuntimeFailure if it does not run or
    its context cannot be read. `procs_files(pod_uid, container_id)`: its cgroups' procs files
    (blocking: called in a thread)."""
    rec = check_running(rec, container)
    if not command:
        raise RuntimeFailure(f"no command to run in container {container.name}")
    try:
        cwd = os.readlink(f"/proc/{rec.pid}/cwd")
    except OSError:
        cwd = str(pod_dir)
    full_env = container_env(rec.pod_name, env)
    enter = await asyncio.to_thread(exec_context, rec.pid)
    check_running(rec, container)
    if enter is None:
        # Run without its context, the command would be the agent's: root, in the host's
        # mounts. Only a container started as the agent's own processes are may do without.
        if rec.launched is not False or rec.cgroup:
            raise RuntimeFailure(
                f"container {container.name} is not running: cannot read the mounts and "
                f"user of its process {rec.pid}"
            )
        enter = {}
    direct = not (enter or rec.cgroup)
    if "mount_ns_pid" in enter:
        # A mount namespace of its own means the launcher started it, whose start time is read
        # with the launch (only a container started without one has it read later).
        enter["mount_ns_start_time"] = rec.proc_start_time
    enter["cgroups"] = [] if direct else await asyncio.to_thread(procs_files, rec.pod_uid, rec.id)
    home_of_user = not any(name == "HOME" for name, _ in env)
    enter.update(cwd=cwd, argv=command, env=full_env, home_of_user=home_of_user)
    return rec, ExecPlan(command, cwd, full_env, enter, direct)
