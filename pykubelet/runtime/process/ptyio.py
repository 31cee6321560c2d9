"""A pseudo-terminal's master side, as the agent holds it for an exec'd command or a container
with `tty`.

What it promises:

- `read_terminal` reads what the command wrote to its terminal, up to its end: b"" once every
  slave fd is closed and nothing is left, including output written just before that close.
- `set_terminal_size` sets the size the command sees (and sends its foreground group SIGWINCH).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import termios


def read_terminal(master: int, n: int) -> bytes:
    """Up to `n` bytes from a terminal's master; b"" at its end (every slave fd closed, all
    read). BlockingIOError if nothing is there yet (a non-blocking master); other OSErrors as
    os.read raises them.

    A read that finds no input before the last slave fd closes fails with EIO (the kernel
    looks for input, then for the close), so output written and closed in between is behind
    an EIO; once the slave is closed nothing new comes, and a second read finds what is left."""
    try:
        return os.read(master, n)
    except OSError as e:
        if e.errno != errno.EIO:
            raise
    try:
        return os.read(master, n)
    except OSError as e:
        if e.errno == errno.EIO:
            return b""
        raise  # BlockingIOError: the slave was opened again, and has not written yet


def set_terminal_size(fd: int, width: int, height: int) -> None:
    """The terminal's size (each clamped to 16 bits); OSError if `fd` is no terminal (any
    more). The kernel sends SIGWINCH to the terminal's foreground process group."""
    winsize = struct.pack("HHHH", _clamp(height), _clamp(width), 0, 0)  # rows, columns
    fcntl.ioctl(fd, termios.TIOCSWINSZ, winsize)


def _clamp(n: int) -> int:
    return max(0, min(int(n), 0xFFFF))
