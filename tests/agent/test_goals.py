"""Goals (agent/goals.py) in a real session: a scripted model, a real kernel, real check commands."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent import events as ev
from agent.goals import GoalBudget, GoalSpec, GoalState
from agent.kernel.sandbox import unavailable
from agent.session import Session
from agent.testing.scripted import ScriptedModel, cells
from agent.trajectory import GoalRecord, TurnStartedRecord, read_records
from tests.conftest import make_config

CHECK = f"{shlex.quote(sys.executable)} -c 'import calc; assert calc.add(2, 3) == 5, calc.add(2, 3)'"


def write_calc(body: str) -> str:
    return f"open('calc.py', 'w').write('def add(a, b):\\n    return {body}\\n')"


def session(project: Path, outputs: list, events: list) -> Session:
    return Session(make_config(), ScriptedModel(outputs), cwd=project, on_event=events.append)


async def test_a_wrong_fix_then_a_right_one_achieves_the_goal_in_two_turns(project: Path):
    events: list = []
    script = [cells(write_calc("a - b")), "fixed", cells(write_calc("a + b")), "fixed now"]
    async with session(project, script, events) as s:
        goal = await s.pursue(GoalState.new(GoalSpec(text="make add work", check=CHECK)))
    assert (goal.state, goal.turns, goal.continuations) == ("achieved", 2, 1)
    second_prompt = next(m.content for m in reversed(s.model.calls[-1]) if m.role == "user")
    assert "AssertionError: -1" in second_prompt and "exit code 1" in second_prompt and "9 continuations" in second_prompt
    goal_events = [e.type for e in events if e.type.startswith("goal.")]
    assert goal_events == ["goal.started", "goal.check", "goal.continued", "goal.check", "goal.finished"]
    records = read_records(s.layout.trajectory)
    turns = [(r.goal_id, r.continuation) for r in records if isinstance(r, TurnStartedRecord)]
    assert turns == [(goal.id, 0), (goal.id, 1)]
    steps = [r.step for r in records if isinstance(r, GoalRecord)]
    assert steps == ["started", "check", "continued", "check", "finished"]
    assert records[-1].state == "achieved" and goal.usage.total_tokens > 0


async def test_a_goal_that_is_never_reached_ends_exhausted_at_its_budget(project: Path):
    events: list = []
    script = [cells(write_calc("a - b")), "fixed", cells(write_calc("a * b")), "fixed again"]
    async with session(project, script, events) as s:
        goal = await s.pursue(GoalState.new(GoalSpec(text="make add work", check=CHECK,
                                                     budget=GoalBudget(max_continuations=1))))
    assert (goal.state, goal.turns) == ("exhausted", 2)
    assert "max_continuations" in goal.reason and not goal.last_check.passed
    finished = [e for e in events if isinstance(e, ev.GoalFinished)]
    assert [(f.state, f.turns) for f in finished] == [("exhausted", 2)]
    assert read_records(s.layout.trajectory)[-1].state == "exhausted"


async def test_autonomous_mode_continues_until_the_model_calls_final(project: Path):
    events: list = []
    script = ["I wrote half of it.", cells("final('all done')")]
    async with session(project, script, events) as s:
        goal = await s.pursue(GoalState.new(GoalSpec(text="write the docs")))
    assert (goal.state, goal.turns, s.last_result.answer) == ("achieved", 2, "all done")
    assert "without a call to `final()`" in s.model.calls[1][-1].content


async def test_the_seconds_budget_interrupts_a_running_turn(project: Path):
    events: list = []
    script = [cells("import time; time.sleep(60)"), "never"]
    async with session(project, script, events) as s:
        goal = await s.pursue(GoalState.new(GoalSpec(text="wait", check="false", budget=GoalBudget(max_seconds=1.5))))
        assert (goal.state, goal.turns) == ("exhausted", 1)
        assert "max_seconds" in goal.reason and goal.seconds() < 30
        assert s.last_result.outcome == "interrupted"


async def test_a_stop_request_ends_the_goal_after_the_turn(project: Path):
    events: list = []
    state = GoalState.new(GoalSpec(text="go", check="false"))
    script = [lambda messages: (setattr(state, "stop_requested", True), "one turn")[1], "never"]
    async with session(project, script, events) as s:
        goal = await s.pursue(state)
    assert (goal.state, goal.turns) == ("stopped", 1)


async def test_a_check_past_its_timeout_is_killed_with_what_it_started_and_fails(project: Path):
    async with session(project, [], []) as s:
        result = await s.check("(sleep 30; echo late > late.txt) & echo started; sleep 30", timeout=0.5)
        assert (result.passed, result.timed_out, result.exit_code) == (False, True, None)
        assert result.output.startswith("started") and "killed after 0.5 seconds" in result.output
        assert result.duration < 10
        long = await s.check(f"{shlex.quote(sys.executable)} -c \"print('x' * 100000)\"", timeout=30)
        assert long.passed and len(long.output) < 9000 and "characters cut" in long.output
    assert not (project / "late.txt").exists()  # the background child went with it


ATTACK = """import json, os
def attempt(fn):
    try:
        fn()
        return "ok"
    except BaseException as e:
        return type(e).__name__
