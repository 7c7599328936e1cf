"""A small OpenAI-compatible chat-completions server for tests and benchmarks.

It answers from a script (a list of `Reply`, or a function of the request), so the real `openai`
client runs end to end: streaming and not, tool calls, logprobs and token ids, injected faults (HTTP
errors with their headers, a server that never answers, a stream that drops, a body that is not JSON,
a proxy's HTML page), and the ways real servers depart from OpenAI's API (see `Reply`'s quirk fields
and tests/agent/test_quirks.py, which cites where each was seen).

    with OpenAIServer([Reply(code=["print(1)"]), Reply(content="done")]) as server:
        ... OPENAI_BASE_URL=server.base_url ...
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent.testing.sse_server import data_url_problem


@dataclass
class Reply:
    content: str = ""
    """Assistant text (the answer, or text-mode cells in ```python fences)."""
    code: list[str] = field(default_factory=list)
    """One `ipython` tool call per entry, with {"code": entry}."""
    raw_arguments: list[str] = field(default_factory=list)
    """Tool calls with these argument strings as-is (for malformed JSON)."""
    status: int = 200
    """An HTTP error status to answer with instead (429, 500, ...)."""
    hang: bool = False
    """Never answer (until the server stops)."""
    drop: bool = False
    """Streaming: send part of the reply, then cut the connection."""
    pause: threading.Event | None = None
    """Streaming: send the first half of the content, then the rest once this is set (at most 60 s)."""
    garbage: bool = False
    """Answer 200 with a body that is not JSON."""
    prompt_tokens: int | None = None
    """Usage to report; by default about a quarter of the request's characters."""
    usage: dict[str, Any] = field(default_factory=dict)
    """More usage fields, merged in: `prompt_tokens_details`, `completion_tokens_details`, `cost`, ..."""
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers to send (`Retry-After`, `x-ratelimit-reset-tokens`, ...)."""
    error: dict[str, Any] | None = None
    """With `status`: the error object to answer with (OpenAI's shape: message, type, code)."""
    html: bool = False
    """Answer with an HTML page (as a proxy or a web UI does), with `status`."""
    # --- quirks of real servers ---
    reasoning: str = ""
    """Reasoning text, sent in `reasoning_field`."""
    reasoning_field: str = "reasoning_content"
    """`reasoning_content` (DeepSeek), `reasoning` (OpenRouter, newer vLLM) or `both` (vLLM sends both)."""
    arguments_as_object: bool = False
    """Tool-call arguments as a JSON object, not a string (Ollama, llama.cpp)."""
    tool_call_index: bool = True
    """False: streamed tool-call deltas carry no `index` (Gemini's OpenAI endpoint)."""
    tool_call_ids: bool = True
    """False: tool calls carry no `id` (Ollama)."""
    finish_reason: str | None = None
    """Instead of the natural one ("length": the token limit cut the reply)."""
    choices: int = 1
    """Choices to answer with (a server honouring `n`; extra ones say something else)."""
    usage_chunk: str = "separate"
    """Streaming: the usage in a last chunk with `choices: []` (`separate`, OpenAI's), with no `choices`
    key at all (`bare`), or in the finish chunk itself (`finish`: transformers serve, llama.cpp)."""
    logprobs: bool = True
    """False: ignore a request's `logprobs` (transformers serve, Ollama)."""


Script = list[Reply] | Callable[[dict[str, Any]], Reply]


VLLM_NO_TOOL_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
"""vLLM's 400 to a request with tools when it was started without a tool parser."""
OLLAMA_NO_TOOLS = "registry.ollama.ai/library/gemma:2b does not support tools"
"""Ollama's 400 to a request with tools for a model whose template has none."""


class OpenAIServer:
    def __init__(self, script: Script, host: str = "127.0.0.1", models: list[dict[str, Any]] | None = None,
                 props: dict[str, Any] | None = None, refuse_tools: str | None = None,
                 listing_status: int = 200, api_key: str | None = None, port: int = 0):
        """`port`: where to listen (0: a free one); `models`: the entries `GET /v1/models` lists (None: no such route, a 404, as before);
        `props`: what llama.cpp's `GET /props` answers (None: a 404); `refuse_tools`: answer every
        request that has `tools` with a 400 with this message (`VLLM_NO_TOOL_PARSER`, `OLLAMA_NO_TOOLS`),
        without taking a reply from the script; `listing_status`: answer `GET /v1/models` with this error
        status instead (a 429, a 500), or with 0 never answer it; `api_key`: answer 401, as OpenAI does,
        any request without `Authorization: Bearer API_KEY`."""
        self._script = script
        self.api_key = api_key
        self.models, self.props, self.refuse_tools = models, props, refuse_tools
        self.listing_status = listing_status
        self.gets: list[str] = []
        """The path of every GET, in order."""
        self.connections = 0
        """Connections clients opened (a client that keeps its connection alive opens one)."""
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            if callable(self._script):
                return self._script(request)
            if not self._script:
                return Reply(status=500, content="script exhausted: the test gave this server no more replies")
            return self._script.pop(0)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else every small reply stalls ~40 ms on delayed ACKs

    def log_message(self, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        server: OpenAIServer = self.server.owner  # type: ignore[attr-defined]
        with server._lock:
            server.connections += 1

    def do_GET(self) -> None:
        server: OpenAIServer = self.server.owner  # type: ignore[attr-defined]
        with server._lock:
            server.gets.append(self.path)
        if self.path.endswith("/v1/models") and server.listing_status != 200:
            if server.listing_status == 0:
                server.stopping.wait(120)
                self.close_connection = True
                return
            return self._json(server.listing_status, {"error": {"message": f"injected {server.listing_status}"}})
        if self.path.endswith("/v1/models") and server.models is not None:
            return self._json(200, {"object": "list", "data": server.models})
        if self.path == "/props" and server.props is not None:
            return self._json(200, server.props)
        return self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self.path.endswith("/chat/completions"):
            return self._json(404, {"error": {"message": f"no route {self.path}"}})
        try:
            request = json.loads(body)
        except ValueError:
            return self._json(400, {"error": {"message": "request body is not JSON"}})
        problem = _invalid_history(request.get("messages") or [])
        if problem:  # as OpenAI does: a request the real API would refuse fails here too
            return self._json(400, {"error": {"message": problem, "type": "invalid_request_error"}})
        server: OpenAIServer = self.server.owner  # type: ignore[attr-defined]
        if server.api_key is not None and self.headers.get("Authorization") != f"Bearer {server.api_key}":
            return self._json(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error",
                                              "code": "invalid_api_key"}})
        if server.refuse_tools and request.get("tools"):
            with server._lock:
                server.requests.append(request)
            error = {"message": server.refuse_tools, "type": "BadRequestError", "param": None, "code": 400}
            return self._json(400, {"error": error})
        reply = server.next_reply(request)
        if reply.hang:
            server.stopping.wait(120)
            self.close_connection = True
            return
        if reply.html:
            page = f"<html><head><title>{reply.status} Bad Gateway</title></head><body><center><h1>{reply.status} " \
                   "Bad Gateway</h1></center><hr><center>nginx</center></body></html>"
            return self._raw(reply.status, page.encode(), "text/html", reply.headers)
        if reply.status != 200:
            error = reply.error or {"message": reply.content or f"injected {reply.status}"}
            return self._raw(reply.status, json.dumps({"error": error}).encode(), "application/json", reply.headers)
        if reply.garbage:
            return self._raw(200, b"<html>502 bad gateway</html>", "application/json")
        if request.get("stream"):
            return self._stream(request, reply)
        return self._json(200, _completion(request, reply))

    def _json(self, status: int, obj: Any) -> None:
        self._raw(status, json.dumps(obj).encode(), "application/json")

    def _raw(self, status: int, data: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, request: dict[str, Any], reply: Reply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        full = _completion(request, reply)
        base = {"id": full["id"], "object": "chat.completion.chunk", "created": full["created"], "model": full["model"]}

        def chunk(delta: dict[str, Any], finish: str | None = None, extra: dict[str, Any] | None = None,
                  index: int = 0, top: dict[str, Any] | None = None) -> None:
            c = {"index": index, "delta": delta, "finish_reason": finish, **(extra or {})}
            self._chunk(b"data: " + json.dumps({**base, "choices": [c], **(top or {})}).encode() + b"\n\n")

        for other in full["choices"][1:]:  # a server honouring `n`: the other choices interleave with the first
            chunk({"role": "assistant", "content": other["message"]["content"]}, index=other["index"])
        choice = full["choices"][0]
        msg = choice["message"]
        for piece in _pieces(reply.reasoning):
            chunk(_reasoning_fields(reply, piece))
        pieces = _pieces(msg["content"] or "")
        lp = choice.get("logprobs")
        ids = choice.get("token_ids")
        for i, piece in enumerate(pieces):
            extra: dict[str, Any] = {}
            if lp and not msg.get("tool_calls"):
                extra["logprobs"] = {"content": [lp["content"][i]]}
            if ids is not None and not msg.get("tool_calls"):
                extra["token_ids"] = [ids[i]]
            chunk({"role": "assistant", "content": piece} if i == 0 else {"content": piece}, extra=extra)
            if reply.pause is not None and i == len(pieces) // 2 - 1:
                self.wfile.flush()
                reply.pause.wait(60)
            if reply.drop and i >= len(pieces) // 2:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # mid-stream, no terminating chunk: a dropped stream
                return
        for i, tc in enumerate(msg.get("tool_calls") or []):
            args = tc["function"]["arguments"]
            first: dict[str, Any] = {"index": i, "type": "function", "function": {"name": "ipython"}}
            rest: dict[str, Any] = {"index": i, "function": {}}
            if tc.get("id"):
                first["id"] = tc["id"]
            if not reply.tool_call_index:
                del first["index"], rest["index"]
            if isinstance(args, str):
                half = len(args) // 2
                first["function"]["arguments"], rest["function"]["arguments"] = args[:half], args[half:]
                chunk({"tool_calls": [first]})
                chunk({"tool_calls": [rest]})
            else:  # an object cannot be sent in parts
                first["function"]["arguments"] = args
                chunk({"tool_calls": [first]})
        extra = {}
        if msg.get("tool_calls") and lp:
            extra["logprobs"] = lp
            if ids is not None:
                extra["token_ids"] = ids
        wants_usage = (request.get("stream_options") or {}).get("include_usage")
        in_finish = reply.usage_chunk == "finish"  # sent whether asked for or not, as those servers do
        chunk({}, choice["finish_reason"], extra, top={"usage": full["usage"]} if in_finish else None)
        if wants_usage and not in_finish:
            last = {**base, "usage": full["usage"]} | ({} if reply.usage_chunk == "bare" else {"choices": []})
            self._chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def _invalid_history(messages: list[dict[str, Any]]) -> str | None:
    """Every assistant tool call must be answered by tool messages right after it; images go in user
    messages alone, as base64 data URLs of the image they name."""
    for i, m in enumerate(messages):
        for k, part in enumerate(m.get("content") if isinstance(m.get("content"), list) else []):
            if part.get("type") != "image_url":
                continue
            if m.get("role") != "user":
                return (f"Invalid 'messages[{i}]'. Image URLs are only allowed for messages with role 'user', but "
                        f"this message with role '{m.get('role')}' contains an image URL.")
            if problem := data_url_problem((part.get("image_url") or {}).get("url")):
                return f"Invalid 'messages[{i}].content[{k}].image_url.url': {problem}."
        ids = [c["id"] for c in m.get("tool_calls") or []]
        if m.get("role") != "assistant" or not ids:
            continue
        answered = []
        for later in messages[i + 1 :]:
            if later.get("role") != "tool":
                break
            answered.append(later.get("tool_call_id"))
        if sorted(answered) != sorted(ids):
            return f"messages[{i}]: tool calls {ids} must each be followed by a tool message; got {answered}"
    return None


def _pieces(text: str) -> list[str]:
    """Split text into word-ish tokens (each keeps its leading space)."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out.append(word if i == 0 else " " + word)
    return [p for p in out if p] or ([text] if text else [])


def _token_id(piece: str) -> int:
    return zlib.crc32(piece.encode()) % 50_000


def _reasoning_fields(reply: Reply, text: str) -> dict[str, str]:
    names = ["reasoning_content", "reasoning"] if reply.reasoning_field == "both" else [reply.reasoning_field]
    return {name: text for name in names}


def _completion(request: dict[str, Any], reply: Reply) -> dict[str, Any]:
    calls: list[Any] = [json.dumps({"code": c}) for c in reply.code] + list(reply.raw_arguments)
    tool_calls = [
        {"id": f"call_{i}_{int(time.time() * 1e6) % 10**9}", "type": "function",
         "function": {"name": "ipython", "arguments": json.loads(a) if reply.arguments_as_object else a}}
        for i, a in enumerate(calls)
    ]
    for tc in tool_calls if not reply.tool_call_ids else []:
        del tc["id"]
    sampled = "".join(calls) if calls else reply.content
    pieces = _pieces(sampled)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None, "tool_calls": tool_calls or None}
    if reply.reasoning:
        message.update(_reasoning_fields(reply, reply.reasoning))
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": reply.finish_reason or ("tool_calls" if tool_calls else "stop"),
    }
    if request.get("logprobs") and reply.logprobs:
        choice["logprobs"] = {
            "content": [{"token": p, "logprob": -0.05 - (_token_id(p) % 7) / 10, "bytes": None, "top_logprobs": []} for p in pieces]
        }
    if (request.get("return_token_ids")):
        choice["token_ids"] = [_token_id(p) for p in pieces]
    others = [{"index": i, "message": {"role": "assistant", "content": f"choice {i} says otherwise"},
               "finish_reason": "stop"} for i in range(1, reply.choices)]
    prompt_chars = sum(len(c) if isinstance(c := m.get("content") or "", str) else  # an image counts as ~85 tokens
                       sum(len(p.get("text") or "") if p.get("type") == "text" else 340 for p in c)
                       for m in request.get("messages", []))
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else prompt_chars // 4 + 1
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "fake"),
        "choices": [choice, *others],
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(pieces), "total_tokens": prompt + len(pieces),
                  **reply.usage},
    }
