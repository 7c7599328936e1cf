"""The model seam: the `Model` protocol and `OpenAIModel` for any OpenAI-compatible server.

Two action formats (agent/actions.py): `tools` (native tool calling with one `ipython` tool) and
`text` (the model writes ```python fenced cells). Transient failures (429, 5xx, timeouts, dropped streams,
malformed replies) are retried with exponential backoff and jitter, or after as long as the server
asks (`Retry-After`, `x-ratelimit-reset-*`); an exhausted quota is waited on within `model.max_wait`;
a model that keeps failing gives way to the next of `model.fallback`. What is left becomes a
`ModelError` (or `ModelTimeout`) carrying a message for the user. Requests and replies are plain
JSON in the wire format of agent/wire.py.

One concern: calling a model. The protocol every caller holds, the errors a call ends in, and the
one client of it (its retries, waits and fallbacks, and reading what a failed call's server said).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import functools
import html
import random
import re
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from agent.actions import IPYTHON_TOOL
from agent.config_models import ModelConfig
from agent.repetition import Repetition
from agent.types import Completion, Message
from agent.vision import bounded, known_vision, listed_vision
from agent.wire import MalformedReply, Reader, ServerReply, Shown, brief, to_wire

DeltaCallback = Callable[[str], None]
RetryCallback = Callable[[int, float, str], None]
"""on_retry(attempt, delay_seconds, reason)."""
FallbackCallback = Callable[[str, str, str], None]
"""on_fallback(from_model, to_model, reason)."""



class ModelError(Exception):
    """A model call failed for good (after retries); the message is for the user."""


class ModelTimeout(ModelError):
    """The server did not answer within the timeout, on every attempt."""


class ContextOverflow(ModelError):
    """The server refused the request because the context is longer than the model's window."""


class ToolsRefused(ModelError):
    """The server refused a request with tools: it cannot serve tool calls for this model."""


class Repeating(ModelError):
    """The completion fell into a loop, repeating one piece of text back to back: it was stopped there
    (`model.repetition_limit`). Not retried: the same request would loop again."""


TOOLS_ERRORS = re.compile(r"enable-auto-tool-choice|tool-call-parser|tool.choice|does not support tools|"
                          r"tools? (are|is) not supported", re.IGNORECASE)
"""vLLM without a tool parser (`"auto" tool choice requires --enable-auto-tool-choice and
--tool-call-parser to be set`), Ollama (`MODEL does not support tools`), ours (`... does not support
tools: its chat template renders none`)."""

CONTEXT_ERRORS = re.compile(r"context.length|context_length|maximum context|context window|too many tokens|prompt is too long",
                            re.IGNORECASE)


class ServerModel(BaseModel):
    """What a server says of the model it serves; each field None (or empty) where it says nothing."""

    context_window: int | None = Field(None, ge=1)
    """Tokens the model accepts: `max_model_len` (vLLM, ours), `context_length` (OpenRouter), `n_ctx`
    (llama.cpp's `/props`)."""
    tools: bool | None = None
    """Whether the server can serve tool calls for it (ours: whether its chat template renders tools)."""
    sampling: dict[str, float] = Field(default_factory=dict)
    """The model's own sampling defaults (ours: from its `generation_config.json`): temperature, top_p."""
    vision: bool | None = None
    """Whether the model takes images in (OpenRouter's `architecture.input_modalities`)."""
    structured_outputs: bool | None = None
    """Whether the server holds a reply to a JSON schema (`response_format` json_schema): ours says so."""
    reached: bool = True
    """False: no server could be reached there (not up yet): ask again later."""


FITTED_COMPLETION_MAX = 32_768
"""The most tokens a completion is fitted to (`model.max_completion_tokens` unset, a known window)."""


