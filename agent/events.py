"""Events: what a session tells its clients, one pydantic model per `type`.

Producers build them as typed values (`CellStarted(cell_id=..., code=...)`); the session stamps
`seq` and `session_id` when it emits one. They become JSON once, at the edge (the daemon's
journal and event stream, `prime-agent run --json`), and are read back with `parse_event`.
A field a producer leaves out or a consumer misspells is a type error, not a silent `None`.

On the wire an event is flat: `{"seq", "session_id", "turn_id", "ts", "type", ...its fields}`.
Journals written before this shape (schema 1: the fields nested under `data`) are migrated
forward by `migrate_v1` (see daemon/meta.py).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agent.hooks import HookCall
from agent.types import (ApprovalKind, CellResult, FileChange, FilesChanged, McpCall, Outcome, Text, ToolCall, TurnBegun,
                         TurnOutcome, Usage)


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = 0
    """Increases by one per event within a session (`Sequence`); set when the event is emitted. A daemon
    that cannot journal an event (a full disk) still sends it to live readers, with seq 0."""
    session_id: str = ""
    turn_id: str | None = None
    ts: float = Field(default_factory=time.time)


class Sequence:
    """A session's one counter of event numbers (`seq`: from 1, no gaps). Whoever records its
    events durably owns it: a daemon's event journal, which goes on across processes and `take`s
    a number once the event is written; where nothing does, the session itself, which takes a
    number once every listener took the event. Everyone else reads `last`: a number not taken (an
    event the journal refused) goes to the next event."""

    def __init__(self, last: int = 0):
        self.last = last
        """The number of the last event taken."""

    def take(self, seq: int) -> None:
        """`seq` is used (ValueError where it is not the next number)."""
        if seq != self.last + 1:
            raise ValueError(f"event {seq} does not follow {self.last}")
        self.last = seq


# --- the session ---------------------------------------------------------------------------------


class SessionStarted(_Event):
    type: Literal["session.started"] = "session.started"
    dir: str
    cwd: str
    model: str
    sandbox: str = ""
    """The sandbox in force, in words (`workspace-write`, `full-access: NO SANDBOX ...`)."""
    ignored: list[str] = Field(default_factory=list)
    """The project's files not in force until a person trusts them (`prime-agent trust`), and its
    settings refused (a project may only tighten the sandbox): a line each (`Config.ignored`)."""
    context_window: int | None = None
    """Tokens the model accepts, as the session uses it (the user's, else its server's, else the default)."""


class SessionResumed(_Event):
    """The session was taken up in a new process from its trajectory: its kernel is new."""

    type: Literal["session.resumed"] = "session.resumed"
    reason: Text
    turns: int
    sandbox: str = ""
    ignored: list[str] = Field(default_factory=list)
    """As SessionStarted's."""
    context_window: int | None = None


class Rewound(_Event):
    """The session went back to a checkpoint (`rewind`); the record is in the trajectory too."""

    type: Literal["session.rewound"] = "session.rewound"
    rewind_id: str
    turn: int
    after: bool = False
    parts: list[str]
    files: list[FileChange] = Field(default_factory=list)
    """Each file the rewind changed."""
    harness: dict[str, str] = Field(default_factory=dict)
    kernel: dict[str, Any] = Field(default_factory=dict)
    forced: list[str] = Field(default_factory=list)
    notice: Text = ""


class Note(_Event):
    """Something said to the user: `note(text)` from the kernel, or the daemon's own remark."""

    type: Literal["note"] = "note"
    text: Text


class Error(_Event):
    """A failure the session survived (the turn's own failures end it: see `TurnFinished.error`)."""

    type: Literal["error"] = "error"
    message: Text


class UsageCharged(_Event):
    """Model spend outside any running turn (a refinement planned between turns, a child that outlived
    its parent's turn); `turn_id` names the turn that caused it, when one did. Spend inside a turn is
    in that turn's `TurnFinished.usage`."""

    type: Literal["usage"] = "usage"
    usage: Usage
    purpose: str


# --- turns ---------------------------------------------------------------------------------------


class TurnQueued(_Event):
    type: Literal["turn.queued"] = "turn.queued"
    prompt: Text
    position: int


class TurnStarted(TurnBegun, _Event):
    type: Literal["turn.started"] = "turn.started"


