"""The versioned harness store: entries, atomic commits with trailers, rollback, refusals, concurrency."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness_store.entries import MAX_ENTRY_CHARS, ImmutableEntry, InvalidEntry, parse
from harness_store.gitenv import inert_env
from harness_store.store import Conflict, Edit, ForeignRepository, HarnessStore, NotFound


@pytest.fixture
def store(tmp_path: Path) -> HarnessStore:
    return HarnessStore(tmp_path / "harness", "user")


def create(store: HarnessStore, entry_id: str, kind: str = "memory", body: str = "text", **kw):
    return store.apply([Edit("create", entry_id, kind=kind, title=entry_id.title(), body=body, **kw)],
                       summary=f"add {entry_id}", trigger="test", source="agent")


def git(store: HarnessStore, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=store.root, capture_output=True, text=True, check=True).stdout


def test_create_update_delete_each_commit_with_trailers(store: HarnessStore):
    create(store, "use-uv", kind="prompt", body="Use uv to install packages.")
    create(store, "csv-tools", kind="skill", body="# CSV tools\nCall `csvtools.load`.",
           description="Load and clean CSV files", files={"csvtools/__init__.py": "def load(p):\n    return p\n"})
    create(store, "reviewer", kind="subagent", body="Review the diff.", description="Reviews a change",
           metadata={"model": "small", "budget": {"max_steps": 5}})
    store.apply([Edit("update", "use-uv", body="Always use uv.", base=store.version_of("use-uv"))],
                summary="tighten the uv note", trigger="refine", source="refine",
                refinement_id="r-1", session="s-9", evidence="turn t3 failed on pip")
    store.apply([Edit("delete", "reviewer")], summary="drop reviewer", trigger="user", source="user")

    note = store.get("use-uv")
    assert (note.body, note.source, note.kind) == ("Always use uv.\n", "refine", "prompt")
    skill_md = (store.root / "skill/csv-tools/SKILL.md").read_text()
    assert skill_md.startswith("---\nid: csv-tools\nkind: skill\ntitle: Csv-Tools\nname: csv-tools\ndescription: Load and clean CSV files\n")
    assert (store.root / "skill/csv-tools/csvtools/__init__.py").is_file()
    with pytest.raises(NotFound):
        store.get("reviewer")

    log = store.log()
    assert [c.summary for c in log] == ["drop reviewer", "tighten the uv note", "add reviewer", "add csv-tools",
                                        "add use-uv", "harness: create the user scope"]
    tighten = log[1]
    assert tighten.trailers == {"Refinement-Id": "r-1", "Trigger": "refine", "Session": "s-9",
                                "Evidence": "turn t3 failed on pip"}
    assert tighten.entries == ["use-uv"] and log[3].entries == ["csv-tools"]
    assert git(store, "status", "--porcelain") == ""


def test_a_change_of_several_entries_is_one_commit_or_nothing(store: HarnessStore):
    create(store, "a")
    head = store.head()
    edits = [Edit("update", "a", body="new"), Edit("create", "b", kind="memory", title="B", body="x" * (MAX_ENTRY_CHARS + 1))]
    with pytest.raises(InvalidEntry, match="limit is 32,768"):
        store.apply(edits, summary="two at once", trigger="test", source="agent")
    assert store.head() == head and store.get("a").body == "text\n"
    assert not (store.root / "memory/b.md").exists()
    change = store.apply([Edit("update", "a", body="new"), Edit("create", "b", kind="memory", title="B")],
                         summary="two at once", trigger="test", source="agent")
    assert change.entries == ["a", "b"] and len(store.log()) == 3


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (Edit("create", "base_prompt", kind="prompt", title="x"), ImmutableEntry, "base prompt"),
        (Edit("create", "../escape", kind="memory", title="x"), InvalidEntry, "invalid id"),
        (Edit("create", "s", kind="skill", title="x", description="d", files={"../../x.py": ""}), InvalidEntry, "escapes"),
        (Edit("create", "s", kind="skill", title="x", description="d", files={"/etc/passwd": ""}), InvalidEntry, "escapes"),
        (Edit("create", "s", kind="skill", title="x"), InvalidEntry, "needs a `description`"),
        (Edit("create", "big", kind="memory", title="x", body="y" * (MAX_ENTRY_CHARS + 1)), InvalidEntry, "limit"),
        (Edit("create", "t", kind="memory", title=""), InvalidEntry, "title"),
        (Edit("update", "missing", body="x"), NotFound, "no entry 'missing'"),
    ],
)
def test_refusals_write_nothing(store: HarnessStore, edit: Edit, error: type, message: str):
    with pytest.raises(error, match=message):  # the scope's first change: refused, it creates no scope
        store.apply([edit], summary="bad", trigger="test", source="agent")
    assert not store.root.exists()
    create(store, "other")
    head = store.head()
    with pytest.raises(error, match=message):
        store.apply([edit], summary="bad", trigger="test", source="agent")
    assert store.head() == head
    assert git(store, "status", "--porcelain") == ""


def test_invalid_front_matter_is_refused_with_the_reason():
    with pytest.raises(InvalidEntry, match="no YAML front matter"):
        parse("just text", "memory/a.md")
    with pytest.raises(InvalidEntry, match="not valid YAML"):
        parse("---\ntitle: [unclosed\n---\nbody", "memory/a.md")
    with pytest.raises(InvalidEntry, match="path says id='a'"):
        parse("---\nid: b\n---\nbody", "memory/a.md")
    with pytest.raises(InvalidEntry, match="source: Input should be"):
        parse("---\nsource: somebody\n---\nbody", "memory/a.md")
    with pytest.raises(InvalidEntry, match="base prompt"):
        parse("---\ntitle: x\n---\nbody", "prompt/base_prompt.md")
    ok = parse("---\ntitle: Hello\n---\nbody\n", "memory/a.md")
    assert (ok.id, ok.kind, ok.source, ok.body) == ("a", "memory", "user", "body\n")


def test_an_edit_planned_against_an_old_version_is_a_conflict(store: HarnessStore):
    create(store, "a")
    planned = store.version_of("a")
    store.apply([Edit("update", "a", body="someone else")], summary="other", trigger="test", source="agent")
    with pytest.raises(Conflict, match="changed since this edit was planned"):
        store.apply([Edit("update", "a", body="mine", base=planned)], summary="mine", trigger="test", source="agent")
    with pytest.raises(Conflict, match="already exists"):
        create(store, "a")
    assert store.get("a").body == "someone else\n"


def test_rollback_of_a_middle_change_restores_only_what_it_touched(store: HarnessStore):
    create(store, "a", body="a1")
    middle = store.apply([Edit("update", "a", body="a2"), Edit("create", "b", kind="prompt", title="B", body="b1")],
                         summary="middle", trigger="test", source="agent", refinement_id="r-middle")
    create(store, "c", body="c1")

    back = store.rollback("r-middle")
    assert back.trailers["Reverts"] == "r-middle" and back.trigger == "rollback" and back.entries == ["a", "b"]
    assert store.get("a").body == "a1\n"
    with pytest.raises(NotFound):
        store.get("b")
    assert store.get("c").body == "c1\n"  # a later, unrelated change stays

    again = store.rollback(back.refinement_id)  # rolling back the rollback re-applies the change
    assert store.get("a").body == "a2\n" and store.get("b").body == "b1\n"
    assert again.trailers["Reverts"] == back.refinement_id
    assert middle.commit in git(store, "log", "--format=%H")  # history is never rewritten


def test_rollback_refuses_when_a_later_change_touched_the_same_entry(store: HarnessStore):
    create(store, "a", body="a1")
    first = store.apply([Edit("update", "a", body="a2")], summary="one", trigger="test", source="agent")
    store.apply([Edit("update", "a", body="a3")], summary="two", trigger="test", source="agent")
    with pytest.raises(Conflict, match="changed again"):
        store.rollback(first.refinement_id)
    assert store.get("a").body == "a3\n"


def test_a_second_rollback_of_a_change_says_it_is_rolled_back_already(store: HarnessStore):
    """Issue 52: the second rollback said the entry "changed again after" the change, which nobody did."""
    create(store, "a", body="a1")
    change = store.apply([Edit("update", "a", body="a2")], summary="one", trigger="test", source="agent")
    store.rollback(change.refinement_id)
    with pytest.raises(InvalidEntry, match=f"{change.refinement_id} is rolled back already: its entries are as"):
        store.rollback(change.refinement_id)
    assert store.get("a").body == "a1\n"


def test_rollback_to_restores_a_whole_earlier_state(store: HarnessStore):
    base = create(store, "a", body="a1")
    create(store, "b", kind="skill", description="d", files={"pkg/__init__.py": "X = 1\n"})
    store.apply([Edit("update", "a", body="a2")], summary="edit a", trigger="test", source="agent")
    change = store.rollback_to(base.refinement_id)
    assert change.trailers["Restores"] == base.commit
    assert store.get("a").body == "a1\n"
    assert not (store.root / "skill/b").exists()
    assert sorted(change.entries) == ["a", "b"]
    with pytest.raises(InvalidEntry, match="already as it was"):
        store.rollback_to(base.commit)


def test_diff_shows_the_last_change_or_a_range(store: HarnessStore):
    first = create(store, "a", body="one")
    store.apply([Edit("update", "a", body="two")], summary="x", trigger="test", source="agent")
    assert "-one\n+two" in store.diff()
    assert "+one" in store.diff(first.commit[:10] + "~1", first.refinement_id)


HAMMER = """
import sys
from pathlib import Path
from harness_store.store import Conflict, Edit, HarnessStore
store = HarnessStore(Path(sys.argv[1]), "user")
me = sys.argv[2]
for i in range(100):
    store.apply([Edit("create", f"{me}-{i}", kind="memory", title=f"{me} {i}")], summary=f"{me} {i}", trigger="test", source="agent")
    while True:  # read-modify-write of one shared entry, planned optimistically
        base = store.version_of("counter")
        n = int(store.get("counter").body)
        try:
            store.apply([Edit("update", "counter", body=str(n + 1), base=base)], summary=f"{me} count", trigger="test", source="agent")
            break
        except Conflict:
            continue
