"""Checkpoints at every turn boundary, and rewinding to any of them.

A checkpoint holds the four things a turn changes:
- the workspace's files: a tree in a shadow git repository under $PRIME_AGENT_HOME/checkpoints,
  whose work tree is the workspace (`WorkspaceStore`). It never touches the user's own repository
  (no commit, branch, stash, ref or index change there), reads the workspace's .gitignore files,
  copies no file over the size caps (and says which it skipped), and sees every change on disk,
  whoever made it: the file helpers, `%%bash`, a subprocess, the person's editor;
- the conversation: the context the trajectory's records up to the checkpoint make;
- the harness: each scope's commit;
- the kernel: a snapshot of the user namespace (agent/runtime/snapshot.py), taken when a turn ends
  by a forked child of the kernel, off the turn's path.

`start` checkpoints are taken before a turn's prompt joins the context, `end` ones once it ended
(in the background). A rewind is a recorded step that loses nothing: it checkpoints the present
first, restores what was asked for (files, a harness commit that restores the old state, the
context, the namespace), and writes an intent file first and removes it last, so a crash midway
is finished at the next start (`recover`): the old state or the new, never a mix.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent import events as ev
from agent.config import CheckpointConfig, home
from agent.context import Context, Sinks
from agent.harness import SessionHarness
from agent.kernel import Kernel, KernelState
from agent.layout import SessionLayout
from agent.trajectory import (
    CheckpointRecord,
    FileChange,
    Record,
    RewindRecord,
    SkippedFile,
    TurnFinished,
    TurnStarted,
    contexts,
    read_records,
    turn_starts,
)
from agent.types import Cell, Message
from harness_store.entries import HarnessError, InvalidEntry

log = logging.getLogger(__name__)
Part = Literal["code", "conversation", "harness", "kernel"]
PARTS: tuple[Part, ...] = ("code", "conversation", "harness", "kernel")
TMP_SUFFIX = ".prime-agent-rewind"
"""A file being restored is written beside it under this suffix, then renamed over it."""
EXCLUDE = f"*{TMP_SUFFIX}\n/.prime-agent/harness/\n"
"""Never checkpointed: files a rewind is writing, and the project harness (rewound as harness)."""
SNAPSHOT_WAIT = 30.0
"""Seconds a rewind waits for a namespace snapshot the kernel's child is still writing."""


class RewindError(Exception):
    """A rewind that cannot be done: `code` is bad_turn, no_checkpoint, conflict, turn_running, or
    failed (it failed midway and was undone)."""

    def __init__(self, code: str, message: str, conflicts: list[str] | None = None):
        super().__init__(message)
        self.code, self.message, self.conflicts = code, message, conflicts or []


# --- the workspace's files ---------------------------------------------------------------------


@dataclass
class Snapshot:
    tree: str
    skipped: list[SkippedFile]
    stored_bytes: int


