"""A scripted server of Anthropic's Messages API (`POST /v1/messages`) for tests: it streams replies as
the service does (`event: message_start`, `content_block_start` / `_delta` / `_stop` with `ping` among
them, `message_delta` with the stop reason and usage, `message_stop`), and refuses with the service's
400s what the service refuses: a missing `anthropic-version` or `max_tokens`, a tool_use not answered by a
tool_result in the next user message, a thinking block changed from what it signed (or a
redacted_thinking block it did not issue), more than 4 `cache_control` breakpoints, an empty text block, an
image block outside a user message or whose data is not base64 of the image type it names.

    with AnthropicServer([Reply(thinking="...", code=["print(1)"]), Reply(text="done")]) as server:
        ... --base-url server.root -c model.provider=anthropic ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.testing.sse_server import ScriptedServer, _Handler, image_problem, pieces, sign


@dataclass
class Reply:
    text: str = ""
    code: list[str] = field(default_factory=list)
    """One `ipython` tool_use block per entry, with {"code": entry}."""
    thinking: str = ""
    """A thinking block first, signed."""
    redacted: str = ""
    """A redacted_thinking block (its `data`) before the thinking."""
    usage: dict[str, int] = field(default_factory=dict)
    """`input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`, `output_tokens`; by
    default the input is a quarter of the request's characters, none of it cached."""
    stop_reason: str | None = None
    """Instead of the natural one (`tool_use` with code, else `end_turn`): `max_tokens`, `refusal`."""
    status: int = 200
    """An HTTP error to answer with instead: 429 (`rate_limit_error`), 529 (`overloaded_error`), ..."""
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers (`retry-after`)."""
    error_event: bool = False
    """Stream the first block, then an `error` event (`overloaded_error`), as the service does mid-stream."""


ERRORS = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error", 500: "api_error",
          529: "overloaded_error"}


class AnthropicServer(ScriptedServer[Reply]):
    path = "/v1/messages"

    @property
    def base_url(self) -> str:
        return self.root

    def answer(self, http: _Handler, request: dict[str, Any], headers: dict[str, str]) -> None:
        if self.api_key is not None and headers.get("x-api-key") != self.api_key:
            return _error(http, 401, "invalid x-api-key")
        problem = invalid(request, headers)
        if problem:
            return _error(http, 400, problem)
        reply = self.next_reply(request) or Reply(status=500, text="script exhausted")
        if reply.status != 200:
            return _error(http, reply.status, reply.text or ERRORS.get(reply.status, "error"), reply.headers)
        blocks = _blocks(reply)
        chars = len(json.dumps(request.get("messages"))) + len(json.dumps(request.get("system", "")))
        usage = {"input_tokens": chars // 4 + 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                 "output_tokens": sum(len(json.dumps(b)) for b in blocks) // 4 + 1, **reply.usage}
        stop = reply.stop_reason or ("tool_use" if reply.code else "end_turn")
        message = {"id": "msg_01scripted", "type": "message", "role": "assistant", "model": request.get("model"),
                   "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not request.get("stream"):
            return http.json(200, message)
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
        for i, block in enumerate(blocks):
            events += _streamed(i, block)
            if i == 0:
                events.append(("ping", {"type": "ping"}))
                if reply.error_event:
                    events.append(("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
                    return http.events(events)
        events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                         "usage": {"output_tokens": usage["output_tokens"]}}))
        events.append(("message_stop", {"type": "message_stop"}))
        http.events(events)


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.redacted:
        blocks.append({"type": "redacted_thinking", "data": reply.redacted + "." + sign(reply.redacted)})
    if reply.thinking:
        blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": sign(reply.thinking)})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for i, code in enumerate(reply.code):
        blocks.append({"type": "tool_use", "id": f"toolu_0{i}{sign(code)[:16]}", "name": "ipython", "input": {"code": code}})
    return blocks


def _streamed(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One content block as the service streams it: its start (text and thinking empty, a tool's input
    `{}`), its deltas, its stop."""
    kind = block["type"]
    start = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking", "thinking": "", "signature": ""},
             "tool_use": {**block, "input": {}}}.get(kind, block)
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    elif kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in ["", *pieces(json.dumps(block["input"]))]]
    return [("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
            *[("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas],
            ("content_block_stop", {"type": "content_block_stop", "index": index})]


def invalid(request: dict[str, Any], headers: dict[str, str]) -> str | None:
    """What the service would refuse in this request, in its words where known."""
    if not headers.get("anthropic-version"):
        return "anthropic-version: header is required"
    if not isinstance(request.get("max_tokens"), int):
        return "max_tokens: Field required"
    messages = request.get("messages") or []
    marks = sum("cache_control" in b for b in [*request.get("tools", []), *request.get("system", [])])
    for i, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if i and m["role"] == messages[i - 1]["role"]:
            return "messages: roles must alternate between \"user\" and \"assistant\""
        for block in m.get("content") or []:
            marks += "cache_control" in block
            if block.get("type") == "text" and not block.get("text"):
                return f"messages.{i}: text content blocks must be non-empty"
            if block.get("type") == "thinking" and block.get("signature") != sign(block.get("thinking", "")):
                return f"messages.{i}: Invalid `signature` in `thinking` block"
            if block.get("type") == "image":
                source = block.get("source") or {}
                if m["role"] != "user":
                    return f"messages.{i}: image content blocks are only allowed in user messages"
                if source.get("type") != "base64":
                    return f"messages.{i}.image.source: Input tag {source.get('type')!r} does not match 'base64'"
                if problem := image_problem(str(source.get("media_type")), source.get("data")):
                    return f"messages.{i}.image.source.base64: {problem}"
            if block.get("type") == "redacted_thinking":
                data, _, mac = str(block.get("data")).rpartition(".")
                if mac != sign(data):
                    return f"messages.{i}: Invalid `data` in `redacted_thinking` block"
        uses = [b["id"] for b in m.get("content") or [] if b.get("type") == "tool_use"]
        after = messages[i + 1]["content"] if i + 1 < len(messages) else None
        results = [b.get("tool_use_id") for b in after or [] if b.get("type") == "tool_result"]
        if uses and after is not None and sorted(results) != sorted(uses):
            return (f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(u for u in uses if u not in results)}")
    if marks > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {marks}."
    return None


def _error(http: _Handler, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    http.json(status, {"type": "error", "error": {"type": ERRORS.get(status, "api_error"), "message": message}}, headers)
