"""An OpenAI-compatible server for the policy: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Every sampled token comes with its logprob and id. Concurrent requests are batched together.
New weights load between batches (hot reload), so requests in flight finish on the weights they
started with; each response names the `policy_version` that sampled it.

    prime-agent rl serve [--checkpoint DIR] [--host 127.0.0.1] [--port 8000]     # a byte policy
    prime-agent rl serve --model NAME|DIR [--dtype bfloat16] [--port 8000]       # a Hugging Face model

A byte policy samples in batches (`Engine`); a Hugging Face causal LM with continuous batching
and a prefix cache (rl/engine.py), its chat template the tokenizer's own.

It also stands in for vLLM as an external rollout server (`train.rollout_url`): the trainer POSTs
{"path": DIR} to /v1/reload after each step. vLLM's replies name no policy version and it has no
such reload route: docs/rl.md says what to configure there.
"""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from rl.grammar import Constraint, GrammarError, Grammars, constraint, start, tool_calls
from rl.policy.checkpoint import latest_checkpoint, load_policy
from rl.policy.policy import Policy, PolicyConfig
from rl.policy.sampler import Job, generate
from rl.policy.tokenizer import ByteTokenizer

MAX_BATCH_ROWS = 256


class Engine:
    """The policy and a worker thread that samples batches of queued jobs."""

    def __init__(self, model: Policy, name: str = "prime-policy", version: int = 0, truncate: bool = False):
        self.model = model
        self.name = name
        self.version = version
        self.truncate = truncate
        """Keep the most recent tokens of a prompt longer than the context, instead of refusing it."""
        self.tok = ByteTokenizer()
        self.tools = False
        """A byte policy's chat format renders no tools."""
        self.sampling: dict[str, float] = {}
        self.context = model.config.max_seq
        self.vocab_size = ByteTokenizer.vocab_size
        self.grammars = Grammars(self.tok, self.vocab_size, (ByteTokenizer.END, ByteTokenizer.EOS))
        """Structured output (rl/grammar.py)."""
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._pending: tuple[dict, int] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, daemon=True, name="policy-sampler")
        self._thread.start()

    # --- weights -------------------------------------------------------------------------------

    def update(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """New weights, swapped in before the next batch (never under a batch in flight).
        Raises ValueError, and keeps the current weights, when they do not fit this policy."""
        current = self.model.state_dict()
        wrong = sorted(k for k in current.keys() | state_dict.keys()
                       if k not in state_dict or k not in current or state_dict[k].shape != current[k].shape)
        if wrong:
            raise ValueError(f"the weights do not fit this policy (e.g. {', '.join(wrong[:3])})")
        with self._lock:
            self._pending = ({k: v.detach().clone() for k, v in state_dict.items()}, version)

    def load(self, path: Path) -> int:
        """Hot-reload a checkpoint directory (or the latest `step-*` under it); returns its version."""
        path = latest_checkpoint(path) or path
        model = load_policy(path)
        version = int((path / "COMPLETE").read_text()) if (path / "COMPLETE").is_file() else self.version + 1
        self.update(model.state_dict(), version)
        return version

    # --- sampling ------------------------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        self._jobs.put(job)
        return job

    def _work(self) -> None:
        while True:
            batch = [self._jobs.get()]
            time.sleep(0.002)  # let concurrent requests join this batch
            while not self._jobs.empty() and sum(len(j.prompts) for j in batch) < MAX_BATCH_ROWS:
                batch.append(self._jobs.get_nowait())
            with self._lock:
                pending, self._pending = self._pending, None
            if pending is not None:
                try:
                    self.model.load_state_dict(pending[0])
                    self.version = pending[1]
                except (RuntimeError, ValueError) as e:  # keep serving the weights it has
                    print(f"policy server: could not load new weights: {e}", flush=True)
            groups: dict[tuple, list[Job]] = {}
            for j in batch:  # one forward pass per compatible group; a seeded job samples alone (reproducible)
                key = (j.temperature, j.top_p, j.ignore_eos) if j.seed is None else ("seeded", id(j))
                groups.setdefault(key, []).append(j)
            for jobs in groups.values():
                self._sample(jobs)

    def _sample(self, jobs: list[Job]) -> None:
        rows = [(j, i) for j in jobs for i in range(len(j.prompts))]
        first = jobs[0]
        gen = torch.Generator().manual_seed(first.seed) if first.seed is not None else None

        def on_token(row: int, token: int, logprob: float) -> bool:
            job, i = rows[row]
            stop = job.on_token(i, token, logprob) if job.on_token else False
            return bool(stop)

        try:
            matchers = [start(j.grammar) if j.grammar is not None else None for j, _ in rows]
            constrained = any(m is not None for m in matchers)
            out = generate(self.model, [j.prompts[i] for j, i in rows], max_tokens=max(j.max_tokens for j in jobs),
                           temperature=first.temperature, top_p=first.top_p, generator=gen, on_token=on_token,
                           row_max_tokens=[j.max_tokens for j, _ in rows],
                           stop_ids=() if first.ignore_eos else (ByteTokenizer.END, ByteTokenizer.EOS),
                           matchers=matchers if constrained else None,
                           executor=self.grammars.executor() if constrained else None)
        except BaseException as e:  # a failed batch fails its requests, not the server
            for j in jobs:
                j.error = e
                j.done.set()
            return
        for j in jobs:
            j.result, j.version, j.cached = [], self.version, [0] * len(j.prompts)
        for (j, _), sampled in zip(rows, out):
            j.result.append(sampled)
        for j in jobs:
            j.done.set()


# --- the HTTP API ----------------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # other OpenAI parameters are accepted and ignored

    model: str | None = None
    n: int = Field(1, ge=1, le=64)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=1)
    """As in vLLM: keep only the last N prompt tokens."""
    ignore_eos: bool = False
    """As in vLLM: sample past the end-of-text tokens."""
    response_format: dict[str, Any] | None = None
    """OpenAI's: `{"type": "json_schema", "json_schema": {"name", "schema"}}` or `{"type": "json_object"}`
    constrains the reply (rl/grammar.py)."""


