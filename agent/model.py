"""The model seam: the `Model` protocol and `OpenAIModel` for any OpenAI-compatible server.

Two action formats: `tools` (native tool calling with one `ipython` tool) and `text` (the model
writes ```python fenced cells). Transient failures (429, 5xx, timeouts, dropped streams,
malformed replies) are retried with exponential backoff and jitter; what is left becomes a
`ModelError` (or `ModelTimeout`) carrying a message for the user.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from agent.config import ModelConfig
from agent.types import Completion, Message, ToolCall, Usage

DeltaCallback = Callable[[str], None]
RetryCallback = Callable[[int, float, str], None]
"""on_retry(attempt, delay_seconds, reason)."""

IPYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "ipython",
        "description": (
            "Run Python code in your persistent IPython kernel and see its output. Variables, "
            "imports and the working directory persist across calls. Cell magics such as %%bash work."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code cell to run."},
                "timeout": {"type": "integer", "description": "Seconds before the cell is interrupted (optional)."},
            },
            "required": ["code"],
        },
    },
}
FENCE = re.compile(r"```(?:python|py|ipython)[ \t]*\n(.*?)```", re.DOTALL)


class ModelError(Exception):
    """A model call failed for good (after retries); the message is for the user."""


class ModelTimeout(ModelError):
    """The server did not answer within the timeout, on every attempt."""


class ContextOverflow(ModelError):
    """The server refused the request because the context is longer than the model's window."""


CONTEXT_ERRORS = re.compile(r"context.length|context_length|maximum context|context window|too many tokens|prompt is too long",
                            re.IGNORECASE)


class Model(Protocol):
    name: str
    action_format: Literal["tools", "text"]

    async def complete(
        self,
        messages: list[Message],
        *,
        tools: bool = True,
        json_mode: bool = False,
        on_delta: DeltaCallback | None = None,
        on_retry: RetryCallback | None = None,
    ) -> Completion:
        """One completion. `tools=False` for plain calls (summaries, `llm()`); `json_mode=True` asks for
        a JSON object (the server's JSON mode); `on_delta` streams text."""
        ...

    def variant(self, name: str) -> Model:
        """The same server and settings with another model name (for `rlm(model=...)`, `llm(model=...)`)."""
        ...


def fenced_cells(text: str) -> list[str]:
    """The ```python cells in a text-mode reply, in order."""
    return [m.group(1) for m in FENCE.finditer(text)]


