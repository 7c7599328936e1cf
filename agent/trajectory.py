"""Trajectories: the append-only JSONL record of a session.

One typed record per line, discriminated by `kind`. Every record is flushed as it is written;
the file is fsynced at turn boundaries. A torn last line (a crash mid-write) is tolerated on read.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from agent.config_models import Config
from agent.hooks import HookCall
from agent.types import ApprovalKind, Cell, CellResult, FileChange, McpCall, Message, SkippedFile, TurnBegun, TurnOutcome, Usage

SCHEMA = 1
"""The record format written here (in each trajectory's `session` record). A change to it appends
a migration, as daemon/meta.py does for a daemon's files; a newer trajectory is refused, not misread."""


class _Record(BaseModel):
    ts: float = Field(default_factory=time.time)


class SessionPlace(BaseModel):
    """Which session, and the directory it works in: what the trajectory's `session` record and the
    daemon's `session.json` (daemon/meta.SessionMeta) both say of a session, as one type."""

    session_id: str
    cwd: str


class SessionRecord(SessionPlace, _Record):
    kind: Literal["session"] = "session"
    schema_version: int = SCHEMA
    model: str
    """The model the session began with (session.json does not keep one: the configuration says)."""
    action_format: str
    harness_version: str | None = None
    """Each harness scope's commit when the session began."""
    parent: str | None = None
    """The parent session's id, for a subagent."""
    config: dict[str, Any] = Field(default_factory=dict)
    repositories: list[str] | None = None
    """The workspace's and the project's `.git` there when the session began (approvals name one made
    since); None in records from before it was kept."""


class TurnStartedRecord(TurnBegun, _Record):
    kind: Literal["turn_started"] = "turn_started"
    turn_id: str


class PlanRecord(_Record):
    """Plan mode: a plan the model proposed, a person's decision on it, and a person turning plan
    mode on or off between turns (`entered`, `left`: `plan` is empty). These records are the one
    truth of whether a session is in plan mode (`in_plan_mode`): session.json keeps only the mode it
    was created in, so an approval is durable the moment its record is written."""

    kind: Literal["plan"] = "plan"
    turn_id: str | None = None
    step: Literal["proposed", "approved", "rejected", "entered", "left"]
    plan: str = ""
    note: str | None = None


class HookRecord(HookCall, _Record):
    """One of the person's hooks ran (the payload `HookRan` carries too)."""

    kind: Literal["hook"] = "hook"
    turn_id: str | None = None


class GoalRecord(_Record):
    """A step of a goal (agent/goals.py): started (with its spec), check, continued, finished."""

    kind: Literal["goal"] = "goal"
    goal_id: str
    step: Literal["started", "check", "continued", "finished"]
    spec: Any = None
    """For `started`: the GoalSpec (text, check, check_timeout, budget)."""
    check: Any = None
    """For `check`: the CheckResult (passed, exit_code, output, duration, timed_out)."""
    continuation: int | None = None
    state: str | None = None
    reason: str | None = None
    usage: Usage | None = None
    continuations: int | None = None
    turns: int | None = None


class MessageRecord(_Record):
    """A message appended to the model's context (system, user, assistant or tool)."""

    kind: Literal["message"] = "message"
    turn_id: str | None = None
    message: Message


class SystemPromptRecord(_Record):
    """The system prompt was rebuilt at a turn boundary (asked for, or on resuming after the harness
    moved); it replaces the first message."""

    kind: Literal["system_prompt"] = "system_prompt"
    turn_id: str
    content: str
    harness_version: str | None = None


class ModelCall(_Record):
    kind: Literal["model_call"] = "model_call"
    turn_id: str
    purpose: Literal["turn", "llm"] = "turn"
    """`turn`: a step of the turn loop; `llm`: a plain call from code in the kernel."""
    context_messages: int
    """How many context messages the request carried (the reply is the next message record)."""
    usage: Usage
    duration: float
    attempts: int
    finish_reason: str | None = None
    model: str
    prompt_token_ids: list[int] | None = None
    """With `model.record_logprobs`: the prompt's token ids as the server saw them (rl.data trains on these)."""


class SubagentRecord(_Record):
    """A child finished; its own trajectory is in `dir`. Its usage is counted in this session's."""

    kind: Literal["subagent"] = "subagent"
    turn_id: str | None = None
    child_id: str
    name: str
    dir: str
    outcome: str
    usage: Usage
    duration: float


class RefinementRecord(_Record):
    """A refinement's fate: applied (with its commit), pending review, a dry run, rejected or failed."""

    kind: Literal["refinement"] = "refinement"
    turn_id: str | None = None
    refinement_id: str
    trigger: str
    status: str
    summary: str
    rationale: str = ""
    edits: list[dict[str, Any]] = Field(default_factory=list)
    refused: list[dict[str, Any]] = Field(default_factory=list)
    commit: str | None = None
    reason: str | None = None


class CellRecord(_Record):
    kind: Literal["cell"] = "cell"
    turn_id: str
    cell: Cell
    result: CellResult


class McpCallRecord(McpCall, _Record):
    kind: Literal["mcp_call"] = "mcp_call"
    turn_id: str | None = None


class ApprovalRecord(_Record):
    """A request for the user's decision (`status: requested`), and its decision: a command to run
    in a sandbox with more room, or an MCP call under policy `ask` (`request_kind`)."""

    kind: Literal["approval"] = "approval"
    turn_id: str | None = None
    request_id: str
    request_kind: ApprovalKind = "command"
    summary: str
    """The command line, or `server.tool(arguments)`."""
    status: Literal["requested", "approve", "always", "deny"]
    by: str | None = None
    reason: str = ""
    exit_code: int | None = None
    full_env: bool = False
    """The command ran with the person's whole environment, as they asked."""


class CompactionRecord(_Record):
    """Older turns were summarised; `messages` is the whole context from here on."""

    kind: Literal["compaction"] = "compaction"
    turn_id: str
    summary: str
    messages: list[Message]
    usage: Usage
    turn_starts: list[int] = Field(default_factory=list)
    """Where each turn kept verbatim begins in `messages`."""


class TurnFinishedRecord(TurnOutcome, _Record):
    kind: Literal["turn_finished"] = "turn_finished"
    turn_id: str
    harness_version: str | None = None
    """The harness in force in this turn (told to the model in the system prompt or a notice)."""


class ResumedRecord(_Record):
    """The session was brought back in a new process (a daemon restart): its kernel is new."""

    kind: Literal["resumed"] = "resumed"
    reason: str
    harness_version: str | None = None


class CheckpointRecord(_Record):
    """The state at a turn boundary (agent/checkpoints.py): `start` before turn `turn_id` is worked
    on, `end` once it ended, `rewind` just after a rewind restored the workspace. The conversation
    at this point is the context the records before it make."""

    kind: Literal["checkpoint"] = "checkpoint"
    turn_id: str | None = None
    at: Literal["start", "end", "rewind"]
    tree: str | None = None
    """The workspace as a tree in the checkpoint store; None when checkpoints are off or failed."""
    skipped: list[SkippedFile] = Field(default_factory=list)
    harness: dict[str, str | None] = Field(default_factory=dict)
    """Each harness scope's commit (None: the scope had no history yet)."""
    kernel: str | None = None
    """The namespace snapshot in force: its name, "" for a fresh namespace, None when unknown."""
    stored_bytes: int = 0
    """Bytes of changed files this checkpoint copied into the store."""
    duration: float = 0.0


class RewindRecord(_Record):
    """The session went back to the checkpoint before (or, with `after`, at the end of) turn `turn`.
    With the conversation restored, `messages` is the whole context from here on, as for a compaction."""

    kind: Literal["rewind"] = "rewind"
    rewind_id: str
    turn_id: str | None = None
    turn: int
    after: bool = False
    parts: list[str]
    target: str
    """The checkpoint restored: `<turn id>:start` or `<turn id>:end`."""
    before_tree: str | None = None
    """The workspace just before the rewind (nothing is lost: a forced rewind keeps the person's edits here)."""
    files: list[FileChange] = Field(default_factory=list)
    not_restored: list[SkippedFile] = Field(default_factory=list)
    harness: dict[str, str] = Field(default_factory=dict)
    """Each scope rewound, and the new commit that restored it."""
    kernel: dict[str, Any] = Field(default_factory=dict)
    forced: list[str] = Field(default_factory=list)
    """Files a person changed since the checkpoint that the rewind overwrote (with --force)."""
    messages: list[Message] | None = None
    turn_starts: list[int] = Field(default_factory=list)
    notice: str = ""
    """What the model is told at its next turn."""


Record = Annotated[
    SessionRecord | TurnStartedRecord | MessageRecord | SystemPromptRecord | ModelCall | CellRecord | SubagentRecord
    | RefinementRecord | CompactionRecord | TurnFinishedRecord | ResumedRecord | McpCallRecord | ApprovalRecord
    | CheckpointRecord | RewindRecord | GoalRecord | HookRecord | PlanRecord,
    Field(discriminator="kind"),
]
_adapter: TypeAdapter[Record] = TypeAdapter(Record)


class WriteFailed(OSError):
    """A line could not be appended (a full disk, a deleted directory); the file is as it was before."""


class AppendFile:
    """A JSONL file appended to a whole line at a time: a line that cannot be written whole (ENOSPC,
    EIO) is cut back off, so a partial line is never followed by a whole one. Opening it first cuts
    a torn last line a crash left."""

    def __init__(self, path: Path):
        self.path = path
        cut_torn_line(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def append(self, line: str) -> None:
        """`line` (without its newline), written whole or not at all (then WriteFailed)."""
        data = (line + "\n").encode("utf-8")
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as e:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass  # then the next open cuts the torn line
            raise WriteFailed(e.errno, f"could not write to {self.path}: {e.strerror}") from e
        self._size += written

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        fd, self._fd = self._fd, -1  # taken first: a second close (another thread's) finds nothing
        if fd >= 0:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def cut_torn_line(path: Path) -> None:
    """Cut a torn last line (a crash mid-write), so the next record starts on a line of its own."""
    if path.exists():
        with open(path, "rb+") as f:
            end = pos = f.seek(0, os.SEEK_END)
            while pos > 0:
                step = min(65536, pos)
                f.seek(pos - step)
                chunk = f.read(step)
                if pos == end and chunk.endswith(b"\n"):
                    break
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    f.truncate(pos - step + cut + 1)
                    break
                pos -= step
            else:
                f.truncate(0)


class TrajectoryWriter:
    def __init__(self, path: Path):
        self.path = path
        self._file = AppendFile(path)

    def append(self, record: _Record) -> None:
        """One record, flushed; WriteFailed (nothing of it written) when the disk refuses it."""
        self._file.append(record.model_dump_json(exclude_none=True))

    def sync(self) -> None:
        """Make everything written so far durable (turn boundaries)."""
        self._file.sync()

    def close(self) -> None:
        self._file.close()


class TrajectoryError(ValueError):
    pass


def read_records(path: Path, damaged: list[str] | None = None) -> list[Record]:
    """All records of a trajectory; a torn final line is dropped. A bad line elsewhere is an error,
    or, with `damaged` (recovery: a session must still wake), skipped and described in it."""
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    out: list[Record] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = _adapter.validate_json(line)
        except ValueError as e:
            if n == len(lines):  # last line, no newline after it: a write cut short
                break
            problem = f"{path}:{n}: not a trajectory record: {str(e)[:200]}"
            if damaged is None:
                raise TrajectoryError(problem) from None
            damaged.append(problem)
            continue
        if isinstance(record, SessionRecord) and record.schema_version > SCHEMA:
            raise TrajectoryError(f"{path}: written by a newer Prime Agent (trajectory schema {record.schema_version}; "
                                  f"this one reads up to {SCHEMA})")
        out.append(record)
    return out


def find_cell(path: Path, turn_id: str, cell_id: str) -> CellRecord | None:
    """The record of cell `cell_id` of turn `turn_id` (the last, where a turn id came back after a
    rewind); None where there is none. Only the lines that name the cell are parsed."""
    needle = json.dumps(cell_id, ensure_ascii=False)
    found = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if '"kind":"cell"' in line and needle in line:
                with contextlib.suppress(ValueError):
                    record = _adapter.validate_json(line)
                    if isinstance(record, CellRecord) and record.turn_id == turn_id and record.cell.id == cell_id:
                        found = record
    return found


def finish_cut_turn(path: Path, turn_id: str, error: str) -> TurnFinishedRecord | None:
    """The record that closes turn `turn_id`: its own, or, for a turn a dead process left open, a new
    `interrupted` one written now. None when the turn never began. (Recovery: damaged lines are
    skipped.)"""
    records = read_records(path, []) if path.exists() else []
    started = next((r for r in records if isinstance(r, TurnStartedRecord) and r.turn_id == turn_id), None)
    if started is None:
        return None
    finished = next((r for r in records if isinstance(r, TurnFinishedRecord) and r.turn_id == turn_id), None)
    if finished is not None:
        return finished
    calls = [r for r in records if isinstance(r, ModelCall) and r.turn_id == turn_id]
    finished = TurnFinishedRecord(
        turn_id=turn_id, outcome="interrupted", error=error,
        usage=sum((c.usage for c in calls), Usage()), duration=records[-1].ts - started.ts,
        steps=sum(1 for c in calls if c.purpose == "turn"),
        cells=sum(1 for r in records if isinstance(r, CellRecord) and r.turn_id == turn_id),
    )
    writer = TrajectoryWriter(path)
    writer.append(finished)
    writer.close()
    return finished


def in_plan_mode(records: list[Record], created_planning: bool) -> bool:
    """Whether a session is in plan mode after `records`: the last plan record that turns it on
    (`entered`) or off (`approved`, `left`) decides; without one, the mode it was created in."""
    planning = created_planning
    for r in records:
        if isinstance(r, PlanRecord) and r.step in ("entered", "approved", "left"):
            planning = r.step == "entered"
    return planning


def pending_plan(records: list[Record]) -> str | None:
    """The plan proposed and not yet decided (nor voided by plan mode being turned off or on again)."""
    last = next((r for r in reversed(records) if isinstance(r, PlanRecord)), None)
    return last.plan if last is not None and last.step == "proposed" else None


def append_record(path: Path, record: _Record) -> None:
    """Append one record to the trajectory of a session no process is running, durably (fsynced)."""
    writer = TrajectoryWriter(path)
    try:
        writer.append(record)
    finally:
        writer.close()


def contexts(records: list[Record]) -> Iterator[list[Message]]:
    """The model's context as whole conversations: one per stretch between compactions (and rewinds)."""
    current: list[Message] = []
    for r in records:
        if isinstance(r, CompactionRecord) or isinstance(r, RewindRecord) and r.messages is not None:
            if current:
                yield current
            current = list(r.messages or [])
        elif isinstance(r, MessageRecord):
            current.append(r.message)
        elif isinstance(r, SystemPromptRecord) and current:  # later calls saw the rebuilt prompt
            current[0] = Message(role="system", content=r.content)
    if current:
        yield current


def begun(records: list[Record]) -> list[TurnStartedRecord]:
    """The turns a trajectory began, in order: how many there are is the session's turn count, for
    the session taken up again (`Session.resume`) and for the daemon's listing of it alike."""
    return [r for r in records if isinstance(r, TurnStartedRecord)]


def turn_starts(records: list[Record]) -> list[int]:
    """Where each turn begins in the last context `contexts` yields (what compaction needs to know)."""
    starts: list[int] = []
    length = 0
    seen: set[str] = set()
    for r in records:
        if isinstance(r, CompactionRecord):
            starts, length, seen = list(r.turn_starts), len(r.messages), {r.turn_id}
        elif isinstance(r, RewindRecord) and r.messages is not None:
            starts, length, seen = list(r.turn_starts), len(r.messages), set()
        elif isinstance(r, MessageRecord):
            if r.turn_id is not None and r.turn_id not in seen:
                seen.add(r.turn_id)
                starts.append(length)
            length += 1
    return starts


def export_openai_chat(records: list[Record]) -> Iterator[dict[str, Any]]:
    """OpenAI chat-format examples (`{"messages", "tools"}`), one per conversation, for SFT."""
    from agent.actions import IPYTHON_TOOL
    from agent.wire import to_wire

    session = next((r for r in records if isinstance(r, SessionRecord)), None)
    tools = [IPYTHON_TOOL] if session is None or session.action_format == "tools" else None
    for messages in contexts(records):
        if not any(m.role == "assistant" for m in messages):
            continue
        example: dict[str, Any] = {"messages": [to_wire(m) for m in messages]}
        if tools:
            example["tools"] = tools
        yield example


def recorded(config: Config) -> dict:
    """The configuration a session's record keeps: no API key, nor any MCP server's env or header values."""
    data = config.model_dump(mode="json", exclude={"model": {"api_key"}})
    for server in data.get("mcp", {}).get("servers", {}).values():
        for secret in ("env", "headers"):
            server[secret] = {k: "<not recorded>" for k in server.get(secret, {})}
    return data