"""


@pytest.mark.slow
def test_two_processes_hammering_one_store_lose_nothing(store: HarnessStore, tmp_path: Path):
    create(store, "counter", body="0")
    script = tmp_path / "hammer.py"
    script.write_text(HAMMER)
    procs = [subprocess.Popen([sys.executable, str(script), str(store.root), name]) for name in ("left", "right")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert store.get("counter").body == "200\n"
    assert len(store.entries()) == 201
    log = store.log()
    assert sum(c.summary.endswith(" count") for c in log) == 200
    assert sum(c.summary.startswith(("left ", "right ")) and not c.summary.endswith("count") for c in log) == 200
    fsck = subprocess.run(["git", "fsck", "--strict"], cwd=store.root, capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    assert git(store, "status", "--porcelain") == ""


def test_skill_updates_leave_untracked_files_and_caches_alone(store: HarnessStore):
    create(store, "tools", kind="skill", description="d", files={"mytools/__init__.py": "X = 1\n"})
    cache = store.root / "skill/tools/mytools/__pycache__/__init__.cpython-311.pyc"
    cache.parent.mkdir()
    cache.write_bytes(b"\x00compiled")
    store.apply([Edit("update", "tools", files={"mytools/__init__.py": "X = 2\n"})], summary="v2", trigger="t", source="agent")
    assert (store.root / "skill/tools/mytools/__init__.py").read_text() == "X = 2\n"
    assert cache.read_bytes() == b"\x00compiled"  # not ours to delete, and never committed
    store.apply([Edit("delete", "tools")], summary="gone", trigger="t", source="agent")
    assert git(store, "ls-files", "skill") == "" and git(store, "status", "--porcelain") == ""
    with pytest.raises(InvalidEntry, match="both a file and the folder"):
        create(store, "clash", kind="skill", description="d", files={"pkg": "x", "pkg/a.py": "y"})
    assert not (store.root / "skill/clash").exists()


def test_a_persons_files_are_committed_as_they_are(store: HarnessStore):
    create(store, "sk", kind="skill", description="d")
    logo = bytes(range(256))
    (store.root / "skill/sk/logo.png").write_bytes(logo)
    (store.root / "memory").mkdir(exist_ok=True)
    (store.root / "memory/My Note.md").write_text("---\ntitle: bad name\n---\nx\n")
    (store.root / "memory/ok.md").write_text("---\ntitle: Fine\ncreated: 2024-05-01 10:00:00\n---\nhand written\n")
    change, problems = store.commit_user_edits()
    assert (store.root / "skill/sk/logo.png").read_bytes() == logo
    committed = subprocess.run(["git", "show", "HEAD:skill/sk/logo.png"], cwd=store.root, capture_output=True).stdout
    assert committed == logo
    assert sorted(change.entries) == ["ok", "sk"] and any("invalid id" in p for p in problems)
    assert store.get("ok").created.tzinfo is not None  # a date without a zone is read as UTC
    from harness_store.view import HarnessView
    assert "hand written" in HarnessView([store]).render()


def test_an_agent_edit_does_not_swallow_a_persons_unsaved_edit(store: HarnessStore):
    create(store, "a", body="one")
    path = store.root / "memory/a.md"
    path.write_text(path.read_text().replace("one", "person's text"))
    store.apply([Edit("update", "a", body="agent's text")], summary="agent", trigger="t", source="agent")
    assert "person's text" in git(store, "log", "-p", "--format=%s")
    assert store.get("a").body == "agent's text\n"


def test_rollback_compares_bytes_so_crlf_files_roll_back(store: HarnessStore):
    change = create(store, "w", kind="skill", description="d", files={"run.bat": "echo hi\r\n"})
    back = store.rollback(change.refinement_id)
    assert back.entries == ["w"] and not (store.root / "skill/w").exists()


def test_links_and_fifos_a_kernel_left_in_a_scope_are_never_followed(tmp_path: Path):
    """What a cell can leave in a scope folder it could write (a project scope made before its
    cover, an unsandboxed kernel's): links to secrets, a FIFO, a skill folder linked outside."""
    store = HarnessStore(tmp_path / "harness", "project")
    create(store, "note", body="the committed text")
    create(store, "tool", kind="skill", body="# Tool", description="A tool")
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = (store.root / "memory" / "note.md").read_text().replace("the committed text", "SECRET-TOKEN")
    (outside / "note.md").write_text(planted)
    (outside / "SKILL.md").write_text(planted.replace("note", "stolen"))
    (store.root / "memory" / "note.md").unlink()
    (store.root / "memory" / "note.md").symlink_to(outside / "note.md")
    (store.root / "skill" / "stolen").symlink_to(outside)
    os.mkfifo(store.root / "memory" / "fifo.md")
    shown = [e.body for e in store.entries()]  # returns at once: the FIFO is not read
    assert not any("SECRET" in b for b in shown) and "the committed text" in shown[0] + shown[-1]
    with pytest.raises(InvalidEntry, match="link"):
        store.version_of("note")
    _, problems = store.commit_user_edits()
    assert any("note.md" in p for p in problems) and not any("SECRET" in e.body for e in store.entries())
    shutil.rmtree(store.root / "skill" / "tool")
    (store.root / "skill" / "tool").symlink_to(outside)
    with pytest.raises(InvalidEntry, match="is a link"):  # through the link: refused, nothing written outside
        store.apply([Edit("update", "tool", body="# Tool v2")], summary="v2", trigger="test", source="agent")
    assert sorted(p.name for p in outside.iterdir()) == ["SKILL.md", "note.md"]
    assert "stolen" in (outside / "SKILL.md").read_text()


def planted_repo(root: Path, marker: Path) -> None:
    """What a cell does to a scope it could reach: its own repository, a hook and an fsmonitor."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "config", "core.fsmonitor", f"sh -c 'env > {marker}'"], check=True)
    hook = root / ".git" / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\nenv > {marker}\n")
    hook.chmod(0o755)


@pytest.mark.parametrize("plant", ["hook and fsmonitor", "include", "link"])
def test_a_scope_whose_repository_the_host_did_not_make_is_refused_and_runs_nothing(tmp_path: Path, plant: str):
    root, marker = tmp_path / "harness", tmp_path / "ran"
    if plant == "hook and fsmonitor":
        planted_repo(root, marker)
    elif plant == "include":
        (tmp_path / "evil.cfg").write_text(f"[core]\n\tfsmonitor = sh -c 'env > {marker}'\n")
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "config", "include.path", str(tmp_path / "evil.cfg")], check=True)
    else:
        planted_repo(tmp_path / "elsewhere", marker)
        root.mkdir()
        (root / ".git").symlink_to(tmp_path / "elsewhere" / ".git")
    store = HarnessStore(root, "project")
    with pytest.raises(ForeignRepository, match="the project scope is refused: the harness repository .* move"):
        store.apply([Edit("create", "x", kind="memory", title="X", body="x")], summary="add", trigger="t", source="user")
    assert store.head() is None and store.log() == [] and store.problem() is not None
    with pytest.raises(ForeignRepository):
        store.commit_user_edits()
    assert not marker.exists()


def test_git_in_a_scope_ignores_the_hosts_global_config_and_git_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    marker, hooks = tmp_path / "ran", tmp_path / "hooks"
    hooks.mkdir()
    for name in ("pre-commit", "post-commit", "reference-transaction"):
        (hooks / name).write_text(f"#!/bin/sh\nenv > {marker}\n")
        (hooks / name).chmod(0o755)
    planted = tmp_path / "global.gitconfig"
    planted.write_text(f"[core]\n\thooksPath = {hooks}\n\tfsmonitor = sh -c 'env > {marker}'\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(planted))
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("SECRET_TOKEN", "sk-do-not-leak")
    store = HarnessStore(tmp_path / "harness", "user")
    store.apply([Edit("create", "x", kind="memory", title="X", body="x")], summary="add", trigger="t", source="user")
    assert [c.summary for c in store.log()] == ["add", "harness: create the user scope"]
    assert not marker.exists() and not (tmp_path / "elsewhere").exists()
    env = inert_env()
    assert "SECRET_TOKEN" not in env and env["GIT_CONFIG_GLOBAL"] == "/dev/null" and "GIT_DIR" not in env
