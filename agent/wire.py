"""The OpenAI chat completions wire format, written once: messages as a request carries them
(`to_wire`), and a reply read as plain JSON, streamed or whole (`ServerReply`), so that how real
servers depart from OpenAI's API is handled in one place. agent/model.py's client sends and retries.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any, Literal, Protocol

from agent.actions import FENCE
from agent.types import Completion, Message, ToolCall, Usage


class MalformedReply(Exception):
    """A reply no model could have meant (not an object, no choices, a stream cut before its end):
    the client retries it as a passing fault."""


def to_wire(m: Message, reasoning: bool = False) -> dict[str, Any]:
    """A message as the OpenAI chat API wants it (a user message with images as content parts); with
    `reasoning`, an assistant message's reasoning
    goes along as `reasoning_content` (providers that require it back: `model.send_reasoning`)."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    wire: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.images:  # a vision model's images (agent/vision.py): data URLs after the text
        urls = [f"data:{i.mime};base64,{i.data}" for i in m.images]
        wire["content"] = [{"type": "text", "text": m.content}, *({"type": "image_url", "image_url": {"url": u}} for u in urls)]
    if m.role == "assistant" and m.tool_calls:
        wire["content"] = m.content or None
        wire["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                              for c in m.tool_calls]
    if reasoning and m.role == "assistant" and m.reasoning:
        wire["reasoning_content"] = m.reasoning
    return wire


class Shown:
    """Deltas of one kind (text or reasoning) as the user has seen them in this call: when a stream
    cut mid-way is retried, the new attempt's first characters, up to what was shown, are not shown again
    (the completed message is the truth; clients show it in full when it comes)."""

    def __init__(self, sink: Callable[[str], None] | None):
        self.sink, self.shown, self.here = sink, 0, 0

    def restart(self) -> None:
        self.here = 0

    def __call__(self, piece: str) -> None:
        start, self.here = self.here, self.here + len(piece)
        if self.sink is not None and self.here > self.shown:
            self.sink(piece[max(0, self.shown - start):])
            self.shown = self.here


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Think:
    """Splits streamed content into reasoning and text: a `<think>` block at the start of a reply
    (DeepSeek-R1 and Qwen3 served without a reasoning parser) is reasoning, not the answer."""

    def __init__(self) -> None:
        self.state: Literal["start", "think", "after", "text"] = "start"
        self.held = ""

    def feed(self, piece: str) -> list[tuple[bool, str]]:
        """(is_reasoning, text) pieces ready to show."""
        self.held += piece
        out: list[tuple[bool, str]] = []
        while self.held:
            if self.state == "start":
                head = self.held.lstrip()
                if head.startswith(THINK_OPEN):
                    self.state, self.held = "think", head[len(THINK_OPEN):].lstrip("\n")
                elif THINK_OPEN.startswith(head):
                    break  # not yet known
                else:
                    self.state = "text"
            elif self.state == "think":
                end = self.held.find(THINK_CLOSE)
                if end >= 0:
                    out.append((True, self.held[:end]))
                    self.state, self.held = "text", self.held[end + len(THINK_CLOSE):].lstrip()
                    if not self.held:
                        self.state = "after"
                    continue
                keep = _partial_suffix(self.held, THINK_CLOSE)
                out.append((True, self.held[: len(self.held) - keep]))
                self.held = self.held[len(self.held) - keep:]
                break
            elif self.state == "after":  # the whitespace between </think> and the answer is not the answer
                self.held = self.held.lstrip()
                if self.held:
                    self.state = "text"
            else:
                out.append((False, self.held))
                self.held = ""
        return [(r, t) for r, t in out if t]

    def flush(self) -> list[tuple[bool, str]]:
        held, self.held = self.held, ""
        return [(self.state == "think", held)] if held and self.state != "after" else []


def _partial_suffix(text: str, tag: str) -> int:
    """How many of `text`'s last characters could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(content: str) -> tuple[str | None, str]:
    """(reasoning, answer) of a whole reply: a leading `<think>` block, or everything before a lone
    `</think>` (Qwen3 thinking models whose template opens the block in the prompt)."""
    head = content.lstrip()
    if head.startswith(THINK_OPEN) and THINK_CLOSE in head:
        thought, _, answer = head[len(THINK_OPEN):].partition(THINK_CLOSE)
        return thought.strip("\n") or None, answer.lstrip()
    if THINK_CLOSE in content and THINK_OPEN not in content:
        thought, _, answer = content.partition(THINK_CLOSE)
        return thought.strip("\n") or None, answer.lstrip()
    return None, content


class Reader(Protocol):
    """One reply, read as plain JSON: a stream's events, or the whole reply (`ServerReply`: chat
    completions'; agent/providers/: the native APIs')."""

    def add_event(self, event: Any) -> None: ...

    def add_message(self, body: Any) -> None: ...

    def completion(self) -> Completion:
        """The reply as ours; raises `MalformedReply` for one cut short (retried)."""
        ...


class ServerReply:
    """One reply assembled from a server's JSON, as OpenAI-compatible servers really send it (each
    quirk below is tested against a recording in tests/agent/test_quirks.py):

    - only choice 0 counts (a server may honour or ignore `n`);
    - tool-call arguments may be a JSON object instead of a string (Ollama, llama.cpp);
    - streamed tool-call deltas may lack their `index` (Gemini's endpoint) or `id` (Ollama);
    - reasoning comes as `reasoning_content` (DeepSeek), `reasoning` (vLLM, OpenRouter; vLLM sends
      both with the same text), or a `<think>` block in the content;
    - the usage may come in a last chunk with an empty (or no) `choices` list, or with the finish
      chunk, with `prompt_tokens_details.cached_tokens` (OpenAI, vLLM) or `prompt_cache_hit_tokens`
      (DeepSeek), `completion_tokens_details.reasoning_tokens`, and a `cost` (OpenRouter).
    """

    def __init__(self, text: Shown, reasoning: Shown, watch: Callable[[str], None] = lambda piece: None):
        """`watch` sees every piece of text the model wrote (answer, reasoning, tool-call arguments) as it
        comes, and may raise to stop the reply there (agent.repetition)."""
        self.show_text, self.show_reasoning, self.watch = text, reasoning, watch
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.think = Think()
        self.calls: list[dict[str, Any]] = []
        self.logprobs: list[float] = []
        self.token_ids: list[int] = []
        self.usage = Usage()
        self.finish: str | None = None
        self.model = ""
        self.prompt_ids: list[int] | None = None
        self.fence = False
        """The last piece of the answer had a backtick in it: it may have closed a cell."""

    def add_event(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise MalformedReply(f"malformed reply from the server: a stream chunk that is not an object: {brief(repr(chunk))}")
        self._common(chunk)
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            self._reasoning(delta)
            if isinstance(delta.get("content"), str):
                self.watch(delta["content"])
                self.fence = "`" in delta["content"]
                for is_reasoning, piece in self.think.feed(delta["content"]):
                    (self.reasoning if is_reasoning else self.text).append(piece)
                    (self.show_reasoning if is_reasoning else self.show_text)(piece)
            for tc in delta.get("tool_calls") or []:
                self._tool_delta(tc)
            self._logprobs(choice)
            self.finish = choice.get("finish_reason") or self.finish

    def add_message(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
            raise MalformedReply(f"malformed reply from the server: {brief(repr(body))}")
        self._common(body)
        choice = next((c for c in body["choices"] if c.get("index", 0) == 0), None)
        if choice is None:
            raise MalformedReply("malformed reply from the server: no choices")
        message = choice.get("message") or {}
        self._reasoning(message, show=False)
        if isinstance(message.get("content"), str):
            self.watch(message["content"])
            self.text.append(message["content"])
        for i, tc in enumerate(message.get("tool_calls") or []):
            arguments = _arguments((tc.get("function") or {}).get("arguments"))
            self.watch(arguments)
            self.calls.append({"id": tc.get("id") or "", "name": (tc.get("function") or {}).get("name") or "",
                               "arguments": [arguments]})
        self._logprobs(choice)
        self.finish = choice.get("finish_reason")

    def _common(self, obj: dict[str, Any]) -> None:
        self.model = obj.get("model") or self.model
        ids = obj.get("prompt_token_ids")  # vLLM and ours: in the first chunk, or the reply
        if isinstance(ids, list) and self.prompt_ids is None:
            self.prompt_ids = ids
        if isinstance(obj.get("usage"), dict):
            self.usage = parse_usage(obj["usage"])

    def _reasoning(self, obj: dict[str, Any], show: bool = True) -> None:
        piece = obj.get("reasoning_content") or obj.get("reasoning")  # vLLM sends both, the same text
        if isinstance(piece, str) and piece:
            self.watch(piece)
            self.reasoning.append(piece)
            if show:
                self.show_reasoning(piece)

    def _tool_delta(self, tc: dict[str, Any]) -> None:
        fn = tc.get("function") or {}
        index = tc.get("index")
        if index is None:  # no index: a new id (or a name, with no call open) starts a call, else it continues
            fresh = not self.calls or (tc.get("id") and tc["id"] != self.calls[-1]["id"] and self.calls[-1]["id"])
            index = len(self.calls) if fresh else len(self.calls) - 1
        while len(self.calls) <= index:
            self.calls.append({"id": "", "name": "", "arguments": []})
        slot = self.calls[index]
        slot["id"] = tc.get("id") or slot["id"]
        slot["name"] = fn.get("name") or slot["name"]
        if fn.get("arguments") is not None:
            slot["arguments"].append(_arguments(fn["arguments"]))
            self.watch(slot["arguments"][-1])

    def _logprobs(self, choice: dict[str, Any]) -> None:
        content = (choice.get("logprobs") or {}).get("content") or []
        self.logprobs.extend(t["logprob"] for t in content if isinstance(t, dict) and "logprob" in t)
        self.token_ids.extend(choice.get("token_ids") or [])

    def stop_after_cell(self) -> bool:
        """Whether the answer streamed so far holds a whole ```python cell, from a server that streams
        each token's id: if so the reply ends here, as a stop string would end it (finish_reason
        "stop"), its usage counted from the ids (none is cached). What a model writes after its cell
        is written before the cell ran: an output it imagines, or the cell again. Without the ids the
        usage could not be counted, and the reply is read to its end."""
        if not (self.fence and self.token_ids) or self.finish is not None or not FENCE.search("".join(self.text)):
            return False
        self.finish = "stop"
        self.usage = Usage(prompt_tokens=len(self.prompt_ids or []), completion_tokens=len(self.token_ids))
        return True

    def completion(self) -> Completion:
        for is_reasoning, piece in self.think.flush():
            (self.reasoning if is_reasoning else self.text).append(piece)
            (self.show_reasoning if is_reasoning else self.show_text)(piece)
        if self.finish is None:
            raise MalformedReply("the stream ended before the model finished (no finish_reason)")
        reasoning, content = "".join(self.reasoning).strip() or None, "".join(self.text)
        if reasoning is None:
            reasoning, content = split_reasoning(content)
        calls = [ToolCall(id=c["id"] or f"call_{i}_{secrets.token_hex(4)}", name=c["name"],
                          arguments="".join(c["arguments"]))
                 for i, c in enumerate(self.calls) if c["name"] or c["arguments"]]
        message = Message(role="assistant", content=content, tool_calls=calls, reasoning=reasoning,
                          logprobs=self.logprobs or None, token_ids=self.token_ids or None)
        return Completion(message=message, usage=self.usage, finish_reason=self.finish, model=self.model,
                          prompt_token_ids=self.prompt_ids)


def _arguments(value: Any) -> str:
    """Tool-call arguments as the JSON text OpenAI's API sends; some servers send the object itself."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def parse_usage(u: dict[str, Any]) -> Usage:
    """A reply's `usage`, with its cached, reasoning and cost details where the server gives them."""
    prompt = u.get("prompt_tokens_details") or {}
    completion = u.get("completion_tokens_details") or {}
    cached = prompt.get("cached_tokens") or u.get("prompt_cache_hit_tokens") or 0
    cost = u.get("cost")
    return Usage(prompt_tokens=int(u.get("prompt_tokens") or 0), completion_tokens=int(u.get("completion_tokens") or 0),
                 cached_tokens=int(cached), reasoning_tokens=int(completion.get("reasoning_tokens") or 0),
                 cost=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else 0.0)


def brief(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters (a server's message, for one of ours)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
