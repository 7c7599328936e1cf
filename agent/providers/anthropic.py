"""Anthropic's Messages API, spoken natively with the official `anthropic` SDK (its client, headers and
errors; requests and replies are plain JSON, as for chat completions).

- The system prompt goes top-level; the `ipython` tool is a tool with an `input_schema`; a cell is a
  `tool_use` block and its output a `tool_result` naming its id (consecutive tool results, and what the
  user says after them, in one user message); a vision model's images are `image` blocks of base64 data
  after the text of the user message that shows them.
- A reply is kept as its content blocks (`Message.blocks`): thinking blocks with their signatures,
  redacted_thinking, text, tool_use; sent back unchanged, as the API requires of thinking.
- Prompt caching: `cache_control` breakpoints on the tool, the system prompt and the last two user
  messages (4, the API's most): each request writes the cache at its end, and the next one, whose
  messages start with this one's, reads it there.
- Usage: `input_tokens` + cache reads + cache writes are the prompt; reads are `cached_tokens`, writes
  `cache_write_tokens`, each priced (`model.prices`: `cached_input`, `cache_write`).
- 429 and 529 (overloaded) are waited on as the service asks (`retry-after`); an `error` event
  mid-stream is a passing fault; stop reasons map to chat completions' finish reasons.
"""

from __future__ import annotations

import json
from typing import Any

from agent.actions import IPYTHON_TOOL
from agent.config_models import ModelConfig
from agent.model import _Retryable, _tls_context
from agent.providers.native import NativeModel, malformed
from agent.types import Blocks, Completion, Message, ToolCall, Usage
from agent.wire import MalformedReply, Shown, brief

FUNCTION = IPYTHON_TOOL["function"]
TOOL = {"name": FUNCTION["name"], "description": FUNCTION["description"], "input_schema": FUNCTION["parameters"]}
CACHE = {"type": "ephemeral"}
MAX_TOKENS = 16_384
"""`max_tokens` (which the API requires) where `model.max_completion_tokens` is not set; a thinking
budget is added to it."""
STOPS = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "tool_use": "tool_calls",
         "max_tokens": "length", "model_context_window_exceeded": "length", "refusal": "content_filter"}
"""Anthropic's stop reasons as chat completions' finish reasons (what the loop reads)."""


class AnthropicModel(NativeModel):
    path = "/v1/messages"

    def __init__(self, config: ModelConfig, key_hint: str = "", api_key: str | None = None):
        super().__init__(config, key_hint or ("check the API key (ANTHROPIC_API_KEY, or model.api_key)"
                                              if api_key or config.api_key
                                              else "no API key was sent: set ANTHROPIC_API_KEY (or model.api_key)"), api_key)

    def prepare(self) -> None:
        with self._preparing:
            if self._client is not None:
                return
            import anthropic

            self._openai = anthropic  # its errors and stream class, under the names OpenAIModel reads
            key = self.api_key or "not-needed"
            base = self.config.base_url
            headers: dict[str, Any] = {"x-api-key": key, "Authorization": anthropic.Omit()}  # the documented header alone
            self._client = anthropic.AsyncAnthropic(
                api_key=key,  # explicit: the SDK then reads no credentials of its own (environment, profiles)
                default_headers=headers,
                base_url=base.rstrip("/").removesuffix("/v1") if base else None,  # its paths begin with /v1
                max_retries=0,
                timeout=self.config.timeout,
                http_client=anthropic.DefaultAsyncHttpxClient(timeout=self.config.timeout, verify=_tls_context()),
            )

    def reader(self, text: Shown, reasoning: Shown) -> MessagesReply:
        return MessagesReply(text, reasoning)

    def _request(self, messages: list[Message], tools: bool, json_mode: bool | dict[str, Any]) -> dict[str, Any]:
        """`json_mode` (a JSON object, or one under a schema) is not sent: the prompt asks for the JSON."""
        cfg = self.config
        system, turns = to_messages(messages)
        budget = cfg.thinking_budget
        req: dict[str, Any] = {"model": self.name, "messages": turns,
                               "max_tokens": cfg.max_completion_tokens or MAX_TOKENS + (budget or 0)}
        if system:
            req["system"] = system
        if tools and self.action_format == "tools":
            req["tools"] = [TOOL]
        if budget:
            req["thinking"] = {"type": "enabled", "budget_tokens": budget}
        if cfg.temperature is not None:
            req["temperature"] = cfg.temperature
        if cfg.stream:
            req["stream"] = True
        req.update(cfg.extra_body)
        mark_cache(req)
        return req

    def _classify(self, e: Exception) -> Exception:
        """The SDK raises an `error` event (`overloaded_error`, `api_error`) as a status error with the
        stream's status, 200: a passing fault."""
        if isinstance(e, self._openai.APIStatusError) and e.status_code == 200:
            error = e.body.get("error") if isinstance(e.body, dict) else None
            said = error.get("message") if isinstance(error, dict) else None
            return _Retryable(f"the server reported an error mid-stream: {brief(str(said or e))}")
        return super()._classify(e)


def to_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, messages) as the Messages API wants them: roles alternate, tool results are user
    content, an assistant reply from Anthropic is its own blocks."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system" and not out:
            system.append({"type": "text", "text": m.content or "(empty)"})
            continue
        if m.role == "assistant":
            role, blocks = "assistant", (m.blocks.items if m.blocks and m.blocks.provider == "anthropic"
                                         else assistant_blocks(m))
        elif m.role == "tool":
            role, blocks = "user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}]
        else:
            role, blocks = "user", [{"type": "text", "text": m.content or "(empty)"}]  # empty text is refused
            blocks += [{"type": "image", "source": {"type": "base64", "media_type": i.mime, "data": i.data}}
                       for i in m.images]
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": list(blocks)})
    for turn in out:  # a user message's tool results come first (a prompt steered in before them goes after)
        if turn["role"] == "user":
            turn["content"].sort(key=lambda b: b.get("type") != "tool_result")
    return system, out