def to_wire(m: Message) -> dict[str, Any]:
    """A message as the OpenAI chat API wants it."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ],
        }
    return {"role": m.role, "content": m.content}


class _Retryable(Exception):
    def __init__(self, reason: str, timeout: bool = False):
        super().__init__(reason)
        self.timeout = timeout


class OpenAIModel:
    def __init__(self, config: ModelConfig):
        if not config.name:
            raise ModelError("no model name configured (set PRIME_AGENT_MODEL or --model)")
        self.config = config
        self.name = config.name
        self.action_format = config.action_format
        self._client: Any = None

    def variant(self, name: str) -> OpenAIModel:
        return OpenAIModel(self.config.model_copy(update={"name": name}))

    def prepare(self) -> None:
        """Import the client library and build the client (~0.5 s); safe to run in a thread."""
        if self._client is not None:
            return
        import openai

        self._openai = openai
        self._client = openai.AsyncOpenAI(
            base_url=self.config.base_url,
            api_key=self.config.api_key or "not-needed",
            max_retries=0,  # we retry ourselves, so dropped streams and bad replies are retried too
            timeout=self.config.timeout,
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def complete(
        self,
        messages: list[Message],
        *,
        tools: bool = True,
        json_mode: bool = False,
        on_delta: DeltaCallback | None = None,
        on_retry: RetryCallback | None = None,
    ) -> Completion:
        self.prepare()
        cfg = self.config
        request = self._request(messages, tools)
        if json_mode:
            request["response_format"] = {"type": "json_object"}
        attempt = 0
        started = time.monotonic()
        while True:
            attempt += 1
            try:
                completion = await self._call(request, on_delta)
            except _Retryable as e:
                if attempt > cfg.max_retries:
                    where = cfg.base_url or "the OpenAI API"
                    kind = ModelTimeout if e.timeout else ModelError
                    raise kind(f"model call to {where} failed after {attempt} attempts: {e}") from None
                delay = min(cfg.retry_max_delay, cfg.retry_base_delay * 2 ** (attempt - 1))
                delay *= random.uniform(0.5, 1.0)  # jitter, so clients do not retry in lockstep
                if on_retry:
                    on_retry(attempt, delay, str(e))
                await asyncio.sleep(delay)
                continue
            completion.attempts = attempt
            completion.duration = time.monotonic() - started
            completion.usage.cost = (
                completion.usage.prompt_tokens * cfg.input_cost_per_mtok
                + completion.usage.completion_tokens * cfg.output_cost_per_mtok
            ) / 1e6
            return completion

    def _request(self, messages: list[Message], tools: bool) -> dict[str, Any]:
        cfg = self.config
        req: dict[str, Any] = {"model": cfg.name, "messages": [to_wire(m) for m in messages]}
        if tools and cfg.action_format == "tools":
            req["tools"] = [IPYTHON_TOOL]
        if cfg.temperature is not None:
            req["temperature"] = cfg.temperature
        if cfg.max_completion_tokens is not None:
            # OpenAI's own API wants the newer name; other servers mostly know only the old one.
            req["max_completion_tokens" if cfg.base_url is None else "max_tokens"] = cfg.max_completion_tokens
        if cfg.record_logprobs:
            req["logprobs"] = True
        if cfg.stream:
            req["stream"] = True
            req["stream_options"] = {"include_usage": True}
        req.update(cfg.extra_body)
        return req

    def _classify(self, e: Exception) -> Exception:
        """Map a client exception to _Retryable, or to a final ModelError."""
        oa = self._openai
        if isinstance(e, oa.APITimeoutError):
            return _Retryable(f"no answer within {self.config.timeout:g}s", timeout=True)
        if isinstance(e, oa.APIConnectionError):
            return _Retryable(f"connection failed: {e.__cause__ or e}")
        if isinstance(e, oa.APIStatusError):
            if e.status_code == 429 or e.status_code >= 500 or e.status_code == 408:
                return _Retryable(f"HTTP {e.status_code}: {_brief(e.message)}")
            if e.status_code in (400, 413) and CONTEXT_ERRORS.search(e.message or ""):
                return ContextOverflow(f"the context is too long for the model: {_brief(e.message)}")
            return ModelError(f"the server refused the request: HTTP {e.status_code}: {_brief(e.message)}")
        if isinstance(e, (oa.APIResponseValidationError, ValueError, KeyError, TypeError)):
            return _Retryable(f"malformed reply from the server: {_brief(str(e))}")
        if type(e).__module__.startswith(("httpx", "httpcore", "h11")):
            return _Retryable(f"the stream dropped: {type(e).__name__}: {_brief(str(e))}")
        return e

    async def _post(self, request: dict[str, Any]) -> Any:
        # `chat.completions.create` re-validates the whole message list against its TypedDicts on
        # every call: O(context) Python work per step (20 ms a step at 100 cells). Our body is
        # plain JSON already, so post it through the same client as is.
        from openai import AsyncStream
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        return await self._client.post(
            "/chat/completions", body=request, cast_to=ChatCompletion,
            stream=bool(request.get("stream")), stream_cls=AsyncStream[ChatCompletionChunk],
        )

    async def _call(self, request: dict[str, Any], on_delta: DeltaCallback | None) -> Completion:
        try:
            if self.config.stream:
                return await self._stream(request, on_delta)
            return self._parse(await self._post(request))
        except (_Retryable, ModelError):
            raise
        except Exception as e:
            raise self._classify(e) from e

    async def _stream(self, request: dict[str, Any], on_delta: DeltaCallback | None) -> Completion:
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        logprobs: list[float] = []
        token_ids: list[int] = []
        usage = Usage()
        finish = None
        model = ""
        prompt_ids = None
        async for chunk in await self._post(request):
            model = chunk.model or model
            prompt_ids = prompt_ids or getattr(chunk, "prompt_token_ids", None)  # vLLM and ours: in the first chunk
            if chunk.usage:
                usage = Usage(prompt_tokens=chunk.usage.prompt_tokens, completion_tokens=chunk.usage.completion_tokens)
            for choice in chunk.choices:
                d = choice.delta
                if d.content:
                    text.append(d.content)
                    if on_delta:
                        on_delta(d.content)
                for tc in d.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": []})
                    slot["id"] = tc.id or slot["id"]
                    if tc.function:
                        slot["name"] = tc.function.name or slot["name"]
                        slot["arguments"].append(tc.function.arguments or "")
                if choice.logprobs and choice.logprobs.content:
                    logprobs.extend(t.logprob for t in choice.logprobs.content)
                token_ids.extend(getattr(choice, "token_ids", None) or [])
                finish = choice.finish_reason or finish
        if finish is None:
            raise _Retryable("the stream ended before the model finished (no finish_reason)")
        message = Message(
            role="assistant",
            content="".join(text),
            tool_calls=[
                ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments="".join(c["arguments"]))
                for i, c in sorted(calls.items())
            ],
            logprobs=logprobs or None,
            token_ids=token_ids or None,
        )
        return Completion(message=message, usage=usage, finish_reason=finish, model=model,
                          prompt_token_ids=prompt_ids if isinstance(prompt_ids, list) else None)

    def _parse(self, resp: Any) -> Completion:
        try:
            choice = resp.choices[0]
            msg = choice.message
            calls = [
                ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
                for c in msg.tool_calls or []
            ]
            logprobs = [t.logprob for t in choice.logprobs.content] if choice.logprobs and choice.logprobs.content else None
            usage = (
                Usage(prompt_tokens=resp.usage.prompt_tokens, completion_tokens=resp.usage.completion_tokens)
                if resp.usage
                else Usage()
            )
        except (AttributeError, IndexError, TypeError) as e:
            raise _Retryable(f"malformed reply from the server: {_brief(str(e))}") from None
        message = Message(
            role="assistant",
            content=msg.content or "",
            tool_calls=calls,
            logprobs=logprobs,
            token_ids=getattr(choice, "token_ids", None),
        )
        prompt_ids = getattr(resp, "prompt_token_ids", None)
        return Completion(message=message, usage=usage, finish_reason=choice.finish_reason, model=resp.model or "",
                          prompt_token_ids=prompt_ids if isinstance(prompt_ids, list) else None)


def _brief(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def parse_tool_arguments(call: ToolCall) -> dict[str, Any]:
    """The `ipython` tool's arguments; raises ValueError with a message for the model."""
    if call.name != "ipython":
        raise ValueError(f"unknown tool {call.name!r}: the only tool is `ipython` with arguments {{code, timeout?}}")
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"the tool call's arguments are not valid JSON ({e}); send {{\"code\": \"...\"}}") from None
    if not isinstance(args, dict) or not isinstance(args.get("code"), str):
        raise ValueError('the tool call needs a string argument "code", e.g. {"code": "print(1)"}')
    timeout = args.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0)):
        raise ValueError('"timeout" must be a positive number of seconds')
    return args
