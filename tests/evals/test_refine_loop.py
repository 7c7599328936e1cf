"""`prime-agent refine loop`: rounds of train rollouts, a plan from them alone, a candidate kept only
if it helps on the validation split, and the held-out test split before and after. Real sessions,
kernels and harness stores; the model (agent and planner alike) is scripted and answers by its prompt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from pathlib import Path

import pytest

from agent.testing.scripted import ScriptedModel, cells
from agent.types import Message
from evals.refine_loop import LoopError, LoopSpec, RefineLoop, split
from evals.refine_report import Report
from evals.tasksets import load_taskset
from harness_store.store import HarnessStore
from tests.agent.test_refine import PLANNER, proposal
from tests.conftest import make_config

GOOD = {"action": "create", "kind": "prompt", "id": "add-exactly", "title": "Add exactly",
        "content": "Add the two numbers exactly.", "reason": "rollouts 2 and 3 answered one too many"}
BAD = {"action": "create", "kind": "prompt", "id": "answer-zero", "title": "Answer zero",
       "content": "Always answer 0.", "reason": "a guess"}
NUMBERS = [(2, 7), (3, 4), (8, 1), (5, 5), (6, 2), (9, 3), (4, 4), (7, 1)]


def write_tasks(path: Path) -> Path:
    """Eight sums; the check knows each one's answer."""
    path.write_text("".join(json.dumps({"id": f"sum-{i}", "prompt": f"What is {a} plus {b}? Answer with the number alone.",
                                        "check": f"answer.strip() == '{a + b}'"}) + "\n"
                            for i, (a, b) in enumerate(NUMBERS)))
    return path


def passes_bare(prompt: str) -> bool:
    """Without a note the agent gets a sum right only when its first number is even."""
    return int(re.search(r"What is (\d+) plus", prompt)[1]) % 2 == 0  # type: ignore[index]


class Agent(ScriptedModel):
    """The agent and the planner in one model. The agent runs one cell, then answers: right when the
    note `Add the two numbers exactly.` is in its system prompt or the first number is even; `0` under
    the note `Always answer 0.`. The planner proposes GOOD, then BAD. `stall_on`: a system prompt text
    at which the agent stops answering (the run is cut there)."""

    def __init__(self, plans: list[dict], stall_on: str | None = None):
        super().__init__([self.respond] * 1000)
        self.plans, self.stall_on, self.stalled = list(plans), stall_on, asyncio.Event()

    async def complete(self, messages: list[Message], **kw):
        if self.stall_on and self.stall_on in messages[0].content and not messages[0].content.startswith(PLANNER):
            self.stalled.set()
            await asyncio.Event().wait()
        return await super().complete(messages, **kw)

    def respond(self, messages: list[Message]):
        system = messages[0].content
        if system.startswith(PLANNER):
            edit = self.plans.pop(0)
            return proposal(edit, summary=edit["title"])
        prompt = next(m.content for m in messages if m.role == "user")
        a, b = map(int, re.search(r"What is (\d+) plus (\d+)", prompt).groups())  # type: ignore[union-attr]
        if not any(m.role == "tool" for m in messages):  # what the workspace holds, and a file left behind
            return cells(f"import os\nprint(sorted(os.listdir('.')))\nopen('left.txt', 'w').write('x')\nprint({a} + {b})")
        if "Always answer 0." in system:
            return "0"
        return str(a + b if "Add the two numbers exactly." in system or a % 2 == 0 else a + b + 1)

    def planner_requests(self) -> list[str]:
        return ["\n".join(m.content for m in call) for call in self.calls if call[0].content.startswith(PLANNER)]


def the_loop(tasks: Path, project: Path, run: Path, model, rounds: int = 2) -> RefineLoop:
    spec = LoopSpec(str(tasks), rounds=rounds, train=2, val=3, test=3, seed=0, concurrency=3, timeout=120.0)
    roots = {"user": project.parent / "home" / "harness", "project": project / ".prime-agent" / "harness"}
    return RefineLoop(spec, make_config(), model, run, roots)


