"""`prime-agent run` on each native provider as a user runs it: a real process, a real kernel, the
official SDK's client against a scripted server that speaks the service's API as the service does
(agent/testing/anthropic_server.py, responses_server.py), `--output-format json` read for the usage."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.atif import from_atif, to_atif
from agent.testing import anthropic_server as ant
from agent.testing import responses_server as resp
from agent.trajectory import MessageRecord, read_records
from tests.e2e.test_run import PRIME_AGENT, session_dir

pytestmark = pytest.mark.slow


def run(*args: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """The run's result line (`--output-format json`)."""
    r = subprocess.run([PRIME_AGENT, "run", "--output-format", "json", *args], cwd=cwd, env={**os.environ, **env},
                       text=True, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (result,) = [json.loads(line) for line in r.stdout.splitlines()]
    return result


def unmarked(value: Any) -> Any:
    """`value` without its `cache_control` marks (the breakpoints move on with the conversation)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    return [unmarked(v) for v in value] if isinstance(value, list) else value


def test_anthropic_messages(project: Path, prime_home: Path):
    cell = "print(6 * 7, await llm('Sure?', system='Be brief.'))"  # llm(): a subagent's call, on the same provider
    script = [ant.Reply(thinking="Six sevens.", code=[cell],
                        usage={"input_tokens": 900, "cache_creation_input_tokens": 1500, "output_tokens": 30}),
              ant.Reply(text="yes", usage={"input_tokens": 10, "output_tokens": 1}),
              ant.Reply(text="42", usage={"input_tokens": 40, "cache_read_input_tokens": 1500,
                                          "cache_creation_input_tokens": 120, "output_tokens": 5})]
    with ant.AnthropicServer(script, api_key="sk-ant-test") as server:
        result = run("-c", "model.provider=anthropic", "--base-url", server.base_url, "--model", "claude-test",
                     "-c", "model.prices.claude-test={input = 3.0, cached_input = 0.3, cache_write = 3.75, output = 15.0}",
                     "what is 6 times 7?", cwd=project, env={"ANTHROPIC_API_KEY": "sk-ant-test"})
    first, subagent, second = server.requests
    assert all(h["x-api-key"] == "sk-ant-test" and h["anthropic-version"] for h in server.headers)
    assert subagent["system"][0]["text"] == "Be brief." and "tools" not in subagent
    assert first["system"][0]["text"].strip() and all(m["role"] != "system" for m in first["messages"])
    assert first["tools"][0]["name"] == "ipython" and "input_schema" in first["tools"][0]
    thinking, tool_use = second["messages"][1]["content"]
    assert thinking["type"] == "thinking" and thinking["signature"] == ant.sign("Six sevens.")
    assert tool_use["type"] == "tool_use" and tool_use["input"] == {"code": cell}
    (tool_result,) = second["messages"][2]["content"]
    assert tool_result["tool_use_id"] == tool_use["id"] and tool_result["content"] == "42 yes"
    assert tool_result["cache_control"] == {"type": "ephemeral"} and first["system"][-1]["cache_control"]
    assert unmarked(second["messages"][:len(first["messages"])]) == unmarked(first["messages"])
    assert result["result"] == "42"
    assert result["usage"] == {"input_tokens": 950, "cache_read_input_tokens": 1500,
                               "cache_creation_input_tokens": 1620, "output_tokens": 36}
    # (900 + 10 + 40) x $3 + 1,500 x $0.30 + 1,620 x $3.75 + 36 x $15, per million
    assert result["total_cost_usd"] == pytest.approx(0.009915)
    path = session_dir(prime_home) / "trajectory.jsonl"
    for records in (read_records(path), from_atif(to_atif(path, "1"))):  # the trajectory keeps the provider's blocks
        kept = [r.message.blocks for r in records if isinstance(r, MessageRecord) and r.message.blocks]
        assert kept[0].items == [thinking, tool_use] and kept[1].items == [{"type": "text", "text": "42"}]


def test_openai_responses(project: Path):
    script = [resp.Reply(reasoning="Six sevens.", code=["print(6 * 7)"],
                         usage={"input_tokens": 1000, "output_tokens": 30, "reasoning_tokens": 12}),
              resp.Reply(text="42", usage={"input_tokens": 1100, "cached_tokens": 1024, "output_tokens": 5})]
    with resp.ResponsesServer(script, api_key="sk-test") as server:
        result = run("-c", "model.provider=openai-responses", "-c", "model.reasoning_effort=low", "--base-url",
                     server.base_url, "--model", "gpt-test", "what is 6 times 7?", cwd=project,
                     env={"OPENAI_API_KEY": "sk-test"})
    first, second = server.requests
    assert all(h["authorization"] == "Bearer sk-test" for h in server.headers)
    assert first["instructions"].strip() and first["store"] is False and first["reasoning"]["effort"] == "low"
    assert first["tools"][0]["name"] == "ipython" and first["include"] == ["reasoning.encrypted_content"]
    reasoning, call, output = second["input"][len(first["input"]):]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"].startswith("gAAAA") and "id" not in reasoning
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"code": "print(6 * 7)"}
    assert output == {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    assert second["input"][:len(first["input"])] == first["input"]
    assert result["result"] == "42"
    assert result["usage"] == {"input_tokens": 1076, "cache_read_input_tokens": 1024, "cache_creation_input_tokens": 0,
                               "output_tokens": 35}
