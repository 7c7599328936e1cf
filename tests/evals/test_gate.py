"""The refiner's regression gate, run through evaluation's task sets."""

from __future__ import annotations

import json
from pathlib import Path

from agent.events import Event
from agent.session import Session
from agent.testing.scripted import ScriptedModel
from agent.types import Message
from evals.gate import make_gate
from tests.agent.test_refine import PLANNER, proposal, wait_for
from tests.conftest import make_config


async def test_the_gate_refuses_a_change_that_breaks_a_passing_task(project: Path, tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "answer", "prompt": "What is the answer?", "check": "answer.strip() == '42'"}) + "\n")
    bad = {"action": "create", "kind": "prompt", "id": "zero", "title": "Zero", "content": "Always answer 0.",
           "scope": "project", "reason": "none"}

    def respond(messages: list[Message]):
        if messages[0].content.startswith(PLANNER):
            return proposal(bad, summary="answer zero")
        return "0" if "Always answer 0." in messages[0].content else "42"

    events: list[Event] = []
    gate = lambda config, model, harness: make_gate(config, model, harness, str(tasks))  # noqa: E731
    async with Session(make_config(), ScriptedModel([respond] * 50), cwd=project, on_event=events.append,
                       gate=gate) as s:
        s.refine()
        rejected = await wait_for(events, "refinement.rejected")
    assert "gate: the change lowers the task set's pass count from 1 to 0 of 1" in rejected.reason
    assert not (project / ".prime-agent" / "harness" / "prompt" / "zero.md").exists()
