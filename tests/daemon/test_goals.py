"""Goals over the daemon's API: a real daemon, real kernels, the fake OpenAI server as the model."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from agent.goals import GoalBudget, GoalSpec, GoalState
from agent.testing.openai_server import OpenAIServer, Reply
from daemon.client import Client, DaemonError, SyncClient, daemon_pid
from tests.daemon.conftest import running_daemon
from tests.daemon.test_recovery import _wait_gone

MAKE_DONE = "open('done', 'w').write('yes')"


def fixer(first: str = "not yet") -> Any:
    """The model: its first turn says `first` and does nothing; every later one creates `done`."""
    turns = []

    def reply(request: dict[str, Any]) -> Reply:
        messages = request["messages"]
        if messages[-1]["role"] == "tool":
            return Reply(content="created done")
        turns.append(1)
        if len(turns) == 1:
            return Reply(content=first) if not first.startswith("run: ") else Reply(code=[first[5:]])
        return Reply(code=[MAKE_DONE])

    return reply


async def goal_events(client: Client, sid: str) -> list:
    out = []
    async for e in client.events(sid, 0):
        out.append(e)
        if e.type == "goal.finished":
            return out
    raise AssertionError("unreachable")


async def test_a_goal_continues_with_the_failing_check_until_it_passes(daemon: Client, project: Path):
    with OpenAIServer(fixer()) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        started = await daemon.start_goal(s.id, "create the file done", check="test -f done",
                                          budget={"max_continuations": 3})
        assert started.state == "running" and started.spec.check == "test -f done"
        assert (await daemon.session(s.id)).goal.startswith("running · continuation 0 of 3 · ")
        with pytest.raises(DaemonError) as e:
            await daemon.start_goal(s.id, "another", check="true")
        assert e.value.status == 409 and e.value.code == "goal_running"
        events = await goal_events(daemon, s.id)
        goal = await daemon.goal(s.id)
    assert (goal.state, goal.turns, goal.continuations) == ("achieved", 2, 1)
    assert goal.last_check.passed and goal.usage.total_tokens > 0 and goal.turn_ids == ["t1", "t2"]
    types = [e.type for e in events if e.type.startswith("goal.")]
    assert types == ["goal.started", "goal.check", "goal.continued", "goal.check", "goal.finished"]
    turns = [e for e in events if e.type == "turn.started"]
    assert [(t.goal_id, t.continuation) for t in turns] == [(goal.id, 0), (goal.id, 1)]
    assert "test -f done" in turns[1].prompt and "exit code 1" in turns[1].prompt
    assert (await daemon.session(s.id)).goal == "achieved after 2 turns"
    meta = json.loads((Path(s.dir) / "session.json").read_text())
    assert meta["goal"]["state"] == "achieved"


async def test_delete_stops_the_goal_after_the_current_turn(daemon: Client, project: Path):
    with OpenAIServer(fixer("run: import time; time.sleep(1.5)")) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        await daemon.start_goal(s.id, "create the file done", check="test -f done")
        async for e in daemon.events(s.id, 0):
            if e.type == "cell.started":
                break
        stopping = await daemon.stop_goal(s.id)
        assert stopping.state == "running" and stopping.stop_requested
        events = await goal_events(daemon, s.id)
        goal = await daemon.goal(s.id)
    assert (goal.state, goal.turns) == ("stopped", 1) and "after the turn" in goal.reason
    finished = [e for e in events if e.type == "turn.finished"]
    assert finished[-1].outcome == "completed"  # the turn ran to its end; no continuation followed
    assert not (project / "done").exists()


async def test_bad_goal_requests_get_a_clear_4xx(daemon: Client, project: Path):
    with OpenAIServer(fixer()) as server:
        s = await daemon.create_session(project, model="fake", base_url=server.base_url)
        with pytest.raises(DaemonError) as e:
            await daemon.goal(s.id)
        assert (e.value.status, e.value.code) == (404, "no_goal")
        with pytest.raises(DaemonError) as e:
            await daemon.start_goal(s.id, "x", budget={"max_continuations": -1})
        assert e.value.status == 422
        with pytest.raises(DaemonError) as e:
            await daemon.start_goal(s.id, "x", budget={"max_minutes": 3})
        assert e.value.status == 422 and "max_minutes" in e.value.message
        for check in ("", "true\u0000"):
            with pytest.raises(DaemonError) as e:
                await daemon.start_goal(s.id, "x", check=check)
            assert e.value.status == 422
        with pytest.raises(DaemonError) as e:
            await daemon.stop_goal(s.id)
        assert e.value.status == 404


async def test_a_goal_cut_by_a_restart_with_no_budget_left_ends_exhausted(prime_home: Path, project: Path):
    with OpenAIServer(fixer()) as server:
        async with running_daemon() as client:
            s = await client.create_session(project, model="fake", base_url=server.base_url)
        meta_path = Path(s.dir) / "session.json"
        meta = json.loads(meta_path.read_text())
        cut = GoalState.new(GoalSpec(text="x", check="false", budget=GoalBudget(max_continuations=2)))
        cut.turns, cut.continuations = 3, 2
        meta["goal"] = json.loads(cut.model_dump_json())
        meta_path.write_text(json.dumps(meta))
        async with running_daemon() as client:
            goal = await client.goal(s.id)
            assert goal.state == "exhausted" and "daemon restarted" in goal.reason
            assert len(server.requests) == 0  # nothing ran


async def test_goals_cut_by_a_restart_past_the_cap_resume_one_after_another(prime_home: Path, project: Path):
    with OpenAIServer(fixer()) as server:
        async with running_daemon() as client:
            sessions = [await client.create_session(project, model="fake", base_url=server.base_url) for _ in range(2)]
        for i, s in enumerate(sessions):  # both cut after their first turn, the first one older
            meta_path = Path(s.dir) / "session.json"
            meta = json.loads(meta_path.read_text())
            cut = GoalState.new(GoalSpec(text="x", check="sleep 1"))
            cut.turns, cut.started = 1, cut.started - 10 + i
            meta["goal"] = json.loads(cut.model_dump_json())
            meta_path.write_text(json.dumps(meta))
        async with running_daemon(max_goals=1) as client:
            with pytest.raises(DaemonError) as e:  # the cap is full with the goals that wait
                await client.start_goal(sessions[0].id, "another", check="true")
            assert e.value.code in ("goal_running", "too_many_goals")
            events = await goal_events(client, sessions[1].id)
            first, second = [await client.goal(s.id) for s in sessions]
    assert first.state == second.state == "achieved"
    assert second.finished - second.last_check.duration >= first.finished - 0.05  # its check began after
    notes = [e.text for e in events if e.type == "note"]
    assert any("waits to resume" in n for n in notes) and any("resumed after the daemon restarted" in n for n in notes)
    assert len(server.requests) == 0


@pytest.mark.slow
def test_a_goal_survives_kill_9_between_continuations_and_resumes_within_its_budget(prime_home: Path, project: Path):
    with OpenAIServer(fixer()) as server:
        client = SyncClient()
        try:
            s = client.create_session(project, model="fake", base_url=server.base_url)
            client.start_goal(s.id, "create the file done", check="test -f done", budget={"max_continuations": 4})
            seen = []
            for e in client.events(s.id, 0):
                seen.append(e)
                if e.type == "goal.check":  # the first turn's check failed: kill before the continuation ends
                    break
            pid = daemon_pid()
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
            after = []
            for e in client.events(s.id, seen[-1].seq):  # the client starts a new daemon
                after.append(e)
                if e.type == "goal.finished":
                    break
            goal = client.goal(s.id)
        finally:
            client.close()  # the daemon it started is stopped by no_daemon_left_behind
    assert goal.state == "achieved" and goal.continuations <= 4
    notes = [e.text for e in after if e.type == "note"]
    assert any("resumed after the daemon restarted" in n and "continuations" in n for n in notes)
    assert [e.type for e in after if e.type.startswith("goal.")][-2:] == ["goal.check", "goal.finished"]
    assert (project / "done").read_text() == "yes"


@pytest.mark.slow
def test_run_daemon_until_pursues_the_goal_in_the_daemon_and_exits_with_its_code(prime_home: Path, project: Path):
    import subprocess
    import sys

    with OpenAIServer(fixer()) as server:
        r = subprocess.run([str(Path(sys.executable).parent / "prime-agent"), "run", "--daemon", "--until",
                            "test -f done", "--max-continuations", "2", "create the file done"], cwd=project,
                           text=True, capture_output=True, timeout=120,
                           env={**os.environ, "OPENAI_BASE_URL": server.base_url, "PRIME_AGENT_MODEL": "fake"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "created done\n" and "goal check failed" in r.stderr and "goal achieved" in r.stderr
    listed = subprocess.run([str(Path(sys.executable).parent / "prime-agent"), "sessions"], text=True,
                            capture_output=True, timeout=60)
    assert "[goal achieved after 2 turns]" in listed.stdout, listed


async def test_goals_past_the_daemons_cap_are_refused(prime_home: Path, project: Path):
    with OpenAIServer(fixer("run: import time; time.sleep(1)")) as server:
        async with running_daemon(max_goals=1) as client:
            a = await client.create_session(project, model="fake", base_url=server.base_url)
            b = await client.create_session(project, model="fake", base_url=server.base_url)
            await client.start_goal(a.id, "one", check="false", budget={"max_continuations": 0})
            with pytest.raises(DaemonError) as e:
                await client.start_goal(b.id, "two", check="true")
            assert (e.value.status, e.value.code) == (429, "too_many_goals")
            await client.interrupt(a.id)
