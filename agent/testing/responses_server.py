"""A scripted server of OpenAI's Responses API (`POST /v1/responses`) for tests: it streams replies as the
service does (`event: response.created`, `response.output_item.added` / `.done` around each item's
deltas: reasoning summary text, output text, function call arguments; `response.completed` or
`response.incomplete` carrying the whole response and its usage), and refuses what the service refuses
of a stateless (`store=false`) conversation: an input item naming an `id` (nothing was stored), a
reasoning item without the `encrypted_content` it issued, a function call without its output or an
output without its call, an `input_image` outside a user message or not a data URL of the image it names.

    with ResponsesServer([Reply(reasoning="...", code=["print(1)"]), Reply(text="done")]) as server:
        ... --base-url server.base_url -c model.provider=openai-responses ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.testing.sse_server import ScriptedServer, _Handler, data_url_problem, pieces, sign


@dataclass
class Reply:
    text: str = ""
    code: list[str] = field(default_factory=list)
    """One `ipython` function_call item per entry, with {"code": entry}."""
    reasoning: str = ""
    """A reasoning item first: its `encrypted_content` where the request included it, and this text as
    its summary where the request asked for one (`reasoning.summary`)."""
    usage: dict[str, int] = field(default_factory=dict)
    """`input_tokens`, `cached_tokens`, `output_tokens`, `reasoning_tokens`; by default the input is a
    quarter of the request's characters, none of it cached."""
    incomplete: str | None = None
    """End `incomplete` for this reason (`max_output_tokens`, `content_filter`)."""
    status: int = 200
    """An HTTP error to answer with instead (429, 500, ...)."""
    headers: dict[str, str] = field(default_factory=dict)


