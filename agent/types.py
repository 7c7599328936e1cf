"""Core values of one agent session: messages, cells, results, usage, turns (events are in
agent/events.py).

Typed inside; they become JSON only on disk (trajectory) and on the wire (events),
through pydantic's own serialisation.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with every lone UTF-16 surrogate (half a character: what a server that cut a multi-byte
    character, or JSON's `"\\ud83d"`, leaves) replaced by U+FFFD, so no encoder downstream (a JSON
    journal, the next request to the model, a terminal) can fail on it."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def has_control(text: str) -> bool:
    """Whether `text` holds a character `visible` writes as an escape."""
    return _CONTROL.search(text) is not None


def visible(text: str) -> str:
    """`text` as it may be put in front of a person: each control character but newline and tab (C0,
    DEL, C1: a terminal acts on them, `\\r` and `ESC[2K` redraw the line) and each bidirectional
    override (an editor reorders what follows it) written as its escape (`\\x1b`, `\\u202e`), so a
    terminal, the app or an editor shows what the text holds, not what it draws."""
    if not has_control(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


Text = Annotated[str, AfterValidator(valid_text)]
"""A str that came from outside (a model, a kernel, a client): made valid where it becomes ours."""

Role = Literal["system", "user", "assistant", "tool"]
Outcome = Literal["completed", "interrupted", "budget_exhausted", "timed_out", "error"]


ApprovalKind = Literal["command", "mcp", "cell"]
"""What waits for a person: a command to run in a sandbox with more room, an MCP call under policy `ask`,
or a cell a PreToolUse hook asked about (`permissionDecision: "ask"`)."""

class ToolCall(BaseModel):
    """One tool call as the model wrote it; `arguments` is the raw JSON text, parsed by the loop."""

    id: str
    name: Text
    arguments: Text


class Blocks(BaseModel):
    """An assistant reply in its provider's own shape (agent/providers): Anthropic's content blocks
    (thinking with its signature, redacted_thinking, text, tool_use) or OpenAI Responses' output items
    (reasoning with its encrypted_content, message, function_call), as the service sent them."""

    provider: Literal["anthropic", "openai-responses"]
    items: list[dict[str, Any]]


class Image(BaseModel):
    """An image a vision model is shown (`model.vision`): a cell's display, prepared by agent/vision.py."""

    mime: Literal["image/png", "image/jpeg"]
    data: str
    """Base64."""
    label: Text
    """`image/png 640×480 from cell call_1`: what the model is told of it."""

    @property
    def stub(self) -> str:
        """What the model reads in its place in a request that holds newer images (`model.max_images`),
        or that goes to a model that sees none."""
        return f"[{self.label}: no longer shown to you]"


