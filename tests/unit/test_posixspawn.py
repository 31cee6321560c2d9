"""runtime/process/posixspawn.py: real processes started by glibc's posix_spawn through ctypes,
looked at in /proc while they run."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykubelet.runtime.process import posixspawn, spawn

pytestmark = pytest.mark.skipif(not posixspawn.available(), reason="glibc without closefrom_np")

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture
def stdio(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """(stdin fd: /dev/null, output fd, the output's file), closed afterwards."""
    log = tmp_path / "out.log"
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    yield null, out, log
    os.close(null)
    os.close(out)


def _run(pid: int) -> int:
    """Its exit status, once it exited."""
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _status(pid: int, field: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return line.split()[1]
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_the_command_gets_exactly_its_environment_its_directory_and_output(
    stdio: tuple[int, int, Path], tmp_path: Path
) -> None:
    null, out, log = stdio
    env = {"PATH": BASE_PATH, "GREETING": "hello world", "EMPTY": ""}
    pid = posixspawn.spawn_process(
        "sh", ["sh", "-c", 'env | sort; pwd; echo "$0" >&2; cat'], env, str(tmp_path), null, out
    )
    assert _run(pid) == 0
    lines = log.read_text().splitlines()
    # env lists the variables (sh adds PWD and SHLVL of its own), then pwd, then sh's $0.
    assert {"EMPTY=", "GREETING=hello world", f"PATH={BASE_PATH}"} <= set(lines)
    assert not any(line.startswith(("HOME=", "PYTEST_")) for line in lines)
    assert lines[-2:] == [str(tmp_path), "sh"]  # cat read /dev/null: nothing more


def test_it_runs_in_a_session_of_its_own_with_three_fds_and_default_signals(
    stdio: tuple[int, int, Path], tmp_path: Path
) -> None:
    null, out, _ = stdio
    leaked_r, leaked_w = os.pipe()  # inheritable fds of the agent's: closed in the child
    os.set_inheritable(leaked_r, True)
    os.set_inheritable(leaked_w, True)
    started: list[int] = []

    def spawn_with_signals_blocked() -> None:
        # The agent ignores SIGPIPE (Python does) and a thread may block signals: none of it
        # reaches the container.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
        started.append(
            posixspawn.spawn_process(
                "sleep", ["sleep", "30"], {"PATH": BASE_PATH}, str(tmp_path), null, out
            )
        )

    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    thread = threading.Thread(target=spawn_with_signals_blocked)
    thread.start()
    thread.join()
    [pid] = started
    try:
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid
        # sleep opens its locale files for an instant after the exec: what stays is the three.
        deadline = time.monotonic() + 5
        while (fds := sorted(os.listdir(f"/proc/{pid}/fd"))) != ["0", "1", "2"]:
            assert time.monotonic() < deadline, fds
            time.sleep(0.01)
        assert os.readlink(f"/proc/{pid}/fd/0") == os.devnull
        assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2")
        assert int(_status(pid, "SigIgn"), 16) == 0
        assert int(_status(pid, "SigBlk"), 16) == 0
    finally:
        os.close(leaked_r)
        os.close(leaked_w)
        os.kill(pid, signal.SIGKILL)
        assert _run(pid) == -signal.SIGKILL


def test_the_program_is_looked_up_in_the_containers_path_from_its_directory(
    stdio: tuple[int, int, Path], tmp_path: Path
) -> None:
    null, out, log = stdio
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "pykubelet-test-tool"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o755)
    # Not in the agent's own PATH; "bin" is relative: to the container's working directory.
    pid = posixspawn.spawn_process(
        tool.name, [tool.name], {"PATH": f"/nonexistent:bin:{BASE_PATH}"}, str(tmp_path), null, out
    )
    assert _run(pid) == 0
    assert log.read_text() == "tool ran\n"
    assert posixspawn.resolve("sh", "", "/bin") == "/bin/sh"  # an empty PATH: the directory
    assert posixspawn.resolve("./x", BASE_PATH, "/") == "./x"  # with a slash: as it is
    # Passed over as execvpe does: a directory of the program's name, an entry that is a file.
    (tmp_path / "dirs" / tool.name).mkdir(parents=True)
    (tmp_path / "file").write_text("")
    assert posixspawn.resolve(tool.name, "dirs:file:bin", str(tmp_path)) == str(tool)
    with pytest.raises(PermissionError):  # only the directory: found, but not a program
        posixspawn.resolve(tool.name, "dirs:file", str(tmp_path))


def test_failures_are_the_calls_errors_naming_the_program(
    stdio: tuple[int, int, Path], tmp_path: Path
) -> None:
    null, out, _ = stdio
    cwd = str(tmp_path)
    with pytest.raises(FileNotFoundError) as missing:
        posixspawn.spawn_process("no-such-tool", ["x"], {"PATH": BASE_PATH}, cwd, null, out)
    assert missing.value.filename == "no-such-tool"

    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    with pytest.raises(PermissionError) as denied:  # found, but not executable
        posixspawn.spawn_process("plain", ["plain"], {"PATH": cwd}, cwd, null, out)
    assert denied.value.filename == "plain"
    with pytest.raises(PermissionError):
        posixspawn.spawn_process(str(plain), [str(plain)], {}, cwd, null, out)

    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF not really")
    garbage.chmod(0o755)
    with pytest.raises(OSError) as format_error:
        posixspawn.spawn_process(str(garbage), [str(garbage)], {}, cwd, null, out)
    assert format_error.value.errno == errno.ENOEXEC

    with pytest.raises(FileNotFoundError):  # the working directory is gone
        posixspawn.spawn_process("/bin/true", ["true"], {}, str(tmp_path / "gone"), null, out)

    with pytest.raises(ValueError, match="embedded null byte"):
        posixspawn.spawn_process("/bin/echo", ["echo", "a\0b"], {}, cwd, null, out)
    with pytest.raises(ValueError, match="embedded null byte"):
        posixspawn.spawn_process("/bin/true", ["true"], {"A": "x\0y"}, cwd, null, out)
    with pytest.raises(ValueError, match="illegal environment variable name"):
        posixspawn.spawn_process("/bin/true", ["true"], {"A=B": "x"}, cwd, null, out)


def test_an_output_on_fd_0_reaches_the_command(
    stdio: tuple[int, int, Path], tmp_path: Path
) -> None:
    """An agent started with its stdio closed opens its files at 0-2: the command still gets
    them, not /dev/null over them."""
    null, out, log = stdio
    saved = os.dup(0)
    try:
        os.dup2(out, 0)  # the log file, now fd 0 as well
        pid = posixspawn.spawn_process(
            "sh", ["sh", "-c", "echo to the log; cat"], {"PATH": BASE_PATH}, str(tmp_path), null, 0
        )
        assert _run(pid) == 0
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert log.read_text() == "to the log\n"


def test_the_signals_asked_for_stay_ignored_if_they_are(
    stdio: tuple[int, int, Path], tmp_path: Path
) -> None:
    """keep_ignored (a launch server's: what the agent was started with ignored, nohup's
    SIGHUP) leaves those ignored; every other signal is at its default, SIGPIPE too."""
    null, out, _ = stdio
    hup = 1 << (signal.SIGHUP - 1)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        pids = [
            posixspawn.spawn_process(
                "sleep", ["sleep", "30"], {"PATH": BASE_PATH}, str(tmp_path), null, out, keep
            )
            for keep in (hup, 0)
        ]
    finally:
        signal.signal(signal.SIGHUP, before)
    try:
        # SIGPIPE, which this process ignores too, is at its default in both.
        assert [int(_status(pid, "SigIgn"), 16) for pid in pids] == [hup, 0]
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            assert _run(pid) == -signal.SIGKILL


def test_every_container_gets_the_same_dev_null_as_stdin() -> None:
    fd = spawn.null_stdin()
    assert spawn.null_stdin() == fd  # opened once, never closed
    assert os.readlink(f"/proc/self/fd/{fd}") == os.devnull
    assert os.get_inheritable(fd) is False  # close-on-exec: only the spawn's dup2 passes it on