def assistant_blocks(m: Message) -> list[dict[str, Any]]:
    """A reply another provider wrote, as blocks (its reasoning stays out: Anthropic takes back only
    thinking it signed)."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    for call in m.tool_calls:
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            arguments = None
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": arguments if isinstance(arguments, dict) else {"arguments": call.arguments}})
    return blocks or [{"type": "text", "text": "(empty)"}]


def mark_cache(req: dict[str, Any]) -> None:
    """`cache_control` on the tool, the last system block and the last block of the last two user
    messages (copies: the messages' own blocks stay as they are)."""
    if req.get("tools"):
        req["tools"][-1] = {**req["tools"][-1], "cache_control": CACHE}
    if req.get("system"):
        req["system"][-1] = {**req["system"][-1], "cache_control": CACHE}
    users = [m for m in req["messages"] if m["role"] == "user"]
    for m in users[-2:]:
        m["content"][-1] = {**m["content"][-1], "cache_control": CACHE}


class MessagesReply:
    """One Messages reply assembled from its events (`message_start`, `content_block_start` / `_delta`
    / `_stop`, `message_delta`, `message_stop`; `ping` is dropped by the SDK), or read whole."""

    def __init__(self, text: Shown, reasoning: Shown):
        self.show_text, self.show_reasoning = text, reasoning
        self.blocks: list[dict[str, Any]] = []
        self.pieces: dict[int, list[str]] = {}
        """Per open block: its text, thinking or tool input JSON so far."""
        self.signatures: dict[int, list[str]] = {}
        self.arguments: dict[int, str] = {}
        """Per tool_use block: its input as the model wrote it (JSON text)."""
        self.usage: dict[str, Any] = {}
        self.stop: str | None = None
        self.model = ""
        self.done = False

    def add_event(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise malformed("an event that is not an object", event)
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self.model = message.get("model") or ""
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            index, block = event.get("index"), event.get("content_block")
            if not isinstance(index, int) or not isinstance(block, dict) or index != len(self.blocks):
                raise malformed("a content block out of order", event)
            self.blocks.append(dict(block))
            self.pieces[index], self.signatures[index] = [], []
        elif kind == "content_block_delta":
            self._delta(event.get("index"), event.get("delta") or {})
        elif kind == "content_block_stop":
            self._close(event.get("index"))
        elif kind == "message_delta":
            self.stop = (event.get("delta") or {}).get("stop_reason") or self.stop
            self.usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.done = True

    def _delta(self, index: Any, delta: dict[str, Any]) -> None:
        if index not in self.pieces:
            raise malformed("a delta for no open block", delta)
        kind = delta.get("type")
        piece = delta.get({"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json",
                           "signature_delta": "signature"}.get(kind or "", ""))
        if not isinstance(piece, str):
            return  # a delta this client does not use (citations)
        if kind == "signature_delta":
            self.signatures[index].append(piece)
            return
        self.pieces[index].append(piece)
        if kind == "text_delta":
            self.show_text(piece)
        elif kind == "thinking_delta":
            self.show_reasoning(piece)

    def _close(self, index: Any) -> None:
        if index not in self.pieces:
            raise malformed("a stop for no open block", index)
        block, joined = self.blocks[index], "".join(self.pieces.pop(index))
        signature = "".join(self.signatures.pop(index))
        if block.get("type") == "text":
            block["text"] = block.get("text", "") + joined
        elif block.get("type") == "thinking":
            block["thinking"] = block.get("thinking", "") + joined
            block["signature"] = signature or block.get("signature", "")
        elif block.get("type") == "tool_use" and joined:
            self.arguments[index] = joined
            try:
                block["input"] = json.loads(joined)
            except ValueError:  # cut short (max_tokens): the loop tells the model; the block keeps {}
                pass

    def add_message(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("content"), list):
            raise malformed("not a message", body)
        self.blocks = [dict(b) for b in body["content"] if isinstance(b, dict)]
        self.model, self.stop, self.done = body.get("model") or "", body.get("stop_reason"), True
        self.usage.update(body.get("usage") or {})

    def completion(self) -> Completion:
        if not self.done or self.pieces:
            raise MalformedReply("the stream ended before the message did (no message_stop)")
        blocks = [b for b in self.blocks if not (b.get("type") == "text" and not b.get("text"))]  # empty text is refused back
        text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        thinking = "\n\n".join(b.get("thinking") or "" for b in blocks if b.get("type") == "thinking").strip()
        calls = [ToolCall(id=b.get("id") or f"toolu_{i}", name=b.get("name") or "",
                          arguments=self.arguments.get(i) or json.dumps(b.get("input") or {}))
                 for i, b in enumerate(self.blocks) if b.get("type") == "tool_use"]
        message = Message(role="assistant", content=text, tool_calls=calls, reasoning=thinking or None,
                          blocks=Blocks(provider="anthropic", items=blocks))
        return Completion(message=message, usage=usage(self.usage), model=self.model,
                          finish_reason=STOPS.get(self.stop or "", self.stop or "stop"))


def usage(u: dict[str, Any]) -> Usage:
    """Anthropic's usage as ours: its `input_tokens` leave out what the cache read and wrote."""
    def n(key: str) -> int:
        value = u.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    read, written = n("cache_read_input_tokens"), n("cache_creation_input_tokens")
    return Usage(prompt_tokens=n("input_tokens") + read + written, completion_tokens=n("output_tokens"),
                 cached_tokens=read, cache_write_tokens=written)
