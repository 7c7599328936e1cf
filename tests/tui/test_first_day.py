"""A newcomer's first day, round 2 (issue 52), in the app: real daemon, real kernels, the fake model."""

from __future__ import annotations

from pathlib import Path

from textual import events

from daemon.client import Client
from tests.tui.test_app import SIZE, app_for, until
from tests.tui.test_onboarding import notices
from tui.app import PrimeApp
from tui.screens.sessions import SessionsScreen
from tui.widgets.command_menu import CommandMenu
from tui.widgets.cell_view import CellView
from tui.widgets.files_row import FilesRow
from tui.widgets.message import AssistantMessage, UserMessage
from tui.widgets.refinement_card import RefinementCard


def answers(app: PrimeApp) -> list[str]:
    return [m.text for m in app.query(AssistantMessage)]


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


async def test_a_session_the_app_made_and_nobody_prompted_is_not_kept(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        first = app.session_id
        typed(app, "/new\r")  # left without a word: it goes
        await until(pilot, lambda: app.session_id not in (None, first) and app.events_seen > 0)
        assert [s.id for s in await daemon.sessions()] == [app.session_id]
        app.query_one("#prompt").load_text("hello")
        await pilot.press("enter")
        await until(pilot, lambda: any(n == "echo: hello" for n in answers(app)))
        prompted = app.session_id
        typed(app, "/new\r")  # prompted: it stays
        await until(pilot, lambda: app.session_id not in (None, prompted) and app.events_seen > 0)
        last = app.session_id
    assert await app.leave() is None  # on exit, as `prime-agent` calls it: the last one was never prompted
    listed = await daemon.sessions()
    assert [s.id for s in listed] == [prompted]
    assert not any((Path(listed[0].dir).parent / gone).exists() for gone in (first, last))


async def test_text_typed_after_esc_in_the_chooser_starts_a_session_with_it(daemon: Client, project: Path,
                                                                           model_server):
    """`prime-agent --resume`, Esc in the chooser, then typing: the text was answered "no session" and lost."""
    app = app_for(daemon, project, model_server, choose=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, SessionsScreen))
        typed(app, "hello there\r")
        await until(pilot, lambda: any(n == "echo: hello there" for n in answers(app)))
        assert [s.id for s in await daemon.sessions()] == [app.session_id]


async def test_steering_shows_queued_until_delivered_and_an_interrupt_hands_it_back(daemon: Client, project: Path,
                                                                                   model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("run: import time; print('working', flush=True); time.sleep(60)")
        await pilot.press("enter")
        await until(pilot, lambda: any(c.output for c in app.query(CellView)))
        typed(app, "look at the logs too\r")
        await until(pilot, lambda: any(m.label == "you (steering)" for m in app.query(UserMessage)))
        (steer,) = [m for m in app.query(UserMessage) if m.label == "you (steering)"]
        assert steer.has_class("queued")  # waiting for the next model call
        await pilot.press("escape")
        await until(pilot, lambda: app.query_one("#prompt").text == "look at the logs too")  # back, to send again
        assert "not sent: back in your prompt" in str(steer.render())
        assert any("your steering is back in the prompt" in n for n in notices(app))


async def test_cost_status_model_and_a_second_rollback(daemon: Client, project: Path, model_server):
    model_server.models = [{"id": "fake", "object": "model"}, {"id": "fake-large", "object": "model"}]
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        typed(app, "hello\r")
        await until(pilot, lambda: "echo: hello" in answers(app))
        await until(pilot, lambda: app.state == "idle")
        typed(app, "/cost\r")
        await until(pilot, lambda: any(n.startswith("cost: ") for n in notices(app)))
        (cost,) = [n for n in notices(app) if n.startswith("cost: ")]
        usage = (await daemon.session(app.session_id)).usage
        assert f"tokens: {usage.prompt_tokens:,} in" in cost and "turns: 1" in cost
        typed(app, "/status\r")
        await until(pilot, lambda: any(n.startswith("daemon ") for n in notices(app)))
        (status,) = [n for n in notices(app) if n.startswith("daemon ")]
        for words in (f"session   {app.session_id} (idle, 1 turns)", f"cwd       {project}",
                      f"model     fake at {model_server.base_url}", "sandbox   workspace-write"):
            assert words in status, (words, status)
        typed(app, "/model\r")
        await until(pilot, lambda: any("the server offers: fake, fake-large" in n for n in notices(app)))
        typed(app, "/refine remember the test command\r")
        await until(pilot, lambda: len(app.query(RefinementCard)) == 1 and
                    app.query_one(RefinementCard).status == "applied")
        typed(app, "/rollback\r")
        await until(pilot, lambda: app.query_one(RefinementCard).status == "rolled back")
        card = app.query_one(RefinementCard)
        typed(app, f"/rollback {card.refinement_id}\r")  # said "changed again after", which nobody did
        await until(pilot, lambda: any(n == f"{card.refinement_id} is rolled back already" for n in notices(app)))


async def test_diff_shows_what_the_session_changed_and_init_asks_for_agents_md(daemon: Client, project: Path,
                                                                              model_server):
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        typed(app, "/diff\r")  # no turn yet: no checkpoint to compare with
        await until(pilot, lambda: any("no checkpoint yet" in n for n in notices(app)))
        app.query_one("#prompt").load_text("run: edit('calc.py', 'a - b', 'a + b')")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and len(app.query(FilesRow)) == 1)
        (project / "notes.txt").write_text("mine\n")  # a person's edit counts too: the workspace as it is now
        typed(app, "/diff\r")
        await until(pilot, lambda: len(app.query(FilesRow)) == 2)
        row = app.query(FilesRow)[-1]
        assert [f.path for f in row.files.files] == ["calc.py", "notes.txt"]
        assert "+    return a + b" in row.files.files[0].diff
        assert any(n.startswith("since this session began: 2 files changed") for n in notices(app))
        sent = len(model_server.requests)
        typed(app, "/init\r")
        await until(pilot, lambda: len(model_server.requests) > sent and app.state == "idle")
        prompt = model_server.requests[-1]["messages"][-1]["content"]
        assert "write an AGENTS.md for this project" in prompt and "Notes from the person: (none)" in prompt
        assert any("once you trust it: prime-agent trust" in n for n in notices(app))


async def test_bang_runs_your_command_in_the_workspace_and_the_model_hears_it(daemon: Client, project: Path,
                                                                             model_server):
    (project / "marker.txt").write_text("here\n")
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        typed(app, "!ls; echo to-stderr >&2; exit 3\r")
        await until(pilot, lambda: any(n.startswith("$ ls;") for n in notices(app)))
        (shown,) = [n for n in notices(app) if n.startswith("$ ls;")]
        assert "marker.txt" in shown and "to-stderr" in shown and "[exit 3," in shown
        assert model_server.requests == []  # the model is not asked about it by itself
        typed(app, "what failed?\r")
        await until(pilot, lambda: model_server.requests)
        said = model_server.requests[-1]["messages"][-1]["content"]
        assert said.startswith("I ran `ls; echo to-stderr >&2; exit 3` in the workspace (exit 3)")
        assert "marker.txt" in said and said.endswith("what failed?")
        typed(app, "!sleep 60\r")  # Esc stops your command, not a turn
        await pilot.pause(0.5)
        await pilot.press("escape")
        await until(pilot, lambda: any(n.startswith("$ sleep 60") and "[stopped," in n for n in notices(app)))
