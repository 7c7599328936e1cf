"""Harness versions: a private copy of a scope at any commit (the live scope untouched), the version a
reference names across scopes, and a commit that records an event without changing an entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness_store.entries import HarnessError, InvalidEntry
from harness_store.store import Edit, HarnessStore, NotFound
from harness_store.versions import check_out, resolve_version


def note(store: HarnessStore, entry_id: str, body: str, rid: str) -> str:
    action = "update" if store.version_of(entry_id) else "create"
    return store.apply([Edit(action, entry_id, kind="prompt" if action == "create" else None, title=entry_id, body=body)],
                       summary=f"{action} {entry_id}", trigger="test", source="user", refinement_id=rid).commit


@pytest.fixture
def stores(tmp_path: Path) -> dict:
    return {"user": HarnessStore(tmp_path / "user", "user"), "project": HarnessStore(tmp_path / "project", "project")}


def test_a_checkout_is_the_scope_at_that_commit_and_changing_it_leaves_the_live_scope(stores, tmp_path: Path):
    project = stores["project"]
    first = note(project, "style", "Use tabs.", "r-1")
    note(project, "style", "Use spaces.", "r-2")
    (project.root / "prompt" / "style.md").write_text("a person's edit, not committed yet")
    head, tree = project.head(), project.tree()

    copy = project.checkout("r-1", tmp_path / "copy")
    assert copy.head() == first and copy.get("style").body.strip() == "Use tabs."
    assert copy.tree() == project.tree(first) != tree
    note(copy, "style", "Use commas.", "r-3")  # the copy is a scope of its own
    assert (project.head(), project.tree()) == (head, tree)
    assert (project.root / "prompt" / "style.md").read_text() == "a person's edit, not committed yet"


def test_a_version_is_each_scopes_commit_named_or_found_in_the_one_scope_that_holds_it(stores, tmp_path: Path):
    user, project = stores["user"], stores["project"]
    u1 = note(user, "tone", "Be brief.", "r-u1")
    p1 = note(project, "style", "Use tabs.", "r-p1")
    p2 = note(project, "style", "Use spaces.", "r-p2")
    assert resolve_version("r-p1", stores) == {"project": p1}
    assert resolve_version(p1[:10], stores) == {"project": p1}
    assert resolve_version(f"user@{u1[:12]} project@{p2[:12]}", stores) == {"user": u1, "project": p2}  # a trajectory's
    with pytest.raises(HarnessError, match="more than one scope"):
        resolve_version("HEAD~1", stores)
    assert resolve_version("project@HEAD~1", stores) == {"project": p1}
    with pytest.raises(NotFound, match="no harness scope holds 'nope'"):
        resolve_version("nope", stores)
    with pytest.raises(HarnessError, match="no session scope here"):
        resolve_version("session@HEAD", stores)

    roots = check_out(stores, {"project": p1, "user": None}, tmp_path / "copies")
    assert HarnessStore(roots["project"], "project").get("style").body.strip() == "Use tabs."
    assert HarnessStore(roots["user"], "user").entries() == []  # None: the scope empty
    roots = check_out(stores, {"project": p1}, tmp_path / "copies-2")
    assert HarnessStore(roots["user"], "user").head() == u1  # a scope not named: at its HEAD


def test_a_record_is_in_the_history_changes_no_entry_and_cannot_be_rolled_back(stores):
    project = stores["project"]
    note(project, "style", "Use tabs.", "r-1")
    tree = project.tree()
    change = project.record("rejected: use spaces (the validation mean fell)",
                            {"Refinement-Id": "r-2", "Trigger": "refine-loop", "Round": "1 of 3", "Run": "/runs/a"})
    assert (change.entries, project.tree()) == ([], tree)
    logged = project.log(1)[0]
    assert (logged.refinement_id, logged.trigger, logged.summary) == ("r-2", "refine-loop", change.summary)
    assert logged.trailers["Round"] == "1 of 3" and logged.trailers["Run"] == "/runs/a"
    with pytest.raises(InvalidEntry, match="changed no entry"):
        project.rollback("r-2")
