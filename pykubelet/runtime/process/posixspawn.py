"""A container's fork+exec through glibc's posix_spawn(3), called without the interpreter lock.

Why: CPython's own fork+exec (subprocess, os.posix_spawn) holds the GIL until the child has
exec'd, 0.3-0.4 ms a start here, during which no other thread of the agent runs Python and its
event loop stands still. ctypes releases the lock around a foreign call, so a start made in a
worker thread leaves the loop and the other threads running while the kernel clones and the
child execs. posix_spawn alone lets it go: its setup calls (glibc filling its own buffers) and
the PATH lookup's misses keep it (ctypes.PyDLL, as common/lockedio.py, which this file cannot
import: the launch server loads it by its path alone), since each call that lets it go costs
the thread a wait to have it back while the loop runs Python.

What it promises: `spawn_process` starts `program` (resolved as execvpe would, against the
container's PATH, relative entries from `cwd`) in a session of its own, in `cwd`, with stdin
and stdout+stderr from the fds given, every other fd closed, every signal at its default
disposition and none blocked (the agent ignores SIGPIPE and SIGXFSZ; a container starts as if
from init), and returns its pid once it has exec'd; an exec that fails is the call's OSError
(glibc reports the child's errno), with the program as the error's filename. A NUL byte in an
argument or a variable, or "=" in a variable's name, is a ValueError, as in subprocess.
`available()` says whether this glibc has what it takes (closefrom and chdir file actions,
2.34); if not, the caller forks as before.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
from functools import cache
from typing import Any, NamedTuple

# <spawn.h> flags.
POSIX_SPAWN_SETSIGDEF = 0x04
POSIX_SPAWN_SETSIGMASK = 0x08
POSIX_SPAWN_SETSID = 0x80
# Larger than glibc's posix_spawnattr_t (336 bytes on x86-64), posix_spawn_file_actions_t
# (80) and sigset_t (128) on any architecture it supports: opaque buffers it fills itself.
_ATTR_SIZE = 1024
_ACTIONS_SIZE = 512
_SIGSET_SIZE = 256


class _Libc(NamedTuple):
    setup: Any  # the setup functions, through ctypes.PyDLL: they keep the interpreter lock
    posix_spawn: Any  # through ctypes.CDLL: it lets the lock go until the child has exec'd


@cache
def _libc() -> _Libc | None:
    """glibc's spawn functions, or None where one is missing."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        spawn = ctypes.CDLL(None, use_errno=True).posix_spawn
        for name in (
            "posix_spawn",
            "posix_spawn_file_actions_init",
            "posix_spawn_file_actions_destroy",
            "posix_spawn_file_actions_adddup2",
            "posix_spawn_file_actions_addchdir_np",
            "posix_spawn_file_actions_addclosefrom_np",
            "posix_spawnattr_init",
            "posix_spawnattr_destroy",
            "posix_spawnattr_setflags",
            "posix_spawnattr_setsigmask",
            "posix_spawnattr_setsigdefault",
            "sigemptyset",
            "access",
        ):
            getattr(libc, name)
    except (OSError, AttributeError):
        return None
    spawn.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    libc.posix_spawnattr_setflags.argtypes = [ctypes.c_void_p, ctypes.c_short]
    libc.posix_spawn_file_actions_addchdir_np.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    libc.access.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _Libc(libc, spawn)


def available() -> bool:
    return _libc() is not None


def _strings(items: list[bytes]) -> ctypes.Array[ctypes.c_char_p]:
    """A NULL-terminated char* array (it keeps the bytes alive)."""
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def _encoded(argv: list[str], env: dict[str, str]) -> tuple[list[bytes], list[bytes]]:
    args = [os.fsencode(a) for a in argv]
    variables = []
    for name, value in env.items():
        key = os.fsencode(name)
        if b"=" in key:
            raise ValueError("illegal environment variable name")
        variables.append(key + b"=" + os.fsencode(value))
    if any(b"\0" in item for item in (*args, *variables)):
        raise ValueError("embedded null byte")
    return args, variables