class TurnFinished(TurnOutcome, _Event):
    type: Literal["turn.finished"] = "turn.finished"
    spend: dict[str, Usage] = Field(default_factory=dict)
    """`usage` by what it was for: turn, compaction, refine, llm, subagent."""
    files: FilesChanged | None = None
    """The workspace files the turn's cells changed, from its start to its last cell: each file's line
    counts, not its diff (the cells' `files` have those)."""


class SteerQueued(_Event):
    """A person's message for the running turn, waiting for its next model call."""

    type: Literal["steer.queued"] = "steer.queued"
    text: Text


class SteerDelivered(_Event):
    type: Literal["steer.delivered"] = "steer.delivered"
    text: Text


class SteerReturned(_Event):
    """Steering no model call took because the person interrupted the turn: handed back to them (the
    app puts it in the prompt again), not sent."""

    type: Literal["steer.returned"] = "steer.returned"
    text: Text


class MessageDelivered(_Event):
    """A message from another agent (parent or child) reached the model."""

    type: Literal["message.delivered"] = "message.delivered"
    sender: str
    text: Text


class Compaction(_Event):
    type: Literal["compaction"] = "compaction"
    folded_messages: int
    summary: Text


# --- the model -----------------------------------------------------------------------------------


class ModelStarted(_Event):
    type: Literal["model.started"] = "model.started"
    step: int


class ModelDelta(_Event):
    type: Literal["model.delta"] = "model.delta"
    text: Text
    reasoning: bool = False
    """The model's reasoning rather than its answer (shown dimmed; never sent back unless required)."""


class ModelRetry(_Event):
    type: Literal["model.retry"] = "model.retry"
    attempt: int
    delay: float
    reason: Text


class ModelFallback(_Event):
    """The model in use kept failing (`model.fallback_after` attempts in a row): the session goes on
    with the next of `model.fallback`."""

    type: Literal["model.fallback"] = "model.fallback"
    from_model: str
    to_model: str
    reason: Text


class ModelCompleted(_Event):
    type: Literal["model.completed"] = "model.completed"
    text: Text
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    reasoning: Text | None = None
    """The model's reasoning for this step, when it gave any."""


# --- cells ---------------------------------------------------------------------------------------


class CellStarted(_Event):
    type: Literal["cell.started"] = "cell.started"
    cell_id: str
    code: Text


class CellOutput(_Event):
    type: Literal["cell.output"] = "cell.output"
    cell_id: str
    stream: str
    text: Text


class CellFinished(_Event):
    type: Literal["cell.finished"] = "cell.finished"
    cell_id: str
    result: CellResult
    """With its text attachments (tables and Markdown, capped: a front end renders them) but not its
    images (the trajectory keeps them: `GET .../cells/{cell_id}/outputs`): see `attachments`."""
    attachments: list[str] = Field(default_factory=list)
    """The MIME type of each display attachment."""
    files: FilesChanged | None = None
    """The workspace files the cell changed, with their diffs (None: none, or `checkpoints.diffs` is off)."""


# --- the harness and its refinements -------------------------------------------------------------


class HarnessEdited(_Event):
    """A person edited a harness scope with their own editor; committed as `source: user` (`external`
    while an unsandboxed kernel ran, which may have made the edit)."""

    type: Literal["harness.edited"] = "harness.edited"
    scope: str
    entries: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    source: Literal["user", "external"] = "user"


class HarnessReloaded(_Event):
    type: Literal["harness.reloaded"] = "harness.reloaded"
    harness_version: str | None


class RefinementProposed(_Event):
    type: Literal["refinement.proposed"] = "refinement.proposed"
    id: str
    trigger: str
    summary: Text
    rationale: Text
    edits: list[dict[str, Any]] = Field(default_factory=list)


class Refused(BaseModel):
    id: str
    reason: Text


class _RefinementDecided(_Event):
    id: str
    summary: Text
    diff: Text = ""
    reason: Text = ""
    scopes: list[str] = Field(default_factory=list)
    refused: list[Refused] = Field(default_factory=list)


class RefinementApplied(_RefinementDecided):
    type: Literal["refinement.applied"] = "refinement.applied"


class RefinementPending(_RefinementDecided):
    """Waits for a person's approval (refine.mode = "review")."""

    type: Literal["refinement.pending"] = "refinement.pending"


class RefinementDryRun(_RefinementDecided):
    type: Literal["refinement.dry_run"] = "refinement.dry_run"


