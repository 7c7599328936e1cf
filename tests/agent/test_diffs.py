"""What a cell and a turn changed in the workspace: a real checkpoint store, a real session and kernel;
the model is scripted."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from agent.checkpoints import WorkspaceStore
from agent.checkpoints.store import RACY_NS
from agent.checkpoints.diffs import DIFF_BYTES, DIFF_LINES, MAX_FILES, WHOLE_BYTES, files_changed
from agent.config_models import CheckpointConfig
from agent.events import CellFinished, CellStarted, Event, TurnFinished
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from tests.conftest import make_config


def test_each_kind_of_change_is_a_bounded_diff(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (ws / "gone.txt").write_text("one\ntwo\n")
    (ws / "big.txt").write_text("x\n" * (DIFF_BYTES // 2 + 1))
    (ws / "run.sh").write_text("echo hi\n")
    store = WorkspaceStore(ws, "s1", CheckpointConfig(), root=tmp_path / "store")
    before = store.snapshot().tree
    (ws / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "gone.txt").unlink()
    (ws / "new.txt").write_text("a\nb\nc\n")
    (ws / "logo.png").write_bytes(b"\x89PNG\0\0" + bytes(range(256)))
    (ws / "big.txt").write_text("y\n" * (DIFF_BYTES // 2 + 1))
    (ws / "long.txt").write_text("".join(f"{i}\n" for i in range(DIFF_LINES * 2)))
    os.chmod(ws / "run.sh", 0o755)
    after = store.snapshot().tree

    files = files_changed(store, before, after)
    assert files is not None and files.more == 0
    by = {f.path: f for f in files.files}
    assert sorted(by) == ["big.txt", "calc.py", "gone.txt", "logo.png", "long.txt", "new.txt", "run.sh"]
    calc = by["calc.py"]
    assert (calc.change, calc.added, calc.removed, calc.headline()) == ("modified", 1, 1, "calc.py +1 -1")
    assert calc.lines() == [("hunk", "@@ -1,2 +1,2 @@"), ("context", " def add(a, b):"),
                            ("removed", "-    return a - b"), ("added", "+    return a + b")]
    assert calc.whole and calc.old_text.endswith("a - b\n") and calc.new_text.endswith("a + b\n")
    assert (by["new.txt"].change, by["new.txt"].added, by["new.txt"].old_text) == ("created", 3, "")
    assert (by["gone.txt"].change, by["gone.txt"].removed, by["gone.txt"].new_text) == ("deleted", 2, "")
    png = by["logo.png"]
    assert (png.change, png.added, png.diff, png.whole) == ("created", None, "", False)
    assert png.note == "binary: 0 -> 262 bytes" and png.headline() == "logo.png (created) (binary: 0 -> 262 bytes)"
    big = by["big.txt"]
    assert (big.diff, big.added, big.whole) == ("", None, False) and big.note.startswith("large: ")
    long = by["long.txt"]  # diffed and counted whole, kept to DIFF_LINES lines, the rest counted
    assert long.added == DIFF_LINES * 2 and len(long.diff.splitlines()) == DIFF_LINES
    assert long.cut == DIFF_LINES * 2 + 1 - DIFF_LINES and long.lines()[-1][0] == "cut"
    assert long.whole == (len((ws / "long.txt").read_bytes()) <= WHOLE_BYTES)
    assert by["run.sh"].note == "mode 100644 -> 100755"
    assert files.summary() == f"7 files changed, +{1 + 3 + DIFF_LINES * 2} -{1 + 2}, lines of 2 not counted"
    assert files_changed(store, after, after) is None


def test_past_the_cap_files_are_counted_not_listed(tmp_path: Path):
    ws = tmp_path / "ws"
    ws.mkdir()
    store = WorkspaceStore(ws, "s1", CheckpointConfig(), root=tmp_path / "store")
    before = store.snapshot().tree
    for i in range(MAX_FILES + 7):
        (ws / f"f{i:03}.txt").write_text(f"{i}\n")
    files = files_changed(store, before, store.snapshot().tree)
    assert files is not None and len(files.files) == MAX_FILES and files.more == 7
    assert files.summary() == f"{MAX_FILES + 7} files changed, +{MAX_FILES} -0, lines of 7 not counted"


def test_a_workspace_is_unchanged_only_while_nothing_git_reads_has_changed(tmp_path: Path):
    """`unchanged` spares a cell that wrote nothing a git process; whatever a cell could do to a file
    git reads makes it say no, a write it hid by setting the old mtime back included."""

    def hide_a_write(ws: Path) -> None:  # the same size, and the old mtime set back
        old = os.stat(ws / "src" / "a.py")
        (ws / "src" / "a.py").write_text("x = 2\n")
        os.utime(ws / "src" / "a.py", ns=(old.st_atime_ns, old.st_mtime_ns))

    changes = {"hidden": hide_a_write, "new": lambda ws: (ws / "src" / "deep").mkdir(),
               "mode": lambda ws: os.chmod(ws / "src" / "a.py", 0o755), "gone": lambda ws: (ws / "src" / "a.py").unlink(),
               "link": lambda ws: (ws / "src" / "a.py").unlink() or (ws / "src" / "a.py").symlink_to("/etc/passwd"),
               "ignored": lambda ws: (ws / "build" / "out.o").write_bytes(b"\0")}
    stores = {}
    for name in changes:
        ws = tmp_path / name
        (ws / "src").mkdir(parents=True)
        (ws / "build").mkdir()
        (ws / ".gitignore").write_text("build/\n")
        (ws / "src" / "a.py").write_text("x = 1\n")
        stores[name] = WorkspaceStore(ws, "s1", CheckpointConfig(), root=tmp_path / "store")
        tree = stores[name].snapshot().tree
        assert not stores[name].unchanged(tree)  # written within a clock tick of the stamp: it cannot tell
    time.sleep(RACY_NS / 1e9 + 0.05)
    for name, change in changes.items():
        store = stores[name]
        tree = store.snapshot().tree
        assert store.unchanged(tree)
        change(store.workspace)
        assert store.unchanged(tree) == (name == "ignored"), name  # what git ignores is not looked at
        after = store.snapshot().tree
        assert (after == tree) == (name in ("ignored", "new")), name  # git keeps no empty folder
        if name == "hidden":
            files = files_changed(store, tree, after)
            assert files is not None and [f.headline() for f in files.files] == ["src/a.py +1 -1"]


async def test_each_cell_carries_the_files_it_changed_and_the_turn_their_sum(project: Path):
    (project / "notes.txt").write_text("one\n")
    events: list[Event] = []
    script = [cells("write('a.py', 'print(1)\\n')"), cells("edit('a.py', 'print(1)', 'print(2)')"),
              cells("print('nothing written')"), cells("%%bash\nrm notes.txt"), "done"]
    async with Session(make_config(), ScriptedModel(script), cwd=project, on_event=events.append) as s:
        await s.prompt("work")
    finished = [e for e in events if isinstance(e, CellFinished)]
    assert [[f.headline() for f in e.files.files] if e.files else None for e in finished] == [
        ["a.py (created) +1 -0"], ["a.py +1 -1"], None, ["notes.txt (deleted) +0 -1"]]
    assert finished[1].files.files[0].diff == "@@ -1 +1 @@\n-print(1)\n+print(2)"
    (turn,) = [e for e in events if isinstance(e, TurnFinished)]
    assert turn.files is not None and turn.files.summary() == "2 files changed, +1 -1"
    assert [(f.path, f.change, f.diff) for f in turn.files.files] == [("a.py", "created", ""),
                                                                      ("notes.txt", "deleted", "")]


async def test_with_diffs_off_no_cell_snapshot_is_taken(project: Path):
    events: list[Event] = []
    config = make_config(checkpoints={"diffs": False})
    async with Session(config, ScriptedModel([cells("write('a.py', 'x = 1\\n')"), "done"]), cwd=project,
                       on_event=events.append) as s:
        await s.prompt("work")
    assert all(e.files is None for e in events if isinstance(e, CellFinished | TurnFinished))
    assert (project / "a.py").read_text() == "x = 1\n"


async def test_an_interrupt_while_a_cells_files_are_read_keeps_its_result_and_files(project: Path, tmp_path: Path):
    events: list[Event] = []
    go = tmp_path / "go"  # the cell goes on once the test holds the lock its snapshot takes

    async def until(condition) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, "timed out"
            await asyncio.sleep(0.01)

    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\nwrite('a.py', 'x = 1\\n')"
    model = ScriptedModel([cells(code), "never asked"])
    async with Session(make_config(), model, cwd=project, on_event=events.append) as s:
        turn = asyncio.ensure_future(s.prompt("work"))
        await until(lambda: any(isinstance(e, CellStarted) for e in events))
        async with s.checkpoints.lock:  # the cell's snapshot waits for it: the interrupt lands meanwhile
            go.touch()
            await until(lambda: bool(s.checkpoints.lock._waiters))  # asyncio.Lock has no public view of its waiters
            await s.interrupt()  # the kernel is idle: this cancels the turn's task
        result = await asyncio.wait_for(turn, 60)
    assert result.outcome == "interrupted"
    (finished,) = [e for e in events if isinstance(e, CellFinished)]
    assert finished.result.ok and [f.headline() for f in finished.files.files] == ["a.py (created) +1 -0"]
    (ended,) = [e for e in events if isinstance(e, TurnFinished)]
    assert ended.files is not None and ended.files.summary() == "1 file changed, +1 -0"
    assert model.outputs == ["never asked"]  # the turn stopped at its next step
