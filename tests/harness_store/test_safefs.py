"""harness_store/safefs.py: the host's no-follow file access, attacked with what a cell can leave behind
(links at each component, FIFOs, devices, oversize files) and checked for what it must still do."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from harness_store import safefs
from harness_store.safefs import UnsafePath


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(root: a workspace with a/b/f.txt, outside: a folder beside it holding secret.txt)."""
    root, outside = tmp_path / "ws", tmp_path / "outside"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("mine")
    outside.mkdir()
    (outside / "secret.txt").write_text("SECRET")
    (outside / "b").mkdir()
    (outside / "b" / "f.txt").write_text("SECRET")
    return root, outside


def test_reads_regular_files_by_absolute_or_relative_path(tree):
    root, _ = tree
    assert safefs.read_bytes(root, root / "a" / "b" / "f.txt", 100) == b"mine"
    assert safefs.read_text(root, Path("a/b/f.txt"), 100) == "mine"
    (root / "bad.txt").write_bytes(b"ok \xff\xfe")
    assert safefs.read_text(root, Path("bad.txt"), 100) == "ok \ufffd\ufffd"


@pytest.mark.parametrize("link", ["a", "a/b", "a/b/f.txt"])
def test_a_link_at_any_component_is_refused_not_followed(tree, link: str):
    root, outside = tree
    at = root / link
    target = {"a": outside, "a/b": outside / "b", "a/b/f.txt": outside / "secret.txt"}[link]
    os.rename(at, at.with_name(at.name + ".moved"))
    at.symlink_to(target)
    with pytest.raises(UnsafePath):
        safefs.read_bytes(root, root / "a" / "b" / "f.txt", 100)
    assert safefs.through_link(root, root / "a" / "b" / "f.txt") == (None if link == "a/b/f.txt" else link)


def test_a_fifo_or_a_device_is_refused_at_once(tree):
    root, _ = tree
    os.mkfifo(root / "fifo")
    got: list[BaseException] = []

    def read() -> None:
        try:
            safefs.read_bytes(root, root / "fifo", 100)
        except BaseException as e:
            got.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive() and isinstance(got[0], UnsafePath)  # no writer: it never blocks
    (root / "null").symlink_to("/dev/null")
    with pytest.raises(UnsafePath):
        safefs.read_bytes(root, root / "null", 100)
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.read_bytes(Path("/"), Path("/dev/zero"), 100)
    with pytest.raises(UnsafePath):
        safefs.read_bytes(root, root / "a", 100)  # a folder


def test_over_the_cap_absent_and_outside_the_root(tree):
    root, _ = tree
    (root / "big").write_bytes(b"x" * 101)
    with pytest.raises(UnsafePath, match="over the 100"):
        safefs.read_bytes(root, root / "big", 100)
    assert safefs.read_bytes(root, root / "big", 101) == b"x" * 101
    with pytest.raises(FileNotFoundError):
        safefs.read_bytes(root, root / "nothing", 100)
    with pytest.raises(FileNotFoundError):
        safefs.read_bytes(root, root / "no" / "folder", 100)
    for bad in (Path("../outside/secret.txt"), root, root.parent / "outside" / "secret.txt"):
        with pytest.raises(UnsafePath, match="not a path inside"):
            safefs.read_bytes(root, bad, 100)


def test_a_write_replaces_a_link_at_the_path_rather_than_following_it(tree):
    root, outside = tree
    (root / "a" / "b" / "f.txt").unlink()
    (root / "a" / "b" / "f.txt").symlink_to(outside / "secret.txt")
    safefs.write_bytes(root, root / "a" / "b" / "f.txt", b"new", 0o755)
    path = root / "a" / "b" / "f.txt"
    assert not path.is_symlink() and path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o755
    assert (outside / "secret.txt").read_text() == "SECRET"
    safefs.write_bytes(root, Path("new/deep/g.txt"), b"g")  # missing folders are made
    assert (root / "new" / "deep" / "g.txt").read_bytes() == b"g"
    assert not [p for p in root.rglob("*") if p.name.endswith(safefs.TMP_SUFFIX)]
    with pytest.raises(UnsafePath, match="a folder is there"):
        safefs.write_bytes(root, root / "a", b"x")


