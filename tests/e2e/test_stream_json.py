"""`prime-agent run --output-format stream-json` as a `claude -p` script reads it: a real process, a
real kernel, the fake OpenAI-compatible server; every line parsed and held to Claude Code's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from tests.e2e.test_run import prime_agent

pytestmark = pytest.mark.slow

# Claude Code's stream-json messages, one of each kind, as the Agent SDK reference types them
# (SDKSystemMessage, SDKAssistantMessage, SDKUserMessage, SDKResultMessage: `@anthropic-ai/claude-agent-sdk`,
# "Agent SDK reference - TypeScript", docs.claude.com/en/docs/agent-sdk/typescript#message-types; mirrored at
# tessl.io/registry/tessl/npm-anthropic-ai--claude-agent-sdk/0.1.0/files/docs/apis/messages.md). The values are
# examples (a tool's `input` is its own: Bash's `{"command"}`, ours `{"code"}`); the test checks our lines
# carry these keys with values of the same JSON types.
CLAUDE_CODE = [
    {"type": "system", "subtype": "init", "uuid": "6b9b0a5e-0f0c-4c1e-9d5c-1f4c1d2a3b4c", "session_id": "abc123",
     "apiKeySource": "none", "cwd": "/home/user/project", "tools": ["Bash", "Read"],
     "mcp_servers": [], "model": "claude-sonnet-4-5", "permissionMode": "default", "slash_commands": [],
     "output_style": "default"},
    {"type": "assistant", "uuid": "0d4c8f3e-5a1b-4d3e-8f2a-9b7c6d5e4f3a", "session_id": "abc123",
     "parent_tool_use_id": None,
     "message": {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                 "content": [{"type": "text", "text": "Let me look."}], "stop_reason": "tool_use",
                 "stop_sequence": None,
                 "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                           "output_tokens": 5}}},
    {"type": "assistant", "uuid": "1e5d9a4f-6b2c-4e4f-9a3b-0c8d7e6f5a4b", "session_id": "abc123",
     "parent_tool_use_id": None,
     "message": {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                 "content": [{"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {}}],
                 "stop_reason": "tool_use", "stop_sequence": None,
                 "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                           "output_tokens": 5}}},
    {"type": "user", "uuid": "2f6e0b5a-7c3d-4f5a-8b4c-1d9e8f7a6b5c", "session_id": "abc123",
     "parent_tool_use_id": None,
     "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01",
                                              "content": "README.md", "is_error": False}]}},
    {"type": "result", "subtype": "success", "uuid": "3a7f1c6b-8d4e-4a6b-9c5d-2e0f9a8b7c6d", "session_id": "abc123",
     "is_error": False, "duration_ms": 2300, "duration_api_ms": 1800, "num_turns": 2, "result": "Done.",
     "stop_reason": "end_turn", "total_cost_usd": 0.0123,
     "usage": {"input_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
               "output_tokens": 10},
     "modelUsage": {"claude-sonnet-4-5": {"inputTokens": 20, "outputTokens": 10, "cacheReadInputTokens": 0,
                                          "cacheCreationInputTokens": 0, "costUSD": 0.0123}},
     "permission_denials": []},
]


CLAUDE_MODES = {"default", "acceptEdits", "bypassPermissions", "plan"}
"""Claude Code's permission modes (the Agent SDK's `PermissionMode`): `permissionMode` is one of them."""


def kind(m: dict) -> str:
    content = m.get("message", {}).get("content") or [{}]
    return m["type"] + ("/" + m["subtype"] if "subtype" in m and m["type"] == "system" else "") + (
        "/" + content[0].get("type", "") if m["type"] in ("assistant", "user") else "")


def same_shape(ours, theirs, where: str = "") -> None:
    """`ours` has every key of `theirs`, recursively, with a value of the same JSON type (null matches anything)."""
    if isinstance(theirs, dict) and where.endswith(".modelUsage"):  # keyed by model name: each value's shape
        assert isinstance(ours, dict) and ours, where
        for value in ours.values():
            same_shape(value, next(iter(theirs.values())), where + "[model]")
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        for key, value in theirs.items():
            assert key in ours, f"{where}.{key} missing"
            same_shape(ours[key], value, f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), where
        for item in ours[:1]:
            if theirs:
                same_shape(item, theirs[0], where + "[0]")
    elif theirs is not None and ours is not None:
        number = (int, float)
        assert isinstance(ours, number) if isinstance(theirs, number) and not isinstance(theirs, bool) \
            else type(ours) is type(theirs), f"{where}: {ours!r} vs {theirs!r}"


def lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]  # every line is one JSON object


def test_stream_json_has_claude_codes_messages_for_a_turn_with_cells(project: Path):
    script = [Reply(content="Let me count.", code=["print(sum(range(5)))"], usage={"cost": 0.002}),
              Reply(code=["1/0"]), Reply(content="The sum is 10.")]
    with OpenAIServer(script) as server:
        p = prime_agent("run", "add up 0..4", "--output-format", "stream-json", cwd=project, server=server)
        out, err = p.communicate(timeout=90)
    assert p.returncode == 0, err
    messages = lines(out)
    reference = {kind(m): m for m in CLAUDE_CODE}
    for m in messages:
        same_shape(m, reference[kind(m)], kind(m))
    assert [kind(m) for m in messages] == [
        "system/init", "assistant/text", "assistant/tool_use", "user/tool_result", "assistant/tool_use",
        "user/tool_result", "assistant/text", "result"]
    init, said, first, out1, second, out2, answer, result = messages
    assert (init["cwd"], init["tools"], init["model"], init["permissionMode"]) == (
        str(project), ["ipython"], "fake-model", "acceptEdits")  # workspace-write, in Claude Code's words
    assert said["message"]["content"] == [{"type": "text", "text": "Let me count."}]
    assert first["message"]["content"][0]["input"] == {"code": "print(sum(range(5)))"}
    assert first["message"]["content"][0]["name"] == "ipython"
    assert out1["message"]["content"][0] == {"type": "tool_result", "tool_use_id": first["message"]["content"][0]["id"],
                                             "content": "10", "is_error": False}
    assert out2["message"]["content"][0]["is_error"] and "ZeroDivisionError" in out2["message"]["content"][0]["content"]
    assert answer["message"]["content"] == [{"type": "text", "text": "The sum is 10."}]
    assert {m["session_id"] for m in messages} == {init["session_id"]}
    assert (result["subtype"], result["is_error"], result["result"], result["num_turns"]) == (
        "success", False, "The sum is 10.", 3)
    assert result["total_cost_usd"] == pytest.approx(0.002) and result["usage"]["output_tokens"] > 0
    assert 0 < result["duration_api_ms"] <= result["duration_ms"]


def test_stream_json_input_is_a_turn_a_line_of_one_session_and_bad_lines_are_named(project: Path):
    script = [Reply(code=["x = 41"]), Reply(content="set"), Reply(code=["print(x + 1)"]), Reply(content="42")]
    stdin = "\n".join([
        json.dumps({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "set x"}]}}),
        "{not json",
        json.dumps({"type": "user", "message": {"role": "user", "content": "print x + 1"}}),
    ]) + "\n"
    with OpenAIServer(script) as server:
        p = prime_agent("run", "--input-format", "stream-json", "--output-format", "stream-json", cwd=project,
                        server=server, stdin=-1)
        out, err = p.communicate(stdin, timeout=90)
        prompts = [r["messages"][-1]["content"] for r in server.requests if r["messages"][-1]["role"] == "user"]
    assert p.returncode == 0, err
    assert "stdin line 2 skipped: not JSON" in err
    messages = lines(out)
    results = [m for m in messages if m["type"] == "result"]
    assert [r["result"] for r in results] == ["set", "42"]  # the kernel kept x: one session, two turns
    assert [m["subtype"] for m in messages if m["type"] == "system"] == ["init"]
    assert any(p.endswith("set x") for p in prompts) and any(p.endswith("print x + 1") for p in prompts)


def test_json_output_is_the_result_alone_and_a_failed_turn_is_an_error_result(project: Path):
    with OpenAIServer([Reply(status=400, error={"message": "bad request", "type": "invalid_request_error"})]) as server:
        p = prime_agent("run", "hi", "--output-format", "json", cwd=project, server=server)
        out, err = p.communicate(timeout=90)
    (result,) = lines(out)
    assert p.returncode == 3
    assert (result["type"], result["subtype"], result["is_error"]) == ("result", "error_during_execution", True)
    assert result["errors"] and "bad request" in result["errors"][0]


def test_a_task_and_stream_json_input_exclude_each_other(project: Path):
    p = prime_agent("run", "hi", "--input-format", "stream-json", cwd=project)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (2, "") and "not both" in err


@pytest.mark.parametrize(("flags", "mode"), [(["--permission-mode", "acceptEdits"], "acceptEdits"),  # none: above
                                             (["--permission-mode", "plan"], "plan"),
                                             (["--sandbox", "read-only"], "default"),
                                             (["--permission-mode", "bypassPermissions"], "bypassPermissions")])
def test_the_permission_mode_is_one_of_claude_codes(project: Path, flags: list[str], mode: str):
    """Issue 52: `permissionMode` read "workspace-write", which no Claude Code script knows."""
    with OpenAIServer([Reply(content="done")]) as server:
        p = prime_agent("run", "hi", "--output-format", "stream-json", *flags, cwd=project, server=server)
        out, err = p.communicate(timeout=90)
    assert p.returncode == 0, err
    assert lines(out)[0]["permissionMode"] == mode and mode in CLAUDE_MODES


def test_permission_modes_that_set_the_sandbox_and_sandbox_exclude_each_other(project: Path):
    p = prime_agent("run", "hi", "--permission-mode", "bypassPermissions", "--sandbox", "read-only", cwd=project)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "give it or --sandbox, not both" in err
