"""The daemon API's wire format: request and response bodies (the OpenAPI spec is built from these)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints

from agent.config_models import ModelConfig
from agent.notebook import Notebook
from agent.subagents import ChildInfo
from agent.trajectory import Record
from agent.types import Budget, FileChange, SkippedFile, Usage
from harness_store.store import Change

SessionState = Literal["idle", "queued", "running", "dormant", "closed"]
"""dormant: known from disk, no kernel yet (after a daemon restart, or put to sleep when idle); it wakes on the
next prompt. closed: closed by a person (`sessions close`) or ended with the `prime-agent run` that made it; a
prompt opens it again."""


Directory = Annotated[str, StringConstraints(min_length=1, pattern=r"^[^\x00]*$")]
"""A directory's path as a request names it: no NUL (no file system has one; Python refuses it)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelKey(_Body):
    """A model API key a client gives for its session (what its own OPENAI_API_KEY or config says),
    with the endpoint it is meant for: the daemon uses it only for a session whose endpoint that is.
    Accepted over the Unix socket only; kept in the daemon's memory for that session and never
    written or logged, so a restarted daemon has it again only once a client sends it."""

    api_key: SecretStr = Field(min_length=1, max_length=10_000)
    base_url: str | None = Field(None, description="The endpoint the key is for; None: OpenAI's API.")

    @classmethod
    def of(cls, model: ModelConfig) -> ModelKey | None:
        """The key a client's own model settings hold, if any."""
        return cls(api_key=SecretStr(model.api_key), base_url=model.base_url) if model.api_key else None

    def fits(self, base_url: str | None) -> bool:
        """Meant for `base_url` (trailing slashes aside)."""
        return (self.base_url or "").rstrip("/") == (base_url or "").rstrip("/")

    def wire(self) -> dict[str, Any]:
        """As a request body carries it (the secret in the clear: for the Unix socket only)."""
        return {"api_key": self.api_key.get_secret_value(), "base_url": self.base_url}


KEY_FIELD = Field(None, description="The model API key for this session, from the client (see ModelKey); "
                  "refused over TCP.")


class CreateSession(_Body):
    cwd: Directory = Field(description="The project directory the session works in (absolute).")
    model: str | None = Field(None, min_length=1, description="Model name; default: the daemon's configuration.")
    base_url: str | None = Field(None, min_length=1, description="OpenAI-compatible endpoint for this session.")
    title: str | None = Field(None, max_length=200)
    budget: Budget | None = Field(None, description="Per-turn limits for this session.")
    sandbox: Literal["read-only", "workspace-write", "full-access"] | None = Field(
        None, description="How the OS confines the session's kernel (sandbox.mode); default: the configuration's.")
    mode: Literal["default", "plan"] | None = Field(
        None, description="plan: the workspace stays read-only until a person approves the model's plan "
        "(POST /v1/sessions/{id}/plan), then the same kernel continues in workspace-write (sandbox.plan).")
    config: dict[str, Any] | None = Field(
        None, description="Config overrides for this session, nested as in config.toml, e.g. "
        '{"model": {"action_format": "text", "temperature": 0.2}} (not [daemon], which is the daemon\'s own). '
        "`model`, `base_url` and `budget` above take precedence.")
    key: ModelKey | None = KEY_FIELD


class SessionInfo(BaseModel):
    id: str
    cwd: str
    model: str
    base_url: str | None
    title: str | None
    created: float
    updated: float = Field(description="Last prompt or turn end (or creation).")
    state: SessionState
    turns: int = Field(description="Turns begun so far.")
    queued: int = Field(description="Prompts waiting behind the running turn.")
    last_seq: int = Field(description="Seq of the session's latest event.")
    usage: Usage
    dir: str
    harness_version: str | None = Field(None, description="Each harness scope's commit in force (live sessions).")
    sandbox: str | None = Field(None, description="The sandbox in force, in words (live sessions); "
                                "`full-access: NO SANDBOX ...` or `UNSANDBOXED: why` where none confines it. "
                                "For a session with no kernel, the mode it wakes in.")
    planning: bool = Field(False, description="Plan mode: the workspace is read-only until a person approves a plan.")
    plan: str | None = Field(None, description="The plan waiting for a person's decision (POST .../plan).")
    ignored: list[str] = Field(default_factory=list, description="The project's files not in force until a person "
                               "trusts them (`prime-agent trust`), and its settings refused (a project may only "
                               "tighten the sandbox), a line each (live sessions).")
    goal: str | None = Field(None, description="The session's goal (running, or the last to end) in a line: "
                             "`running · continuation 2 of 10 · 1,200 tokens`; GET .../goal has all of it.")
    elsewhere: int | None = Field(None, description="The pid of the process that hosts the session outside the "
                                  "daemon now (`prime-agent run`): listed, not to be prompted, rewound or closed "
                                  "until that process ends.")


