"""What the native providers share: the chat completions client's retries, waits, fallbacks and cost
(agent/model.py's `OpenAIModel`, whose `complete` drives them), a call that posts a provider's request
and reads its reply (streamed or whole) with the provider's own reader, and the protocol of such a reader.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from agent.model import ModelError, OpenAIModel, ServerModel, _Retryable
from agent.types import Completion, Message
from agent.wire import MalformedReply, Shown, brief


class Reader(Protocol):
    """One reply of a provider, read as plain JSON: a stream's events, or the whole reply."""

    def add_event(self, event: Any) -> None: ...

    def add_message(self, body: Any) -> None: ...

    def completion(self) -> Completion:
        """The reply as ours; raises `MalformedReply` for one cut short (retried)."""
        ...


class NativeModel(OpenAIModel):
    """A provider's own API on the chat completions client's machinery: a subclass says where it posts
    (`path`), builds its request (`_request`) and reads its replies (`reader`)."""

    path = ""

    def reader(self, text: Shown, reasoning: Shown) -> Reader:
        raise NotImplementedError

    async def complete(self, messages: list[Message], **options: Any) -> Completion:
        await asyncio.to_thread(self.prepare)  # the SDK's import takes seconds (anthropic's: 1.6 s of CPU): off the loop
        return await super().complete(messages, **options)

    async def describe(self) -> ServerModel:
        """Neither service lists a context window: nothing is asked, and the configuration stands."""
        return ServerModel()

    def _mid_stream(self, e: Exception) -> Exception | None:
        """An error the service sent inside a stream that had begun well, as a passing fault; None if `e`
        is not one."""
        return None

    async def _call(self, request: dict[str, Any], text: Shown, reasoning: Shown, first_cell: bool = False) -> Completion:
        """`first_cell` is chat completions' (a text-mode reply cut after its first cell); a native reply
        is read to its end."""
        reader = self.reader(text, reasoning)
        try:
            if request.get("stream"):
                stream = await self._client.post(self.path, body=request, cast_to=object, stream=True,
                                                 stream_cls=self._openai.AsyncStream[object])
                try:
                    await self._refuse_html(stream.response)
                    async for event in stream:
                        reader.add_event(event)
                finally:
                    await stream.close()
            else:
                body = await self._client.post(self.path, body=request, cast_to=object)
                if isinstance(body, str):  # not JSON: the client hands the text over as it is
                    await self._refuse_html(None, body)
                    raise _Retryable(f"malformed reply from the server: not JSON: {brief(body)}")
                reader.add_message(body)
            return reader.completion()
        except MalformedReply as e:
            raise _Retryable(str(e)) from None
        except (_Retryable, ModelError):
            raise
        except Exception as e:
            raise (self._mid_stream(e) or self._classify(e)) from e


def malformed(what: str, value: Any) -> MalformedReply:
    return MalformedReply(f"malformed reply from the server: {what}: {brief(repr(value))}")
