"""ProcessRuntime.exec_stream with real processes: stdio kept apart, stdin and its EOF, exit
codes, a terminal and its size, output that waits for its reader, close() and the container's
exit killing the command, and a container started through the launcher (its user, its mounts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import re
import time
import uuid
from pathlib import Path

import pytest

from pykubelet.runtime.base import (
    STDERR,
    STDOUT,
    ExecStream,
    Mount,
    RuntimeContainer,
    RuntimeFailure,
    TerminalSize,
)
from pykubelet.runtime.process import ptyio
from pykubelet.runtime.process.runtime import ProcessRuntime
from tests.unit.test_process_runtime import (
    TIMEOUT,
    gone,
    new_pod,
    sh,
    wait_exited,
    wait_until,
)

FOREVER = "exec sleep 600"


async def running(rt: ProcessRuntime, script: str = FOREVER, **changes: object) -> RuntimeContainer:
    pod, sandbox = await new_pod(rt)
    cfg = dataclasses.replace(sh(script), **changes)  # type: ignore[arg-type]
    return await rt.start_container(pod, sandbox, cfg)


async def collect(stream: ExecStream) -> dict[str, bytes]:
    out = {STDOUT: b"", STDERR: b""}
    async with asyncio.timeout(TIMEOUT):
        async for name, data in stream.output():
            out[name] += data
    return out


async def read_until(stream: ExecStream, pattern: bytes) -> bytes:
    """Output (any stream) until `pattern` appears in it."""
    seen = b""
    async with asyncio.timeout(TIMEOUT):
        async for _, data in stream.output():
            seen += data
            if re.search(pattern, seen):
                return seen
    pytest.fail(f"{pattern!r} never came; got {seen!r}")


async def finished(stream: ExecStream) -> int | None:
    async with asyncio.timeout(TIMEOUT):
        return await stream.wait()


async def test_stdout_and_stderr_kept_apart_and_the_exit_code(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c,
        ["/bin/sh", "-c", "echo out; echo err >&2; echo $GREETING; exit 3"],
        [("GREETING", "hi")],
        stdin=False,
        tty=False,
    )
    try:
        assert await collect(stream) == {STDOUT: b"out\nhi\n", STDERR: b"err\n"}
        assert await finished(stream) == 3
    finally:
        await stream.close()
    await stream.close()  # twice is fine


async def test_stdin_is_echoed_and_its_eof_ends_cat(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(c, ["cat"], [], stdin=True, tty=False)
    try:
        await stream.write_stdin(b"hello\n")
        assert await read_until(stream, b"hello\n") == b"hello\n"
        await stream.write_stdin(b"again")
        await stream.close_stdin()
        assert await collect(stream) == {STDOUT: b"again", STDERR: b""}
        assert await finished(stream) == 0
        await stream.write_stdin(b"after the end")  # dropped: nobody reads it any more
    finally:
        await stream.close()


async def test_without_stdin_the_command_reads_nothing(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(c, ["cat"], [], stdin=False, tty=False)
    try:
        assert await collect(stream) == {STDOUT: b"", STDERR: b""}
        assert await finished(stream) == 0
        with pytest.raises(RuntimeFailure, match="not attached"):
            await stream.write_stdin(b"x")
    finally:
        await stream.close()


async def test_killed_by_a_signal_has_no_exit_code(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c,
        ["/bin/sh", "-c", "kill -9 $$"],
        [],
        stdin=False,
        tty=False,
    )
    try:
        assert await finished(stream) is None
    finally:
        await stream.close()


async def test_a_terminal_has_the_clients_size_from_the_start(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c, ["/bin/sh", "-c", "stty size"], [], stdin=False, tty=True, size=TerminalSize(132, 43)
    )
    try:
        assert (await collect(stream))[STDOUT] == b"43 132\r\n"
        assert await finished(stream) == 0
    finally:
        await stream.close()


async def test_a_terminal_its_size_and_its_eof(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c,
        ["/bin/sh", "-c", "tty; echo err >&2; read line; stty size; cat; echo end"],
        [],
        stdin=True,
        tty=True,
    )
    try:
        first = await read_until(stream, rb"err\r\n")
        assert re.match(rb"/dev/pts/\d+\r\n", first), first
        await stream.resize(100, 40)
        await stream.write_stdin(b"go\n")
        assert b"40 100\r\n" in await read_until(stream, rb"40 100\r\n")
        await stream.close_stdin()  # ^D: cat ends
        rest = await collect(stream)
        assert rest[STDERR] == b"" and rest[STDOUT].endswith(b"end\r\n")
        assert await finished(stream) == 0
    finally:
        await stream.close()


class EioOnce:
    """The `os` module, as ptyio.py sees it, but for the kernel's race at a terminal's close:
    the first read fails with EIO although output is still there (the kernel looked for input
    just before the last slave fd closed behind it)."""

    def __init__(self) -> None:
        self.failed = False

    def read(self, fd: int, n: int) -> bytes:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.read(fd, n)

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


async def test_a_terminals_last_output_comes_after_an_eio(
    rt: ProcessRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c, ["/bin/sh", "-c", "echo last line; exit 4"], [], stdin=False, tty=True
    )
    try:
        assert await finished(stream) == 4  # exited: its terminal's slave is closed
        fake = EioOnce()
        monkeypatch.setattr(ptyio, "os", fake)
        assert (await collect(stream))[STDOUT] == b"last line\r\n"
        assert fake.failed
    finally:
        await stream.close()


async def test_a_terminal_is_the_controlling_terminal(rt: ProcessRuntime) -> None:
    c = await running(rt)
    # /dev/tty opens only in a process that has a controlling terminal.
    stream = await rt.exec_stream(
        c,
        ["/bin/sh", "-c", "echo ctty > /dev/tty"],
        [],
        stdin=False,
        tty=True,
    )
    try:
        out = await collect(stream)
        assert out[STDOUT] == b"ctty\r\n", out
        assert await finished(stream) == 0
    finally:
        await stream.close()


def wchan(pid: int) -> str:
    return Path(f"/proc/{pid}/wchan").read_text()


async def test_output_nobody_reads_blocks_the_command(rt: ProcessRuntime) -> None:
    c = await running(rt)
    size = 20_000_000
    stream = await rt.exec_stream(
        c, ["head", "-c", str(size), "/dev/zero"], [], stdin=False, tty=False
    )
    try:
        pid = stream.pid  # type: ignore[attr-defined]
        await asyncio.sleep(1.0)
        # Blocked writing into the full pipe: nothing read its output into memory meanwhile.
        assert not gone(pid) and wchan(pid).endswith("pipe_write")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await stream.wait()
        total = 0
        async with asyncio.timeout(TIMEOUT):
            async for name, data in stream.output():
                assert name == STDOUT and len(data) <= 65536
                total += len(data)
        assert total == size
        assert await finished(stream) == 0
    finally:
        await stream.close()


async def test_close_kills_a_running_command_and_its_group(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c,
        ["/bin/sh", "-c", "sleep 600 & echo $!; wait"],
        [],
        stdin=True,
        tty=False,
    )
    child = int((await read_until(stream, rb"\d+\n")).decode())
    pid = stream.pid  # type: ignore[attr-defined]
    started = time.monotonic()
    await stream.close()
    assert time.monotonic() - started < 5
    assert gone(pid)
    await wait_until(lambda: gone(child), "the command's child killed")  # SIGKILL takes a moment
    assert await finished(stream) is None
    await stream.close()


async def test_leftovers_of_its_group_die_with_it(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(
        c,
        ["/bin/sh", "-c", "sleep 600 & echo $!"],
        [],
        stdin=False,
        tty=False,
    )
    try:
        out = await collect(stream)  # ends: the sleep holding the pipe is killed at the exit
        assert await finished(stream) == 0
        await wait_until(lambda: gone(int(out[STDOUT])), "the leftover killed")
    finally:
        await stream.close()


async def test_the_command_dies_with_its_container(rt: ProcessRuntime) -> None:
    c = await running(rt)
    stream = await rt.exec_stream(c, ["sleep", "600"], [], stdin=False, tty=False)
    try:
        await rt.stop_container(c, 5)
        assert await finished(stream) is None
    finally:
        await stream.close()


async def test_a_container_not_running_or_a_command_that_cannot_start(
    rt: ProcessRuntime,
) -> None:
    c = await running(rt, "exit 0")
    await wait_exited(rt, c)
    with pytest.raises(RuntimeFailure, match="not running"):
        await rt.exec_stream(c, ["true"], [], stdin=False, tty=False)
    alive = await running(rt)
    with pytest.raises(RuntimeFailure, match="executable file not found"):
        await rt.exec_stream(
            alive,
            ["no-such-command-pykubelet"],
            [],
            stdin=True,
            tty=False,
        )
    with pytest.raises(RuntimeFailure, match="executable file not found"):
        await rt.exec_stream(
            alive,
            ["no-such-command-pykubelet"],
            [],
            stdin=True,
            tty=True,
        )


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_nothing_is_left_open(rt: ProcessRuntime) -> None:
    c = await running(rt)
    before = fd_count()
    for tty in (False, True):
        stream = await rt.exec_stream(c, ["cat"], [], stdin=True, tty=tty)
        await stream.write_stdin(b"x\n")
        await read_until(stream, b"x")
        await stream.close()
    assert fd_count() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="the launcher's users and mounts need root")
async def test_through_the_launcher_its_user_and_its_mounts(
    rt: ProcessRuntime, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "ready").write_text("yes\n")
    # Reachable by the user: the test's own directories are 0700 root.
    target = Path("/tmp") / f"pykubelet-exec-stream-{uuid.uuid4().hex}"
    c = await running(
        rt,
        mounts=[Mount(str(src), str(target), read_only=True)],
        run_as_user=65534,
        supplemental_groups=[4001],
    )
    try:
        script = f"cat {target}/ready; id -u; id -G; cat"
        stream = await rt.exec_stream(
            c,
            ["/bin/sh", "-c", script],
            [],
            stdin=True,
            tty=False,
        )
        try:
            await stream.write_stdin(b"through stdin\n")
            await stream.close_stdin()
            lines = (await collect(stream))[STDOUT].decode().splitlines()
            assert lines[:2] == ["yes", "65534"] and "4001" in lines[2].split()
            assert lines[3] == "through stdin"
            assert await finished(stream) == 0
        finally:
            await stream.close()

        # A terminal too: the user's own, and the mounts are still there.
        script = f'cat {target}/ready; stat -c %u "$(tty)"; id -u'
        stream = await rt.exec_stream(
            c,
            ["/bin/sh", "-c", script],
            [],
            stdin=False,
            tty=True,
        )
        try:
            out = await collect(stream)
            assert out[STDOUT].split(b"\r\n")[:3] == [b"yes", b"65534", b"65534"], out
            assert await finished(stream) == 0
        finally:
            await stream.close()

        with pytest.raises(RuntimeFailure, match="executable file not found"):
            await rt.exec_stream(
                c,
                ["no-such-command-pykubelet"],
                [],
                stdin=False,
                tty=False,
            )
    finally:
        await rt.stop_container(c, 5)
        target.rmdir()
