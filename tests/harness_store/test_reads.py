"""Reading a harness scope never creates it: its folder and repository come with the first write.

Each read (entries, show, version, log, diff, a change looked up, a person's edits looked for) runs
on a scope nothing was written to, and the directory tree is compared before and after.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agent.config import home
from agent.harness import SessionHarness, scope_roots
from cli.main import main as prime_agent
from harness_store.store import Edit, HarnessStore, NotFound


def tree(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, name), root) for d, dirs, files in os.walk(root) for name in dirs + files}


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A person's project: a real git repository with history of its own, no harness yet."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "README.md").write_text("hello\n")
    for args in (["init", "-q"], ["add", "README.md"],
                 ["-c", "user.name=p", "-c", "user.email=p@x", "commit", "-q", "-m", "first"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


def reads(store: HarnessStore) -> None:
    """Every read a store offers, each as a caller makes it."""
    assert store.entries() == [] and store.version_of("x") is None and store.head() is None
    with pytest.raises(NotFound):
        store.get("x")
    assert store.log() == [] and store.log(5) == []
    assert store.diff() == ""
    for a, b in (("HEAD~1", None), ("HEAD~1", "HEAD"), ("r-1", None)):
        with pytest.raises(NotFound, match="no history yet"):
            store.diff(a, b)
    with pytest.raises(NotFound, match="no history yet"):
        store.resolve("HEAD")
    with pytest.raises(NotFound):
        store.rollback("HEAD")
    with pytest.raises(NotFound):
        store.rollback_to("HEAD")
    assert store.commit_user_edits() == (None, [])
    store.dry_run(Edit("create", "note", kind="memory", title="Note", body="text"))


@pytest.mark.parametrize("where", ["missing", "empty folder", "inside a project's repository"])
def test_no_read_of_a_store_creates_its_scope(tmp_path: Path, checkout: Path, where: str):
    root = {"missing": tmp_path / "nowhere" / "harness", "empty folder": tmp_path / "empty",
            "inside a project's repository": checkout / ".prime-agent" / "harness"}[where]
    if where == "empty folder":
        root.mkdir()
    before = tree(tmp_path)
    store = HarnessStore(root, "project")
    reads(store)
    assert tree(tmp_path) == before


def test_no_read_of_the_merged_view_creates_a_scope(tmp_path: Path, checkout: Path):
    harness = SessionHarness(scope_roots(tmp_path / "home", checkout, tmp_path / "session"))
    before = tree(tmp_path)
    assert harness.list() == [] and harness.view.version() == "" and harness.view.render() == ""
    with pytest.raises(NotFound):
        harness.show("x")
    assert tree(tmp_path) == before


def test_the_first_write_creates_the_scope(tmp_path: Path):
    store = HarnessStore(tmp_path / "harness", "user")
    reads(store)
    store.apply([Edit("create", "note", kind="memory", title="Note", body="text")], summary="add note",
                trigger="test", source="agent")
    assert store.exists() and store.head() and [c.summary for c in store.log()] == [
        "add note", "harness: create the user scope"]
    assert "+text" in store.diff()


def test_a_persons_own_file_in_an_uncreated_scope_is_committed(tmp_path: Path):
    """A person writing an entry by hand is a write: it creates the scope, as before."""
    store = HarnessStore(tmp_path / "harness", "project")
    (store.root / "memory").mkdir(parents=True)
    (store.root / "memory" / "mine.md").write_text("---\nid: mine\nkind: memory\ntitle: Mine\n---\nby hand\n")
    change, problems = store.commit_user_edits()
    assert change is not None and change.entries == ["mine"] and problems == [] and store.exists()


@pytest.mark.parametrize("argv", [
    ["list"], ["list", "--scope", "project"], ["list", "--scope", "user", "--json"],
    ["show", "x"], ["show", "x", "--scope", "project"],
    ["log"], ["log", "--scope", "project"],
    ["diff"], ["diff", "--scope", "project"], ["diff", "--scope", "project", "HEAD~1", "HEAD"],
])
def test_harness_reads_on_the_command_line_create_no_scope(tmp_path: Path, checkout: Path, prime_home: Path,
                                                            argv: list[str], capsys):
    before = tree(tmp_path)
    code = prime_agent(["harness", *argv, "--project", str(checkout)])
    out, err = capsys.readouterr()
    assert code in (0, 2), (out, err)
    assert "Traceback" not in err
    assert tree(tmp_path) == before
    assert not (home() / "harness").exists()
