"""Finding a checkpoint in a session's records, and the session's turns as a person chooses among them."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from agent.checkpoints.store import WorkspaceStore
from agent.layout import SessionLayout
from agent.trajectory import CheckpointRecord, Record, RewindRecord, TurnFinishedRecord, TurnStartedRecord, contexts, read_records, turn_starts
from agent.types import Message


class RewindError(Exception):
    """A rewind that cannot be done: `code` is bad_turn, no_checkpoint, conflict, turn_running, or
    failed (it failed midway and was undone)."""

    def __init__(self, code: str, message: str, conflicts: list[str] | None = None):
        super().__init__(message)
        self.code, self.message, self.conflicts = code, message, conflicts or []


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
    return [r.turn_id for r in records if isinstance(r, TurnStartedRecord)]


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


class TurnRow(BaseModel):
    """A turn as a person choosing where to rewind sees it."""

    turn: int
    """1-based, in the order turns began."""
    turn_id: str
    prompt: str
    ts: float
    outcome: str | None
    """How it ended (None: it has not, or the record was lost)."""
    checkpoint: bool
    """A checkpoint was taken before it began."""
    files: list[str]
    """The files it changed (between its checkpoints)."""


def turn_list(layout: SessionLayout, store: WorkspaceStore | None) -> list[TurnRow]:
    """The session's turns for a person choosing where to rewind."""
    records = read_records(layout.trajectory, []) if layout.trajectory.is_file() else []
    turns: dict[str, TurnRow] = {}
    trees = {(r.turn_id, r.at): r.tree for r in records if isinstance(r, CheckpointRecord) and r.tree is not None}
    for r in records:
        if isinstance(r, TurnStartedRecord):
            turns[r.turn_id] = TurnRow(turn=len(turns) + 1, turn_id=r.turn_id, prompt=r.prompt, ts=r.ts,
                                       outcome=None, checkpoint=(r.turn_id, "start") in trees, files=[])
        elif isinstance(r, TurnFinishedRecord) and r.turn_id in turns:
            turns[r.turn_id].outcome = r.outcome
    for turn_id, row in turns.items():
        start, end = trees.get((turn_id, "start")), trees.get((turn_id, "end"))
        if store is not None and start and end:
            try:
                row.files = sorted(store.changed_paths(start, end))
            except OSError:
                pass
    return list(turns.values())