class ChatRequest(_Request):
    messages: list[dict[str, Any]]
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    """`required` or a named function: the reply is a tool call, its arguments valid under the tool's
    parameters (rl/grammar.py); `auto` and `none`: text."""


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | bool | None = None
    echo: bool = False


def create_app(engine, strict_name: bool = False) -> FastAPI:
    """The HTTP API over a sampler: `Engine` (byte policies) or rl.engine.HFEngine. `strict_name`: a
    request naming another model than `engine.name` is refused (404 `model_not_found`, as OpenAI and
    vLLM answer), so a misspelt name fails here as it would on any other server; without it (the
    trainer's own servers, a byte policy) any name is served."""
    app = FastAPI(title="Prime Agent policy server")
    tok = engine.tok

    def unknown(req: _Request) -> JSONResponse | None:
        if not strict_name or req.model in (None, engine.name):
            return None
        return JSONResponse({"error": {"message": f"The model `{req.model}` does not exist: this server serves "
                                                  f"`{engine.name}` (GET /v1/models lists it)",
                                       "type": "invalid_request_error", "param": "model", "code": "model_not_found"}},
                            404)

    # Errors in OpenAI's shape, so clients show the message.
    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        return JSONResponse({"error": {"message": exc.detail, "type": "invalid_request_error"}}, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": {"message": problems, "type": "invalid_request_error"}}, 400)

    @app.get("/v1/models")
    async def models() -> dict:
        # What a client needs to fit the model (agent.model.OpenAIModel.describe): its context, whether its
        # template renders tools, its own sampling defaults (a request that names no temperature is
        # still sampled at 1.0 here: the client sends them), that it honours response_format and forced tool calls
        # and, from the built-in engine, its memory in bytes (weights, kv_cache, prefix_cache, other, pss)
        memory = {"memory": engine.memory()} if hasattr(engine, "memory") else {}
        return {"object": "list", "data": [{"id": engine.name, "object": "model", "owned_by": "prime-agent",
                                            "max_model_len": engine.context, "policy_version": engine.version,
                                            "tools": engine.tools, "sampling_defaults": engine.sampling,
                                            "structured_outputs": True, **memory}]}

    @app.post("/v1/reload")
    async def reload(body: dict) -> dict:
        try:
            return {"policy_version": await asyncio.to_thread(engine.load, Path(body["path"]))}
        except (KeyError, FileNotFoundError, OSError, ValueError) as e:
            raise HTTPException(400, f"cannot load weights: {e}") from None

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request):
        if (refused := unknown(req)) is not None:
            return refused
        for m in req.messages:
            if not isinstance(m.get("content", ""), (str, type(None))):
                m["content"] = "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
        tools = req.tools
        c = _constraint(req.response_format, tools, req.tool_choice)
        if tools and not engine.tools and not (c and c.tool_call):
            # as vLLM and Ollama refuse them: a 400 naming why, never dropped silently (a forced call is
            # served on any model, as vLLM serves one: its arguments are held to the tool's schema)
            raise HTTPException(400, f"{engine.name} does not support tools: its chat template renders none "
                                     "(ask for ```python cells in text: the agent's model.action_format = \"text\")")
        try:
            messages = [{"role": m.get("role", "user"), "content": m.get("content") or ""} for m in req.messages]
            prompt = tok.chat(messages, tools=tools) if tools and engine.tools else tok.chat(messages)
        except Exception as e:  # the model's own chat template refused the messages (jinja raise_exception)
            raise HTTPException(400, f"the chat template refused the messages: {e}") from None
        return await _respond(engine, req, [prompt], True, request, c)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        if (refused := unknown(req)) is not None:
            return refused
        p = req.prompt
        if isinstance(p, str):
            prompts = [tok.encode(p)]
        elif p and all(isinstance(x, int) for x in p):
            prompts = [list(p)]
        else:
            prompts = [tok.encode(x) if isinstance(x, str) else list(x) for x in p]
        if not prompts or any(not x for x in prompts):
            raise HTTPException(400, "prompt must not be empty")
        if any(t < 0 or t >= engine.vocab_size for x in prompts for t in x):
            raise HTTPException(400, f"token ids must be in [0, {engine.vocab_size})")
        return await _respond(engine, req, prompts, False, request, _constraint(req.response_format, None, None))

    return app