class RefinementRejected(_RefinementDecided):
    type: Literal["refinement.rejected"] = "refinement.rejected"


class RefinementFailed(_Event):
    type: Literal["refinement.failed"] = "refinement.failed"
    trigger: str
    reason: Text


class RefinementSkipped(_Event):
    """Auto-refine's review call said there is nothing worth changing."""

    type: Literal["refinement.skipped"] = "refinement.skipped"
    trigger: str
    rationale: Text


class RefinementRolledBack(_Event):
    type: Literal["refinement.rolled_back"] = "refinement.rolled_back"
    ref: str
    """The change undone (a refinement id or commit)."""
    scope: str
    id: str
    """The rollback's own refinement id."""
    entries: list[str] = Field(default_factory=list)


# --- MCP and approvals ---------------------------------------------------------------------------


class McpCalled(McpCall, _Event):
    type: Literal["mcp.called"] = "mcp.called"



"""command: the kernel asks to run a shell command in a sandbox with more room (`request_permission`);
mcp: a cell calls a tool of an MCP server whose policy is `ask`."""


class ApprovalRequested(_Event):
    """Something waits for the user's decision; decide it with POST /v1/sessions/{id}/approvals/{request_id}
    (approve, always, deny)."""

    type: Literal["approval.requested"] = "approval.requested"
    request_id: str
    kind: ApprovalKind = "command"
    summary: Text
    """The command line, or the MCP call as `server.tool(arguments)` (shortened)."""
    reason: Text = ""
    """Why the kernel asks (a command's request)."""
    prefix: str | None
    """What `always` approves for the rest of the session: the command's rule as agent/approval_rules.py
    shows it (the same command again; `git commit -m …`: the same options, any paths and message;
    `cat -n …`: the same options, paths inside the workspace), or every call of this MCP tool
    (`server.tool`). None: `always` is not offered (an interpreter, a launcher, a package manager, an
    option that runs a command, a chain...): approve once or deny."""
    runs_in: Text = ""
    """Where an approved command runs, in words: a sandbox of its own (the workspace writable, and its
    `.git` for a line of git commands), or unconfined where the OS cannot sandbox."""
    notes: list[Text] = Field(default_factory=list)
    """What the person must know before deciding: a `.git` the agent made since the session began,
    control characters in the command, no sandbox on this machine."""
    server: str | None = None
    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    """An MCP call's."""
    cell_id: str | None = None


class ApprovalDecided(_Event):
    type: Literal["approval.decided"] = "approval.decided"
    request_id: str
    kind: ApprovalKind = "command"
    decision: Literal["approve", "always", "deny"]
    by: Literal["user", "rule", "policy", "timeout", "cancelled", "hook", "no-terminal"]
    """user: a person decided; rule: an earlier `always`; policy: `sandbox.approval = "never"`, or nobody
    can answer here (outside the daemon and a terminal); timeout: nobody decided in time; cancelled:
    the cell that asked was interrupted; no-terminal: the terminal to ask at could not be opened; hook:
    the person's PermissionRequest hook."""
    exit_code: int | None = None
    """A command's, once it ran (approved)."""
    full_env: bool = False
    """It ran with the person's whole environment (they asked); else with the kernel's, secrets dropped."""


# --- plan mode (sandbox.plan) --------------------------------------------------------------------


class PlanProposed(_Event):
    """The model proposed a plan (`propose_plan`); decide it with POST /v1/sessions/{id}/plan."""

    type: Literal["plan.proposed"] = "plan.proposed"
    plan: Text


class PlanDecided(_Event):
    """A person approved the plan (the workspace is writable now, in the same kernel) or rejected it."""

    type: Literal["plan.decided"] = "plan.decided"
    approved: bool
    note: Text | None = None
    plan: Text
    """The plan as approved (a person may have edited it)."""


# --- hooks (agent/hooks.py) ----------------------------------------------------------------------


class HookRan(HookCall, _Event):
    """One of the person's hooks ran (`cell_id`: the cell it concerned, if one did)."""

    type: Literal["hook.ran"] = "hook.ran"


# --- subagents -----------------------------------------------------------------------------------


class SubagentSpawned(_Event):
    type: Literal["subagent.spawned"] = "subagent.spawned"
    id: str
    name: str
    dir: str