def fitted(config: ModelConfig, server: ServerModel) -> ModelConfig:
    """`config` with what the server says of its model wherever the user set nothing: the context
    window, a completion cap fitted to it (a fifth of a window known from the server or the user),
    whether it sees images, text mode for a model that renders no tools, its sampling defaults. What
    the user set stays set (the result's `model_fields_set` is the user's), and wins."""
    update: dict[str, Any] = {}
    if server.context_window and not config.user_set("context_window"):
        update["context_window"] = server.context_window
    window = update.get("context_window") or (config.context_window if config.user_set("context_window") else None)
    if window and not config.user_set("max_completion_tokens"):
        update["max_completion_tokens"] = max(1, min(window // 5, FITTED_COMPLETION_MAX))
    if config.vision == "auto" and (server.vision if server.vision is not None else known_vision(config.name)):
        update["vision"] = True  # else `auto` stays, and is off
    if server.tools is False and not config.user_set("action_format"):
        update["action_format"] = "text"
    sampling = dict(server.sampling)
    if "temperature" in sampling and config.temperature is None:
        update["temperature"] = sampling["temperature"]
    extra = {k: v for k, v in sampling.items() if k != "temperature" and k not in config.extra_body}
    if extra:
        update["extra_body"] = {**extra, **config.extra_body}
    return config.with_defaults(**update) if update else config


class Model(Protocol):
    name: str
    action_format: Literal["tools", "text"]

    async def describe(self) -> ServerModel:
        """What the model's server says of it (asked once per server and model, until it answers), empty
        where it says nothing; not `reached` where it cannot be asked (yet)."""
        ...

    def reconfigure(self, config: ModelConfig) -> None:
        """Go on with these settings: the session's fit of the model to its server, or text mode after
        the server refused tools."""
        ...

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
        """One completion. `tools=False` for plain calls (summaries, `llm()`); `json_mode=True` asks for
        a JSON object (the server's JSON mode), a JSON schema for a reply valid under it (`response_format`
        json_schema, for a server that can: `ServerModel.structured_outputs`); `on_delta` streams text and
        `on_reasoning` the model's reasoning; `on_retry` hears of each wait and `on_fallback` of a switch to
        a fallback model."""
        ...

    def variant(self, name: str) -> Model:
        """The same server and settings with another model name (for `rlm(model=...)`, `llm(model=...)`)."""
        ...


DRAIN_SECONDS = 1.0
"""How long the rest of a streamed body is read after its `[DONE]` (a server that ends it at once takes none)."""


def _read_to_the_end(openai: Any) -> type:
    """openai's stream, but one that reads the body to its end before it is closed: the client's
    own stops at `[DONE]` and closes the response with the body's last chunk unread, which drops the
    connection, so every model call opened a new one (a TCP connect, for a remote server a TLS
    handshake; 1-3 ms a call against a local server). What comes after `[DONE]` is never read as a
    reply, nor can it fail one: the completion is whole by then."""

    class ReadToTheEnd(openai.AsyncStream[object]):
        async def _iter_events(self) -> Any:
            events = self._decoder.aiter_bytes(self.response.aiter_bytes())
            async for sse in events:
                if sse.data.startswith("[DONE]"):
                    with contextlib.suppress(Exception):  # a timeout, a connection cut after the answer
                        async with asyncio.timeout(DRAIN_SECONDS):
                            async for _ in events:
                                pass
                yield sse

    return ReadToTheEnd


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS settings every client of this process shares: what httpx makes for each client by default
    (its CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR), made once. Loading the bundle took 20-70 ms a
    client here, on every session a daemon starts; an `SSLContext` is safe to share."""
    import httpx

    return httpx.create_ssl_context()


def preload() -> None:
    """What every model client of this process needs, made ahead: the client library imported (~0.4 s) and
    the TLS settings loaded. A host that starts sessions (the daemon) runs it in a thread as it starts, so
    that its first session does not wait for it."""
    import openai  # noqa: F401

    _tls_context()


class _Retryable(Exception):
    def __init__(self, reason: str, timeout: bool = False, wait: float | None = None, quota: bool = False):
        super().__init__(reason)
        self.timeout = timeout
        self.wait = wait
        """Seconds the server asked us to wait (Retry-After, x-ratelimit-reset-*), if it said."""
        self.quota = quota
        """A quota or credit limit, not a passing overload: waited on longer, within `max_wait`."""


QUOTA_ERRORS = re.compile(r"insufficient.quota|exceeded your current quota|quota exceeded|usage limit|"
                          r"insufficient (balance|credits?|funds)|more credits|out of credits", re.IGNORECASE)
"""OpenAI's `insufficient_quota` (a 429), DeepSeek's 402 "Insufficient Balance", OpenRouter's 402
"requires more credits", Anthropic-style "usage limit" messages."""


DESCRIBE_TIMEOUT = 10.0
"""Seconds `describe` waits for the server's model listing."""
SAMPLING = ("temperature", "top_p")
"""The sampling defaults a server's listing may advertise that the agent sends."""


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) < 1e6


class OpenAIModel:
    path = "/chat/completions"
    """Where a request is posted, under the base URL."""

    def __init__(self, config: ModelConfig, key_hint: str = "", api_key: str | None = None):
        """`key_hint`: what to do when the server refuses the key (HTTP 401), where the key comes from;
        by default, to set OPENAI_API_KEY or model.api_key. `api_key`: the key to send, where it is not
        the configuration's (a daemon's client's, which no configuration holds)."""
        if not config.name:
            raise ModelError("no model name configured (set PRIME_AGENT_MODEL or --model)")
        self.config = config
        self.api_key = api_key or config.api_key
        self.key_hint = key_hint or ("check the API key (OPENAI_API_KEY, or model.api_key)" if self.api_key
                                     else "no API key was sent: set OPENAI_API_KEY (or model.api_key)")
        self.name = config.name
        """The model in use: `config.name`, or the `fallback` model it switched to."""
        self.action_format = config.action_format
        self._client: Any = None
        self._stream_cls: Any = None
        self._preparing = threading.Lock()
        self._described: dict[tuple[str | None, str], ServerModel] = {}
        """What each server said of each model, by (base URL, model name): asked once a session."""

    def variant(self, name: str) -> OpenAIModel:
        other = type(self)(self.config.model_copy(update={"name": name}), self.key_hint, self.api_key)
        other._described = self._described
        return other

    def reconfigure(self, config: ModelConfig) -> None:
        self.config, self.action_format = config, config.action_format

    def prepare(self) -> None:
        """Import the client library and build the client (~0.5 s); safe to run in a thread."""
        with self._preparing:
            if self._client is not None:
                return
            import openai

            self._openai = openai
            self._stream_cls = _read_to_the_end(openai)
            self._client = openai.AsyncOpenAI(
                base_url=self.config.base_url,
                api_key=self.api_key or "not-needed",
                max_retries=0,  # we retry ourselves, so dropped streams and bad replies are retried too
                timeout=self.config.timeout,
                http_client=openai.DefaultAsyncHttpxClient(timeout=self.config.timeout, verify=_tls_context()),
            )

    async def describe(self) -> ServerModel:
        """`GET /v1/models` (and llama.cpp's `/props`), read for this model's entry. OpenAI's own API
        (no base URL) says nothing of use and is not asked; a server that answers with an error says
        nothing; one that cannot be reached is asked again next time."""
        key = (self.config.base_url, self.name)
        if key in self._described:
            return self._described[key]
        server = ServerModel() if self.config.base_url is None else await self._ask_server()
        if server.reached:
            self._described[key] = server
        return server

    async def _ask_server(self) -> ServerModel:
        await asyncio.to_thread(self.prepare)
        options = {"timeout": min(self.config.timeout, DESCRIBE_TIMEOUT)}
        try:
            listing = await self._client.get("/models", cast_to=object, options=options)
        except self._openai.APITimeoutError:  # a listing that does not come in time is not waited on again
            return ServerModel()
        except self._openai.APIConnectionError:  # no server there yet: asked again before the next call
            return ServerModel(reached=False)
        except Exception:  # no listing (transformers serve offline: a 500): the server says nothing
            return ServerModel()
        entries = listing.get("data") if isinstance(listing, dict) else None
        entry = next((e for e in entries or [] if isinstance(e, dict) and e.get("id") == self.name), {})
        window = _positive(entry.get("max_model_len")) or _positive(entry.get("context_length"))
        if window is None and entry.get("owned_by") == "llamacpp":
            props_url = self.config.base_url.rstrip("/").removesuffix("/v1") + "/props"
            with contextlib.suppress(Exception):
                props = await self._client.get(props_url, cast_to=object, options=options)
                settings = props.get("default_generation_settings") or {}
                window = _positive(props.get("n_ctx")) or _positive(settings.get("n_ctx"))
        tools = entry.get("tools")
        sampling = entry.get("sampling_defaults")
        sampling = {k: float(v) for k, v in sampling.items() if k in SAMPLING and _number(v)} \
            if isinstance(sampling, dict) else {}
        structured = entry.get("structured_outputs")
        return ServerModel(context_window=window, tools=tools if isinstance(tools, bool) else None, sampling=sampling,
                           vision=listed_vision(entry),
                           structured_outputs=structured if isinstance(structured, bool) else None)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

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
        self.prepare()
        cfg = self.config
        messages = bounded(messages, cfg.max_images if cfg.vision is True else 0)
        # What a stream cut mid-way already showed is not shown again when the retry streams it anew.
        shown = Shown(on_delta), Shown(on_reasoning)
        attempt = tries = failures = quota_waits = 0
        waited = 0.0
        started = time.monotonic()
        while True:
            attempt += 1
            tries += 1
            request = self._request(messages, tools, json_mode)
            for s in shown:
                s.restart()
            try:
                completion = await self._call(request, *shown, first_cell=tools and self.action_format == "text")
            except _Retryable as e:
                failures += 1
                limited = e.wait is not None or e.quota  # a wait the server asked for, or a quota's: within max_wait
                if e.quota:
                    quota_waits += 1
                    tries -= 1  # quota waits are bounded by max_wait, not max_retries
                delay = self._delay(e, quota_waits if e.quota else tries)
                out_of_time = limited and waited + delay > cfg.max_wait
                giving_up = out_of_time or tries > cfg.max_retries
                if (failures >= cfg.fallback_after or giving_up) and self._fall_back(str(e), on_fallback):
                    failures = tries = quota_waits = 0
                    continue
                where = cfg.base_url or "the OpenAI API"
                if out_of_time:
                    raise ModelError(f"model call to {where} failed: {e}; gave up after waiting {waited:.3g}s "
                                     f"in all (model.max_wait = {cfg.max_wait:g})") from None
                if giving_up:
                    kind = ModelTimeout if e.timeout else ModelError
                    raise kind(f"model call to {where} failed after {tries} attempts: {e}") from None
                if on_retry:
                    on_retry(attempt, delay, _waiting(e, delay, cfg.max_wait - waited))
                await asyncio.sleep(delay)
                if limited:
                    waited += delay
                continue
            completion.attempts = attempt
            completion.duration = time.monotonic() - started
            if completion.usage.cost == 0.0 and (price := cfg.prices.get(self.name)) is not None:
                completion.usage.cost = price.cost(completion.usage)
            return completion

    def _fall_back(self, reason: str, on_fallback: FallbackCallback | None) -> bool:
        """Switch to the next `fallback` model, if one is left; it stays in use from then on."""
        chain = [self.config.name, *self.config.fallback]
        at = chain.index(self.name) if self.name in chain else 0
        if at + 1 >= len(chain):
            return False
        previous, self.name = self.name, chain[at + 1]
        if on_fallback:
            on_fallback(previous, self.name, reason)
        return True

    def _delay(self, e: _Retryable, n: int) -> float:
        """The wait before try `n + 1`."""
        cfg = self.config
        if e.quota:
            backoff = cfg.quota_retry_delay * 2 ** (n - 1)
            return max(e.wait or 0.0, backoff)
        if e.wait is not None:
            return e.wait  # the server said how long: no more, no less
        delay = min(cfg.retry_max_delay, cfg.retry_base_delay * 2 ** (n - 1))
        return delay * random.uniform(0.5, 1.0)  # jitter, so clients do not retry in lockstep

    def _request(self, messages: list[Message], tools: bool, json_mode: bool | dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        wire = [to_wire(m, cfg.send_reasoning) for m in messages]
        req: dict[str, Any] = {"model": self.name, "messages": wire}
        if tools and self.action_format == "tools":
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
        if isinstance(json_mode, dict):
            name = re.sub(r"[^A-Za-z0-9_-]", "_", str(json_mode.get("title") or "reply"))[:64]
            req["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": json_mode}}
        elif json_mode:
            req["response_format"] = {"type": "json_object"}
        req.update(cfg.extra_body)
        return req

    def _classify(self, e: Exception) -> Exception:
        """Map a client exception to _Retryable, or to a final ModelError."""
        oa = self._openai
        if isinstance(e, oa.APITimeoutError):
            return _Retryable(f"no answer within {self.config.timeout:g}s", timeout=True)
        if isinstance(e, oa.APIConnectionError):
            where = f"is a server up at {self.config.base_url}?" if self.config.base_url else "no network?"
            return _Retryable(f"connection failed: {e.__cause__ or e} ({where})")
        if isinstance(e, oa.APIStatusError):
            status, message = e.status_code, _error_text(e)
            headers = e.response.headers
            if status in (402, 403, 429) and (getattr(e, "code", None) == "insufficient_quota"
                                              or QUOTA_ERRORS.search(message)):
                return _Retryable(f"out of quota: HTTP {status}: {message}", wait=retry_after(headers), quota=True)
            if status == 429 or status >= 500 or status == 408:
                return _Retryable(f"HTTP {status}: {message}", wait=retry_after(headers))
            if status == 400 and TOOLS_ERRORS.search(message):
                return ToolsRefused(f"the server refused tool calling for {self.name}: {message}")
            if status in (400, 413) and CONTEXT_ERRORS.search(message):
                return ContextOverflow(f"the context is too long for the model: {message}")
            hint = f"; {self.key_hint}" if status == 401 else ""
            return ModelError(f"the server refused the request: HTTP {status}: {message}{hint}")
        if isinstance(e, oa.APIError):  # an error event inside a stream that had begun well
            return _Retryable(f"the server reported an error mid-stream: {brief(e.message)}")
        if isinstance(e, (oa.APIResponseValidationError, ValueError, KeyError, TypeError, AttributeError)):
            return _Retryable(f"malformed reply from the server: {brief(str(e))}")
        if type(e).__module__.startswith(("httpx", "httpcore", "h11")):
            return _Retryable(f"the stream dropped: {type(e).__name__}: {brief(str(e))}")
        return e

    async def _post(self, request: dict[str, Any]) -> Any:
        # `chat.completions.create` re-validates the whole message list against its TypedDicts on
        # every call: O(context) Python work per step (20 ms a step at 100 cells). Our body is
        # plain JSON already, so post it through the same client as is, and read the reply as plain
        # JSON too: servers differ from OpenAI's types in ways their models would hide (see agent.wire.ServerReply).
        return await self._client.post(self.path, body=request, cast_to=object, stream=bool(request.get("stream")),
                                       stream_cls=self._stream_cls)

    def reader(self, text: Shown, reasoning: Shown) -> Reader:
        """What reads one reply (a native provider's subclass reads its own API's)."""
        return ServerReply(text, reasoning, self._watch())

    def _watch(self) -> Callable[[str], None]:
        """What watches a completion's text for a loop: raises `Repeating` once it fell into one."""
        limit = self.config.repetition_limit
        if not limit:
            return lambda piece: None
        guard, written = Repetition(limit), 0

        def watch(piece: str) -> None:
            nonlocal written
            written += len(piece)
            if (loop := guard.feed(piece)) is not None:
                raise Repeating(f"the model fell into a loop, writing {loop.describe()}: its completion was "
                                f"stopped after {written:,} characters (model.repetition_limit = {limit})")

        return watch

    async def _call(self, request: dict[str, Any], text: Shown, reasoning: Shown, first_cell: bool = False) -> Completion:
        """`first_cell`: a text-mode step, whose streamed reply ends with its first whole cell where it can
        (`ServerReply.stop_after_cell`)."""
        try:
            reply = self.reader(text, reasoning)
            if request.get("stream"):
                stream = await self._post(request)
                try:
                    await self._refuse_html(stream.response)
                    async for chunk in stream:
                        reply.add_event(chunk)
                        if first_cell and isinstance(reply, ServerReply) and reply.stop_after_cell():
                            break
                finally:  # also when the reply is stopped early: the server stops sampling it
                    await stream.close()
            else:
                body = await self._post(request)
                if isinstance(body, str):  # not JSON: the client hands the text over as it is
                    await self._refuse_html(None, body)
                    raise _Retryable(f"malformed reply from the server: not JSON: {brief(body)}")
                reply.add_message(body)
            return reply.completion()
        except MalformedReply as e:
            raise _Retryable(str(e)) from None
        except (_Retryable, ModelError):
            raise
        except Exception as e:
            raise self._classify(e) from e

    async def _refuse_html(self, response: Any, body: str | None = None) -> None:
        """A 200 that is a web page (a login portal, a UI at the base URL) is no passing fault: say so."""
        if response is not None:
            if "html" not in response.headers.get("content-type", ""):
                return
            body = (await response.aread()).decode(errors="replace")
        if body is not None and (title := html_title(body)) is not None:
            raise ModelError(f"the server at {self.config.base_url or 'the OpenAI API'} answered with a web page "
                             f"({title!r}), not the chat completions API: check model.base_url (it usually ends in /v1)")




def retry_after(headers: Any) -> float | None:
    """Seconds a server asks a client to wait before it tries again: `Retry-After` (seconds or an
    HTTP date), `retry-after-ms`, else the `x-ratelimit-reset-*` of the limit that ran out
    (OpenAI's durations: `1s`, `6m0s`, `20ms`); None when it does not say."""
    if (ms := headers.get("retry-after-ms")) is not None:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000)
    if (value := headers.get("retry-after")) is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                when = email.utils.parsedate_to_datetime(value)
                when = when if when.tzinfo else when.replace(tzinfo=datetime.UTC)
                return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())
    resets = []
    for limit in ("requests", "tokens"):
        reset = _duration(headers.get(f"x-ratelimit-reset-{limit}"))
        if reset is not None:
            resets.append((headers.get(f"x-ratelimit-remaining-{limit}") == "0", reset))
    if resets:
        return max([r for out, r in resets if out] or [r for _, r in resets])
    return None


DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def _duration(text: str | None) -> float | None:
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(text))
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        return None
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)


def html_title(text: str) -> str | None:
    """The title (or first words) of an HTML page; None if `text` is not one."""
    if not re.search(r"<(html|!doctype html|body|head)\b", text[:2000], re.IGNORECASE):
        return None
    title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
    words = title.group(1) if title else re.sub(r"<[^>]+>", " ", text)
    return brief(html.unescape(words), 120) or "an HTML page"


def _error_text(e: Any) -> str:
    """An HTTP error's message: the server's own, or what an HTML error page (a proxy's) says it is."""
    body = e.body if isinstance(e.body, str) else None
    if body is None and e.response is not None:
        with contextlib.suppress(Exception):
            body = e.response.text
    if body and (title := html_title(body)) is not None:
        return f"{title} (an HTML page: a proxy or gateway answered, not the model server)"
    if isinstance(e.body, dict):  # OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, or a bare {"message"}
        inner = e.body.get("error", e.body)
        said = inner.get("message") or inner.get("detail") if isinstance(inner, dict) else inner
        if isinstance(said, str) and said:
            return brief(said)
    return brief(e.message or "")


def _waiting(e: _Retryable, delay: float, left: float) -> str:
    """What a retry says to the user."""
    if e.quota:
        return f"{e}; waiting {delay:.3g}s for the quota (up to {left:.0f}s more in all: model.max_wait)"
    if e.wait is not None:
        return f"{e}; the server asked to wait {delay:g}s"
    return str(e)


