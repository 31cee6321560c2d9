"""The file calls that keep the interpreter lock: the same results and errors as `os`'s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pykubelet.common import lockedio


def test_a_file_written_closed_and_renamed(tmp_path: Path) -> None:
    tmp, target = str(tmp_path / ".new"), str(tmp_path / "state.json")
    fd = lockedio.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    lockedio.write_all(fd, b'{"a":1}\n' * 10_000, tmp)  # more than one write may take
    lockedio.close_fd(fd, tmp)
    lockedio.rename(tmp, target)
    assert Path(target).read_bytes() == b'{"a":1}\n' * 10_000
    assert os.stat(target).st_mode & 0o777 == 0o600 and not os.path.exists(tmp)


def test_errors_are_os_errors_of_their_kind_naming_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir" / "file")
    with pytest.raises(FileNotFoundError) as e:
        lockedio.open_fd(missing, os.O_WRONLY | os.O_CREAT, 0o600)
    assert e.value.filename == missing
    existing = tmp_path / "there"
    existing.write_text("")
    with pytest.raises(FileExistsError):
        lockedio.open_fd(str(existing), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with pytest.raises(FileNotFoundError):
        lockedio.rename(missing, str(tmp_path / "elsewhere"))
    with pytest.raises(OSError) as closed:
        lockedio.close_fd(987654, "fd 987654")
    assert closed.value.filename == "fd 987654"