class WorkspaceStore:
    """Workspace trees in a shadow git repository (one per workspace, shared by its sessions: a
    file kept by one is stored once). Each session has its own index there, which makes a
    checkpoint cost a scan of the workspace's metadata plus hashing what changed."""

    def __init__(self, workspace: Path, session_id: str, config: CheckpointConfig, root: Path | None = None):
        self.workspace = workspace.resolve()
        self.config = config
        key = hashlib.sha256(str(self.workspace).encode()).hexdigest()[:16]
        self.git_dir = (root or home() / "checkpoints") / f"{self.workspace.name or 'root'}-{key}"
        self.index = self.git_dir / "indexes" / session_id
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        self._env.update(GIT_INDEX_FILE=str(self.index), GIT_CONFIG_NOSYSTEM="1")
        self._ready = False
        self._tree: str | None = None
        """The tree of this session's index as last written (unchanged while nothing changed)."""

    def _git(self, *args: str, input: bytes | None = None) -> bytes:
        done = subprocess.run(
            ["git", f"--git-dir={self.git_dir}", f"--work-tree={self.workspace}", "-c", "core.autocrlf=false",
             "-c", "core.fsmonitor=false", "-c", "core.quotepath=false", *args],
            input=input, capture_output=True, env=self._env, cwd=self.workspace)
        if done.returncode != 0:
            raise OSError(f"git {args[0]} in the checkpoint store {self.git_dir}: "
                          f"{done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def _ensure(self) -> None:
        if self._ready:
            return
        if not (self.git_dir / "HEAD").is_file():
            self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.git_dir.with_name(f"{self.git_dir.name}.{secrets.token_hex(4)}.tmp")
            subprocess.run(["git", "init", "-q", "--bare", str(tmp)], check=True, capture_output=True, env=self._env)
            subprocess.run(["git", f"--git-dir={tmp}", "config", "core.bare", "false"], check=True, env=self._env)
            subprocess.run(["git", f"--git-dir={tmp}", "config", "gc.auto", "0"], check=True, env=self._env)
            (tmp / "info").mkdir(exist_ok=True)
            (tmp / "info" / "exclude").write_text(EXCLUDE)
            (tmp / "workspace").write_text(str(self.workspace) + "\n")
            try:
                tmp.rename(self.git_dir)  # whole or not at all; another session may have won the race
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        self.index.parent.mkdir(exist_ok=True)
        if not self.index.exists():  # start from another session's view of the same files: no rehash
            others = sorted(self.index.parent.glob("*"), key=lambda p: p.stat().st_mtime)
            if others:
                self.index.write_bytes(others[-1].read_bytes())
        self._ready = True

    def snapshot(self) -> Snapshot:
        """The workspace as a tree now: every file git would not ignore, within the size caps."""
        self._ensure()
        c = self.config
        listed = self._git("ls-files", "-z", "-t", "-m", "-o", "--exclude-standard").split(b"\0")
        update, drop, skipped, stored = [], [], [], 0
        for item in filter(None, listed):
            tag, rel = item[:1], os.fsdecode(item[2:])
            tracked = tag != b"?"
            if rel.endswith("/"):  # a folder ls-files does not go into: a git repository of its own
                skipped.append(SkippedFile(path=rel, reason="a git repository of its own"))
                continue
            path = self.workspace / rel
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):  # deleted (its folder may be a file now)
                if tracked:
                    drop.append(rel)
                continue
            reason = None
            if stat.S_ISDIR(st.st_mode):  # a file that became a folder: its files are listed on their own
                drop.append(rel)
                continue
            if stat.S_ISLNK(st.st_mode):
                pass
            elif not stat.S_ISREG(st.st_mode):
                reason = "not a regular file"
            elif st.st_size > c.max_file_bytes:
                reason = "over checkpoints.max_file_bytes"
            elif st.st_size > c.max_binary_bytes and _binary(path):
                reason = "binary, over checkpoints.max_binary_bytes"
            elif stored + st.st_size > c.max_checkpoint_bytes:
                reason = "over checkpoints.max_checkpoint_bytes with the files before it"
            if reason is not None:
                skipped.append(SkippedFile(path=rel, bytes=st.st_size, reason=reason))
                if tracked:
                    drop.append(rel)
                continue
            stored += st.st_size if stat.S_ISREG(st.st_mode) else 0
            update.append(rel)
        if drop:
            self._git("update-index", "-z", "--force-remove", "--stdin", input=_paths(drop))
        if update:  # --replace: a folder that became a file (or the other way) takes the place of the old
            self._git("update-index", "-z", "--add", "--remove", "--replace", "--stdin", input=_paths(update))
        if update or drop or self._tree is None:
            self._tree = self._git("write-tree").decode().strip()
        return Snapshot(self._tree, skipped, stored)

    def changes(self, a: str, b: str) -> list[tuple[str, str, str, str]]:
        """What changes from tree `a` to tree `b`: (status A|M|D|T, path, mode in b, blob in b)."""
        if a == b:
            return []
        fields = self._git("diff-tree", "-r", "-z", "--no-renames", a, b).split(b"\0")
        out = []
        for meta, rel in zip(fields[0::2], fields[1::2]):
            if not meta.startswith(b":"):
                continue
            _, mode, _, blob, status = meta[1:].decode().split(" ")
            out.append((status[0], os.fsdecode(rel), mode, blob))
        return out

    def changed_paths(self, a: str, b: str) -> set[str]:
        return {rel for _, rel, _, _ in self.changes(a, b)}

    def restore(self, current: str, target: str, keep: set[str]) -> None:
        """Make the workspace's files, as they are in tree `current`, those of tree `target`.
        Paths in `keep` (the target's skipped files) and everything ignored are left alone. Each
        file is replaced whole (written beside it, then renamed over it)."""
        changes = [c for c in self.changes(current, target) if c[1] not in keep]
        for status, rel, _, _ in changes:
            if status == "D":
                path = self.workspace / rel
                if path.is_symlink() or path.is_file():
                    path.unlink()
                _prune(path.parent, self.workspace)
        writes = [(rel, mode, blob) for status, rel, mode, blob in changes if status != "D" and mode != "160000"]
        contents = self._blobs([blob for _, _, blob in writes])
        for rel, mode, blob in writes:
            path = self.workspace / rel
            tmp = path.with_name(path.name + TMP_SUFFIX)
            path.parent.mkdir(parents=True, exist_ok=True)
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            if mode == "120000":
                os.symlink(os.fsdecode(contents[blob]), tmp)
            else:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755 if mode == "100755" else 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(contents[blob])
                os.chmod(tmp, 0o755 if mode == "100755" else 0o644)
            if path.is_dir() and not path.is_symlink():
                path.rmdir()  # a folder where the file was (its files were deleted above)
            os.replace(tmp, path)

    def _blobs(self, ids: list[str]) -> dict[str, bytes]:
        if not ids:
            return {}
        out = self._git("cat-file", "--batch", input=("\n".join(ids) + "\n").encode())
        blobs, at = {}, 0
        while at < len(out):
            end = out.index(b"\n", at)
            sha, _, size = out[at:end].decode().split(" ")
            at = end + 1
            blobs[sha] = out[at:at + int(size)]
            at += int(size) + 1
        return blobs

    def disk_bytes(self) -> int:
        """What the store takes on disk (for bench/rewind.py)."""
        return sum(p.stat().st_size for p in self.git_dir.rglob("*") if p.is_file())


