"""After a crash: a rewind whose intent file is still there is finished at the next start."""

from __future__ import annotations

import json
from pathlib import Path

from agent.checkpoints.rewind import Plan, file_changes, harness_heads, rewind_record, apply
from agent.checkpoints.store import WorkspaceStore
from agent.checkpoints.turns import find
from agent.config_models import CheckpointConfig
from agent.harness import SessionHarness
from agent.layout import SessionLayout
from agent.trajectory import CheckpointRecord, RewindRecord, TrajectoryWriter, read_records


def recover(layout: SessionLayout, cwd: Path, harness: SessionHarness, config: CheckpointConfig,
            session_id: str) -> RewindRecord | None:
    """Finish a rewind a crash cut short (its intent file is still there): files and harness as
    planned, the conversation with them; the kernel died with the process, so its namespace is
    fresh. Returns the rewind's record (None when no rewind was cut)."""

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
            plan.files = file_changes(store, intent["before_tree"], target.record.tree,
                                       {s.path for s in target.record.skipped})
        kernel = {"status": "not restored", "why": "the process stopped during the rewind; the kernel is new"} \
            if "kernel" in parts else {}
        done = rewind_record(plan, intent, harness, kernel)
        writer = TrajectoryWriter(layout.trajectory)
        try:
            writer.append(done)
            if store is not None:
                snap = store.snapshot()
                writer.append(CheckpointRecord(at="rewind", tree=snap.tree, skipped=snap.skipped,
                                               harness=harness_heads(harness), kernel=""))
        finally:
            writer.close()
    path.unlink()
    return done
