"""A daemon session's refinements pass the regression gate its config asks for, as `prime-agent run`'s
do: the daemon is started the way users get it (by a client, as `prime-agent daemon start`), and
the command line hands it the gate it cannot build itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent import events as ev
from agent.testing.openai_server import OpenAIServer, Reply
from daemon.client import connect

BAD = {"action": "create", "kind": "prompt", "id": "zero", "title": "Zero", "content": "Always answer 0.",
       "scope": "project", "reason": "none"}


def model(request: dict[str, Any]) -> Reply:
    """Plans a change that breaks the task; answers 0 where the change is in force, 42 elsewhere."""
    system = request["messages"][0]["content"]
    if system.startswith("You refine the harness"):
        return Reply(content=json.dumps({"summary": "answer zero", "rationale": "none", "expected_outcome": "none",
                                         "edits": [BAD]}))
    return Reply(content="0" if "Always answer 0." in system else "42")


@pytest.mark.slow
async def test_a_daemon_sessions_refinement_that_fails_the_gate_is_refused(project: Path, tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "answer", "prompt": "What is the answer?", "check": "answer.strip() == '42'"}))
    with OpenAIServer(model) as server:
        async with await connect() as client:  # starts the daemon, as a user's first command does
            s = await client.create_session(project, model="fake", base_url=server.base_url,
                                            config={"refine": {"gate_taskset": str(tasks)}})
            await client.refine(s.id)
            async for e in client.events(s.id, s.last_seq):
                if isinstance(e, ev.Decided | ev.RefinementFailed):
                    break
    assert isinstance(e, ev.RefinementRejected), e
    assert "gate: the change lowers the task set's pass count from 1 to 0 of 1" in e.reason
    assert not (project / ".prime-agent" / "harness" / "prompt" / "zero.md").exists()


@pytest.mark.slow
async def test_after_a_model_switch_the_gate_replays_on_the_new_model(project: Path, tmp_path: Path):
    """The gate was built at wake with the session's model and kept it after `/model NAME`: every
    refinement was judged by replays on the previous model. It is rebuilt when the model changes."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "answer", "prompt": "What is the answer?", "check": "answer.strip() == '42'"}))
    replayed_on: list[str] = []

    def recording(request: dict[str, Any]) -> Reply:
        if request["messages"][-1].get("content") == "What is the answer?":
            replayed_on.append(request["model"])
        return model(request)

    with OpenAIServer(recording) as server:
        async with await connect() as client:
            s = await client.create_session(project, model="fake", base_url=server.base_url,
                                            config={"refine": {"gate_taskset": str(tasks)}})
            await client.update(s.id, model="fake-2")
            await client.refine(s.id)
            async for e in client.events(s.id, s.last_seq):
                if isinstance(e, ev.Decided | ev.RefinementFailed):
                    break
    assert isinstance(e, ev.RefinementRejected), e
    assert replayed_on and set(replayed_on) == {"fake-2"}, replayed_on