def _paths(paths: list[str]) -> bytes:
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def _binary(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(8192)
    except OSError:
        return False


def _prune(folder: Path, root: Path) -> None:
    """Remove `folder` and the folders above it while they are empty (never the workspace itself)."""
    while folder != root and folder.is_relative_to(root) and folder.is_dir() and not folder.is_symlink():
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


# --- finding a checkpoint ----------------------------------------------------------------------


@dataclass
class Target:
    """Checkpoint `record` (at index `index` of the records) and the conversation it stands for."""

    turn: int
    after: bool
    record: CheckpointRecord
    index: int
    messages: list[Message]
    turn_starts: list[int]


def turn_ids(records: list[Record]) -> list[str]:
    """The session's turns in the order they began: turn N is `turn_ids(...)[N - 1]`."""
    return [r.turn_id for r in records if isinstance(r, TurnStarted)]


def find(records: list[Record], turn: int, after: bool = False) -> Target:
    """The checkpoint before turn `turn` (1-based) began, or, with `after`, when it ended. The
    turn after the last is the state the last one left (`after` on the last turn)."""
    ids = turn_ids(records)
    if not ids:
        raise RewindError("bad_turn", "this session has no turns yet: nothing to rewind to")
    if turn < 1 or turn > len(ids) + 1 or (after and turn > len(ids)):
        last = len(ids) + (0 if after else 1)
        raise RewindError("bad_turn", f"turn {turn} is not one of this session's (1 to {last}"
                          f"{'' if after else f'; {last} is the state after the last turn'})")
    if turn == len(ids) + 1:
        turn, after = len(ids), True
    turn_id, at = ids[turn - 1], "end" if after else "start"
    index = next((i for i, r in enumerate(records)
                  if isinstance(r, CheckpointRecord) and r.turn_id == turn_id and r.at == at), None)
    if index is None:
        raise RewindError("no_checkpoint", f"turn {turn} has no checkpoint {'after' if after else 'before'} it "
                          "(checkpoints were off, or it failed: see the session's errors)")
    before = records[:index]
    conversations = list(contexts(before))
    record = records[index]
    assert isinstance(record, CheckpointRecord)
    return Target(turn, after, record, index, conversations[-1] if conversations else [], turn_starts(before))


def person_changes(store: WorkspaceStore, records: list[Record], index: int, now: str) -> set[str]:
    """Files whose content on disk was last written outside a turn since checkpoint `index`: by a
    person's editor, a build they ran, between one turn's end (or a rewind) and the next checkpoint,
    or since the last of them. A file a later turn or rewind wrote over again is no longer theirs."""
    points: list[tuple[str, str]] = []  # (kind, tree): start | end | rewind | before | now
    for r in records[index:]:
        if isinstance(r, RewindRecord) and r.before_tree is not None:
            points.append(("before", r.before_tree))
        elif isinstance(r, CheckpointRecord) and r.tree is not None:
            points.append((r.at, r.tree))
    points.append(("now", now))
    theirs: dict[str, bool] = {}
    for (kind, a), (_, b) in zip(points, points[1:]):
        person = kind in ("end", "rewind")  # the stretch after a turn ended, or after a rewind
        if person or any(theirs.values()):  # a turn's own changes matter only to take a file back
            for rel in store.changed_paths(a, b):
                theirs[rel] = person
    return {rel for rel, mine in theirs.items() if mine}


def _harness_heads(harness: SessionHarness) -> dict[str, str | None]:
    return {scope: store.head() for scope, store in harness.stores.items()}


# --- the session's part ------------------------------------------------------------------------


@dataclass
class Plan:
    """What a rewind would do; `conflicts` refuse it unless forced."""

    target: Target
    parts: list[Part]
    now: Snapshot | None
    files: list[FileChange] = field(default_factory=list)
    not_restored: list[SkippedFile] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    harness: dict[str, str | None] = field(default_factory=dict)
    """Each scope to rewind, and the commit whose state it gets back."""
    heads: dict[str, str | None] = field(default_factory=dict)
    """Each scope's commit when the plan was made (what a failed rewind goes back to)."""
    kernel: str | None = None

    def summary(self) -> dict[str, Any]:
        return {"turn": self.target.turn, "after": self.target.after, "parts": list(self.parts),
                "files": [f.model_dump() for f in self.files],
                "not_restored": [s.model_dump() for s in self.not_restored], "conflicts": self.conflicts,
                "harness": {k: v for k, v in self.harness.items()}, "kernel": self.kernel}


class Checkpoints:
    """A session's checkpoints: taken at its turn boundaries, restored by `rewind`. Handed what it
    works with (the workspace, the kernel, the harness, the context and the session's sinks)."""

    def __init__(self, config: CheckpointConfig, cwd: Path, layout: SessionLayout, session_id: str,
                 kernel: Kernel, harness: SessionHarness, context: Context, sinks: Sinks, enabled: bool = True):
        self.config, self.layout, self.session_id = config, layout, session_id
        self.kernel, self.harness, self.context, self.sinks = kernel, harness, context, sinks
        self.enabled = enabled and config.enabled
        self.store = WorkspaceStore(cwd, session_id, config) if self.enabled else None
        self.kernel_dir = layout.kernel_snapshots
        self.namespace: str | None = ""
        """The namespace snapshot the kernel holds now ("": fresh; None: unknown)."""
        self.lock = asyncio.Lock()
        """Held by a rewind and by a checkpoint being taken; a turn begins once neither runs."""
        self._pending: asyncio.Task | None = None
        self._said_snapshots_fail = False

    async def settle(self) -> None:
        """Wait for the end-of-turn checkpoint still being taken, and for a rewind under way."""
        if self._pending is not None:
            await asyncio.gather(self._pending, return_exceptions=True)
            self._pending = None
        async with self.lock:
            pass

    async def close(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
            await asyncio.gather(self._pending, return_exceptions=True)

    def warm(self) -> None:
        """At session start: read the workspace into the store in the background, so the first
        turn's checkpoint only hashes what changed since (the first, on a big workspace, is seconds)."""
        if self.enabled and self.store is not None:
            self._pending = asyncio.ensure_future(asyncio.to_thread(self.store.snapshot))

    async def at_turn_start(self, turn_id: str) -> None:
        """Before turn `turn_id` begins (before anything of it is recorded)."""
        if self.enabled:
            async with self.lock:
                await self._checkpoint("start", turn_id, self.namespace)

    def after_turn(self, turn_id: str) -> None:
        """Once the turn ended: snapshot the namespace, then checkpoint, in the background."""
        if self.enabled:
            self._pending = asyncio.ensure_future(self._after_turn(turn_id))

    async def _after_turn(self, turn_id: str) -> None:
        async with self.lock:
            self.namespace = await self._snapshot_kernel()
            await self._checkpoint("end", turn_id, self.namespace)

    async def _checkpoint(self, at: str, turn_id: str | None, namespace: str | None) -> CheckpointRecord | None:
        started, store = time.monotonic(), self.store
        assert store is not None
        try:
            snap, heads = await asyncio.to_thread(lambda: (store.snapshot(), _harness_heads(self.harness)))
        except (OSError, HarnessError, subprocess.SubprocessError) as e:
            log.exception("checkpoint failed")
            self.sinks.emit(ev.Error(turn_id=turn_id, message=f"the {at} checkpoint could not be taken "
                                     f"(rewinding to it will not be possible): {e}"))
            return None
        record = CheckpointRecord(turn_id=turn_id, at=at, tree=snap.tree, skipped=snap.skipped, harness=heads,
                                  kernel=namespace, stored_bytes=snap.stored_bytes,
                                  duration=time.monotonic() - started)
        self.sinks.record(record)
        return record

    # --- the namespace -------------------------------------------------------------------------

    async def _snapshot_kernel(self) -> str | None:
        if not self.config.kernel or self.kernel.state is not KernelState.IDLE:
            return None
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        code = (f"import agent.runtime.snapshot as _s; _s.save(globals(), {str(self.kernel_dir)!r}, {name!r}, "
                f"{self.config.max_variable_bytes}, {self.config.max_namespace_bytes}); del _s")
        result = await self.kernel.execute(Cell(id="checkpoint", code=code, timeout=60))
        if result.error_name or result.kernel_events:
            log.warning("namespace snapshot failed: %s %s", result.error_name, result.error_value)
            if not self._said_snapshots_fail:  # once a session: a rewind will not bring variables back
                self._said_snapshots_fail = True
                self.sinks.emit(ev.Error(message=f"the kernel's namespace could not be snapshotted "
                                         f"({result.error_name}: {result.error_value}); a rewind restores files, "
                                         "conversation and harness, not variables"))
            return None
        return name

    async def _restore_kernel(self, name: str | None) -> dict[str, Any]:
        if name is None:
            return {"status": "not restored", "why": "the checkpoint has no namespace snapshot"}
        if self.kernel.state is not KernelState.IDLE:
            return {"status": "not restored", "why": f"the kernel is {self.kernel.state.value}"}
        manifest = self.kernel_dir / f"{name}.json"
        deadline = time.monotonic() + SNAPSHOT_WAIT
        while name and not manifest.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the kernel's child may still be writing it
        if name and not manifest.exists():
            return {"status": "not restored", "why": "its snapshot was never written (the kernel's snapshot "
                    "child failed or was stopped)"}
        if name and (failed := json.loads(manifest.read_text()).get("error")):
            return {"status": "not restored", "why": f"its snapshot failed: {failed}"}
        code = f"import agent.runtime.snapshot as _s; _s.restore(globals(), {str(self.kernel_dir)!r}, {name!r}); del _s"
        result = await self.kernel.execute(Cell(id="rewind", code=code, timeout=300))
        if result.error_name or result.kernel_events:
            return {"status": "not restored", "why": f"{result.error_name}: {result.error_value}"}
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        self.namespace = name
        return {"status": "restored" if name else "fresh", **summary}

    # --- rewinding -----------------------------------------------------------------------------

    async def plan(self, turn: int, parts: list[Part], after: bool = False) -> Plan:
        """What rewinding to before `turn` (or after it) would change, and what stands in its way."""
        await self.settle()
        records = read_records(self.layout.trajectory, [])
        target = find(records, turn, after)
        return await asyncio.to_thread(self._plan, records, target, parts)

    def _plan(self, records: list[Record], target: Target, parts: list[Part]) -> Plan:
        cp = target.record
        now = self.store.snapshot() if self.store is not None else None
        plan = Plan(target, parts, now, heads=_harness_heads(self.harness))
        if "code" in parts:
            if cp.tree is None or self.store is None:
                raise RewindError("no_checkpoint", f"turn {target.turn}'s checkpoint has no files (checkpoints off)")
            assert now is not None
            keep = {s.path for s in cp.skipped}
            plan.files = _file_changes(self.store, now.tree, cp.tree, keep)
            current = {s.path for s in now.skipped}
            plan.not_restored = [s for s in cp.skipped if s.path in current or (self.store.workspace / s.path).exists()]
            mine = person_changes(self.store, records, target.index, now.tree)
            plan.conflicts += sorted(f.path for f in plan.files if f.path in mine)
        if "harness" in parts:
            for scope, commit in cp.harness.items():
                store = self.harness.stores.get(scope)  # type: ignore[call-overload]
                if store is None or store.head() == commit:
                    continue
                plan.harness[scope] = commit
                plan.conflicts += [f"harness ({scope} scope): {c.summary} ({c.trigger or 'change'} "
                                   f"{c.refinement_id or c.commit[:12]}, not by this session)"
                                   for c in _since(store, commit) if c.trailers.get("Session") != self.session_id
                                   and c.trigger != "init"]
        if "kernel" in parts:
            plan.kernel = cp.kernel
        return plan

    async def rewind(self, plan: Plan, force: bool = False) -> RewindRecord:
        """Do `plan`; refused (RewindError "conflict") when it would overwrite a person's changes."""
        if plan.conflicts and not force:
            raise RewindError("conflict", "changed since the checkpoint by someone other than this session's "
                              "turns, and a rewind would overwrite them (--force goes ahead; the present is "
                              "checkpointed first, so nothing is lost): " + ", ".join(plan.conflicts),
                              plan.conflicts)
        async with self.lock:
            rewind_id = f"rw-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
            intent = {"rewind_id": rewind_id, "turn": plan.target.turn, "after": plan.target.after,
                      "parts": plan.parts, "before_tree": plan.now.tree if plan.now else None,
                      "forced": plan.conflicts}
            _write_json(self.layout.rewind_intent, intent)
            try:
                await asyncio.to_thread(apply, self.store, self.harness, plan, self.session_id)
            except (OSError, HarnessError) as e:
                if not await asyncio.to_thread(self._undo, plan):
                    raise  # the intent stays: the next start finishes the rewind
                self.layout.rewind_intent.unlink(missing_ok=True)
                raise RewindError("failed", f"the rewind failed and was undone, nothing changed: "
                                  f"{type(e).__name__}: {e}") from e
            kernel = await self._restore_kernel(plan.kernel) if "kernel" in plan.parts else {}
            record = _record(plan, intent, self.harness, kernel)
            self.sinks.record(record)
            if record.messages is not None:
                self.context.messages = list(record.messages)
                self.context.turn_starts = list(record.turn_starts)
                self.context.tokens = self.context.mark = 0
            if self.store is not None:
                await self._checkpoint("rewind", None, self.namespace)
            self.layout.rewind_intent.unlink(missing_ok=True)
        return record

    def _undo(self, plan: Plan) -> bool:
        """A rewind that failed midway (a full disk): put the files and the harness back as they
        were; False when that fails too (then the next start finishes the rewind instead)."""
        try:
            if self.store is not None and plan.now is not None and "code" in plan.parts:
                self.store.restore(self.store.snapshot().tree, plan.now.tree, set())
            for scope, head in plan.heads.items():
                store = self.harness.stores[scope]  # type: ignore[index]
                if head is not None and store.head() != head:
                    store.rollback_to(head, session=self.session_id)
            return True
        except (OSError, HarnessError):
            log.exception("a failed rewind could not be undone; the next start finishes it")
            return False


def _since(store, commit: str | None) -> list:
    """The scope's changes after `commit` (all of them when it is None), newest first."""
    out = []
    for change in store.log():
        if change.commit == commit:
            break
        out.append(change)
    return out


def _file_changes(store: WorkspaceStore, now: str, target: str, keep: set[str]) -> list[FileChange]:
    kinds = {"A": "created", "D": "deleted"}
    return [FileChange(path=rel, change=kinds.get(status, "restored"))
            for status, rel, _, _ in store.changes(now, target) if rel not in keep]


def apply(store: WorkspaceStore | None, harness: SessionHarness, plan: Plan, session_id: str) -> None:
    """The files and the harness of `plan` (again, after a crash: each step is idempotent)."""
    cp = plan.target.record
    if "code" in plan.parts and store is not None and cp.tree is not None:
        now = store.snapshot()
        store.restore(now.tree, cp.tree, {s.path for s in cp.skipped})
    for scope, commit in plan.harness.items():
        scope_store = harness.stores[scope]  # type: ignore[index]
        ref = commit if commit is not None else _root(scope_store)
        if ref is None:
            continue
        try:
            scope_store.rollback_to(ref, session=session_id)
        except InvalidEntry as e:
            if "already as it was" not in str(e):
                raise


def _root(store) -> str | None:
    """The first commit of a scope (it holds no entries): a scope that had no history comes back to it."""
    log_ = store.log()
    return log_[-1].commit if log_ else None


def _record(plan: Plan, intent: dict[str, Any], harness: SessionHarness, kernel: dict[str, Any]) -> RewindRecord:
    cp = plan.target.record
    parts = plan.parts
    heads = {scope: harness.stores[scope].head() for scope in plan.harness}  # type: ignore[index]
    conversation = "conversation" in parts
    notice = _notice(plan, heads, kernel)
    return RewindRecord(
        rewind_id=intent["rewind_id"], turn=plan.target.turn, after=plan.target.after, parts=list(parts),
        target=f"{cp.turn_id}:{cp.at}", before_tree=intent["before_tree"], files=plan.files,
        not_restored=plan.not_restored, harness={k: v for k, v in heads.items() if v}, kernel=kernel,
        forced=intent["forced"], messages=plan.target.messages if conversation else None,
        turn_starts=plan.target.turn_starts if conversation else [], notice=notice,
    )


def _notice(plan: Plan, heads: dict[str, str | None], kernel: dict[str, Any]) -> str:
    """What the model is told at its next turn."""
    where = f"{'the end of' if plan.target.after else 'before'} turn {plan.target.turn}"
    lines = [f"[The user rewound this session to {where}."]
    if "code" in plan.parts:
        if plan.files:
            shown = ", ".join(f"{f.path} ({f.change})" for f in plan.files[:30])
            more = f" and {len(plan.files) - 30} more" if len(plan.files) > 30 else ""
            lines.append(f"Files restored to that point: {shown}{more}.")
        else:
            lines.append("The files were already as they were then.")
        if plan.not_restored:
            lines.append("Not restored (too large or binary at the checkpoint): "
                         + ", ".join(s.path for s in plan.not_restored[:20]) + ".")
    if "conversation" in plan.parts:
        lines.append("The conversation goes on from that point; anything said after it is gone from your context.")
    if "harness" in plan.parts:
        lines.append("The harness is back as it was then (" + (", ".join(f"{s} scope at {c[:12]}" for s, c in
                     heads.items() if c) or "no change") + ").")
    if "kernel" in plan.parts:
        status = kernel.get("status")
        if status == "restored":
            kept = ", ".join(kernel.get("restored", [])) or "none"
            lines.append(f"The kernel's namespace is as it was then (variables: {kept}).")
            if kernel.get("not_restored"):
                lines.append("Not restored (not serialisable or too large): "
                             + ", ".join(kernel["not_restored"]) + ".")
        elif status == "fresh":
            lines.append("The kernel's namespace is fresh, as it was then: every variable from later is gone.")
        else:
            lines.append(f"The kernel's namespace was not restored ({kernel.get('why', 'unknown')}); "
                         "it is as the last turn left it.")
    else:
        lines.append("The kernel's namespace is as the last turn left it.")
    return " ".join(lines) + "]"


def rewound(record: RewindRecord) -> ev.Rewound:
    """The event that tells clients of a rewind."""
    return ev.Rewound(rewind_id=record.rewind_id, turn=record.turn, after=record.after, parts=record.parts,
                      files=[f.model_dump() for f in record.files], harness=record.harness, kernel=record.kernel,
                      forced=record.forced, notice=record.notice)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- after a crash ---------------------------------------------------------------------------


def recover(layout: SessionLayout, cwd: Path, harness: SessionHarness, config: CheckpointConfig,
            session_id: str) -> RewindRecord | None:
    """Finish a rewind a crash cut short (its intent file is still there): files and harness as
    planned, the conversation with them; the kernel died with the process, so its namespace is
    fresh. Returns the rewind's record (None when no rewind was cut)."""
    from agent.trajectory import TrajectoryWriter

    path = layout.rewind_intent
    if not path.is_file():
        return None
    intent = json.loads(path.read_text())
    records = read_records(layout.trajectory, [])
    done = next((r for r in records if isinstance(r, RewindRecord) and r.rewind_id == intent["rewind_id"]), None)
    if done is None:
        store = WorkspaceStore(cwd, session_id, config) if config.enabled else None
        target = find(records, intent["turn"], intent["after"])
        parts = [p for p in intent["parts"]]
        plan = Plan(target, parts, None)
        if "harness" in parts:
            plan.harness = {s: c for s, c in target.record.harness.items()
                            if s in harness.stores and harness.stores[s].head() != c}  # type: ignore[index]
        apply(store, harness, plan, session_id)
        if store is not None and target.record.tree is not None and intent["before_tree"]:
            plan.files = _file_changes(store, intent["before_tree"], target.record.tree,
                                       {s.path for s in target.record.skipped})
        kernel = {"status": "not restored", "why": "the process stopped during the rewind; the kernel is new"} \
            if "kernel" in parts else {}
        done = _record(plan, intent, harness, kernel)
        writer = TrajectoryWriter(layout.trajectory)
        try:
            writer.append(done)
            if store is not None:
                snap = store.snapshot()
                writer.append(CheckpointRecord(at="rewind", tree=snap.tree, skipped=snap.skipped,
                                               harness=_harness_heads(harness), kernel=""))
        finally:
            writer.close()
    path.unlink()
    return done


def turn_list(layout: SessionLayout, store: WorkspaceStore | None) -> list[dict[str, Any]]:
    """The session's turns for a person choosing where to rewind: number, id, prompt, when, how it
    ended, and the files it changed (between its checkpoints)."""
    records = read_records(layout.trajectory, []) if layout.trajectory.is_file() else []
    turns: dict[str, dict[str, Any]] = {}
    trees = {(r.turn_id, r.at): r.tree for r in records if isinstance(r, CheckpointRecord) and r.tree is not None}
    for r in records:
        if isinstance(r, TurnStarted):
            turns[r.turn_id] = {"turn": len(turns) + 1, "turn_id": r.turn_id, "prompt": r.prompt, "ts": r.ts,
                                "outcome": None, "checkpoint": (r.turn_id, "start") in trees, "files": []}
        elif isinstance(r, TurnFinished) and r.turn_id in turns:
            turns[r.turn_id]["outcome"] = r.outcome
    for turn_id, row in turns.items():
        start, end = trees.get((turn_id, "start")), trees.get((turn_id, "end"))
        if store is not None and start and end:
            try:
                row["files"] = sorted(store.changed_paths(start, end))
            except OSError:
                pass
    return list(turns.values())