class PruneSessions(_Body):
    older_than_days: float | None = Field(None, gt=0, strict=True, description="Also sessions not used (prompted, a turn begun "
                                          "or ended) for this many days.")
    cwd: Directory | None = Field(None, max_length=4096, description="Only sessions of this directory or one below it.")
    dry_run: bool = Field(False, description="Say what would go; remove nothing.")


class PrunedSession(BaseModel):
    id: str
    cwd: str
    title: str | None
    turns: int
    why: Literal["deleted", "empty", "unused"] = Field(description="deleted: deleted, its files left on disk; "
                                                       "empty: never prompted; unused: not used for older_than_days.")
    bytes: int = Field(description="Its files on disk.")


class Pruned(BaseModel):
    """Sessions removed with their files (none with `dry_run`); live, busy ones and those another process
    hosts are left alone."""

    sessions: list[PrunedSession]
    bytes: int


class Transcript(BaseModel):
    """A session's whole trajectory: every record, in order (agent/trajectory.py)."""

    session: SessionInfo
    records: list[Record]


class ChildTranscript(BaseModel):
    """A subagent's registry entry and whole trajectory."""

    child: ChildInfo
    records: list[Record]


class CloseSession(_Body):
    if_idle: bool = Field(False, description="Only if nothing runs or waits in the session (else 409 `busy`).")


class UpdateSession(_Body):
    title: str | None = Field(None, max_length=200)
    model: str | None = Field(None, min_length=1, max_length=200, description="Used from the next turn on.")
    sandbox: Literal["read-only", "workspace-write", "full-access"] | None = Field(
        None, description="The sandbox mode from the next turn on: the session's kernel restarts in it (its "
        "variables are lost). A session in plan mode leaves it for any other mode (its pending plan is dropped).")
    plan: bool | None = Field(None, description="Plan mode on (the workspace read-only, in workspace-write, until a "
                              "person approves a plan: POST .../plan) or off (a pending plan is dropped), from the "
                              "next turn on: the session's kernel restarts (its variables are lost).")


class DecidePlan(_Body):
    approve: bool
    note: str | None = Field(None, max_length=20_000, description="Why, for the model (a rejection's reason).")
    plan: str | None = Field(None, max_length=200_000, description="The plan as approved, if the person edited it.")


class PlanDecision(BaseModel):
    approved: bool
    turn_id: str | None = Field(description="The turn that carries the approved plan out.")


class Decide(_Body):
    approve: bool


class DecideApproval(_Body):
    decision: Literal["approve", "always", "deny"] = Field(
        description="approve: run the command (or the MCP call) once; always: and every later command of this "
        "session its rule covers, as the request's `prefix` says (docs/sandbox.md#approvals; an MCP request: "
        "every call of `server.tool`, or with `prefix` = the server, of any of its tools); deny: refuse (the "
        "model is told). `always` is refused (400) where the request's `prefix` is null.")
    prefix: str | None = Field(None, min_length=1, max_length=1000,
                               description="With `always`: for an MCP request, the server (or `server.tool`) every "
                               "call of which is approved; for a command, only the request's own `prefix`.")
    full_env: bool = Field(False, description="Run the command with the person's whole environment, secrets "
                           "included (this once); by default it gets the kernel's, secret-looking variables dropped.")


class ApprovalDecision(BaseModel):
    request_id: str
    decision: Literal["approve", "always", "deny"]
    prefix: str | None
    full_env: bool = False


class SendMessage(_Body):
    text: str = Field(min_length=1, max_length=1_000_000)
    mode: Literal["prompt", "steer", "follow_up"] = Field(
        "prompt",
        description="prompt/follow_up: a new turn, queued behind a running one. steer: reaches the running "
        "turn at its next model call (with no turn running, it starts one).",
    )
    key: ModelKey | None = KEY_FIELD
    notebook: Notebook | None = Field(None, description="a notebook's code cells: the turn runs them in the "
                                      "session's kernel, each approved as the model's are, instead of calling the "
                                      "model (`text` is its prompt; mode prompt only)")


class MessageAccepted(BaseModel):
    turn_id: str
    mode: Literal["prompt", "steer", "follow_up"]
    queued: bool = Field(description="True when the turn waits behind another.")


class Interrupt(_Body):
    drop_queued: bool = Field(False, description="Also drop the prompts queued behind the running turn.")
    turn_id: str | None = Field(None, max_length=32, description="Only this turn: interrupt it if it runs, "
                                "drop it if it is queued (409 if neither).")


class Interrupted(BaseModel):
    turn_id: str | None = Field(description="The turn that was running, if any.")
    dropped: list[str] = Field(description="Queued turns dropped.")


