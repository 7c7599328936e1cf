"""Sessions as ATIF v1.8 documents (agent/atif.py): a session recorded with token ids, against the
fake OpenAI-compatible server, exported, validated with the `atif` package's own models, and read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import atif
import pytest

from agent.atif import from_atif, to_atif
from agent.model import OpenAIModel
from agent.session import Session
from agent.testing.openai_server import OpenAIServer, Reply
from agent.trajectory import CellRecord, MessageRecord, ModelCall, read_records
from rl.data import rate, samples
from tests.conftest import make_config


def script(request: dict[str, Any]) -> Reply:
    """The parent reads a file, delegates to a child, fails a cell, answers; the child answers at once."""
    messages = request["messages"]
    if "started by a parent agent" in messages[0]["content"]:
        return Reply(content="hello from the child", usage={"cost": 0.001})
    step = sum(m["role"] == "assistant" for m in messages)
    return [Reply(content="Reading first.", code=["print(open('notes.txt').read())", "x = 6 * 7"],
                  usage={"prompt_tokens_details": {"cached_tokens": 3}, "cost": 0.002}),
            Reply(code=["print(await rlm.run('say hello', name='helper'))"]),
            Reply(code=["1/0"]),
            Reply(content="x is 42.", reasoning="the cell said so")][step]


async def record(project: Path, action_format: str = "tools") -> Path:
    (project / "notes.txt").write_text("remember the milk\n")
    config = make_config(model={"record_logprobs": True, "extra_body": {"return_token_ids": True},
                                "action_format": action_format}, refine={"auto_every": 0})
    with OpenAIServer(script if action_format == "tools" else TEXT) as server:
        config.model.name, config.model.base_url = "fake-model", server.base_url
        model = OpenAIModel(config.model)
        async with Session(config, model, cwd=project) as s:
            result = await s.prompt("what is x?")
            assert result.outcome == "completed", result.error
        await model.close()
    return s.dir / "trajectory.jsonl"


TEXT = [Reply(content="Let me see.\n```python\nprint(1 + 1)\n```\n```python\ny = 3\nprint(y)\n```"),
        Reply(content="Two and three.")]


async def test_an_exported_session_is_valid_atif_with_its_cells_tokens_and_subagent(project: Path):
    path = await record(project)
    rate(path.parent, 0.5, "fine")
    doc = atif.Trajectory.model_validate_json(json.dumps(to_atif(path, "9.9").to_json_dict()))  # the package's check
    records = read_records(path)
    replies = [r.message for r in records if isinstance(r, MessageRecord) and r.message.role == "assistant"]
    calls = [r for r in records if isinstance(r, ModelCall) and r.purpose == "turn"]
    assert doc.schema_version == "ATIF-v1.8" and doc.agent.name == "prime-agent" and doc.agent.version == "9.9"
    assert [s.source for s in doc.steps] == ["system", "user", "agent", "agent", "agent", "agent"]
    assert [s.step_id for s in doc.steps] == [1, 2, 3, 4, 5, 6]
    agent = [s for s in doc.steps if s.source == "agent"]
    # token ids and logprobs, reply by reply, exactly as recorded; usage and cost per step
    assert [s.metrics.completion_token_ids for s in agent] == [m.token_ids for m in replies]
    assert [s.metrics.logprobs for s in agent] == [m.logprobs for m in replies]
    assert all(s.metrics.completion_token_ids and len(s.metrics.logprobs) == len(s.metrics.completion_token_ids)
               for s in agent)
    assert [s.metrics.prompt_tokens for s in agent] == [c.usage.prompt_tokens for c in calls]
    assert (agent[0].metrics.cached_tokens, agent[0].metrics.cost_usd) == (3, pytest.approx(0.002))
    # each cell a tool call, its output the observation
    first = agent[0]
    assert [(c.function_name, c.arguments) for c in first.tool_calls] == [
        ("ipython", {"code": "print(open('notes.txt').read())"}), ("ipython", {"code": "x = 6 * 7"})]
    assert [(r.source_call_id, r.content) for r in first.observation.results] == [
        (first.tool_calls[0].tool_call_id, "remember the milk"), (first.tool_calls[1].tool_call_id, "(no output)")]
    failed = agent[2]
    assert "ZeroDivisionError" in failed.observation.results[0].content
    assert failed.tool_calls[0].extra["cell"]["ok"] is False
    assert (agent[3].message, agent[3].reasoning_content) == ("x is 42.", "the cell said so")
    # the child, embedded and referenced from the step whose cell spawned it
    (child,) = doc.subagent_trajectories
    (ref,) = [r for r in agent[1].observation.results if r.subagent_trajectory_ref]
    assert ref.subagent_trajectory_ref[0].trajectory_id == child.trajectory_id
    assert [s.message for s in child.steps if s.source == "agent"] == ["hello from the child"]
    assert "hello from the child" in agent[1].observation.results[-1].content
    # totals and what is ours
    assert doc.final_metrics.total_prompt_tokens == sum(c.usage.prompt_tokens for c in calls)
    assert doc.final_metrics.total_cost_usd == pytest.approx(sum(c.usage.cost for c in calls))
    assert doc.final_metrics.extra["reward"] == 0.5
    assert "harness_version" in doc.final_metrics.extra


@pytest.mark.parametrize("action_format", ["tools", "text"])
async def test_a_document_reads_back_to_the_sessions_context_and_samples(project: Path, action_format: str):
    path = await record(project, action_format)
    records = read_records(path)
    doc = atif.Trajectory.model_validate(to_atif(path, "1").to_json_dict())
    back = from_atif(doc)
    context = [(m.role, m.content, m.tool_call_id, m.token_ids, m.logprobs)
               for m in (r.message for r in records if isinstance(r, MessageRecord))]
    assert [(m.role, m.content, m.tool_call_id, m.token_ids, m.logprobs)
            for m in (r.message for r in back if isinstance(r, MessageRecord))] == context
    if action_format == "text":  # the fenced cells became tool calls with their outputs
        cells = [r for r in records if isinstance(r, CellRecord)]
        assert [c.arguments["code"] for c in doc.steps[2].tool_calls] == [c.cell.code for c in cells]
        assert [r.content for r in doc.steps[2].observation.results] == ["2", "3"]
    # the same samples, token for token (the fake server's ids are no policy's: no vocabulary check)
    assert list(samples(back, vocab_size=None)) == list(samples(records, vocab_size=None))
    assert list(samples(records, vocab_size=None))


def test_another_agents_document_becomes_context_and_tool_results():
    doc = atif.Trajectory.model_validate({
        "schema_version": "ATIF-v1.8", "session_id": "s1", "agent": {"name": "terminus-2", "version": "2.0"},
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are a shell agent."},
            {"step_id": 2, "source": "user", "message": "list the files"},
            {"step_id": 3, "source": "agent", "message": "", "model_name": "m",
             "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "ls"}}],
             "observation": {"results": [{"source_call_id": "c1", "content": "a.txt"}]},
             "metrics": {"prompt_token_ids": [1, 2, 3], "completion_token_ids": [7, 8], "logprobs": [-0.1, -0.2]}},
            {"step_id": 4, "source": "agent", "message": "a.txt", "extra": {"provider_blocks": {"provider": "gemini"}},
             "metrics": {"prompt_token_ids": [1, 2, 3, 7, 8, 9], "completion_token_ids": [10], "logprobs": [-0.3]}},
        ]})
    records = from_atif(doc)
    messages = [r.message for r in records if isinstance(r, MessageRecord)]
    assert [(m.role, m.content) for m in messages] == [("system", "You are a shell agent."), ("user", "list the files"),
                                                       ("assistant", ""), ("tool", "a.txt"), ("assistant", "a.txt")]
    assert messages[4].blocks is None  # blocks not ours to send back are left out; the text stands
    assert messages[2].tool_calls[0].name == "bash" and json.loads(messages[2].tool_calls[0].arguments) == {"cmd": "ls"}
    (sample,) = list(samples(records, vocab_size=None))  # the second prompt extends the first: one sample
    assert sample.ids == [1, 2, 3, 7, 8, 9, 10]
    assert sample.mask == [False, False, False, True, True, False, True]
    assert sample.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
