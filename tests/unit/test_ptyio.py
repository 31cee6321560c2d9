"""ptyio.read_terminal on real pseudo-terminals: what was written before the last slave fd
closed is read, then the end; a terminal still open has nothing yet."""

from __future__ import annotations

import os

import pytest

from pykubelet.runtime.process.ptyio import read_terminal, set_terminal_size


def test_output_written_before_the_close_then_the_end() -> None:
    master, slave = os.openpty()
    try:
        os.write(slave, b"last line\n")
        os.close(slave)
        assert read_terminal(master, 4096) == b"last line\r\n"
        assert read_terminal(master, 4096) == b""
        assert read_terminal(master, 4096) == b""
    finally:
        os.close(master)


def test_an_open_terminal_with_nothing_yet_would_block() -> None:
    master, slave = os.openpty()
    os.set_blocking(master, False)
    try:
        with pytest.raises(BlockingIOError):
            read_terminal(master, 4096)
    finally:
        os.close(master)
        os.close(slave)


def test_a_descriptor_that_is_no_terminal_raises() -> None:
    r, w = os.pipe()
    os.close(r)
    with pytest.raises(OSError):
        read_terminal(w, 4096)  # the write end of a pipe: EBADF
    with pytest.raises(OSError):
        set_terminal_size(w, 80, 24)
    os.close(w)