class RefineRequest(_Body):
    instructions: str | None = Field(None, max_length=20_000)
    mode: Literal["auto", "review", "dry-run"] | None = None


class Notice(BaseModel):
    message: str = Field(description="What was done with the request, in words (a refinement's planning started, "
                         "or the refiner is busy; a compaction or a new system prompt due at the next turn).")


class RefinementDecision(BaseModel):
    refinement_id: str
    status: str = Field(description="The refinement's outcome: applied, rejected, ...")


class Rollback(_Body):
    ref: str = Field(min_length=1, max_length=100, description="A refinement id or a commit.")
    scope: Literal["user", "project", "session"] = "user"
    to: bool = Field(False, description="Restore the whole scope as it was at `ref`, not undo one change.")
    session: str | None = Field(None, description="The session whose session or project scope is meant.")
    project: str | None = Field(None, description="The project whose project scope is meant (without `session`).")


class RolledBack(Change):
    """The rollback's own change (a new commit; history is never rewritten)."""

    scope: str


class HarnessEntry(BaseModel):
    """An entry in force, as the harness's listing shows it."""

    id: str
    kind: str
    scope: str
    title: str
    summary: str


class RewindRequest(_Body):
    turn: int = Field(ge=1, le=10**9, description="Go back to before this turn began (1-based, in the order "
                      "turns began; the turn after the last is the state the last one left).")
    after: bool = Field(False, description="The state when turn `turn` ended, not before it began.")
    code: bool = Field(True, description="Restore the workspace's files.")
    conversation: bool = Field(True, description="Restore the model's context to that point.")
    harness: bool = Field(True, description="Restore each harness scope (a new commit; history is kept).")
    kernel: bool = Field(True, description="Restore the kernel's namespace (what the snapshot could keep).")
    force: bool = Field(False, description="Overwrite files a person changed since the checkpoint.")
    dry_run: bool = Field(False, description="Only say what would change (and what stands in the way).")


class RewindResult(BaseModel):
    rewind_id: str | None = Field(description="The rewind's id in the trajectory; None for a dry run.")
    dry_run: bool
    turn: int
    after: bool
    parts: list[str]
    files: list[FileChange] = Field(description="Each file changed (or to change).")
    not_restored: list[SkippedFile] = Field(default_factory=list,
                                            description="Files the checkpoint skipped (size caps), left alone.")
    conflicts: list[str] = Field(default_factory=list,
                                 description="What a person changed since the checkpoint that the rewind overwrites.")
    harness: dict[str, str | None] = Field(default_factory=dict)
    kernel: dict[str, Any] | str | None = None
    notice: str = Field("", description="What the model is told at its next turn.")


class KernelInfo(BaseModel):
    connection_file: str
    state: str


class Status(BaseModel):
    pid: int
    version: str
    socket: str
    tcp: str | None
    remote_unsandboxed: bool = Field(False, description="Clients over TCP may loosen a sandbox and approve what "
                                     "runs outside one (the daemon was started with --allow-remote-unsandboxed).")
    uptime: float
    started: float = Field(description="When the daemon started (seconds since the epoch).")
    model_env: dict[str, str] = Field(description="The model settings in the daemon's environment when it "
                                      "started (PRIME_AGENT_MODEL, OPENAI_BASE_URL; OPENAI_API_KEY as `set`), "
                                      "beneath config.toml's and each session's own.")
    client_keys: int = Field(description="Sessions using a model API key their client gave (kept in memory only).")
    sessions: int = Field(description="Sessions listed (not deleted).")
    live_sessions: int = Field(description="Sessions with a kernel.")
    running_turns: int
    pool_ready: int = Field(description="Pre-started kernels ready to hand out.")
    disk_free_mb: float = Field(description="Free space where the daemon keeps its sessions.")
    write_error: str | None = Field(None, description="The last write the disk refused (e.g. it is full), if any.")


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class OpenWeb(_Body):
    address: str = Field(min_length=3, max_length=300, description="HOST:PORT the page is served on (port 0: any free one).")
    cwd: Directory = Field(description="Where the page's New session opens by default.")


class WebAccess(BaseModel):
    """The first line of POST /v1/web: where the page is and the token that logs a browser in."""

    address: str = Field(description="HOST:PORT the daemon listens on.")
    token: str = Field(description="The login token: valid while the request that got it stays open.")


class WebLogin(_Body):
    token: str = Field(min_length=1, max_length=200)


class LoggedIn(BaseModel):
    xsrf: str = Field(description="Send it as `X-Prime-Agent-Xsrf` with every request, beside the cookie.")
    cwd: str = Field(description="The folder `prime-agent web` runs in: New session's default.")
