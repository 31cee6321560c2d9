"""ProcessRuntime.attach with real processes: a container's stdin kept open across attaches and
closed by the first with stdinOnce, output from the attach on (not before), a terminal with its
size and its output in the log, detaching without stopping the container, and the end of the
output at the container's exit.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from pykubelet.runtime.base import STDOUT, RuntimeFailure
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.unit.test_exec_stream import collect, finished, read_until, running
from tests.unit.test_process_runtime import wait_exited, wait_log


async def test_stdin_is_kept_open_across_attaches(rt: ProcessRuntime) -> None:
    # A shell reading lines: each attach's input reaches the same process.
    c = await running(
        rt, 'echo before; while read -r line; do echo "got $line"; done; echo eof', stdin=True
    )
    await asyncio.sleep(0.3)
    first = await rt.attach(c, stdin=True, tty=False)
    await first.write_stdin(b"one\n")
    seen = await read_until(first, rb"got one\n")
    assert b"before" not in seen  # what it wrote before the attach is in the log, not here
    await first.close_stdin()  # the client's EOF: without stdinOnce the container's stays open
    await first.close()
    second = await rt.attach(c, stdin=True, tty=False)
    await second.write_stdin(b"two\n")
    await read_until(second, rb"got two\n")
    await second.close()
    assert (await rt.get_pod(c.pod_uid)) is not None
    assert b"got one\ngot two\n" in await rt.read_log(c)
    assert not (await rt.get_pod(c.pod_uid)).containers[0].finished_at  # type: ignore[union-attr]


async def test_stdin_once_closes_its_stdin_when_the_first_attach_ends(rt: ProcessRuntime) -> None:
    c = await running(rt, "cat; echo done; exec sleep 600", stdin=True, stdin_once=True)
    stream = await rt.attach(c, stdin=True, tty=False)
    await stream.write_stdin(b"hello\n")
    await read_until(stream, rb"hello\n")
    await stream.close()
    # cat read its EOF: the container goes on to what follows.
    await wait_log(rt, c, b"done")
    later = await rt.attach(c, stdin=True, tty=False)
    await later.write_stdin(b"dropped\n")  # nobody's stdin any more: dropped, no error
    await later.close()


async def test_the_output_ends_with_the_container(rt: ProcessRuntime) -> None:
    c = await running(rt, "read -r x; echo bye $x; exit 4", stdin=True)
    stream = await rt.attach(c, stdin=True, tty=False)
    await stream.write_stdin(b"now\n")
    out = await collect(stream)
    assert out[STDOUT] == b"bye now\n"
    assert await finished(stream) == 4
    await stream.close()


async def test_a_terminal_its_size_and_its_log(rt: ProcessRuntime) -> None:
    c = await running(
        rt,
        'stty -echo; echo ready; read -r x; stty size; echo "tty? $(tty)"; exec sleep 600',
        stdin=True,
        tty=True,
    )
    await wait_log(rt, c, b"ready")
    stream = await rt.attach(c, stdin=True, tty=True)
    await stream.resize(100, 30)
    await stream.write_stdin(b"go\n")
    seen = await read_until(stream, rb"tty\? /dev/pts/\d+")
    assert b"30 100" in seen
    await stream.close()
    # The terminal's output is the container's log too, and it runs on after the detach.
    log = await rt.read_log(c)
    assert b"ready" in log and b"30 100" in log
    pod = await rt.get_pod(c.pod_uid)
    assert pod is not None and pod.containers[0].finished_at is None


async def test_without_stdin_input_is_dropped(rt: ProcessRuntime) -> None:
    c = await running(rt, "exec sleep 600")
    stream = await rt.attach(c, stdin=True, tty=False)
    await stream.write_stdin(b"nobody reads this\n")
    await stream.close()


async def test_a_container_not_running_is_refused(rt: ProcessRuntime) -> None:
    c = await running(rt, "exit 0", stdin=True)
    await wait_exited(rt, c)
    with pytest.raises(RuntimeFailure, match="not running"):
        await rt.attach(c, stdin=True, tty=False)


async def test_nothing_is_left_open(rt: ProcessRuntime) -> None:
    # The launch server's socket is the runtime's for its whole life: opened by a first start.
    await wait_exited(rt, await running(rt, "exit 0", stdin=True, tty=True))
    before = set(os.listdir("/proc/self/fd"))
    c = await running(rt, "read -r x; exit 0", stdin=True, tty=True)
    stream = await rt.attach(c, stdin=True, tty=True)
    await stream.write_stdin(b"x\n")
    await collect(stream)
    await stream.close()
    await wait_exited(rt, c)
    await rt.remove_pod(c.pod_uid)
    await asyncio.sleep(0.1)
    assert set(os.listdir("/proc/self/fd")) - before == set()
