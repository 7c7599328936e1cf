"""`ScriptedModel`: a deterministic model behind the real `Model` protocol, for tests.

Each call pops the next output: an answer string, a `cells(...)` message, a full `Message`, an
exception to raise (e.g. `ModelError`), a whole `Completion` (to set its finish reason or usage),
or a function of the messages it was sent.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any, Literal

from agent.config_models import ModelConfig
from agent.model import DeltaCallback, FallbackCallback, ModelError, RetryCallback, ServerModel
from agent.types import Completion, Message, ToolCall, Usage

Output = str | Message | Completion | Exception | Callable[[list[Message]], "str | Message | Completion"]
_ids = itertools.count(1)


def cells(*codes: str, text: str = "") -> Message:
    """An assistant message that runs each code string as one `ipython` tool call."""
    calls = [ToolCall(id=f"call_{next(_ids)}", name="ipython", arguments=json.dumps({"code": c})) for c in codes]
    return Message(role="assistant", content=text, tool_calls=calls)


class ScriptedModel:
    def __init__(self, outputs: list[Output], action_format: Literal["tools", "text"] = "tools", name: str = "scripted"):
        self.outputs = list(outputs)
        self.action_format = action_format
        self.name = name
        self.calls: list[list[Message]] = []
        """The messages of every call, as sent."""

    async def describe(self) -> ServerModel:
        """No server, so nothing said: the session keeps its settings."""
        return ServerModel()

    def reconfigure(self, config: ModelConfig) -> None:
        """Only a switch to text mode changes a scripted model: its own action format is the test's choice."""
        if config.action_format == "text":
            self.action_format = "text"

    def variant(self, name: str) -> ScriptedModel:
        """Another name over the same script (outputs are shared)."""
        other = ScriptedModel([], action_format=self.action_format, name=name)
        other.outputs, other.calls = self.outputs, self.calls
        return other

    async def complete(
        self,
        messages: list[Message],
        *,
        tools: bool = True,
        json_mode: bool | dict[str, Any] = False,
        on_delta: DeltaCallback | None = None,
        on_reasoning: DeltaCallback | None = None,
        on_retry: RetryCallback | None = None,
        on_fallback: FallbackCallback | None = None,
    ) -> Completion:
        self.calls.append([m.model_copy() for m in messages])
        if not self.outputs:
            raise ModelError("scripted model: the script has no more outputs")
        out = self.outputs.pop(0)
        if callable(out) and not isinstance(out, Message):
            out = out(messages)
        if isinstance(out, Exception):
            raise out
        if isinstance(out, Completion):
            return out
        message = out if isinstance(out, Message) else Message(role="assistant", content=out)
        if self.action_format == "text" and message.tool_calls:
            fences = [f"```python\n{json.loads(c.arguments)['code']}\n```" for c in message.tool_calls]
            message = Message(role="assistant", content="\n".join([message.content, *fences]).strip())
        if on_reasoning and message.reasoning:
            on_reasoning(message.reasoning)
        if on_delta and message.content:
            on_delta(message.content)
        prompt = sum(len(m.content) for m in messages) // 4
        usage = Usage(prompt_tokens=prompt, completion_tokens=max(1, len(message.content) // 4))
        return Completion(message=message, usage=usage, finish_reason="stop", model=self.name)
