"""Checkpoints and rewind: a real session, real kernel, real git repositories; the model is scripted."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.checkpoints import RewindError, WorkspaceStore
from agent.config_models import CheckpointConfig
from agent.events import Event, Rewound
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import CheckpointRecord, RewindRecord, read_records
from agent.types import Cell
from tests.conftest import make_config


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def user_repo(root: Path) -> Path:
    """A workspace that is the user's own git repository, with a branch, a stash and a reflog."""
    for d in (root / ".git",):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "u@example.com")
    git(root, "config", "user.name", "U")
    (root / "b.txt").write_text("bee\n")
    (root / ".gitignore").write_text("build/\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    git(root, "branch", "feature")
    (root / "b.txt").write_text("stashed\n")
    git(root, "stash", "-q")
    return root


def plumbing(repo: Path) -> dict[str, str]:
    """The user's repository as git's plumbing sees it (none of these commands writes)."""
    index = hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest()
    return {
        "head": git(repo, "rev-parse", "HEAD"), "symbolic": git(repo, "symbolic-ref", "HEAD"),
        "refs": git(repo, "for-each-ref"), "index": git(repo, "ls-files", "--stage", "--debug"),
        "index_file": index, "stash": git(repo, "stash", "list"), "reflog": git(repo, "reflog", "show", "--all"),
        "objects": git(repo, "count-objects", "-v"),
    }


async def value(s: Session, name: str) -> str:
    """A variable of the session's kernel, as printed there."""
    result = await s.kernel.execute(Cell(id="look", code=f"print({name})"))
    return result.stdout.strip() or result.render()


def session(project: Path, outputs: list, events: list[Event] | None = None, **sections) -> Session:
    return Session(make_config(**sections), ScriptedModel(outputs), cwd=project,
                   on_event=events.append if events is not None else None)


async def test_rewind_goes_back_and_forward_in_all_four_parts(project: Path):
    repo = user_repo(project)
    before = plumbing(repo)
    events: list[Event] = []
    script = [
        cells("write('a.py', 'print(1)\\n'); x = 1"), "one",
        cells("edit('a.py', 'print(1)', 'print(2)')"), cells("%%bash\nrm b.txt"), "two",
        cells("harness.create('memory', 'm1', 'The project uses tabs.', title='Tabs'); x = 42"), "three",
        cells("print(x)"), "after the rewind",
        "forward again",
    ]
    async with session(project, script, events) as s:
        for prompt in ("first", "second", "third"):
            assert (await s.prompt(prompt)).outcome == "completed"
        assert not (project / "b.txt").exists() and (project / "a.py").read_text() == "print(2)\n"
        assert "The project uses tabs." in s.harness.view.render()
        commits = len(s.harness.store("session").log())

        record = await s.rewind(2)
        assert isinstance(record, RewindRecord)
        assert (project / "a.py").read_text() == "print(1)\n"
        assert (project / "b.txt").read_text() == "bee\n"
        assert "The project uses tabs." not in s.harness.view.render()
        log = s.harness.store("session").log()
        assert len(log) == commits + 1 and log[0].trigger == "rollback"  # a new commit: history kept
        assert record.kernel["status"] == "restored" and "x" in record.kernel["restored"]
        assert await value(s, "x") == "1"
        assert {f.path: f.change for f in record.files} == {"a.py": "restored", "b.txt": "created"}

        record = await s.rewind(4)  # forward again: the state turn 3 left
        assert not (project / "b.txt").exists() and (project / "a.py").read_text() == "print(2)\n"
        assert "The project uses tabs." in s.harness.view.render()
        assert record.kernel["status"] == "restored" and await value(s, "x") == "42"

        await s.rewind(2)
        assert (await s.prompt("what is x?")).answer == "after the rewind"
        request = s.model.calls[-2]  # the first call of the turn after the rewind
        users = [m.content for m in request if m.role == "user"]
        assert len(users) == 2 and users[0] == "first"
        assert users[1].startswith("[The user rewound this session to before turn 2.") and "a.py" in users[1]
        assert users[1].count("[The user rewound") == 1 and users[1].endswith("what is x?")
        assert [m.content for m in request if m.role == "assistant"] == ["", "one"]  # turn 1's alone
        assert not any("tabs" in (m.content or "") for m in request)  # the memory came after
        assert s.model.calls[-1][-1].content == "1"  # x as it was before turn 2

        await s.rewind(3, after=True)  # turn 4 ran since: the end of turn 3 is still there
        assert not (project / "b.txt").exists() and await value(s, "x") == "42"
        await s.prompt("again")
        request = s.model.calls[-1]
        assert [m.content for m in request if m.role == "user"][:3] == ["first", "second", "third"]
        assert any("tabs" in (m.content or "") for m in request)  # told (in a harness notice) before turn 3 ended
    rewinds = [(e.turn, e.after) for e in events if isinstance(e, Rewound)]
    assert rewinds == [(2, False), (3, True), (2, False), (3, True)]
    records = read_records(s.layout.trajectory)
    assert sum(isinstance(r, RewindRecord) for r in records) == 4
    assert {r.at for r in records if isinstance(r, CheckpointRecord)} == {"start", "end", "rewind"}
    assert plumbing(repo) == before  # the user's repository: same HEAD, index, branches, stash, reflog, objects


async def test_a_file_the_person_edited_refuses_the_rewind_unless_forced(project: Path):
    (project / ".gitignore").write_text("build/\n")
    script = [cells("write('a.py', 'agent\\n')"), "one", cells("write('a.py', 'agent again\\n')"), "two"]
    async with session(project, script) as s:
        await s.prompt("first")
        await s.prompt("second")
        await s.checkpoints.settle()
        (project / "a.py").write_text("the person's own edit\n")  # their editor, after the agent's turn
        (project / "notes.md").write_text("mine\n")
        (project / "build").mkdir()
        (project / "build" / "out").write_text("ignored: never checkpointed, never touched")
        with pytest.raises(RewindError) as refused:
            await s.rewind(2)
        assert refused.value.code == "conflict" and refused.value.conflicts == ["a.py", "notes.md"]
        assert "a.py, notes.md" in refused.value.message
        assert (project / "a.py").read_text() == "the person's own edit\n"  # refused: nothing changed
        assert (await s.rewind(2, ["conversation", "kernel"], dry_run=True)).conflicts == []  # files untouched
        plan = await s.rewind(2, dry_run=True)
        assert plan.conflicts == ["a.py", "notes.md"] and (project / "notes.md").exists()
        record = await s.rewind(2, force=True)
        assert record.forced == ["a.py", "notes.md"] and (project / "a.py").read_text() == "agent\n"
        assert not (project / "notes.md").exists() and (project / "build" / "out").exists()
        # nothing is lost: the person's edits are in the tree the rewind kept
        store = s.checkpoints.store
        blob = store._git("rev-parse", f"{record.before_tree}:notes.md").decode().strip()
        assert store.blobs([blob])[blob] == b"mine\n"
        # the edit made by the agent's own turn (turn 2) is no conflict when going forward again
        assert (await s.rewind(3, dry_run=True)).conflicts == []


async def test_rewind_parts_alone_and_bad_turns(project: Path):
    script = [cells("write('a.py', '1'); y = 'one'"), "one", cells("write('a.py', '2'); y = 'two'"), "two"]
    async with session(project, script) as s:
        await s.prompt("first")
        await s.prompt("second")
        for bad in (0, 4, -1):
            with pytest.raises(RewindError, match="not one of this session's"):
                await s.rewind(bad)
        record = await s.rewind(2, ["code"])
        assert (project / "a.py").read_text() == "1" and record.messages is None
        assert len([m for m in s.messages if m.role == "user"]) == 2  # the conversation kept
        assert "namespace is as the last turn left it" in record.notice
        record = await s.rewind(1, ["kernel"])
        assert record.kernel["status"] == "fresh" and "y" in record.kernel["removed"]
        assert (project / "a.py").read_text() == "1"


def test_the_store_respects_gitignore_and_caps_and_says_what_it_skipped(tmp_path: Path):
    ws = tmp_path / "ws"
    (ws / "build").mkdir(parents=True)
    (ws / ".gitignore").write_text("build/\n*.log\n")
    (ws / "build" / "out.o").write_bytes(b"\0" * 1000)
    (ws / "run.log").write_text("noise")
    (ws / "big.txt").write_text("x" * 5000)
    (ws / "blob.bin").write_bytes(b"\0\1" * 1500)
    (ws / "small.bin").write_bytes(b"\0\1" * 10)
    (ws / "src.py").write_text("print(1)\n")
    (ws / "nested").mkdir()
    git(ws / "nested", "init", "-q")
    store = WorkspaceStore(ws, "s1", CheckpointConfig(max_file_bytes=4000, max_binary_bytes=1000))
    snap = store.snapshot()
    files = set(store._git("ls-tree", "-r", "--name-only", snap.tree).decode().split())
    assert files == {".gitignore", "small.bin", "src.py"}
    assert {s.path: s.reason for s in snap.skipped} == {
        "big.txt": "over checkpoints.max_file_bytes", "blob.bin": "binary, over checkpoints.max_binary_bytes",
        "nested/": "a git repository of its own"}
    capped = WorkspaceStore(ws, "s2", CheckpointConfig(max_checkpoint_bytes=30), root=tmp_path / "other")
    over = "over checkpoints.max_checkpoint_bytes with the files before it"
    first = capped.snapshot()
    assert {s.path for s in first.skipped if s.reason == over} == {"big.txt", "blob.bin", "small.bin"}
    second = capped.snapshot()  # what one checkpoint could not take, the next one does
    assert {s.path for s in second.skipped if s.reason == over} == {"big.txt", "blob.bin"}
    # a rewind leaves skipped and ignored files alone
    (ws / "src.py").write_text("changed\n")
    (ws / "new.py").write_text("new\n")
    now = store.snapshot()
    store.restore(now.tree, snap.tree, {s.path for s in snap.skipped})
    assert (ws / "src.py").read_text() == "print(1)\n" and not (ws / "new.py").exists()
    assert (ws / "big.txt").exists() and (ws / "build" / "out.o").exists() and (ws / "run.log").exists()


async def test_the_namespace_snapshot_keeps_what_pickles_and_lists_what_it_cannot(project: Path):
    setup = ("import json as j, threading\n"
             "def double(v):\n    return 2 * v\n"
             "class Point:\n    def __init__(self, x): self.x = x\n"
             "p = Point(3); keep = [1, 2]; lock = threading.Lock(); big = 'x' * 5000; gen = (i for i in range(3))")
    script = [cells(setup), "one", cells("keep.append(3); del p; later = 1"), "two"]
    async with session(project, script, checkpoints={"max_variable_bytes": 2000}) as s:
        await s.prompt("first")
        await s.prompt("second")
        record = await s.rewind(2, ["kernel"])
        k = record.kernel
        assert k["status"] == "restored"
        assert {"j", "threading", "double", "Point", "p", "keep"} <= set(k["restored"])
        assert set(k["not_restored"]) == {"lock", "big", "gen"} and "max_variable_bytes" in k["not_restored"]["big"]
        assert "not serialisable" in k["not_restored"]["lock"] and k["removed"] == ["later"]
        assert await value(s, "(keep, double(p.x), j.dumps(1), 'lock' in dir())") == "([1, 2], 6, '1', False)"
        assert "Not restored (not serialisable or too large): lock, big, gen" in record.notice


async def test_a_rewind_that_fails_midway_is_undone(project: Path):
    (project / ".gitignore").write_text("*.log\n")
    script = [cells("write('a.txt', 'old'); write('x', 'a file')"), "one",
              cells("import os; os.remove('x'); os.mkdir('x'); write('x/keep.py', '1'); write('x/junk.log', 'ignored');"
                    " write('a.txt', 'new')"), "two"]
    async with session(project, script) as s:
        await s.prompt("first")
        await s.prompt("second")
        with pytest.raises(RewindError) as failed:  # x must be a file again, but x/ holds an ignored file
            await s.rewind(2)
        assert failed.value.code == "failed" and "undone" in failed.value.message
        assert (project / "a.txt").read_text() == "new" and (project / "x" / "keep.py").read_text() == "1"
        assert not s.layout.rewind_intent.exists()
        assert not any(isinstance(r, RewindRecord) for r in read_records(s.layout.trajectory))
        (project / "x" / "junk.log").unlink()
        await s.rewind(2)  # now x/ goes, and the file x comes back; then forward: the folder again
        assert (project / "x").read_text() == "a file" and (project / "a.txt").read_text() == "old"
        await s.rewind(3)
        assert (project / "x" / "keep.py").read_text() == "1" and (project / "a.txt").read_text() == "new"


async def test_a_kernel_that_cannot_write_snapshots_says_so_once_and_the_rest_rewinds(project: Path):
    events: list[Event] = []
    s = session(project, [cells("write('a.txt', '1'); v = 1"), "one", cells("write('a.txt', '2')"), "two"], events)
    s.dir.mkdir(parents=True)
    (s.dir / "checkpoints").write_text("a file where the snapshots' folder would be")  # as a read-only mount
    async with s:
        await s.prompt("first")
        await s.prompt("second")
        await s.checkpoints.settle()
        said = [e for e in events if e.type == "error" and "could not be snapshotted" in e.message]
        assert len(said) == 1
        record = await s.rewind(2)
        assert (project / "a.txt").read_text() == "1"
        assert record.kernel == {"status": "not restored", "why": "the checkpoint has no namespace snapshot"}
        assert "namespace was not restored" in record.notice


HOOK = "#!/bin/sh\necho planted > planted.txt\n"


@pytest.mark.parametrize("hide", [False, True], ids=["link", "ignored-link"])
async def test_a_rewind_never_writes_through_a_linked_folder(project: Path, hide: bool):
    hooks = project / ".git" / "hooks"  # read-only to the kernel; the host may write anywhere
    hooks.mkdir()
    swap = ("import os, shutil; shutil.rmtree('sub'); os.symlink('.git/hooks', 'sub')"
            + ("; write('.gitignore', 'sub\\n')" if hide else ""))
    script = [cells(f"write('sub/pre-commit', {HOOK!r}); os_ = __import__('os'); os_.chmod('sub/pre-commit', 0o755)"),
              "one", cells(swap), "two"]
    async with session(project, script) as s:
        await s.prompt("first")
        await s.prompt("second")
        assert (project / "sub").is_symlink()
        plan = await s.rewind(2, ["code"], dry_run=True)
        if hide:  # the link stays, and the restore would go through it: the dry run says so
            assert plan.conflicts == ["sub/pre-commit (sub is a link: a forced rewind makes it a real folder)"]
            with pytest.raises(RewindError) as refused:
                await s.rewind(2, ["code"])
            assert refused.value.code == "conflict" and "sub is a link" in refused.value.message
            assert (project / "sub").is_symlink() and not list(hooks.iterdir())
        record = await s.rewind(2, ["code"], force=hide)
        assert not list(hooks.iterdir())  # nothing written through the link
        assert not (project / "sub").is_symlink() and (project / "sub" / "pre-commit").read_text() == HOOK
        assert {f.path for f in record.files} >= {"sub/pre-commit"}


PLANT = ("import glob, os\n"
         "for p in glob.glob(os.path.join(os.environ['PRIME_AGENT_SESSION_DIR'], 'checkpoints', 'kernel', '*.json')):\n"
         "    {}\n")


@pytest.mark.parametrize("plant", ["fifo", "link", "oversize"])
async def test_a_planted_snapshot_manifest_never_blocks_the_host(project: Path, tmp_path: Path, plant: str):
    outside = tmp_path / "outside.fifo"
    os.mkfifo(outside)
    code = {"fifo": "os.remove(p); os.mkfifo(p)", "link": f"os.remove(p); os.symlink({str(outside)!r}, p)",
            "oversize": "open(p, 'w').write(' ' * 17_000_000)"}[plant]
    script = [cells("v = 1"), "one", cells(PLANT.format(code)), "two"]
    async with session(project, script) as s:
        await s.prompt("first")
        deadline = time.monotonic() + 60  # the first turn's snapshot is written in the background: plant it once it is
        while not list(s.layout.kernel_snapshots.glob("*.json")):
            assert time.monotonic() < deadline, "the first turn's namespace snapshot was never written"
            await asyncio.sleep(0.05)
        await s.prompt("second")
        await s.checkpoints.settle()
        done = threading.Event()

        def unblock() -> None:  # a host that blocks on a FIFO until a writer comes: this one ends the test
            while not done.wait(10 if not done.is_set() else 0):
                for f in [outside, *s.layout.kernel_snapshots.glob("*.json")]:
                    with contextlib.suppress(OSError):
                        fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)
                        os.write(fd, b"{}")
                        os.close(fd)

        gaps: list[float] = []

        async def tick() -> None:  # the event loop answers meanwhile
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.05)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        threading.Thread(target=unblock, daemon=True).start()
        ticker = asyncio.ensure_future(tick())
        started = time.monotonic()
        try:
            record = await s.rewind(2, ["kernel"])
        finally:
            took = time.monotonic() - started
            done.set()
            ticker.cancel()
        assert took < 8 and max(gaps, default=0) < 2, (took, gaps)
        assert record.kernel["status"] == "not restored", record.kernel
        why = {"fifo": "not a regular file", "link": "a link", "oversize": "over the"}[plant]
        assert "manifest" in record.kernel["why"] and why in record.kernel["why"], record.kernel
        assert await value(s, "v") == "1"  # the namespace as the last turn left it


