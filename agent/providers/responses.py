"""OpenAI's Responses API, spoken natively with the `openai` SDK's client (requests and replies as plain
JSON, as for chat completions), statelessly: `store=false`, the whole conversation sent every time.

- The system prompt is `instructions`; the conversation is input items: messages, a cell as a
  `function_call` and its output as a `function_call_output` naming its `call_id`; a vision model's
  images are `input_image` parts (data URLs) of the user message that shows them.
- A reply is kept as its output items (`Message.blocks`), reasoning items with their `encrypted_content`
  (asked for with `include`) among them, and sent back as they came but for their `id`s: with
  `store=false` the service keeps nothing an id could name, and refuses one it cannot find.
- OpenAI caches prompt prefixes by itself; `usage.input_tokens_details.cached_tokens` is counted as
  `cached_tokens` and priced at `cached_input`. `model.reasoning_effort` is `reasoning.effort` and
  `model.reasoning_summary` `reasoning.summary` (the summaries are the reasoning shown).
"""

from __future__ import annotations

import re
from typing import Any

from agent.actions import IPYTHON_TOOL
from agent.model import CONTEXT_ERRORS, ContextOverflow, ModelError, _Retryable
from agent.providers.native import NativeModel, malformed
from agent.types import Blocks, Completion, Message, ToolCall, Usage
from agent.wire import MalformedReply, Shown, brief

TOOL = {"type": "function", **IPYTHON_TOOL["function"]}
INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}
"""Why a response is `incomplete`, as chat completions' finish reasons (what the loop reads)."""


class ResponsesModel(NativeModel):
    path = "/responses"

    def reader(self, text: Shown, reasoning: Shown) -> ResponsesReply:
        return ResponsesReply(text, reasoning)

    def _request(self, messages: list[Message], tools: bool, json_mode: bool | dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        instructions, items = to_input(messages)
        req: dict[str, Any] = {"model": self.name, "input": items, "store": False,
                               "include": ["reasoning.encrypted_content"]}
        if instructions:
            req["instructions"] = instructions
        if tools and self.action_format == "tools":
            req["tools"] = [TOOL]
        if reasoning := {k: v for k, v in (("effort", cfg.reasoning_effort), ("summary", cfg.reasoning_summary)) if v}:
            req["reasoning"] = reasoning
        if cfg.temperature is not None:
            req["temperature"] = cfg.temperature
        if cfg.max_completion_tokens is not None:
            req["max_output_tokens"] = cfg.max_completion_tokens
        if cfg.stream:
            req["stream"] = True
        if isinstance(json_mode, dict):  # a schema: not `strict` (that needs every field required, none extra)
            name = re.sub(r"[^A-Za-z0-9_-]", "_", str(json_mode.get("title") or "reply"))[:64]
            req["text"] = {"format": {"type": "json_schema", "name": name, "schema": json_mode, "strict": False}}
        elif json_mode:
            req["text"] = {"format": {"type": "json_object"}}
        req.update(cfg.extra_body)
        return req


def to_input(messages: list[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions, input items)."""
    instructions: str | None = None
    items: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.role == "system" and i == 0:
            instructions = m.content
        elif m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content})
        elif m.role == "assistant" and m.blocks and m.blocks.provider == "openai-responses":
            items += [{k: v for k, v in item.items() if k != "id"} for item in m.blocks.items]
        elif m.role == "assistant":  # another provider's reply (its reasoning stays out: it is not OpenAI's)
            if m.content:
                items.append({"role": "assistant", "content": m.content})
            items += [{"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
                      for c in m.tool_calls]
        elif m.images:
            items.append({"role": "user", "content": [
                {"type": "input_text", "text": m.content},
                *({"type": "input_image", "image_url": f"data:{i.mime};base64,{i.data}"} for i in m.images)]})
        else:
            items.append({"role": "developer" if m.role == "system" else "user", "content": m.content})
    return instructions, items


class ResponsesReply:
    """One response assembled from its events (`response.output_text.delta` and the reasoning deltas
    shown as they come, `response.output_item.done` for each item, `response.completed` or
    `response.incomplete` to end it), or read whole."""

    def __init__(self, text: Shown, reasoning: Shown):
        self.show_text, self.show_reasoning = text, reasoning
        self.items: dict[int, dict[str, Any]] = {}
        self.response: dict[str, Any] | None = None

    def add_event(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise malformed("an event that is not an object", event)
        kind = event.get("type")
        delta = event.get("delta")
        if kind == "response.output_text.delta" and isinstance(delta, str):
            self.show_text(delta)
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta") and isinstance(delta, str):
            self.show_reasoning(delta)
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self.items[event.get("output_index", len(self.items))] = event["item"]
        elif kind in ("response.completed", "response.incomplete"):
            self.add_message(event.get("response"))
        elif kind == "response.failed":
            raise failed((event.get("response") or {}).get("error") or {})
        elif kind == "error":
            raise failed(event)

    def add_message(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("output", []), list):
            raise malformed("not a response", body)
        if body.get("status") == "failed":
            raise failed(body.get("error") or {})
        self.response = body

    def completion(self) -> Completion:
        if self.response is None:
            raise MalformedReply("the stream ended before the response did (no response.completed)")
        r = self.response
        output = [i for i in (r.get("output") or [self.items[k] for k in sorted(self.items)]) if isinstance(i, dict)]
        text = "".join(part.get("text") or "" for item in output if item.get("type") == "message"
                       for part in item.get("content") or [] if part.get("type") == "output_text")
        thinking = "\n\n".join(part.get("text") or "" for item in output if item.get("type") == "reasoning"
                               for part in [*(item.get("summary") or []), *(item.get("content") or [])]).strip()
        calls = [ToolCall(id=item.get("call_id") or "", name=item.get("name") or "", arguments=item.get("arguments") or "")
                 for item in output if item.get("type") == "function_call"]
        reason = (r.get("incomplete_details") or {}).get("reason")
        finish = INCOMPLETE.get(str(reason), "length") if r.get("status") == "incomplete" else "tool_calls" if calls else "stop"
        message = Message(role="assistant", content=text, tool_calls=calls, reasoning=thinking or None,
                          blocks=Blocks(provider="openai-responses", items=output))
        return Completion(message=message, usage=usage(r.get("usage") or {}), finish_reason=finish,
                          model=r.get("model") or "")


def failed(error: dict[str, Any]) -> Exception:
    """A response the service failed: the context too long is said at once; the rest is retried."""
    message = brief(str(error.get("message") or error.get("code") or "no reason given"))
    if error.get("code") == "context_length_exceeded" or CONTEXT_ERRORS.search(message):
        return ContextOverflow(f"the context is too long for the model: {message}")
    if error.get("code") in ("invalid_prompt", "invalid_request_error"):
        return ModelError(f"the server refused the request: {message}")
    return _Retryable(f"the server reported an error mid-stream: {message}")


def usage(u: dict[str, Any]) -> Usage:
    def n(obj: Any, key: str) -> int:
        value = obj.get(key) if isinstance(obj, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Usage(prompt_tokens=n(u, "input_tokens"), completion_tokens=n(u, "output_tokens"),
                 cached_tokens=n(u.get("input_tokens_details"), "cached_tokens"),
                 reasoning_tokens=n(u.get("output_tokens_details"), "reasoning_tokens"))
