"""The native providers (agent/providers) against scripted servers that speak each API as its service
does (agent/testing/anthropic_server.py, responses_server.py): the official SDKs' clients end to end,
the requests checked by what the services refuse. The whole `prime-agent run` on each: tests/e2e/test_providers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import load_config
from agent.config_models import ModelConfig, Price
from agent.model import ModelError
from agent.providers import open_model
from agent.providers.anthropic import AnthropicModel
from agent.providers.responses import ResponsesModel
from agent.refine import model_caller
from agent.testing import anthropic_server as ant
from agent.testing import responses_server as resp
from agent.types import Message, ToolCall, Usage
from tests.conftest import make_config

USER = [Message(role="system", content="sys"), Message(role="user", content="hi")]


def anthropic(server: ant.AnthropicServer, **fields) -> AnthropicModel:
    cfg = {"name": "claude-test", "provider": "anthropic", "base_url": server.base_url, "api_key": "sk-ant",
           "retry_base_delay": 0.01, "timeout": 5, **fields}
    return AnthropicModel(ModelConfig(**cfg))


def responses(server: resp.ResponsesServer, **fields) -> ResponsesModel:
    cfg = {"name": "gpt-test", "provider": "openai-responses", "base_url": server.base_url, "api_key": "sk",
           "retry_base_delay": 0.01, "timeout": 5, **fields}
    return ResponsesModel(ModelConfig(**cfg))


def test_the_provider_is_the_one_set_else_the_one_the_base_url_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    assert ModelConfig(base_url="https://api.anthropic.com").api == "anthropic"
    assert ModelConfig(base_url="https://api.openai.com/v1").api == "openai-responses"
    assert ModelConfig(base_url="http://localhost:8000/v1").api == ModelConfig().api == "openai-chat"
    assert ModelConfig(base_url="https://api.openai.com/v1", provider="openai-chat").api == "openai-chat"
    assert type(open_model(ModelConfig(name="m", base_url="https://api.anthropic.com"))) is AnthropicModel
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    assert load_config(tmp_path).model.api_key == "sk-openai"
    assert load_config(tmp_path, {"model": {"provider": "anthropic"}}).model.api_key == "sk-ant"
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.anthropic.com/")
    config = load_config(tmp_path)
    assert config.model.api == "anthropic" and config.model.api_key == "sk-ant"
    assert load_config(tmp_path, {"model": {"api_key": "given"}}).model.api_key == "given"


async def test_anthropic_thinking_and_redacted_thinking_go_back_unchanged_and_breakpoints_stay_within_four():
    script = [ant.Reply(thinking="think 1", redacted="opaque", code=["print(1)"]),
              ant.Reply(thinking="think 2", text="more", code=["print(2)"]), ant.Reply(text="done")]
    with ant.AnthropicServer(script) as server:
        model, messages = anthropic(server, thinking_budget=2048), list(USER)
        for _ in range(3):  # the server refuses a changed signature, an unknown redacted block, a fifth breakpoint
            c = await model.complete(messages)
            messages += [c.message] + [Message(role="tool", tool_call_id=t.id, content="out") for t in c.message.tool_calls]
    first, last = server.requests[0], server.requests[-1]
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048} and first["max_tokens"] == 16_384 + 2048
    assert [b["type"] for b in last["messages"][1]["content"]] == ["redacted_thinking", "thinking", "tool_use"]
    assert c.message.content == "done" and messages[2].reasoning == "think 1"
    assert all("cache_control" not in b for m in messages if m.blocks for b in m.blocks.items)  # kept unmarked


@pytest.mark.parametrize("status", [429, 529])
async def test_anthropic_rate_limits_and_overload_are_waited_on_as_asked(status: int):
    with ant.AnthropicServer([ant.Reply(status=status, headers={"retry-after": "0"}), ant.Reply(text="fine")]) as server:
        retries: list[tuple[int, float, str]] = []
        c = await anthropic(server).complete(USER, on_retry=lambda *a: retries.append(a))
    assert c.message.content == "fine"
    assert retries == [(1, 0.0, f"HTTP {status}: {ant.ERRORS[status]}; the server asked to wait 0s")]


async def test_anthropic_an_error_event_mid_stream_is_retried_and_what_was_shown_not_shown_again():
    shown: list[str] = []
    with ant.AnthropicServer([ant.Reply(text="partial answer", error_event=True), ant.Reply(text="partial answer")]) as server:
        c = await anthropic(server).complete(USER, on_delta=shown.append)
    assert c.message.content == "partial answer" == "".join(shown) and c.attempts == 2


@pytest.mark.parametrize(("stop", "finish"), [("max_tokens", "length"), ("refusal", "content_filter"), ("end_turn", "stop")])
async def test_anthropic_stop_reasons_are_mapped(stop: str, finish: str):
    with ant.AnthropicServer([ant.Reply(text="x", stop_reason=stop)]) as server:
        assert (await anthropic(server).complete(USER)).finish_reason == finish


async def test_anthropic_text_mode_and_a_reply_from_another_provider():
    """Text mode sends no tools; a reply another provider wrote (no blocks; its reasoning unsigned) goes
    as text and tool_use, its reasoning left out; plain (unstreamed) replies read the same."""
    other = Message(role="assistant", content="Looking.", reasoning="not Anthropic's",
                    tool_calls=[ToolCall(id="call_1", name="ipython", arguments='{"code": "1"}')])
    history = [*USER, other, Message(role="tool", tool_call_id="call_1", content="1"), Message(role="user", content="go")]
    with ant.AnthropicServer([ant.Reply(text="```python\nprint(1)\n```")] * 2) as server:
        await anthropic(server, action_format="text").complete(USER)
        c = await anthropic(server, stream=False).complete(history)
    text_mode, replay = server.requests
    assert "tools" not in text_mode and text_mode["system"][0]["text"] == "sys"
    assert replay["messages"][1]["content"] == [{"type": "text", "text": "Looking."},
                                                {"type": "tool_use", "id": "call_1", "name": "ipython", "input": {"code": "1"}}]
    assert [b["type"] for b in replay["messages"][2]["content"]] == ["tool_result", "text"]  # one user message
    assert c.message.content.startswith("```python")


async def test_anthropic_usage_counts_cache_reads_and_writes_in_tokens_and_cost():
    usage = {"input_tokens": 100, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 500, "output_tokens": 10}
    price = Price(input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)
    with ant.AnthropicServer([ant.Reply(text="x", usage=usage)]) as server:
        c = await anthropic(server, prices={"claude-test": price}).complete(USER)
    assert c.usage.model_dump(exclude={"cost"}) == Usage(prompt_tokens=2600, completion_tokens=10, cached_tokens=2000,
                                                         cache_write_tokens=500).model_dump(exclude={"cost"})
    assert c.usage.cost == pytest.approx((100 * 3 + 2000 * 0.3 + 500 * 3.75 + 10 * 15) / 1e6)
    assert c.usage.describe() == "2,600 in (2,000 cached, 500 written) · 10 out · $0.0029"


async def test_the_refiner_plans_through_anthropic_with_its_system_prompt_top_level():
    plan = json.dumps({"summary": "nothing to change"})
    with ant.AnthropicServer([ant.Reply(text=plan)]) as server:
        complete = model_caller(anthropic(server), make_config())
        answer = await complete([{"role": "system", "content": "You plan."}, {"role": "user", "content": "the window"}])
    (request,) = server.requests
    assert answer == plan and request["system"][0]["text"] == "You plan." and "tools" not in request


async def test_a_key_the_service_refuses_names_anthropics_variable():
    with ant.AnthropicServer([], api_key="right") as server:
        with pytest.raises(ModelError, match="HTTP 401: invalid x-api-key; no API key was sent: set ANTHROPIC_API_KEY"):
            await anthropic(server, api_key=None).complete(USER)


async def test_responses_reasoning_goes_back_encrypted_without_ids_and_the_settings_are_sent():
    script = [resp.Reply(reasoning="plan it", code=["print(1)"], usage={"cached_tokens": 7, "reasoning_tokens": 3}),
              resp.Reply(text="cut", incomplete="max_output_tokens")]
    with resp.ResponsesServer(script) as server:
        model = responses(server, reasoning_effort="high", reasoning_summary="auto", max_completion_tokens=500)
        c = await model.complete(USER, json_mode=True)
        history = [*USER, c.message, Message(role="tool", tool_call_id=c.message.tool_calls[0].id, content="1")]
        schema = {"title": "Plan", "type": "object"}
        cut = await responses(server, stream=False).complete(history, json_mode=schema)  # ids, forged reasoning: refused
    first, second = server.requests
    assert first["reasoning"] == {"effort": "high", "summary": "auto"} and first["max_output_tokens"] == 500
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert first["text"] == {"format": {"type": "json_object"}} and first["instructions"] == "sys"
    assert [i.get("type") for i in second["input"]] == [None, "reasoning", "function_call", "function_call_output"]
    assert c.message.reasoning == "plan it" and c.usage.cached_tokens == 7 and c.usage.reasoning_tokens == 3
    assert second["text"] == {"format": {"type": "json_schema", "name": "Plan", "schema": schema, "strict": False}}
    assert c.message.blocks is not None and c.message.blocks.items[0]["id"].startswith("rs_")  # kept as it came
    assert cut.finish_reason == "length" and cut.message.content == "cut"
