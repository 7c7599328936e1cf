"""What the native providers share: the chat completions client's retries, waits, fallbacks, cost and
call (agent/model.py's `OpenAIModel`), posting to the provider's `path` and reading its reply with the
provider's own `reader` (an `agent.wire.Reader`)."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.model import OpenAIModel, ServerModel
from agent.types import Completion, Message
from agent.wire import MalformedReply, brief


class NativeModel(OpenAIModel):
    """A provider's own API on the chat completions client's machinery: a subclass says where it posts
    (`path`), builds its request (`_request`) and reads its replies (`reader`)."""

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        await asyncio.to_thread(self.prepare)  # the SDK's import takes seconds (anthropic's: 1.6 s of CPU): off the loop
        return await super().complete(messages, **options)

    async def describe(self) -> ServerModel:
        """Neither service lists a context window: nothing is asked, and the configuration stands."""
        return ServerModel()


def malformed(what: str, value: Any) -> MalformedReply:
    return MalformedReply(f"malformed reply from the server: {what}: {brief(repr(value))}")
