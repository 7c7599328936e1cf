"""The turn loop with a scripted model and a real kernel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.events import Event
from agent.kernel import KernelError
from agent.model import ContextOverflow, ModelError, ModelTimeout
from agent.prompt import system_prompt
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import CellRecord, CompactionRecord, TurnFinishedRecord, read_records
from agent.types import Completion, Message, ToolCall
from tests.conftest import make_config, trust


def session(project: Path, outputs: list, events: list[Event] | None = None, action_format="tools", **sections) -> Session:
    model = ScriptedModel(outputs, action_format=action_format)
    return Session(make_config(**sections), model, cwd=project, on_event=events.append if events is not None else None)


def last_input(s: Session) -> str:
    """What the model saw last: the content of the final message of its last call."""
    return s.model.calls[-1][-1].content


async def test_answer_without_a_cell_ends_the_turn(project: Path):
    events: list[Event] = []
    async with session(project, ["Nothing to do."], events) as s:
        r = await s.prompt("hello")
    assert (r.outcome, r.answer, r.steps, r.cells) == ("completed", "Nothing to do.", 1, 0)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events][-1] == "turn.finished"
    system = s.model.calls[0][0]
    assert system.role == "system" and "persistent IPython kernel" in system.content and str(project) in system.content


async def test_final_from_code_ends_the_turn_and_answers_every_call(project: Path):
    async with session(project, [cells("final('done: ' + str(6*7))", "print('never')")]) as s:
        r = await s.prompt("go")
    assert (r.outcome, r.answer) == ("completed", "done: 42")
    tool_msgs = [m for m in s.messages if m.role == "tool"]
    assert [m.content for m in tool_msgs] == ["(no output)", "Not run: the turn ended before this call."]


async def test_variables_persist_across_cells_and_turns(project: Path):
    script = [cells("x = 20"), cells("x += 1"), "first", cells("print(x * 2)"), "second"]
    async with session(project, script) as s:
        assert (await s.prompt("one")).answer == "first"
        assert (await s.prompt("two")).answer == "second"
    assert last_input(s) == "42"


async def test_malformed_tool_call_is_reported_to_the_model(project: Path):
    bad = Message(role="assistant", tool_calls=[ToolCall(id="c1", name="ipython", arguments='{"code": "print(1)"')])
    async with session(project, [bad, "recovered"]) as s:
        r = await s.prompt("go")
    assert r.outcome == "completed" and r.answer == "recovered"
    assert "not valid JSON" in last_input(s)


async def test_kernel_faults_reach_the_next_model_input(project: Path):
    script = [
        cells("kept = 1"),
        Message(role="assistant", tool_calls=[
            ToolCall(id="t", name="ipython", arguments='{"code": "while True: pass", "timeout": 2}')
        ]),
        cells("print(kept)"),
        cells("import os; os._exit(1)"),
        cells("print('y' * 10_000_000)"),
        cells("print('still here')"),
        "survived",
    ]
    inputs: list[str] = []
    async with session(project, script) as s:
        r = await s.prompt("break things")
        inputs = [call[-1].content for call in s.model.calls]
    assert r.outcome == "completed" and r.answer == "survived"
    assert "KeyboardInterrupt" in inputs[2] and "2s timeout" in inputs[2] and "intact" in inputs[2]
    assert inputs[3] == "1"
    assert "kernel died" in inputs[4] and "restarted" in inputs[4]
    assert "characters cut from the middle" in inputs[5] and len(inputs[5]) < 70_000
    assert inputs[6] == "still here"


async def test_model_failure_ends_the_turn_and_the_session_goes_on(project: Path):
    script = [ModelTimeout("no answer within 1s"), ModelError("HTTP 400: bad"), "back"]
    async with session(project, script) as s:
        assert (await s.prompt("a")).outcome == "timed_out"
        r = await s.prompt("b")
        assert (r.outcome, r.error) == ("error", "HTTP 400: bad")
        assert (await s.prompt("c")).answer == "back"
    assert "previous turn ended early (error): HTTP 400: bad" in last_input(s)


async def test_step_cell_and_time_budgets(project: Path):
    loop_forever = lambda messages: cells(str(len(messages)))  # noqa: E731 (a new cell each time: no repeat)
    async with session(project, [loop_forever] * 10, budget={"max_steps": 3}) as s:
        r = await s.prompt("spin")
    assert (r.outcome, r.steps) == ("budget_exhausted", 3) and "max_steps" in r.error

    async with session(project, [cells("1", "2", "3")], budget={"max_cells": 2}) as s:
        r = await s.prompt("spin")
    assert (r.outcome, r.cells) == ("budget_exhausted", 2) and "max_cells" in r.error
    assert s.messages[-1].content == "Not run: the turn ended before this call."

    async with session(project, [cells("import time; time.sleep(30)")], budget={"max_seconds": 1.5}) as s:
        r = await s.prompt("sleep")
    assert r.outcome == "budget_exhausted" and r.duration < 10


@pytest.mark.parametrize("action_format", ["tools", "text"])
async def test_the_same_cell_with_the_same_result_three_times_in_a_row_ends_the_turn(project: Path, action_format):
    # SmolLM2 at temperature 0 writes the same cell again and again, each time told the same error: without
    # a guard it went on to budget.max_steps (200 calls, ten minutes on two cores)
    stuck = lambda messages: cells("print(mul(2, 3))")  # noqa: E731
    async with session(project, [stuck] * 10, action_format=action_format) as s:
        r = await s.prompt("Add a function mul(a, b) to calc.py and a test")
    assert (r.outcome, r.steps, r.cells) == ("budget_exhausted", 3, 3)
    assert r.error == ("the model ran the same cell with the same result 3 times in a row, going round in circles, "
                       "so the turn stops (budget.max_repeats)")
    assert "NameError: name 'mul' is not defined" in s.messages[-1].content  # the last cell's result is told
    (finished,) = [rec for rec in read_records(s.layout.trajectory) if isinstance(rec, TurnFinishedRecord)]
    assert (finished.outcome, finished.error) == ("budget_exhausted", r.error)


async def test_a_cell_run_again_that_gets_somewhere_is_not_a_repeat(project: Path):
    # the same code, a new result each time (polling a file that grows), and the same cell between others
    script = [cells("n = globals().get('n', 0) + 1; print(n)")] * 4 + [cells("1"), cells("1"), cells("2"), cells("1"),
                                                                       "done"]
    async with session(project, script, budget={"max_repeats": 3}) as s:
        r = await s.prompt("poll")
    assert (r.outcome, r.cells) == ("completed", 8)


async def test_steering_reaches_the_next_model_call(project: Path):
    holder: dict[str, Session] = {}

    def first(messages):
        holder["s"].steer("use tabs, not spaces")
        return cells("1")

    async with session(project, [first, "ok"]) as s:
        holder["s"] = s
        await s.prompt("format the file")
    assert s.model.calls[1][-1].content == "[Message from the user while you work]\nuse tabs, not spaces"


async def test_interrupting_a_cell_ends_the_turn_and_keeps_the_kernel(project: Path):
    async with session(project, [cells("kept = 5"), cells("import time; time.sleep(60)"), cells("print(kept)"), "ok"]) as s:
        turn = asyncio.create_task(s.prompt("wait"))
        while s.kernel.state.value != "busy" or s.turn is None or s.turn.cells < 2:
            await asyncio.sleep(0.05)
        await s.interrupt()
        r = await turn
        assert r.outcome == "interrupted"
        assert (await s.prompt("again")).answer == "ok"
    assert last_input(s) == "5"


async def test_interrupting_a_model_call(project: Path):
    class Slow(ScriptedModel):
        async def complete(self, messages, **kw):
            await asyncio.sleep(60)

    s = Session(make_config(), Slow([]), cwd=project)
    async with s:
        turn = asyncio.create_task(s.prompt("think"))
        while s.turn is None or s.turn.steps < 1:
            await asyncio.sleep(0.01)
        await s.interrupt()
        r = await turn
    assert r.outcome == "interrupted"


async def test_text_mode_runs_fenced_cells(project: Path):
    async with session(project, [cells("a = 3", "print(a * 3)"), "nine"], action_format="text") as s:
        r = await s.prompt("compute")
    assert r.answer == "nine"
    assert last_input(s) == "[cell 1 output]\n(no output)\n\n[cell 2 output]\n9"


async def test_compaction_folds_older_turns_and_keeps_the_kernel(project: Path):
    script = [
        cells("secret = 'kept in the kernel'; print('x' * 4000)"), "turn one done",
        "SUMMARY: set secret; printed x",  # the compaction call, before turn two's first step
        cells("print(secret)"), "turn two done",
    ]
    events: list[Event] = []
    base = len(system_prompt(make_config(), project)) // 4  # tokens of the system prompt alone
    sections = {"model": {"context_window": (base + 800) * 2, "base_prompt": "full"}, "compaction": {"keep_recent_turns": 0, "threshold": 0.5}}
    async with session(project, script, events, **sections) as s:
        await s.prompt("one")
        assert not any(e.type == "compaction" for e in events)  # nothing older than the current turn
        await s.prompt("two")
    assert [e.type for e in events].count("compaction") == 1
    assert "SUMMARY: set secret" in s.messages[1].content and s.messages[2].content == "two"
    assert s.model.calls[2][0].content.startswith("You compact")  # the summary call itself
    assert "x" * 100 in s.model.calls[2][1].content
    assert last_input(s) == "kept in the kernel"
    records = read_records(s.dir / "trajectory.jsonl")
    assert sum(isinstance(r, CompactionRecord) for r in records) == 1


async def test_project_instructions_follow_the_base_prompt(project: Path):
    (project / "AGENTS.md").write_text("Always run `make check`.")
    trust(project, "AGENTS.md")
    async with session(project, ["ok"]) as s:
        await s.prompt("hi")
    system = s.model.calls[0][0].content
    assert system.index("persistent IPython kernel") < system.index("# Project instructions (AGENTS.md)")
    assert "Always run `make check`." in system


async def test_note_reaches_the_user_and_everything_is_recorded(project: Path):
    events: list[Event] = []
    async with session(project, [cells("note('halfway'); print(1)"), "done"], events) as s:
        await s.prompt("go")
    assert [e.text for e in events if e.type == "note"] == ["halfway"]
    records = read_records(s.dir / "trajectory.jsonl")
    kinds = [r.kind for r in records]
    assert kinds[0] == "session" and kinds[-1] == "turn_finished"
    assert [r.cell.code for r in records if isinstance(r, CellRecord)] == ["note('halfway'); print(1)"]
    assert isinstance(records[-1], TurnFinishedRecord) and records[-1].outcome == "completed"


async def test_a_long_single_turn_compacts_its_own_early_steps_and_ids_stay_unique(project: Path):
    replies = iter([cells(f"print('{c}' * 2000)") for c in "vwxyz"] + ["done", "second turn done"])

    def model(messages: list[Message]):
        return "SUMMARY of earlier steps" if messages[0].content.startswith("You compact") else next(replies)

    events: list[Event] = []
    sections = {"model": {"context_window": 2400, "base_prompt": "full"}, "compaction": {"keep_recent_turns": 0, "threshold": 0.5}}
    async with session(project, [model] * 20, events, **sections) as s:
        r = await s.prompt("do a long task")
        assert (r.outcome, r.answer) == ("completed", "done")
        assert s.messages[1].content.endswith("SUMMARY of earlier steps")
        assert s.messages[2].content == "do a long task"  # the prompt stays verbatim after the summary
        assert s.messages[3].role == "assistant"  # a kept step starts with its call; every call has its reply
        await s.prompt("and another")
    assert [e.type for e in events].count("compaction") >= 2
    assert [e.turn_id for e in events if e.type == "turn.started"] == ["t1", "t2"]
    assert all(len(call) < 12 for call in s.model.calls)  # the context never grew unbounded


async def test_a_context_overflow_compacts_and_retries_once(project: Path):
    script = [cells("1"), cells("2"), cells("3"), ContextOverflow("the context is too long"), "SUMMARY", "fine"]
    async with session(project, script) as s:
        r = await s.prompt("go")
    assert (r.outcome, r.answer) == ("completed", "fine")
    assert s.model.calls[4][0].content.startswith("You compact")


async def test_a_steer_sent_during_the_final_answer_is_answered_in_the_same_turn(project: Path):
    holder: dict[str, Session] = {}

    def answer(messages):
        holder["s"].steer("also add a test")
        return "done with the fix"

    async with session(project, [answer, "added the test too"]) as s:
        holder["s"] = s
        r = await s.prompt("fix it")
    assert r.answer == "added the test too" and r.steps == 2


async def test_a_reply_cut_off_at_the_length_limit_is_continued(project: Path):
    cut = Completion(message=Message(role="assistant", content="Here is my plan: first"), finish_reason="length")
    async with session(project, [cut, "the whole answer"]) as s:
        r = await s.prompt("plan")
    assert r.answer == "the whole answer"
    assert "cut off at the output length limit" in s.model.calls[1][-1].content


async def test_a_broken_event_listener_does_not_break_the_turn(project: Path):
    def broken(event: Event) -> None:
        if event.type == "cell.output":
            raise BrokenPipeError("client went away")

    s = Session(make_config(), ScriptedModel([cells("print('x')"), "ok"]), cwd=project, on_event=broken)
    async with s:
        r = await s.prompt("go")
    assert (r.outcome, r.answer) == ("completed", "ok")


async def test_a_session_that_cannot_start_leaves_nothing_running(project: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch):
    shadow = tmp_path / "shadow" / "agent"  # the kernel imports this `agent` instead: bootstrap fails
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('broken install')\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    s = Session(make_config(), ScriptedModel([]), cwd=project)
    with pytest.raises(KernelError, match="bootstrap failed: ImportError: broken install"):
        await s.start()
    assert not s.bridge.path.exists()
    assert not await s.kernel.is_alive()


async def test_an_interrupted_host_call_does_not_desync_the_bridge(project: Path):
    async def slow() -> str:
        await asyncio.sleep(3)
        return "slow-reply"

    script = [
        Message(role="assistant", tool_calls=[ToolCall(id="a", name="ipython", arguments='{"code": "host.call(\\"slow\\")", "timeout": 1}')]),
        cells("print(host.call('ping'), await host.acall('ping'))"),
        "ok",
    ]
    async with session(project, script) as s:
        s.bridge.handlers["slow"] = slow
        await s.prompt("go")
    assert last_input(s) == "pong pong"
