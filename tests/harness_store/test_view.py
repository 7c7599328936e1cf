"""The merged prompt view and live edits by a person."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from harness_store.store import Edit, HarnessStore
from harness_store.view import HarnessView
from harness_store.watch import HarnessWatcher


@pytest.fixture
def scopes(tmp_path: Path):
    stores = [HarnessStore(tmp_path / name, name) for name in ("user", "project", "session")]
    return stores


def add(store: HarnessStore, entry_id: str, kind: str = "memory", body: str = "", **kw) -> None:
    store.apply([Edit("create", entry_id, kind=kind, title=kw.pop("title", entry_id), body=body, **kw)],
                summary=f"add {entry_id}", trigger="test", source="agent")


def test_narrower_scopes_shadow_wider_ones_and_say_so(scopes):
    user, project, session = scopes
    add(user, "style", kind="prompt", body="tabs")
    add(project, "style", kind="prompt", body="spaces")
    add(user, "only-user", body="u")
    view = HarnessView(scopes)
    style = view.get("style")
    assert (style.scope, style.shadows, style.entry.body) == ("project", ["user"], "spaces\n")
    add(session, "style", kind="prompt", body="two spaces")
    assert view.get("style").shadows == ["user", "project"]
    assert {v.entry.id: v.scope for v in view.entries()} == {"style": "session", "only-user": "user"}
    assert view.version().startswith("user@") and " session@" in view.version()


def test_prompt_view_is_stable_first_and_fits_its_budget(scopes):
    user = scopes[0]
    add(user, "m-old", body="first memory")
    add(user, "note", kind="prompt", body="Prefer small diffs.")
    add(user, "tool", kind="skill", body="long instructions " * 50, description="Does the thing")
    for i in range(40):
        add(user, f"fact-{i:02d}", body=f"fact {i} " + "x" * 300)
    view = HarnessView(scopes, budget={"memory": 3000})
    text = view.render()
    assert text.index("## Prompt notes") < text.index("## Skills") < text.index("## Memories")
    assert "### note [note] (by the agent)\nPrefer small diffs." in text  # written by the agent, and marked so
    assert "- tool [tool] (by the agent): Does the thing" in text and "long instructions long" not in text
    memories = text[text.index("## Memories"):]
    assert memories.index("m-old") < memories.index("fact-00")  # oldest first: new entries append
    assert "more; `harness.list(kind='memory')` lists them" in memories
    assert len(memories) < 3200
    assert view.render() is text  # unchanged harness: the same string, not rebuilt
    add(user, "late", kind="prompt", body="A new note.")
    assert "A new note." in view.render()


def test_a_persons_edit_is_committed_as_user_and_a_broken_one_is_reported(scopes):
    user = scopes[0]
    add(user, "style", kind="prompt", body="tabs")
    seen: list[tuple] = []
    arrived = threading.Event()

    def on_edit(store, change, problems):
        seen.append((store.scope, change, problems))
        arrived.set()

    watcher = HarnessWatcher([user], on_edit)
    watcher.start()
    try:
        path = user.root / "prompt/style.md"
        path.write_text(path.read_text().replace("tabs", "spaces, four of them"))
        assert arrived.wait(5)
        scope, change, problems = seen[-1]
        assert change is not None and change.trigger == "user-edit" and change.entries == ["style"] and not problems
        entry = user.get("style")
        assert (entry.source, entry.body) == ("user", "spaces, four of them\n")
        assert "spaces, four of them" in HarnessView([user]).render()

        arrived.clear()
        head = user.head()
        path.write_text("---\ntitle: [broken\n---\nnew text\n")
        assert arrived.wait(5)
        scope, change, problems = seen[-1]
        assert change is None and "not valid YAML" in problems[0]
        assert user.head() == head
        assert "spaces, four of them" in HarnessView([user]).render()  # the last good version stays in force
    finally:
        watcher.stop()
