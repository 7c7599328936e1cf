"""What a rewind would do (`Plan`), doing it (`apply`: idempotent, so a crash midway is finished
by running it again), and what the rewind's record tells the model and clients."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent import events as ev
from harness_store import safefs
from agent.checkpoints.store import Snapshot, WorkspaceStore
from agent.checkpoints.turns import Target
from agent.harness import SessionHarness
from agent.trajectory import FileChange, RewindRecord, SkippedFile
from harness_store.entries import InvalidEntry

Part = Literal["code", "conversation", "harness", "kernel"]
PARTS: tuple[Part, ...] = ("code", "conversation", "harness", "kernel")


def harness_heads(harness: SessionHarness) -> dict[str, str | None]:
    return {scope: store.head() for scope, store in harness.stores.items()}



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
                "files": self.files, "not_restored": self.not_restored, "conflicts": self.conflicts,
                "harness": {k: v for k, v in self.harness.items()}, "kernel": self.kernel}



def changes_since(store, commit: str | None) -> list:
    """The scope's changes after `commit` (all of them when it is None), newest first."""
    out = []
    for change in store.log():
        if change.commit == commit:
            break
        out.append(change)
    return out


def file_changes(store: WorkspaceStore, now: str, target: str, keep: set[str]) -> list[FileChange]:
    kinds = {"A": "created", "D": "deleted"}
    return [FileChange(path=c.path, change=kinds.get(c.status, "restored"))
            for c in store.changes(now, target) if c.path not in keep]


def through_links(workspace: Path, files: list[FileChange]) -> list[str]:
    """The conflicts of files a rewind would write behind a link the workspace holds now (a cell
    can make a folder a link to anywhere, `.git/hooks` say): a rewind never writes through one, and
    only a forced one goes ahead, making the link a real folder. A link the rewind itself removes
    first is none; a file to remove behind a link is left alone (it is not the workspace's)."""
    deleted = {f.path for f in files if f.change == "deleted"}
    out = []
    for f in files:
        link = safefs.through_link(workspace, Path(f.path)) if f.change != "deleted" else None
        if link is not None and link not in deleted and os.path.islink(workspace / link):
            out.append(f"{f.path} ({link} is a link: a forced rewind makes it a real folder)")
    return out


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


def rewind_record(plan: Plan, intent: dict[str, Any], harness: SessionHarness, kernel: dict[str, Any]) -> RewindRecord:
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
                      files=record.files, harness=record.harness, kernel=record.kernel,
                      forced=record.forced, notice=record.notice)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