def _constraint(response_format, tools, tool_choice) -> Constraint | None:
    try:
        return constraint(response_format, tools, tool_choice)
    except GrammarError as e:
        raise HTTPException(400, str(e)) from None


async def _grammar(engine, req: _Request, c: Constraint | None):
    """The compiled grammar of a request's constraint (None: it has none); a 400 for what cannot be enforced."""
    if c is None:
        return None
    if req.ignore_eos:
        raise HTTPException(400, "ignore_eos cannot be combined with response_format or a forced tool call")
    try:
        return await asyncio.to_thread(engine.grammars.compile, c.grammar)
    except GrammarError as e:
        raise HTTPException(400, str(e)) from None


async def _respond(engine, req: _Request, prompts: list[list[int]], chat: bool, request: Request,
                   constraint: Constraint | None = None):
    tok = engine.tok
    grammar = await _grammar(engine, req, constraint)
    limit = engine.context
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    max_tokens = next((m for m in (req.max_completion_tokens, req.max_tokens) if m is not None), 256 if chat else 16)
    keep = req.truncate_prompt_tokens or (max(1, limit - min(max_tokens, limit // 2)) if engine.truncate else None)
    if keep is not None:
        prompts = [keep_tail(p, keep, tok.bos) for p in prompts]
    if any(len(p) >= limit for p in prompts):
        raise HTTPException(400, f"this model's maximum context length is {limit} tokens and the prompt has "
                                 f"{max(map(len, prompts))}: pass truncate_prompt_tokens ([env] prompt_tokens in RL) or "
                                 "start the server with --truncate to keep its last tokens, or send a shorter prompt "
                                 "(the agent: --set model.base_prompt=short)")
    expanded = [p for p in prompts for _ in range(req.n)]
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
    created = int(time.time())
    loop = asyncio.get_running_loop()
    stream_q: asyncio.Queue | None = asyncio.Queue() if req.stream else None
    streams = [tok.detokenizer() for _ in expanded]
    texts = [""] * len(expanded)
    ends: list[list[int]] = [[] for _ in expanded]  # each row's text length after each of its tokens
    sent = [0] * len(expanded)  # characters of each row's text already streamed

    def on_token(i: int, token: int, logprob: float) -> bool:
        texts[i] += streams[i].push(token)
        ends[i].append(len(texts[i]))
        hit = min((texts[i].index(s) for s in stops if s and s in texts[i]), default=None)
        # Stream only text that cannot turn out to be the start of a stop string.
        safe = hit if hit is not None else len(texts[i]) - _held(texts[i], stops)
        piece, sent[i] = texts[i][sent[i] : max(safe, sent[i])], max(safe, sent[i])
        if stream_q is not None:
            loop.call_soon_threadsafe(stream_q.put_nowait, (i, token, logprob, piece, hit is not None))
        return hit is not None

    job = engine.submit(Job(expanded, max_tokens, req.temperature, req.top_p, req.seed, stops, on_token,
                            ignore_eos=req.ignore_eos, grammar=grammar))
    waiter = asyncio.ensure_future(asyncio.to_thread(job.done.wait))
    if stream_q is not None:
        reply = _Reply(engine, req, job, waiter, stream_q, rid, created, chat, prompts, expanded, streams, texts, sent,
                       constraint if constraint is not None and constraint.tool_call else None)
        return StreamingResponse(_stream(reply), media_type="text/event-stream")
    while not waiter.done():  # a client that hangs up stops its rows (the sampler drops them)
        await asyncio.wait([waiter], timeout=0.5)
        if not waiter.done() and await request.is_disconnected():
            job.cancelled = True
            return JSONResponse({"error": {"message": "the client disconnected"}}, 499)
    if job.error is not None:
        raise HTTPException(500, f"sampling failed: {job.error}")
    for i, stream in enumerate(streams):
        texts[i] += stream.flush()
    choices = []
    for i, s in enumerate(job.result):
        text, tokens, lps, finish = _cut(texts[i], ends[i], s, stops)
        choice: dict[str, Any] = {"index": i, "finish_reason": finish, "token_ids": tokens}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            if constraint is not None and constraint.tool_call:  # the output is the call: no content
                calls = tool_calls(constraint, text, _call_id)
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls" if finish == "stop" else finish
            choice["logprobs"] = {"content": [_lp_entry(tok, t, lp) for t, lp in zip(tokens, lps)]} if req.logprobs else None
        else:
            choice["text"] = text
            choice["logprobs"] = ({"tokens": [tok.token_str(t) for t in tokens], "token_logprobs": lps,
                                   "top_logprobs": None, "text_offset": None} if req.logprobs else None)
        choices.append(choice)
    completion_tokens = sum(len(c["token_ids"]) for c in choices)
    return JSONResponse({
        "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
        "model": req.model or engine.name, "choices": choices, "policy_version": job.version,
        "prompt_token_ids": prompts[0] if len(prompts) == 1 else prompts,
        "usage": _usage(expanded, job, completion_tokens),
    })


def _usage(rows: list[list[int]], job: Job, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's usage, the prompt counted once per row sampled (as vLLM counts `n`), with the part
    its prefix cache served."""
    prompt_tokens = sum(len(p) for p in rows)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": sum(job.cached or [])}}


@dataclass
class _Reply:
    """A streamed reply in the making: the request, its job, and each row's text so far."""

    engine: Any
    req: _Request
    job: Job
    waiter: asyncio.Future
    queue: asyncio.Queue
    """(row, token, logprob, text piece, stopped) per sampled token, from the sampler's thread."""
    id: str
    created: int
    chat: bool
    prompts: list[list[int]]
    rows: list[list[int]]
    streams: list
    texts: list[str]
    sent: list[int]
    calls: Constraint | None = None
    """A forced tool call's: its text is sent as `tool_calls` once a row ends, not as content."""


async def _stream(reply: _Reply):
    try:
        async for piece in _chunks(reply):
            yield piece
    finally:  # also when the client hangs up (the generator is closed early): its rows stop
        reply.job.cancelled = not reply.job.done.is_set()


async def _chunks(r: _Reply):
    engine, req, job, waiter, q, chat, prompts, rows, texts, sent = (
        r.engine, r.req, r.job, r.waiter, r.queue, r.chat, r.prompts, r.rows, r.texts, r.sent)
    rid, created, streams = r.id, r.created, r.streams
    tok = engine.tok
    obj = "chat.completion.chunk" if chat else "text_completion"
    counts = [0] * len(rows)
    base = {"id": rid, "object": obj, "created": created, "model": req.model or engine.name}

    def chunk(choice: dict) -> str:
        return "data: " + json.dumps({**base, "choices": [choice]}) + "\n\n"

    if chat:  # the first chunk also names the prompt's token ids, as vLLM's does
        first = {**base, "prompt_token_ids": prompts[0] if len(prompts) == 1 else prompts}
        for i in range(len(counts)):
            first["choices"] = [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            yield "data: " + json.dumps(first) + "\n\n"
    stopped: set[int] = set()
    while not (waiter.done() and q.empty()):
        try:
            i, token, logprob, piece, hit = await asyncio.wait_for(q.get(), 0.05)
        except TimeoutError:
            continue
        if i in stopped:
            continue
        counts[i] += 1
        if hit:
            stopped.add(i)
        entry = _lp_entry(tok, token, logprob)
        if chat:
            c = {"index": i, "delta": {} if r.calls else {"content": piece}, "finish_reason": None, "token_ids": [token],
                 "logprobs": {"content": [entry]} if req.logprobs else None}
        else:
            c = {"index": i, "text": piece, "finish_reason": None, "token_ids": [token],
                 "logprobs": {"tokens": [entry["token"]], "token_logprobs": [logprob]} if req.logprobs else None}
        yield chunk(c)
    await waiter
    if job.error is not None:
        yield "data: " + json.dumps({"error": {"message": f"sampling failed: {job.error}"}}) + "\n\n"
        return
    for i, stream in enumerate(streams):
        texts[i] += stream.flush()
    for i, s in enumerate(job.result):
        finish = "stop" if i in stopped else s.finish_reason
        if r.calls:  # the whole call at once (clients accumulate a call's deltas: one is a valid sequence)
            calls = tool_calls(r.calls, texts[i][: sent[i]] if i in stopped else texts[i], _call_id)
            yield chunk({"index": i, "delta": {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]},
                         "finish_reason": None})
            yield chunk({"index": i, "delta": {}, "finish_reason": "tool_calls" if finish == "stop" else finish})
            continue
        rest = "" if i in stopped else texts[i][sent[i]:]  # text held back for a stop string that never came
        yield chunk({"index": i, "delta": {"content": rest} if rest else {}, "finish_reason": finish} if chat
                    else {"index": i, "text": rest, "finish_reason": finish})
    if (req.stream_options or {}).get("include_usage"):
        yield "data: " + json.dumps({**base, "choices": [], "policy_version": job.version,
                                     "usage": _usage(rows, job, sum(counts))}) + "\n\n"
    yield "data: [DONE]\n\n"


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:16]}"


def keep_tail(ids: list[int], keep: int, bos: int | None = ByteTokenizer.BOS) -> list[int]:
    """A prompt cut to its last `keep` tokens, still starting with `bos` if it did."""
    if len(ids) <= keep:
        return ids
    return [bos, *ids[len(ids) - keep + 1:]] if bos is not None and ids[0] == bos else ids[-keep:]


def _held(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` could begin one of the stop strings."""
    return max((n for s in stops for n in range(min(len(s), len(text)), 0, -1) if text.endswith(s[:n])), default=0)


def _cut(text: str, ends: list[int], s, stops: list[str]):
    """Apply stop strings: the text ends before the stop; the tokens whose text reaches into it are
    dropped. `ends[j]` is the length of the text after token j."""
    tokens, lps = list(s.tokens), list(s.logprobs)
    hit = min((text.index(x) for x in stops if x and x in text), default=None)
    if hit is None:
        return text, tokens, lps, s.finish_reason
    n = 0
    while n < len(tokens) and n < len(ends) and ends[n] <= hit:
        n += 1
    return text[:hit], tokens[:n], lps[:n], "stop"


def _lp_entry(tok, token: int, logprob: float) -> dict[str, Any]:
    text = tok.token_str(token)
    return {"token": text, "logprob": logprob,
            "bytes": ([token] if token < 256 else []) if isinstance(tok, ByteTokenizer) else list(text.encode()),
            "top_logprobs": []}


# --- running it ----------------------------------------------------------------------------------


class BackgroundServer:
    """uvicorn in a thread, for the trainer and for tests: `with BackgroundServer(engine) as url:` (or an app)."""

    def __init__(self, engine: Engine | FastAPI, host: str = "127.0.0.1", port: int = 0, strict_name: bool = False):
        import socket

        import uvicorn

        self.sock = socket.socket()
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        app = engine if isinstance(engine, FastAPI) else create_app(engine, strict_name)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=3)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self.base_url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def engine_from(checkpoint: str | None, config: PolicyConfig | None = None, seed: int = 0,
                truncate: bool = False) -> Engine:
    if checkpoint:
        path = latest_checkpoint(Path(checkpoint)) or Path(checkpoint)
        return Engine(load_policy(path), version=int((path / "COMPLETE").read_text()), truncate=truncate)
    torch.manual_seed(seed)
    return Engine(Policy(config or PolicyConfig()), truncate=truncate)


def hf_engine(model: str, name: str | None = None, dtype: str = "float32", truncate: bool = False, **options):
    """A Hugging Face model served by rl.engine.HFEngine: a name `prime-agent models list` shows, a model
    directory, or a LoRA adapter's (served merged into its base). Served under `name` (default: the model's
    name)."""
    from rl.engine import HFEngine
    from rl.hf import load_hf
    from rl.pull import resolve

    path = resolve(model)
    version = int((path / "COMPLETE").read_text()) if (path / "COMPLETE").is_file() else 0
    policy = load_hf(path)
    return HFEngine(policy.plain() if policy.adapter else policy, name=name or Path(model).name, version=version, truncate=truncate,
                    dtype=getattr(torch, dtype), base=policy.base_weights() if policy.adapter else None, **options)


def main(args) -> int:
    import uvicorn

    if not args.model:
        engine = engine_from(args.checkpoint, truncate=args.truncate)
        _announce(f"a byte policy ({engine.model.num_params():,} parameters)", engine, args)
        # requests in flight get a few seconds on a signal, not their whole generation
        uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level="warning",
                    timeout_graceful_shutdown=3)
        return 0
    from rl.decoder import kernels
    from rl.engine import serving_heap

    serving_heap()  # a process that only serves: its engine trims the heap itself
    engine = hf_engine(args.model, args.served_model_name, args.dtype, args.truncate, thread=False, trim=True,
                       prefix_cache_mb=args.prefix_cache_mb, context=args.max_model_len,
                       max_rows=args.max_num_seqs, max_batched_tokens=args.max_num_batched_tokens)
    runs_on = f", kernels {kernels()}" if engine.decoder else ""
    _announce(f"{engine.name} ({engine.parameters:,} parameters, {args.dtype}, context {engine.context}{runs_on})",
              engine, args)
    signal.signal(signal.SIGTERM, lambda *_: _stop())
    # HTTP in a thread, answering to the served name only; sampling here (HFEngine.run)
    with BackgroundServer(engine, args.host, args.port, strict_name=True):
        try:
            engine.run()
        except KeyboardInterrupt:
            engine.close()  # requests in flight end with an error instead of waiting forever
    return 0


def _announce(what: str, engine, args) -> None:
    print(f"policy server: {what}, version {engine.version}, http://{args.host}:{args.port}/v1", flush=True)


def _stop() -> None:
    raise KeyboardInterrupt