async def test_a_planted_filter_fsmonitor_or_global_config_runs_nothing_when_the_host_checkpoints_and_rewinds(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The cell plants a filter for every file in `.gitattributes`, with its driver and an fsmonitor in
    the repository's config; the person's global config has the same driver (as git-lfs's is there)
    and the host's environment `GIT_*` variables naming more. Checkpoints and a rewind run none of them."""
    marker = tmp_path / "ran"
    planted = tmp_path / "global.gitconfig"
    planted.write_text(f"[filter \"evil\"]\n\tclean = sh -c 'env > {marker} && cat'\n\tsmudge = sh -c 'env > {marker} && cat'\n"
                       f"[core]\n\tfsmonitor = sh -c 'env > {marker}'\n\thooksPath = {tmp_path}\n")
    (tmp_path / "person").mkdir()
    (tmp_path / "person" / ".gitconfig").write_text(planted.read_text())
    monkeypatch.setenv("HOME", str(tmp_path / "person"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(planted))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='sh -c \"env > {marker}\"'")
    (project / ".git").rmdir()
    script = [
        cells("%%bash\nprintf '* filter=evil diff=evil\\n' > .gitattributes\necho one > a.txt\n"
              "git init -q . && git config filter.evil.clean \"sh -c 'env > "
              f"{marker}; cat'\" && git config core.fsmonitor \"sh -c 'env > {marker}'\"; true"), "one",
        cells("write('a.txt', 'two\\n')"), "two",
    ]
    async with session(project, script) as s:
        for prompt in ("plant", "change"):
            assert (await s.prompt(prompt)).outcome == "completed"
        assert (project / ".gitattributes").is_file() and (project / "a.txt").read_text() == "two\n"
        await s.rewind(2)
        assert (project / "a.txt").read_text() == "one\n"
    assert not marker.exists()


async def test_a_git_a_cell_plants_in_the_workspaces_path_never_runs_on_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The person's PATH holds the project's activated `.venv/bin`; a cell plants a `git` there. The
    checkpoint at the turn's end runs the host's git, never the planted one (which would run unsandboxed)."""
    project = tmp_path / "fresh"
    project.mkdir()
    marker = tmp_path / "planted-git-ran"
    monkeypatch.setenv("PATH", f"{project / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    plant = ("import os; os.makedirs('.venv/bin', exist_ok=True)\n"
             f"write('.venv/bin/git', '#!/bin/sh\\necho ran >> {marker}\\nexec /usr/bin/git \"$@\"\\n')\n"
             "os.chmod('.venv/bin/git', 0o755)")
    async with session(project, [cells(plant), "planted", cells("write('a.py', 'x = 1\\n')"), "edited"]) as s:
        assert (await s.prompt("one")).outcome == "completed"
        assert (project / ".venv" / "bin" / "git").is_file()
        assert (await s.prompt("two")).outcome == "completed"
        await s.rewind(2)
        assert not (project / "a.py").exists()  # the checkpoints worked, with the host's own git
    assert not marker.exists()
