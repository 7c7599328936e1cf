"""A session's checkpoints: taken at its turn boundaries (files, harness heads, and a snapshot of
the kernel's namespace taken by a forked child of the kernel, off the turn's path), restored by a rewind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

from agent import events as ev
from harness_store import safefs
from agent.checkpoints.diffs import counts_only, files_changed, since_first
from agent.checkpoints.rewind import (Part, Plan, apply, changes_since, file_changes, harness_heads, rewind_record,
                                     through_links, write_json)
from agent.checkpoints.store import WorkspaceStore
from agent.checkpoints.turns import RewindError, Target, find, person_changes
from agent.config_models import CheckpointConfig
from agent.context import Context, Sinks
from agent.harness import SessionHarness
from agent.kernel import Kernel, KernelState
from agent.layout import SessionLayout
from agent.trajectory import CheckpointRecord, Record, RewindRecord, read_records
from agent.types import Cell, FilesChanged
from harness_store.entries import HarnessError

log = logging.getLogger(__name__)
SNAPSHOT_WAIT = 30.0
"""Seconds a rewind waits for a namespace snapshot the kernel's child is still writing."""
MANIFEST_BYTES = 16 * 1024 * 1024
"""The largest namespace snapshot manifest a rewind reads (it names variables, not their values)."""


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
        self._turn_tree: str | None = None
        """The running turn's start checkpoint's tree (None: none was taken, or diffs are off)."""
        self._tree: str | None = None
        """The workspace's tree after the running turn's last cell (at its start: `_turn_tree`)."""

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
                record = await self._checkpoint("start", turn_id, self.namespace)
            self._turn_tree = self._tree = record.tree if record is not None and self.config.diffs else None

    async def after_cell(self) -> FilesChanged | None:
        """What the cell that just ran changed in the workspace: a snapshot taken now, against the
        last one (None: nothing changed, or diffs are off). A change made between the cells (a
        person's editor during a model call) is counted with the next cell."""
        if self.store is None or self._tree is None:
            return None
        store, before = self.store, self._tree

        def changed() -> tuple[str, FilesChanged | None]:  # one trip to a thread
            if store.unchanged(before):  # most cells write nothing: then no git process is started
                return before, None
            tree = store.snapshot().tree
            return tree, files_changed(store, before, tree)

        async with self.lock:
            try:
                tree, files = await asyncio.to_thread(changed)
            except (OSError, subprocess.SubprocessError) as e:
                log.warning("the files a cell changed could not be read: %s", e)
                return None
        self._tree = tree
        return files

    async def turn_files(self) -> FilesChanged | None:
        """What the running turn's cells changed, from its start to its last cell (counts, not diffs)."""
        if self.store is None or self._turn_tree is None or self._tree is None:
            return None
        store, start, end = self.store, self._turn_tree, self._tree
        self._turn_tree = self._tree = None
        try:
            files = await asyncio.to_thread(files_changed, store, start, end)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("the files a turn changed could not be read: %s", e)
            return None
        return counts_only(files) if files is not None else None

    async def since_start(self) -> FilesChanged | None:
        """What changed in the workspace since the session's first checkpoint, to now (None: nothing).
        ValueError when there is nothing to compare with (checkpoints off, no turn yet)."""
        first = next((r.tree for r in read_records(self.layout.trajectory, []) if isinstance(r, CheckpointRecord)
                      and r.tree is not None), None) if self.layout.trajectory.is_file() else None
        if self.store is None or first is None:
            raise ValueError("checkpoints are off in this session" if self.store is None else
                             "no checkpoint yet: the first is taken when the first turn begins")
        store = self.store
        async with self.lock:
            return await asyncio.to_thread(since_first, store, first)

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
            snap, heads = await asyncio.to_thread(lambda: (store.snapshot(), harness_heads(self.harness)))
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
        code = (f"import agent.kernel.runtime.snapshot as _s; _s.save(globals(), {str(self.kernel_dir)!r}, {name!r}, "
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
        while name and not os.path.lexists(manifest) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the kernel's child may still be writing it
        if name and not os.path.lexists(manifest):
            return {"status": "not restored", "why": "its snapshot was never written (the kernel's snapshot "
                    "child failed or was stopped)"}
        if name:  # the kernel writes this folder: the manifest may be a link, a FIFO, anything
            try:
                raw = await asyncio.to_thread(safefs.read_bytes, self.layout.dir, manifest, MANIFEST_BYTES)
                failed = json.loads(raw).get("error")
            except (OSError, ValueError, AttributeError) as e:
                return {"status": "not restored", "why": f"its snapshot's manifest is not one the host reads ({e})"}
            if failed:
                return {"status": "not restored", "why": f"its snapshot failed: {failed}"}
        code = f"import agent.kernel.runtime.snapshot as _s; _s.restore(globals(), {str(self.kernel_dir)!r}, {name!r}); del _s"
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
        plan = Plan(target, parts, now, heads=harness_heads(self.harness))
        if "code" in parts:
            if cp.tree is None or self.store is None:
                raise RewindError("no_checkpoint", f"turn {target.turn}'s checkpoint has no files (checkpoints off)")
            assert now is not None
            keep = {s.path for s in cp.skipped}
            plan.files = file_changes(self.store, now.tree, cp.tree, keep)
            current = {s.path for s in now.skipped}
            plan.not_restored = [s for s in cp.skipped if s.path in current or (self.store.workspace / s.path).exists()]
            mine = person_changes(self.store, records, target.index, now.tree)
            plan.conflicts += sorted(f.path for f in plan.files if f.path in mine)
            plan.conflicts += through_links(self.store.workspace, plan.files)
        if "harness" in parts:
            for scope, commit in cp.harness.items():
                store = self.harness.stores.get(scope)  # type: ignore[call-overload]
                if store is None or store.head() == commit:
                    continue
                plan.harness[scope] = commit
                plan.conflicts += [f"harness ({scope} scope): {c.summary} ({c.trigger or 'change'} "
                                   f"{c.refinement_id or c.commit[:12]}, not by this session)"
                                   for c in changes_since(store, commit) if c.trailers.get("Session") != self.session_id
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
            write_json(self.layout.rewind_intent, intent)
            try:
                await asyncio.to_thread(apply, self.store, self.harness, plan, self.session_id)
            except (OSError, HarnessError) as e:
                if not await asyncio.to_thread(self._undo, plan):
                    raise  # the intent stays: the next start finishes the rewind
                self.layout.rewind_intent.unlink(missing_ok=True)
                raise RewindError("failed", f"the rewind failed and was undone, nothing changed: "
                                  f"{type(e).__name__}: {e}") from e
            kernel = await self._restore_kernel(plan.kernel) if "kernel" in plan.parts else {}
            record = rewind_record(plan, intent, self.harness, kernel)
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