def resolve(program: str, path: str, cwd: str) -> str:
    """The file execvpe would run for `program` with PATH `path`, relative entries (and an
    empty one) taken from `cwd`. Raises FileNotFoundError, or PermissionError when a candidate
    exists but cannot be run, naming `program`."""
    if "/" in program:
        return program
    denied = False
    for directory in path.split(os.pathsep):
        candidate = os.path.join(cwd, directory, program)
        if not _may_exist(candidate):
            continue
        try:
            mode = os.stat(candidate).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) and os.access(candidate, os.X_OK):
            return candidate
        denied = True
    if denied:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _may_exist(path: str) -> bool:
    """False when `path` is certainly missing (access(2) says ENOENT or ENOTDIR), through
    ctypes.PyDLL: the PATH entries that do not hold the program cost no wait for the lock."""
    libc = _libc()
    if libc is None or "\0" in path or libc.setup.access(os.fsencode(path), os.F_OK) == 0:
        return True  # (os.stat says what is wrong with a NUL byte)
    return ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR)


def spawn_process(
    program: str,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    stdin: int,
    output: int,
    keep_ignored: int = 0,
) -> int:
    """Start `program` with `argv` and exactly `env` in `cwd`, stdin from fd `stdin`, stdout
    and stderr to fd `output`; its pid. Blocks until it has exec'd: call it in a worker
    thread, where the call lets the GIL go. `keep_ignored`: the signals (bit n-1 for signal n,
    as /proc's SigIgn) left ignored if they are, rather than set to their defaults."""
    libc = _libc()
    if libc is None:
        raise OSError(errno.ENOSYS, "posix_spawn with closefrom and chdir is not available")
    args, variables = _encoded(argv, env)
    executable = resolve(program, env.get("PATH", os.defpath), cwd)
    # An fd of 0-2 (an agent started with its stdio closed opens files there) would be
    # overwritten by the dup2s before it is read: use copies above 2.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in (stdin, output) if fd < 3]
    try:
        if stdin < 3:
            stdin = moved[0]
        if output < 3:
            output = moved[-1]
        return _spawn(libc, program, executable, args, variables, cwd, stdin, output, keep_ignored)
    finally:
        for fd in moved:
            os.close(fd)


def _spawn(
    spawn_libc: _Libc,
    program: str,
    executable: str,
    args: list[bytes],
    variables: list[bytes],
    cwd: str,
    stdin: int,
    output: int,
    keep_ignored: int = 0,
) -> int:
    libc = spawn_libc.setup
    actions = ctypes.create_string_buffer(_ACTIONS_SIZE)
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    mask = ctypes.create_string_buffer(_SIGSET_SIZE)
    # Every bit set (but those kept): every signal back to its default. sigfillset would leave
    # out glibc's own two (32 and 33), which the child then starts with ignored, unlike after a
    # fork+exec. The first 64 signals are the first 8 bytes, little-endian (x86-64, arm64).
    first = ((1 << 64) - 1) & ~keep_ignored
    defaults = ctypes.create_string_buffer(
        first.to_bytes(8, "little") + b"\xff" * (_SIGSET_SIZE - 8), _SIGSET_SIZE
    )
    _check(libc.posix_spawn_file_actions_init(actions))
    try:
        _check(libc.posix_spawnattr_init(attr))
        try:
            _check(libc.posix_spawn_file_actions_adddup2(actions, stdin, 0))
            _check(libc.posix_spawn_file_actions_adddup2(actions, output, 1))
            _check(libc.posix_spawn_file_actions_adddup2(actions, output, 2))
            _check(libc.posix_spawn_file_actions_addclosefrom_np(actions, 3))
            _check(libc.posix_spawn_file_actions_addchdir_np(actions, os.fsencode(cwd)))
            libc.sigemptyset(mask)
            _check(libc.posix_spawnattr_setsigmask(attr, mask))
            _check(libc.posix_spawnattr_setsigdefault(attr, defaults))
            flags = POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF
            _check(libc.posix_spawnattr_setflags(attr, flags))
            pid = ctypes.c_int(0)
            err = spawn_libc.posix_spawn(
                ctypes.byref(pid),
                os.fsencode(executable),
                actions,
                attr,
                _strings(args),
                _strings(variables),
            )
            if err != 0:
                raise OSError(err, os.strerror(err), program)
            return pid.value
        finally:
            libc.posix_spawnattr_destroy(attr)
    finally:
        libc.posix_spawn_file_actions_destroy(actions)


def _check(err: int) -> None:
    """The setup calls return an errno (ENOMEM, EBADF), not -1."""
    if err != 0:
        raise OSError(err, os.strerror(err))
