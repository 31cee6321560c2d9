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


def test_stat_says_what_os_stat_says(tmp_path: Path) -> None:
    regular, directory, link = tmp_path / "pod.yaml", tmp_path / "dir", tmp_path / "link.yaml"
    regular.write_bytes(b"x" * 12_345)
    directory.mkdir()
    link.symlink_to(regular)
    for path in (regular, directory, link, Path("/proc/self/status")):
        ours, theirs = lockedio.stat(str(path)), os.stat(path)
        assert (ours.st_mode, ours.st_dev, ours.st_ino, ours.st_size, ours.st_mtime_ns) == (
            theirs.st_mode,
            theirs.st_dev,
            theirs.st_ino,
            theirs.st_size,
            theirs.st_mtime_ns,
        ), path
    missing = str(tmp_path / "gone.yaml")
    with pytest.raises(FileNotFoundError) as e:
        lockedio.stat(missing)
    assert e.value.filename == missing


def test_read_file_reads_all_of_it_whatever_the_hint(tmp_path: Path) -> None:
    path = tmp_path / "pod.json"
    content = bytes(range(256)) * 100  # larger than a read of the default buffer
    path.write_bytes(content)
    for hint in (0, 10, len(content), len(content) * 2):
        assert lockedio.read_file(str(path), hint) == content
    path.write_bytes(b"")
    assert lockedio.read_file(str(path)) == b""
    fifo = tmp_path / "fifo.yaml"  # put where a manifest was: read as empty, not waited on
    os.mkfifo(fifo)
    assert lockedio.read_file(str(fifo)) == b""
    with pytest.raises(IsADirectoryError) as e:
        lockedio.read_file(str(tmp_path))
    assert e.value.filename == str(tmp_path)


def test_mkdir_makes_one_directory_with_its_mode(tmp_path: Path) -> None:
    path = str(tmp_path / "pod")
    lockedio.mkdir(path, 0o700)
    assert os.stat(path).st_mode & 0o777 == 0o700
    with pytest.raises(FileExistsError):
        lockedio.mkdir(path, 0o700)
    with pytest.raises(FileNotFoundError):
        lockedio.mkdir(str(tmp_path / "no" / "parent"), 0o700)


def test_stat_without_statx_in_the_c_library_says_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("kind: Pod\n")
    with_statx = lockedio.stat(str(path))
    monkeypatch.setattr(lockedio, "_statx", None)  # a glibc older than 2.28
    assert lockedio.stat(str(path)) == with_statx
    with pytest.raises(FileNotFoundError):
        lockedio.stat(str(tmp_path / "gone.yaml"))


def test_makedirs_as_os_makedirs_with_exist_ok(tmp_path: Path) -> None:
    leaf = tmp_path / "a" / "b" / "c"
    lockedio.makedirs(str(leaf), 0o700)
    assert leaf.is_dir() and leaf.stat().st_mode & 0o777 == 0o700
    # The parents as os.makedirs makes them: 0777 less the umask.
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o777 & ~umask
    lockedio.makedirs(str(leaf), 0o700)  # there already: fine
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        lockedio.makedirs(str(tmp_path / "file"), 0o700)
    with pytest.raises(NotADirectoryError):
        lockedio.makedirs(str(tmp_path / "file" / "below"), 0o700)


def test_modes_links_and_unlink_as_os_does_them(tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = lockedio.open_fd(str(path), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    lockedio.fchmod(fd, 0o640, str(path))
    lockedio.close_fd(fd, str(path))
    assert path.stat().st_mode & 0o777 == 0o640
    lockedio.chmod(str(path), 0o604)
    assert path.stat().st_mode & 0o777 == 0o604
    link = tmp_path / "link"
    lockedio.symlink("..data/f", str(link))
    assert os.readlink(link) == lockedio.readlink(str(link)) == "..data/f"
    with pytest.raises(FileExistsError):
        lockedio.symlink("x", str(link))
    with pytest.raises(OSError) as e:
        lockedio.readlink(str(path))  # not a link
    assert e.value.filename == str(path)
    lockedio.unlink(str(link))
    assert not os.path.lexists(link)
    with pytest.raises(FileNotFoundError):
        lockedio.unlink(str(link))


def test_lstat_is_symlink_exists_and_is_mount_as_os_path_says(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    paths = ["/", "/proc", "/proc/self", "/dev/shm", str(tmp_path), str(target)]
    paths += [str(tmp_path / n) for n in ("link", "dangling", "nowhere")]
    for path in paths:
        assert lockedio.is_symlink(path) == os.path.islink(path), path
        assert lockedio.exists(path) == os.path.exists(path), path
        assert lockedio.is_mount(path) == os.path.ismount(path), path
    ours, theirs = lockedio.lstat(str(tmp_path / "link")), os.lstat(tmp_path / "link")
    assert (ours.st_mode, ours.st_ino, ours.st_size) == (
        theirs.st_mode,
        theirs.st_ino,
        theirs.st_size,
    )