class SubagentFinished(_Event):
    type: Literal["subagent.finished"] = "subagent.finished"
    id: str
    name: str
    outcome: str
    answer: Text | None = None
    error: Text | None = None
    usage: Usage = Field(default_factory=Usage)


# --- goals (agent/goals.py) ---------------------------------------------------------------------


class GoalStarted(_Event):
    type: Literal["goal.started"] = "goal.started"
    goal_id: str
    text: Text
    check: Text | None = None
    budget: dict[str, Any] = Field(default_factory=dict)


class GoalCheck(_Event):
    """The goal's check ran after a turn (or, without a check, whether the turn called `final()`)."""

    type: Literal["goal.check"] = "goal.check"
    goal_id: str
    passed: bool
    exit_code: int | None = None
    output: Text = ""
    duration: float = 0.0


class GoalContinued(_Event):
    """A continuation turn starts: the check failed and the budget has room."""

    type: Literal["goal.continued"] = "goal.continued"
    goal_id: str
    continuation: int
    budget_left: dict[str, float] = Field(default_factory=dict)


class GoalFinished(_Event):
    type: Literal["goal.finished"] = "goal.finished"
    goal_id: str
    state: Literal["achieved", "exhausted", "stopped", "error"]
    reason: Text
    continuations: int
    turns: int
    usage: Usage = Field(default_factory=Usage)
    seconds: float = 0.0


class ScheduleFired(_Event):
    """A schedule of the daemon fired into this session (`turn_id`: the prompt it sent), or did not:
    `skipped` (its last prompt still queued), `missed` (fires while the daemon was down, not replayed),
    `failed` (the session could not take it)."""

    type: Literal["schedule.fired"] = "schedule.fired"
    schedule_id: str
    outcome: Literal["sent", "queued", "skipped", "missed", "failed"]
    missed: int = 0
    heartbeat: bool = False
    reason: Text | None = None


Event = Annotated[
    SessionStarted | SessionResumed | Rewound | Note | Error | UsageCharged
    | TurnQueued | TurnStarted | TurnFinished | SteerQueued | SteerDelivered | SteerReturned | MessageDelivered
    | Compaction
    | ModelStarted | ModelDelta | ModelRetry | ModelFallback | ModelCompleted
    | CellStarted | CellOutput | CellFinished
    | HarnessEdited | HarnessReloaded
    | RefinementProposed | RefinementApplied | RefinementPending | RefinementDryRun | RefinementRejected
    | RefinementFailed | RefinementSkipped | RefinementRolledBack
    | McpCalled | ApprovalRequested | ApprovalDecided | HookRan | PlanProposed | PlanDecided
    | SubagentSpawned | SubagentFinished
    | GoalStarted | GoalCheck | GoalContinued | GoalFinished | ScheduleFired,
    Field(discriminator="type"),
]
"""Every event a client can see."""

Decided = RefinementApplied | RefinementPending | RefinementDryRun | RefinementRejected
"""A refinement's outcome (`isinstance(e, Decided)`)."""

EVENTS: TypeAdapter[Event] = TypeAdapter(Event)
DECIDED: dict[str, type[_RefinementDecided]] = {
    "applied": RefinementApplied, "pending": RefinementPending, "dry-run": RefinementDryRun,
}
"""A refinement's outcome status -> its event (any other status is a rejection)."""


def parse_event(data: str | bytes) -> Event:
    """One event from its JSON (as the journal and the event stream carry it)."""
    return EVENTS.validate_json(data)


def migrate_v1(event: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: the type's fields move out of `data` to the top level; fields schema 1 wrote
    that schema 2 has no place for are dropped (none were read), and a null takes the field's default."""
    data = event.pop("data", None) or {}
    cls = _by_type().get(event.get("type", ""))
    if cls is not None:
        data = {k: v for k, v in data.items() if k in cls.model_fields and v is not None}
        if cls is CellFinished and isinstance(data.get("result"), dict):
            data["result"] = {k: v for k, v in data["result"].items() if k in CellResult.model_fields}
    return {**event, **{k: v for k, v in data.items() if k not in event}}


def _by_type() -> dict[str, type[_Event]]:
    return {cls.model_fields["type"].default: cls for cls in _leaves(_Event)}


def _leaves(cls: type[_Event]) -> list[type[_Event]]:
    subs = cls.__subclasses__()
    return [leaf for sub in subs for leaf in _leaves(sub)] if subs else [cls]
