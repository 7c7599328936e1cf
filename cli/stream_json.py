"""`prime-agent run --output-format stream-json|json` and `--input-format stream-json`: the run in
Claude Code's headless shape (`claude -p --output-format stream-json`), so scripts written for it
port with a flag.

One JSON object a line: a `system` message (subtype `init`) first; `assistant` messages whose
content blocks are the model's `text` (and `thinking`) and a `tool_use` (name `ipython`, input
`{"code"}`) for each cell; a `user` message with the cell's `tool_result`; and, for each turn, a
`result` with the answer, `is_error`, durations, turns, cost and usage. `json` prints only the
results. Token counts are Anthropic's: `input_tokens` excludes what the cache served
(`cache_read_input_tokens`) and what it stored (`cache_creation_input_tokens`).

With `--input-format stream-json`, prompts come on stdin, one a line, as Claude Code reads them:
`{"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "..."}]}}`
(content may also be a string); each is a turn of the same session.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any, TextIO

from agent import events as ev
from agent.types import Usage

SUBTYPES = {"completed": "success", "budget_exhausted": "error_max_turns", "interrupted": "error_during_execution",
            "timed_out": "error_during_execution", "error": "error_during_execution"}
"""A turn's outcome as the result's subtype (Claude Code's names)."""


def permission_mode(sandbox: str, planning: bool) -> str:
    """The sandbox in force (as a session's events say it) as Claude Code's permission mode: plan mode is
    `plan`; read-only, where every write is a request to a person, `default`; workspace-write, where the
    agent's code writes the workspace unasked and asks for anything beyond it, `acceptEdits`; full-access
    (or no sandbox at all), `bypassPermissions`."""
    if planning:
        return "plan"
    if sandbox.startswith("read-only"):
        return "default"
    if sandbox.startswith("workspace-write"):
        return "acceptEdits"
    return "bypassPermissions"


def anthropic_usage(u: Usage) -> dict[str, int]:
    """Our usage in Anthropic's terms: input_tokens are the prompt tokens the cache neither served nor stored."""
    return {"input_tokens": u.prompt_tokens - u.cached_tokens - u.cache_write_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens, "cache_read_input_tokens": u.cached_tokens,
            "output_tokens": u.completion_tokens}


class StreamJson:
    """Renders a session's events as stream-json lines on `out` (with `only_result`: the `json` format)."""

    def __init__(self, model: str, sandbox: str, planning: bool = False, only_result: bool = False,
                 out: TextIO | None = None):
        self.model, self.sandbox, self.planning, self.only_result = model, sandbox, planning, only_result
        self.out = out or sys.stdout
        self.session_id: str | None = None
        self.message_id = ""
        """The model call whose content blocks are being sent (each block is a message of its own)."""
        self.called: float | None = None
        self.api_seconds = 0.0
        """Time spent in model calls this turn."""

    def show(self, e: ev.Event) -> None:
        if self.session_id is None:
            self.session_id = e.session_id
            cwd = e.cwd if isinstance(e, ev.SessionStarted) else ""
            self.emit({"type": "system", "subtype": "init", "cwd": cwd, "session_id": e.session_id,
                       "tools": ["ipython"], "mcp_servers": [], "model": self.model,
                       "permissionMode": permission_mode(getattr(e, "sandbox", None) or self.sandbox, self.planning),
                       "slash_commands": [], "apiKeySource": "none", "output_style": "default"})
        if isinstance(e, ev.TurnStarted):
            self.api_seconds = 0.0
        elif isinstance(e, ev.ModelStarted):
            self.called, self.message_id = e.ts, f"msg_{uuid.uuid4().hex[:24]}"
        elif isinstance(e, ev.ModelCompleted):
            if self.called is not None:
                self.api_seconds += e.ts - self.called
                self.called = None
            blocks: list[dict[str, Any]] = []
            if e.reasoning:
                blocks.append({"type": "thinking", "thinking": e.reasoning, "signature": ""})
            if e.text:
                blocks.append({"type": "text", "text": e.text})
            if blocks:
                self.assistant(blocks, e.usage, "end_turn" if not e.tool_calls else "tool_use")
        elif isinstance(e, ev.CellStarted):
            self.assistant([{"type": "tool_use", "id": e.cell_id, "name": "ipython", "input": {"code": e.code}}],
                           None, "tool_use")
        elif isinstance(e, ev.CellFinished):
            self.emit({"type": "user", "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": e.cell_id, "content": e.result.render(),
                 "is_error": not e.result.ok}]}, "parent_tool_use_id": None, "session_id": self.session_id})
        elif isinstance(e, ev.TurnFinished):
            self.result(e)

    def assistant(self, content: list[dict[str, Any]], usage: Usage | None, stop_reason: str) -> None:
        self.emit({"type": "assistant", "message": {
            "id": self.message_id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": None, "usage": anthropic_usage(usage or Usage())},
            "parent_tool_use_id": None, "session_id": self.session_id})

    def result(self, e: ev.TurnFinished) -> None:
        failed = e.outcome != "completed"
        out: dict[str, Any] = {
            "type": "result", "subtype": SUBTYPES[e.outcome], "is_error": failed,
            "duration_ms": round(e.duration * 1000), "duration_api_ms": round(self.api_seconds * 1000),
            "num_turns": e.steps, "result": e.answer or "", "stop_reason": "end_turn" if not failed else None,
            "session_id": self.session_id, "total_cost_usd": e.usage.cost, "usage": anthropic_usage(e.usage),
            "modelUsage": {self.model: {"inputTokens": anthropic_usage(e.usage)["input_tokens"],
                                        "outputTokens": e.usage.completion_tokens,
                                        "cacheReadInputTokens": e.usage.cached_tokens,
                                        "cacheCreationInputTokens": e.usage.cache_write_tokens,
                                        "costUSD": e.usage.cost}},
            "permission_denials": [],
        }
        if failed:
            out["errors"] = [f"{e.outcome}: {e.error}" if e.error else e.outcome]
        self.emit(out, final=True)

    def emit(self, message: dict[str, Any], final: bool = False) -> None:
        if self.only_result and not final:
            return
        message["uuid"] = str(uuid.uuid4())
        self.out.write(json.dumps(message, ensure_ascii=False) + "\n")
        self.out.flush()


class BadInput(ValueError):
    """A line of stream-json input that is not a user message with text."""


def prompt_of(line: str) -> str:
    """The text of one stream-json input line (a user message); BadInput says what is wrong with it."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise BadInput(f"not JSON ({e})") from None
    message = obj.get("message") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or obj.get("type") != "user" or not isinstance(message, dict):
        raise BadInput('expected {"type": "user", "message": {"role": "user", "content": [...]}}')
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    else:
        raise BadInput("message.content is neither a string nor a list of content blocks")
    if not text.strip():
        raise BadInput("the message has no text")
    return text


async def stdin_prompts(stream: TextIO | None = None) -> AsyncIterator[str]:
    """Prompts from stream-json lines on stdin (read off the event loop) until its end; a bad line
    is reported on stderr and skipped."""
    stream = stream or sys.stdin
    n = 0
    while line := await asyncio.to_thread(stream.readline):
        n += 1
        if not line.strip():
            continue
        try:
            yield prompt_of(line)
        except BadInput as e:
            print(f"prime-agent: stdin line {n} skipped: {e}", file=sys.stderr)
