"""The file helpers bound into the kernel (plain functions; the kernel tests check the binding)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kernel.runtime.files import edit, glob, grep, read, write


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_write_creates_parents_and_read_slices_lines():
    assert write("a/b/c.txt", "one\ntwo\nthree\n") == "wrote 14 characters to a/b/c.txt"
    assert read("a/b/c.txt") == "one\ntwo\nthree\n"
    assert read("a/b/c.txt", 2, 3) == "two\nthree\n"
    assert read("a/b/c.txt", start=3) == "three\n"
    assert read("a/b/c.txt", end=1) == "one\n"


def test_edit_replaces_one_exact_match():
    write("f.py", "x = 1\ny = 2\n")
    assert edit("f.py", "y = 2", "y = 3") == "edited f.py at line 2"
    assert read("f.py") == "x = 1\ny = 3\n"


def test_edit_refuses_missing_and_ambiguous_text():
    write("f.py", "a = 1\na = 1\nvalue = compute(x)\n")
    with pytest.raises(ValueError, match=r"occurs 2 times .*lines 1, 2"):
        edit("f.py", "a = 1", "a = 2")
    with pytest.raises(ValueError, match=r"not found .*closest line: 'value = compute\(x\)'"):
        edit("f.py", "value = compute(y)", "z")
    assert read("f.py") == "a = 1\na = 1\nvalue = compute(x)\n"  # nothing landed


def test_grep_skips_vcs_and_binary_files():
    write("src/m.py", "def hello():\n    return 'hi'\n")
    write("README.md", "say Hello\n")
    write(".git/config", "hello\n")
    Path("blob.bin").write_bytes(b"hello\xff\xfe\x00")
    assert grep("hello") == ["src/m.py:1: def hello():"]
    assert sorted(grep("hello", ignore_case=True)) == ["README.md:1: say Hello", "src/m.py:1: def hello():"]
    assert grep("hello", "src/m.py") == ["src/m.py:1: def hello():"]
    assert repr(grep("nothing-like-this")) == "(no matches)"


def test_glob_recurses_and_sorts():
    for name in ["b.py", "a/c.py", "a/d.txt", "node_modules/x.py"]:
        write(name, "")
    assert glob("**/*.py") == ["a/c.py", "b.py"]
    assert repr(glob("*.py")) == "b.py"


def test_edit_keeps_crlf_line_ends_and_undecodable_bytes():
    Path("w.txt").write_bytes(b"a = 1\r\nb = 2\r\n# caf\xe9\r\n")
    edit("w.txt", "b = 2\n", "b = 3\n")
    assert Path("w.txt").read_bytes() == b"a = 1\r\nb = 3\r\n# caf\xe9\r\n"


def test_glob_takes_absolute_patterns(in_tmp: Path):
    write("x/y.py", "")
    assert glob(str(in_tmp / "**/*.py")) == [str(in_tmp / "x/y.py")]
