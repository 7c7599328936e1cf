"""A newcomer's first day, round 2 (issue 52), in the app: real daemon, real kernels, the fake model."""

from __future__ import annotations

from pathlib import Path

from textual import events

from daemon.client import Client
from tests.tui.test_app import SIZE, app_for, until
from tests.tui.test_onboarding import notices
from tui.app import PrimeApp
from tui.widgets.command_menu import CommandMenu


def typed(app: PrimeApp, text: str) -> None:
    """Keys as a terminal delivers them to a person typing quickly: all at once, before any is handled."""
    for ch in text:
        key = {"\r": "enter", " ": "space", "/": "slash", "!": "exclamation_mark"}.get(ch, ch)
        event = events.Key(key, None if key == "enter" else ch)
        event.set_sender(app)
        app._driver.send_message(event)


async def test_enter_runs_the_command_typed_not_the_one_highlighted_before_it_was(daemon: Client, project: Path,
                                                                              model_server):
    """Type `/`, wait for the menu (with /new highlighted), type `help` and Enter: /help runs, not /new."""
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        first = app.session_id
        await pilot.press("/")
        menu = app.query_one(CommandMenu)
        await until(pilot, lambda: menu.display and menu.chosen() == "/new")
        typed(app, "help\r")
        await until(pilot, lambda: any("/interrupt" in n for n in notices(app)))  # /help's list
        assert app.session_id == first and len(await daemon.sessions()) == 1  # /new did not run
        assert app.query_one("#prompt").sent[-1] == "/help"
        typed(app, "/mo\r")  # a prefix still runs the command it completes to
        await until(pilot, lambda: any(n.startswith("model: fake") for n in notices(app)))