json.dump({
    "workspace": attempt(lambda: open("made.txt", "w").write("fine")),
    "git": attempt(lambda: open(".git/config", "a").write("[core]\\n")),
    "harness": attempt(lambda: open(".prime-agent/harness/x.md", "w")),
    "home": attempt(lambda: open(%(home)r + "/x", "w")),
    "token": attempt(lambda: open(%(token)r).read()),
    "outside": attempt(lambda: open(%(outside)r, "w")),
    "secret": os.environ.get("MY_API_KEY", "unset"),
}, open("escape.json", "w"))
"""


@pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")
async def test_code_the_model_wrote_runs_in_the_check_under_the_sessions_sandbox(project: Path, prime_home: Path,
                                                                                  tmp_path: Path, monkeypatch):
    """The check runs what the model wrote (a conftest.py, the module a test imports): outside the
    sandbox it would be the model's way out of it. Here every escape fails, the check still passes."""
    monkeypatch.setenv("MY_API_KEY", "sk-live-123456")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".prime-agent" / "harness").mkdir(parents=True)
    (prime_home / "run").mkdir(parents=True, exist_ok=True)
    (prime_home / "run" / "token").write_text("daemon-token")
    attack = ATTACK % {"home": str(prime_home), "token": str(prime_home / "run" / "token"),
                       "outside": str(tmp_path / "outside.txt")}
    script = [cells(f"write('calc.py', {attack!r})"), "wrote calc.py"]
    async with session(project, script, []) as s:
        check = f"{shlex.quote(sys.executable)} -c 'import calc'"
        goal = await s.pursue(GoalState.new(GoalSpec(text="write calc", check=check)))
    assert goal.state == "achieved", goal.last_check
    got = json.loads((project / "escape.json").read_text())
    assert got.pop("workspace") == "ok" and got.pop("secret") == "unset"
    assert {k: v for k, v in got.items() if v == "ok"} == {}, got
    assert not (tmp_path / "outside.txt").exists() and not (prime_home / "x").exists()


@pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")
async def test_the_check_has_the_sessions_limits_and_network(project: Path):
    server = socket.create_server(("127.0.0.1", 0))
    python = shlex.quote(sys.executable)
    config = make_config(sandbox={"memory_mb": 256, "network": False})
    try:
        async with Session(config, ScriptedModel([]), cwd=project) as s:
            big = await s.check(f"{python} -c \"b = b'x' * (1024 * 2**20)\"", timeout=60)
            assert not big.passed and "the check hit the sandbox's memory limit (256 MiB" in big.output, big
            port = server.getsockname()[1]
            tcp = await s.check(f"{python} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\"",
                                timeout=60)
            assert not tcp.passed and ("ConnectionRefusedError" in tcp.output or "OSError" in tcp.output), tcp
            assert (await s.check("true", timeout=60)).passed
    finally:
        server.close()