class Message(BaseModel):
    role: Role
    content: Text = ""
    images: list[Image] = Field(default_factory=list)
    """For user messages: images the model is shown with the text (agent/vision.py)."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    """For role=tool: the call this message answers."""
    token_ids: list[int] | None = None
    """For assistant messages: the sampled token ids, when the server returned them."""
    logprobs: list[float] | None = None
    """For assistant messages: the log-probability of each sampled token, when requested."""
    reasoning: Text | None = None
    """For assistant messages: the model's reasoning (a server's `reasoning_content` / `reasoning`
    field, or a leading `<think>` block), kept apart from `content`: recorded and shown, and sent
    back only where the provider requires it (`model.send_reasoning`)."""
    blocks: Blocks | None = None
    """For assistant messages from a native provider: the reply as it came, sent back to that
    provider unchanged (other providers are sent `content`, `tool_calls` and `reasoning`)."""


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Of `prompt_tokens`, how many the provider read from its prompt cache (billed at the cached rate)."""
    cache_write_tokens: int = 0
    """Of `prompt_tokens`, how many the provider wrote to its prompt cache (Anthropic bills them above
    the input rate)."""
    reasoning_tokens: int = 0
    """Of `completion_tokens`, how many the model spent reasoning."""
    cost: float = 0.0
    """Dollars: the server's own figure where it reports one (OpenRouter's `usage.cost`), else
    the price table's (`model.prices`)."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost=self.cost + other.cost,
        )

    def describe(self) -> str:
        """`1,200 in (800 cached, 100 written) · 300 out (120 reasoning) · $0.0042`, for a person."""
        cache = [f"{self.cached_tokens:,} cached"] * bool(self.cached_tokens) + \
            [f"{self.cache_write_tokens:,} written"] * bool(self.cache_write_tokens)
        text = f"{self.prompt_tokens:,} in" + (f" ({', '.join(cache)})" if cache else "")
        text += f" · {self.completion_tokens:,} out" + (
            f" ({self.reasoning_tokens:,} reasoning)" if self.reasoning_tokens else "")
        return text + (f" · ${self.cost:.4f}" if self.cost else "")


class Completion(BaseModel):
    """What one model call returned."""

    message: Message
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None
    model: str = ""
    attempts: int = 1
    duration: float = 0.0
    prompt_token_ids: list[int] | None = None
    """The prompt as the server tokenized (and perhaps truncated) it, when it says so (the
    project's policy server does): what the sampled tokens were conditioned on, exactly."""


class Cell(BaseModel):
    id: str
    code: Text
    """Parsed from the model's reply (a tool call's JSON may spell a lone surrogate as an escape)."""
    timeout: float | None = None
    """Seconds; None uses the kernel's configured cell timeout."""


class Attachment(BaseModel):
    """Rich display output of a cell: an image (kept out of the model's text, but for a line naming it,
    and shown to a vision model), or a table or Markdown (`text/markdown`: the model reads it, a
    person's front end renders it)."""

    mime: str
    data: Text
    """Base64 for binary types, text otherwise."""

    @property
    def is_text(self) -> bool:
        """Text the model reads as it is (a table as Markdown), not an image named by a line."""
        return self.mime == "text/markdown"


KernelEvent = Literal["timed_out", "interrupted", "died", "restarted"]


class CellResult(BaseModel):
    model_config = ConfigDict(validate_assignment=True)  # the kernel runtime fills one in as output arrives

    stdout: Text = ""
    stderr: Text = ""
    result: Text | None = None
    """The text/plain value of the cell's last expression, if any."""
    error_name: str | None = None
    error_value: Text | None = None
    traceback: Text | None = None
    attachments: list[Attachment] = Field(default_factory=list)
    truncated: dict[str, int] = Field(default_factory=dict)
    """Per stream, how many characters were cut from the middle."""
    kernel_events: list[KernelEvent] = Field(default_factory=list)
    kernel_message: Text | None = None
    """What the runtime did to the kernel during this cell (timeout, death, restart), for the model."""
    hook_notes: list[Text] = Field(default_factory=list)
    """What the person's hooks said about this cell to the model (agent/hooks.py)."""
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error_name is None and not self.kernel_events

    def render(self) -> str:
        """The text the model sees for this cell."""
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        if self.result is not None:
            parts.append(self.result if not parts else "[result]\n" + self.result)
        if self.traceback:
            parts.append(self.traceback.rstrip("\n"))
        elif self.error_name:
            parts.append(f"{self.error_name}: {self.error_value}")
        for a in self.attachments:  # a table as Markdown as it is; an image as a line naming it
            parts.append(a.data.rstrip("\n") if a.is_text else
                         f"[display: {a.mime}, {len(a.data)} bytes, shown to the user]")
        if self.kernel_message:
            parts.append("[kernel] " + self.kernel_message)
        parts += [f"[hook] {note}" for note in self.hook_notes]
        return "\n".join(parts) if parts else "(no output)"


DiffLine = Literal["hunk", "added", "removed", "context", "cut"]


class FileDiff(BaseModel):
    """One workspace file a cell (or a turn) changed, as the checkpoint store saw it
    (agent/checkpoints/diffs.py): bounded, whatever the file."""

    path: str
    """Relative to the workspace."""
    change: Literal["created", "modified", "deleted"]
    added: int | None = None
    removed: int | None = None
    """Lines; None where they were not counted (a binary or large file: see `note`)."""
    diff: Text = ""
    """The unified diff's hunks (`@@` lines, then ` `, `+` and `-` lines), without the file header;
    empty where `note` says why, and in a turn's summary."""
    cut: int = 0
    """Lines of the diff left out past the cap."""
    note: str | None = None
    """Why there is no diff: `binary, 2,048 bytes`, `large: 300,000 -> 310,000 bytes`, ..."""
    whole: bool = False
    """`old_text` and `new_text` hold the whole file before and after (it is small): what an editor's
    diff view takes (ACP's diff content)."""
    old_text: Text = ""
    new_text: Text = ""

    def headline(self) -> str:
        """`calc.py +1 -1`, `new.txt (created) +3`, `logo.png (binary: 0 -> 2,048 bytes)`."""
        counts = f" +{self.added} -{self.removed}" if self.added is not None and self.removed is not None else ""
        return (f"{self.path}{f' ({self.change})' if self.change != 'modified' else ''}{counts}"
                + (f" ({self.note})" if self.note else ""))

    def lines(self) -> list[tuple[DiffLine, str]]:
        """The diff's lines, each with what it is (for a front to colour), and a last line saying
        how many were cut."""
        kinds: dict[str, DiffLine] = {"@": "hunk", "+": "added", "-": "removed"}
        out = [(kinds.get(line[:1], "context"), line) for line in self.diff.splitlines()]
        return out + ([("cut", f"... {self.cut:,} more lines of diff not kept")] if self.cut else [])


class FilesChanged(BaseModel):
    """What a cell, or a whole turn, changed in the workspace."""

    files: list[FileDiff]
    more: int = 0
    """Files changed past the cap on files listed."""

    @property
    def added(self) -> int:
        return sum(f.added or 0 for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed or 0 for f in self.files)

    def summary(self) -> str:
        """`3 files changed, +12 -4`, and how many files' lines the counts leave out (binary, large,
        past the cap on files listed)."""
        n = len(self.files) + self.more
        uncounted = sum(f.added is None for f in self.files) + self.more
        return (f"{n} file{'s' if n != 1 else ''} changed, +{self.added} -{self.removed}"
                + (f", lines of {uncounted} not counted" if uncounted else ""))


# --- facts a session both records (agent/trajectory.py) and tells (agent/events.py) ---------------
# Each is typed once, here; the record and the event carry its fields (and add their own).


class TurnBegun(BaseModel):
    """A turn's start: its prompt, and the goal it works toward if it is one of a goal's turns."""

    prompt: Text
    goal_id: str | None = None
    """The goal this turn works toward (its `goal` records say how the goal went), so a whole goal can
    be scored as one."""
    continuation: int | None = None
    """0 for a goal's first turn, n for its n-th continuation."""


class TurnOutcome(BaseModel):
    """How a turn ended."""

    outcome: Outcome
    answer: Text | None = None
    error: Text | None = None
    usage: Usage = Field(default_factory=Usage)
    duration: float = 0.0
    steps: int = 0
    cells: int = 0


class McpCall(BaseModel):
    """A cell's call to an MCP server's tool (or a read of one of its resources), and how it went."""

    cell_id: str | None = None
    server: str
    tool: str
    """The tool's name, or `read:URI` for a resource."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    outcome: Literal["ok", "error", "denied", "cancelled"]
    result: Any = None
    """The result as the trajectory keeps it (binary data as its size, long text cut)."""
    error: Text | None = None
    duration: float = 0.0


class Budget(BaseModel):
    """Limits on one turn; None means unlimited."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int | None = 200
    """Model calls in one turn."""
    max_cells: int | None = 500
    """Code cells executed in one turn."""
    max_tokens: int | None = None
    """Prompt plus completion tokens spent in one turn."""
    max_seconds: float | None = 1800.0
    """Wall-clock seconds for one turn: half an hour, so that no turn nobody watches (a `send`, a
    schedule, a session left running) goes on for good; a person goes on with another prompt."""
    max_repeats: int | None = Field(3, ge=2)
    """Cells in a row with the same code and the same result (the model going round in circles)
    after which the turn ends."""

    def left(self, turn: Turn | None) -> Budget:
        """What `turn` has not used of this budget (all of it when no turn runs); `max_repeats`, a limit on
        no quantity used, as it is."""
        if turn is None:
            return self
        used = {"max_steps": turn.steps, "max_cells": turn.cells, "max_tokens": turn.usage.total_tokens,
                "max_seconds": time.monotonic() - turn.started}
        return self.model_copy(update={k: None if (limit := getattr(self, k)) is None else max(0, limit - used[k])
                                       for k in used})

    def within(self, limit: Budget) -> Budget:
        """Each limit the lower of this one's and `limit`'s (None, no limit, is never the lower)."""
        return Budget(**{k: min((v for v in (getattr(self, k), getattr(limit, k)) if v is not None), default=None)
                         for k in type(self).model_fields})


@dataclass
class Turn:
    """One user prompt through to the model's final answer, while it runs."""

    id: str
    prompt: str
    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    """Model calls so far."""
    cells: int = 0
    usage: Usage = field(default_factory=Usage)
    spend: dict[str, Usage] = field(default_factory=dict)
    """`usage` by what it was for: turn (the loop's model calls), compaction, refine, llm, subagent."""
    stop: Exception | None = None
    """Set from outside the loop (`final(answer)` from the kernel, an interrupt): what ends the
    turn at the loop's next check. The first one set wins."""

    same_cells: tuple[int, tuple[str, ...]] = (0, ())
    """How many cells in a row so far ran the same code with the same result, and that code and result."""
    final: bool = False
    """Code called `final(answer)` (rather than the model answering without a cell)."""
    goal_id: str | None = None
    continuation: int | None = None
    """The goal this turn works toward, and which of its turns it is (0 the first)."""

    def stop_with(self, reason: Exception) -> None:
        if self.stop is None:
            self.stop = reason


class TurnResult(TurnOutcome):
    """A turn's end as its caller gets it."""

    turn_id: str
    final: bool = False
    """The turn ended with a call to `final()`."""


class SkippedFile(BaseModel):
    """A workspace file a checkpoint did not copy."""

    path: str
    bytes: int = 0
    reason: str


class FileChange(BaseModel):
    """A workspace file a rewind changed (or, in a dry run, would)."""

    path: str
    change: Literal["restored", "created", "deleted"]