class ResponsesServer(ScriptedServer[Reply]):
    path = "/v1/responses"

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.issued: set[str] = set()
        """Every `encrypted_content` given out: a reasoning item sent back must carry one of them."""

    def answer(self, http: _Handler, request: dict[str, Any], headers: dict[str, str]) -> None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(http, 401, "Incorrect API key provided", "invalid_api_key")
        status, problem = invalid(request, self.issued)
        if problem:
            return _error(http, status, problem, "invalid_request_error")
        reply = self.next_reply(request) or Reply(status=500, text="script exhausted")
        if reply.status != 200:
            return _error(http, reply.status, reply.text or f"injected {reply.status}", None, reply.headers)
        output = self._output(reply, request)
        chars = len(json.dumps(request.get("input"))) + len(request.get("instructions") or "")
        u = {"input_tokens": chars // 4 + 1, "cached_tokens": 0, "output_tokens": len(json.dumps(output)) // 4 + 1,
             "reasoning_tokens": len(reply.reasoning) // 4, **reply.usage}
        response = {"id": "resp_scripted", "object": "response", "created_at": 1764806400, "model": request.get("model"),
                    "status": "incomplete" if reply.incomplete else "completed", "error": None,
                    "incomplete_details": {"reason": reply.incomplete} if reply.incomplete else None,
                    "output": output, "store": request.get("store", True),
                    "usage": {"input_tokens": u["input_tokens"], "input_tokens_details": {"cached_tokens": u["cached_tokens"]},
                              "output_tokens": u["output_tokens"],
                              "output_tokens_details": {"reasoning_tokens": u["reasoning_tokens"]},
                              "total_tokens": u["input_tokens"] + u["output_tokens"]}}
        if not request.get("stream"):
            return http.json(200, response)
        begun = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        events: list[dict[str, Any]] = [{"type": "response.created", "response": begun},
                                        {"type": "response.in_progress", "response": begun}]
        for i, item in enumerate(output):
            events += _streamed(i, item)
        events.append({"type": "response.incomplete" if reply.incomplete else "response.completed", "response": response})
        http.events([(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)])


    def _output(self, reply: Reply, request: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if reply.reasoning:
            summary = [{"type": "summary_text", "text": reply.reasoning}] if (request.get("reasoning") or {}).get("summary") else []
            item: dict[str, Any] = {"id": "rs_" + sign(reply.reasoning)[:24], "type": "reasoning", "summary": summary}
            if "reasoning.encrypted_content" in (request.get("include") or []):
                item["encrypted_content"] = "gAAAA" + sign("encrypted:" + reply.reasoning)
                self.issued.add(item["encrypted_content"])
            items.append(item)
        return items + _answer(reply)


def _answer(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text:
        items.append({"id": "msg_" + sign(reply.text)[:24], "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.text, "annotations": []}]})
    for code in reply.code:
        items.append({"id": "fc_" + sign(code)[:24], "type": "function_call", "status": "completed",
                      "arguments": json.dumps({"code": code}), "call_id": "call_" + sign("call" + code)[:16],
                      "name": "ipython"})
    return items


def _streamed(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """One output item as the service streams it: added (empty), its deltas, done (whole)."""
    kind, at = item["type"], {"item_id": item["id"], "output_index": index}
    empty = {**item, "summary": []} if kind == "reasoning" else {**item, "status": "in_progress", "content": []} \
        if kind == "message" else {**item, "status": "in_progress", "arguments": ""}
    events: list[dict[str, Any]] = [{"type": "response.output_item.added", "output_index": index, "item": empty}]
    if kind == "reasoning" and item["summary"]:
        text = item["summary"][0]["text"]
        events += [{"type": "response.reasoning_summary_text.delta", **at, "summary_index": 0, "delta": p} for p in pieces(text)]
        events.append({"type": "response.reasoning_summary_text.done", **at, "summary_index": 0, "text": text})
    elif kind == "message":
        text = item["content"][0]["text"]
        events += [{"type": "response.output_text.delta", **at, "content_index": 0, "delta": p} for p in pieces(text)]
        events.append({"type": "response.output_text.done", **at, "content_index": 0, "text": text})
    elif kind == "function_call":
        events += [{"type": "response.function_call_arguments.delta", **at, "delta": p} for p in pieces(item["arguments"])]
        events.append({"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]})
    return [*events, {"type": "response.output_item.done", "output_index": index, "item": item}]


def invalid(request: dict[str, Any], issued: set[str]) -> tuple[int, str | None]:
    """What the service would refuse in this request (status, message in its words), if anything."""
    items = request.get("input") or []
    calls = [i.get("call_id") for i in items if i.get("type") == "function_call"]
    outputs = [i.get("call_id") for i in items if i.get("type") == "function_call_output"]
    for n, item in enumerate(items):
        for k, part in enumerate(item.get("content") if isinstance(item.get("content"), list) else []):
            if part.get("type") != "input_image":
                continue
            if item.get("role") != "user":
                return 400, f"Invalid 'input[{n}].content[{k}]': input_image is only allowed in user messages."
            if problem := data_url_problem(part.get("image_url")):
                return 400, f"Invalid 'input[{n}].content[{k}].image_url': {problem}."
        if request.get("store") is False and item.get("id"):
            return 404, (f"Item with id '{item['id']}' not found. Items are not persisted when `store` is set to "
                         "false. Try again with `store` set to true, or remove this item from your input.")
        if item.get("type") == "reasoning" and item.get("encrypted_content") not in issued:
            return 400, "The encrypted content for a reasoning item could not be verified."
        if item.get("type") == "reasoning" and not isinstance(item.get("summary"), list):
            return 400, "Missing required parameter: 'input[].summary'."
    for call in calls:
        if call not in outputs:
            return 400, f"No tool output found for function call {call}."
    for output in outputs:
        if output not in calls:
            return 400, f"No tool call found for function call output with call_id {output}."
    return 200, None


def _error(http: _Handler, status: int, message: str, code: str | None, headers: dict[str, str] | None = None) -> None:
    http.json(status, {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                                 "param": None, "code": code}}, headers)
