"""`/goal` and `/autonomous` in the app (Pilot): progress in the status bar, Esc stops the goal."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer
from daemon.client import Client
from tests.daemon.test_goals import fixer
from tests.tui.snapshots import assert_snapshot
from tests.tui.test_app import SIZE, app_for, until
from tui.commands import parse_goal
from tui.widgets.message import Notice
from tui.widgets.status_bar import StatusBar


async def test_goal_shows_progress_in_the_status_bar_and_escape_stops_it(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text(
            '/goal run: import time; time.sleep(30) --until "test -f done" --max-continuations 3')
        await pilot.press("enter")
        status = app.query_one(StatusBar)
        await until(pilot, lambda: status.state == "running" and "goal running" in status.goal)
        assert "continuation 0 of 3" in status.goal
        await pilot.press("escape")
        await until(pilot, lambda: "goal stopped" in status.goal, timeout=30)
        goal = await daemon.goal(app.session_id)
        assert goal.state == "stopped" and goal.turns == 1 and "interrupted" in goal.reason
        assert any("goal stopped" in str(n.render()) for n in app.query(Notice))


async def test_autonomous_goes_on_until_final_and_bad_flags_are_said(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("/autonomous run: final('finished') --max-continuations 2")
        await pilot.press("enter")
        status = app.query_one(StatusBar)
        await until(pilot, lambda: "goal achieved" in status.goal)
        assert (await daemon.goal(app.session_id)).turns == 1
        app.query_one("#prompt").load_text("/goal fix it")
        await pilot.press("enter")
        await until(pilot, lambda: any("--until CMD is the check" in str(n.render()) for n in app.query(Notice)))


async def test_snapshot_of_a_goal_achieved_on_its_first_continuation(daemon: Client, fixed_project: Path):
    with OpenAIServer(fixer()) as server:
        app = app_for(daemon, fixed_project, server)
        async with app.run_test(size=(100, 40)) as pilot:  # all of it on one screen: no scroll position to vary
            await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
            app.query_one("#prompt").load_text(
                "/goal create the file done --until 'test -f done' --max-continuations 3 --max-tokens 90000")
            await pilot.press("enter")
            status = app.query_one(StatusBar)
            await until(pilot, lambda: "goal achieved" in status.goal and app.state == "idle"
                        and any("goal achieved after" in str(n.render()) for n in app.query(Notice)))
            await pilot.pause()
            assert status.goal.startswith("goal achieved · continuation 1 of 3 · ")
            assert status.goal.endswith(" of 90,000 tok")
            assert_snapshot(app, "goal")


def test_goal_arguments_are_parsed_as_a_shell_would():
    assert parse_goal("fix O'Brien's tests --until 'pytest -q' --max-seconds 60", False) == (
        "fix O'Brien's tests", "pytest -q", {"max_seconds": 60.0})
    for bad, autonomous in (("x --max-tokens many --until true", False), ("--until true", False),
                            ("x --until true", True), ('x --until "open', False),
                            ("x --until true stray", False)):
        with pytest.raises(ValueError):
            parse_goal(bad, autonomous)