@pytest.mark.timeout(600)  # about twenty rollouts, each a real session and kernel, on a loaded machine
async def test_a_helpful_note_is_kept_a_harmful_one_rejected_and_the_held_out_split_measures_it(
        project: Path, tmp_path: Path):
    tasks, run = write_tasks(tmp_path / "sums.jsonl"), tmp_path / "run"
    spec = LoopSpec(str(tasks), rounds=2, train=2, val=3, test=3, seed=0)
    splits = split(load_taskset(str(tasks)).tasks(8, seed=0), spec)
    assert splits.ids() == split(load_taskset(str(tasks)).tasks(8, seed=0), spec).ids()  # the same split every time
    val_bare = sum(passes_bare(t.prompt) for t in splits.val) / 3
    test_bare = sum(passes_bare(t.prompt) for t in splits.test) / 3
    assert 0 < val_bare < 1 and test_bare < 1  # the seed deals each split some of both kinds
    live = HarnessStore(project / ".prime-agent" / "harness", "project")

    # Cut the run while the harmful candidate runs on the validation split: nothing of it is live.
    model = Agent([GOOD, BAD], stall_on="Always answer 0.")
    running = asyncio.create_task(the_loop(tasks, project, run, model).run())
    await asyncio.wait_for(model.stalled.wait(), 400)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert [e.id for e in live.entries()] == ["add-exactly"]
    assert (run / "rounds" / "02" / "plan.json").is_file() and not (run / "rounds" / "02" / "round.json").exists()
    assert len(model.planner_requests()) == 2

    # Resumed: round 2 is finished from its plan (the planner is not asked again), then the test split.
    resumed = Agent([])
    report = await the_loop(tasks, project, run, resumed).run()
    assert resumed.planner_requests() == []

    assert report.splits == splits.ids()
    assert set(report.splits["train"]).isdisjoint(report.splits["val"] + report.splits["test"])
    kept, rejected = report.rounds
    assert (kept.kept, kept.val.before, kept.val.after, kept.regressions) == (True, val_bare, 1.0, [])
    assert kept.reason == f"the validation mean rose ({val_bare:.3f} -> 1.000)"
    assert (rejected.kept, rejected.val.before, rejected.val.after) == (False, 1.0, 0.0)
    assert rejected.regressions == splits.ids()["val"]  # every validation task passed with the kept note
    assert rejected.reason == "the validation mean fell (1.000 -> 0.000) and 3 validation tasks that passed before now fail"
    assert kept.tokens > 0 and rejected.tokens > 0
    t = report.test
    assert (t.before.mean, t.after.mean, t.n) == (test_bare, 1.0, 3)
    assert t.diff == sum(1.0 - passes_bare(task.prompt) for task in splits.test) / 3  # the task is the unit
    assert t.per_task == {task.id: (float(passes_bare(task.prompt)), 1.0) for task in splits.test}
    assert t.ci95[0] <= t.diff <= t.ci95[1]

    # Every rollout began in a fresh, empty workspace: nothing an earlier one left was there.
    seen = [m.content for call in model.calls + resumed.calls for m in call if m.role == "tool"]
    assert len(seen) >= 19 and all(out.startswith("[") and "left.txt" not in out for out in seen), seen

    # The refiner read the train rollouts and nothing of the validation or test tasks.
    requests = model.planner_requests()
    for request in requests:
        for task in splits.train:
            assert task.prompt in request
        for task in splits.val + splits.test:
            assert task.prompt not in request and task.id not in request

    # The live harness holds the kept note alone; its history, the kept change and the rejection.
    assert [e.id for e in live.entries()] == ["add-exactly"]
    assert report.harness_after == kept.commit and report.harness_before == live.log()[-1].commit
    history = {c.refinement_id: c for c in live.log()}
    assert history[kept.refinement_id].trailers["Trigger"] == "refine-loop"
    assert history[kept.refinement_id].trailers["Round"] == "1 of 2"
    assert history[kept.refinement_id].trailers["Run"] == str(run.resolve())
    assert history[kept.refinement_id].entries == ["add-exactly"]
    note = history[rejected.refinement_id]
    assert (note.commit, note.entries) == (rejected.commit, [])
    assert note.summary == f"rejected: Answer zero ({rejected.reason})"
    on_disk = Report.model_validate_json((run / "report.json").read_text())
    assert on_disk == report
    assert (run / "refine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Resumed once more, a finished loop runs nothing and says the same.
    again = await the_loop(tasks, project, run, ScriptedModel([])).run()
    assert again == report


@pytest.mark.timeout(300)
async def test_a_loop_whose_every_rollout_errors_stops_and_measures_nothing(project: Path, tmp_path: Path):
    """The model is unreachable (every call fails): the validation split's rollouts all error, and the
    loop stops saying so rather than plan from nothing and report an outage as a score of 0."""
    tasks, run = write_tasks(tmp_path / "sums.jsonl"), tmp_path / "run"
    with pytest.raises(LoopError, match=r"every rollout of val-0 errored, twice \(the first: .*scripted model"):
        await the_loop(tasks, project, run, ScriptedModel([]), rounds=1).run()
    assert not (run / "rounds").exists() and not (run / "report.json").exists()
    assert HarnessStore(project / ".prime-agent" / "harness", "project").entries() == []