def test_a_write_through_a_linked_folder_is_refused_or_the_link_replaced(tree):
    root, outside = tree
    (root / "hooks").symlink_to(outside)
    with pytest.raises(UnsafePath):
        safefs.write_bytes(root, root / "hooks" / "pre-commit", b"#!/bin/sh\necho owned\n", 0o755)
    with pytest.raises(UnsafePath):
        safefs.symlink(root, root / "hooks" / "x", "/etc/passwd")
    assert sorted(p.name for p in outside.iterdir()) == ["b", "secret.txt"]
    safefs.write_bytes(root, root / "hooks" / "pre-commit", b"data", replace_links=True)
    assert (root / "hooks").is_dir() and not (root / "hooks").is_symlink()
    assert (root / "hooks" / "pre-commit").read_bytes() == b"data" and not (outside / "pre-commit").exists()


def test_a_symlink_is_written_as_a_link(tree):
    root, _ = tree
    safefs.symlink(root, root / "a" / "l", "b/f.txt")
    assert os.readlink(root / "a" / "l") == "b/f.txt"
    safefs.symlink(root, root / "a" / "l", "elsewhere")  # replaced, not followed
    assert os.readlink(root / "a" / "l") == "elsewhere" and (root / "a" / "b" / "f.txt").read_text() == "mine"


def test_unlink_and_rmdir_never_reach_through_a_link(tree):
    root, outside = tree
    (root / "x").symlink_to(outside)
    with pytest.raises(UnsafePath):
        safefs.unlink(root, root / "x" / "secret.txt")
    with pytest.raises(UnsafePath):
        safefs.rmdir(root, root / "x" / "b")
    assert (outside / "secret.txt").exists() and (outside / "b").is_dir()
    with pytest.raises(NotADirectoryError):
        safefs.rmdir(root, root / "x")  # the link itself is no folder
    safefs.unlink(root, root / "x")  # the link goes, its target stays
    assert not os.path.lexists(root / "x") and (outside / "secret.txt").exists()
    safefs.unlink(root, root / "x")  # absent is fine
    safefs.unlink(root, root / "no" / "such")
    with pytest.raises(OSError):
        safefs.rmdir(root, root / "a")  # not empty
    (root / "a" / "b" / "f.txt").unlink()
    safefs.rmdir(root, root / "a" / "b")
    assert not (root / "a" / "b").exists()


def test_copy_file_copies_a_regular_file_and_refuses_the_rest(tree, tmp_path: Path):
    root, outside = tree
    (root / "big").write_bytes(b"y" * 3_000_000)
    assert safefs.copy_file(root, root / "big", tmp_path / "copy", 3_000_000) == 3_000_000
    assert (tmp_path / "copy").read_bytes() == b"y" * 3_000_000 and (tmp_path / "copy").stat().st_mode & 0o777 == 0o600
    assert (root / "big").exists()  # a copy: the source stays
    with pytest.raises(UnsafePath):
        safefs.copy_file(root, root / "big", tmp_path / "small", 1000)
    assert not (tmp_path / "small").exists()
    (root / "linked").symlink_to(outside / "secret.txt")
    with pytest.raises(UnsafePath):
        safefs.copy_file(root, root / "linked", tmp_path / "stolen", 1000)
    (tmp_path / "planted").symlink_to(outside / "new")
    with pytest.raises(FileExistsError):  # a link at the target is never followed
        safefs.copy_file(root, root / "a" / "b" / "f.txt", tmp_path / "planted", 1000)
    assert not (outside / "new").exists()
