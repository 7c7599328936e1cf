"""The app, driven with Textual's Pilot against a real daemon, real kernels and the fake model."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from textual.widgets import DataTable

from agent.trajectory import PlanRecord
from daemon.client import Client
from tests.conftest import trust
from tests.daemon.conftest import running_daemon
from tests.tui.snapshots import assert_snapshot
from tui.app import NewSession, PrimeApp
from tui.commands import COMMANDS
from tui.slash import SlashCommands
from tui.screens.harness import HarnessScreen
from tui.screens.sessions import SessionsScreen
from tui.widgets.approval_card import ApprovalCard
from tui.widgets.cell_view import CellView, McpRow
from tui.widgets.files_row import FilesRow
from tui.widgets.message import AssistantMessage, Notice, UserMessage
from tui.widgets.refinement_card import RefinementCard
from tui.widgets.status_bar import StatusBar

SIZE = (100, 30)


async def until(pilot, condition, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the app"
        await pilot.pause(0.05)


def app_for(client: Client, project: Path, model_server, **kw) -> PrimeApp:
    return PrimeApp(client, project, new=NewSession("fake", model_server.base_url, model_source="--model"), **kw)


async def type_and_send(pilot, text: str) -> None:
    for ch in text:
        await pilot.press(ch if ch != " " else "space")
    await pilot.press("enter")


async def test_a_prompt_streams_its_answer_and_shows_the_cell(daemon: Client, project: Path, model_server):
    model_server.models = [{"id": "fake", "object": "model", "max_model_len": 32768}]  # as vLLM lists it
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("run: print(6 * 7)")
        await pilot.press("enter")
        await until(pilot, lambda: any(m.text == "ran: 42" for m in app.query(AssistantMessage))
                    and app.state == "idle")  # the turn's end may come in a batch after its answer
        (cell,) = app.query(CellView)
        assert cell.code == "print(6 * 7)" and cell.output == [("stdout", "42\n")] and cell.result.duration > 0
        assert [m.text for m in app.query(UserMessage)] == ["run: print(6 * 7)"]
        status = app.query_one(StatusBar)
        assert status.state == "idle" and status.tokens > 0 and status.model == "fake"
        assert re.search(r"fake · ctx [\d.]+k/32k · idle", str(status.render())), status.render()
        app.save_screenshot(str(project / "chat.svg"))
    assert "ran:\xa042" in (project / "chat.svg").read_text().replace("&#160;", "\xa0")


async def test_a_cell_that_writes_files_shows_their_diff_under_it_collapsible_and_the_turn_sums_them_up(
        daemon: Client, project: Path, model_server):
    (project / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("run: edit('calc.py', 'a - b', 'a + b')\n"
                                           "write('notes.md', ''.join(f'line {i}\\n' for i in range(20)))")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and len(app.query(FilesRow)) == 1
                    and any("files changed" in str(n.content) for n in app.query(Notice)))
        (cell,), (row,) = app.query(CellView), app.query(FilesRow)
        assert row.parent is cell
        shown = row.content.plain
        assert shown.splitlines()[:2] == ["└─ 2 files changed, +21 -1", "   calc.py +1 -1"]
        assert "-    return a - b" in shown and "+    return a + b" in shown
        assert "line 19" not in shown and "more lines (enter to expand)" in shown  # collapsed
        styles = {span.style for span in row.content.spans}
        assert {"green", "red", "cyan"} <= styles  # added, removed, hunk lines
        row.focus()
        await pilot.press("enter")
        assert row.expanded and "+line 19" in row.content.plain and "(enter to collapse)" in row.content.plain
        await pilot.click(row)  # a click toggles it too, and not the cell's output
        assert not row.expanded and not cell.expanded
        (summary,) = [n for n in app.query(Notice) if "files changed" in str(n.content)]
        assert str(summary.content) == "2 files changed, +21 -1: calc.py, notes.md"


async def test_escape_interrupts_a_long_cell_and_the_session_goes_on(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        app.query_one("#prompt").load_text("run: import time; print('working', flush=True); time.sleep(60)")
        await pilot.press("enter")
        await until(pilot, lambda: any(c.output for c in app.query(CellView)))
        assert app.query_one(StatusBar).state == "running"
        await pilot.press("escape")
        await until(pilot, lambda: app.state == "idle")
        notices = [str(n.render()) for n in app.query(Notice)]
        assert any("turn interrupted" in n for n in notices)
        assert "interrupted" in app.query_one(CellView).result.kernel_message
        app.query_one("#prompt").load_text("run: print(time.time() > 0)")  # the kernel kept `time`
        await pilot.press("enter")
        await until(pilot, lambda: any(m.text == "ran: True" for m in app.query(AssistantMessage)))


async def test_refine_shows_a_card_and_r_rolls_it_back(daemon: Client, project: Path, model_server, prime_home):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        await type_and_send(pilot, "/refine remember the test command")
        await until(pilot, lambda: len(app.query(RefinementCard)) == 1)
        card = app.query_one(RefinementCard)
        assert card.status == "applied" and card.scopes == ["project"] and "test-command" in card.diff
        assert "test-command" in [e.id for e in await daemon.harness(session=app.session_id)]
        card.focus()
        await pilot.press("r")
        await until(pilot, lambda: card.status == "rolled back")
        assert "test-command" not in [e.id for e in await daemon.harness(session=app.session_id)]
        app.save_screenshot(str(project / "card.svg"))


async def test_tab_completes_a_slash_command_and_help_lists_every_one(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        for key in ["/", "h", "e", "tab"]:
            await pilot.press(key)
        assert app.query_one("#prompt").text == "/help "
        await pilot.press("enter")
        await until(pilot, lambda: any("/interrupt" in str(n.render()) for n in app.query(Notice)))
        (help,) = [str(n.render()) for n in app.query(Notice) if "/interrupt" in str(n.render())]
        assert all(f"{name:<11} {c.help}" in help for name, c in COMMANDS.items())


async def test_an_mcp_call_shows_under_its_cell_and_mcp_lists_the_servers(daemon: Client, project: Path,
                                                                          model_server):
    time_server = str(Path(sys.prefix) / "mcp-servers" / "time" / "bin" / "mcp-server-time")
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"time": {"command": time_server}}}))
    trust(project, ".mcp.json")
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("run: print((await mcp.time.get_current_time(timezone='UTC'))['timezone'])")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and len(app.query(McpRow)) == 1)
        (row,) = app.query(McpRow)
        assert isinstance(row.parent, CellView)
        assert str(row.render()) == "└─ mcp time.get_current_time(timezone='UTC') ok"
        app.query_one("#prompt").load_text("/mcp")
        await pilot.press("enter")
        await until(pilot, lambda: any("policy allow" in str(n.render()) for n in app.query(Notice)))
        (listed,) = [str(n.render()) for n in app.query(Notice) if "policy allow" in str(n.render())]
        assert listed.startswith("time  stdio  policy allow  ready  2 tools") and "get_current_time" in listed, listed


async def test_detach_and_reattach_shows_the_whole_history(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        for n in range(3):
            app.query_one("#prompt").load_text(f"run: print({n} * 10)")
            await pilot.press("enter")
            await until(pilot, lambda: any(m.text == f"ran: {n * 10}" for m in app.query(AssistantMessage)))
        await pilot.press("ctrl+c")
        await pilot.press("ctrl+c")  # idle: twice detaches
        await until(pilot, lambda: app.return_value is not None)
    session_id = app.return_value
    assert (await daemon.session(session_id)).state == "idle"  # still there
    again = app_for(daemon, project, model_server, session_id=session_id)
    async with again.run_test(size=SIZE) as pilot:
        last = (await daemon.session(session_id)).last_seq
        await until(pilot, lambda: again.events_seen >= last)
        assert [m.text for m in again.query(UserMessage)] == [f"run: print({n} * 10)" for n in range(3)]
        assert [c.output for c in again.query(CellView)] == [[("stdout", f"{n * 10}\n")] for n in range(3)]


async def test_the_sessions_screen_lists_attaches_and_starts_sessions(daemon: Client, project: Path, model_server):
    first = await daemon.create_session(project, model="fake", base_url=model_server.base_url, title="first one")
    app = app_for(daemon, project, model_server, choose=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen.query_one(DataTable).row_count)
        app.save_screenshot(str(project / "sessions.svg"))
        await pilot.press("enter")
        await until(pilot, lambda: app.session_id == first.id)
        await type_and_send(pilot, "/harness")
        await until(pilot, lambda: isinstance(app.screen, HarnessScreen))
        await pilot.press("escape")
        await type_and_send(pilot, "/new")
        await until(pilot, lambda: app.session_id not in (None, first.id))
    assert len(await daemon.sessions()) == 2


async def test_a_daemon_that_goes_away_shows_disconnected_and_the_app_recovers(project: Path, model_server,
                                                                               prime_home):
    first = running_daemon()
    client = await first.__aenter__()
    try:
        app = app_for(client, project, model_server)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
            first.stop.set()  # the daemon stops under the open app
            await first.task
            await until(pilot, lambda: not app.query_one(StatusBar).connected)
            async with running_daemon():  # and comes back
                await until(pilot, lambda: app.query_one(StatusBar).connected)
                app.query_one("#prompt").load_text("after the restart")
                await pilot.press("enter")
                await until(pilot, lambda: any(m.text == "echo: after the restart" for m in app.query(AssistantMessage)))
                assert any("resumed" in str(n.render()) for n in app.query(Notice))
    finally:
        await client.close()


async def test_snapshots_of_the_main_screens_at_80x24(daemon: Client, fixed_project: Path, model_server):
    app = app_for(daemon, fixed_project, model_server)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        await pilot.pause()
        assert_snapshot(app, "welcome")
        app.query_one("#prompt").load_text("run: for i in range(12): print('line', i)")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and len(app.query(AssistantMessage)) == 1)
        await pilot.pause()
        await until(pilot, lambda: app.conversation.is_vertical_scroll_end)
        await pilot.pause()
        assert_snapshot(app, "chat")
        await type_and_send(pilot, "/refine")
        await until(pilot, lambda: len(app.query(RefinementCard)) == 1)
        await pilot.pause()
        assert_snapshot(app, "refinement")
        await type_and_send(pilot, "/harness")
        await until(pilot, lambda: isinstance(app.screen, HarnessScreen))
        await until(pilot, lambda: app.screen.query_one("Tree").root.children)
        await pilot.press("down", "down", "enter")
        await pilot.pause(0.3)
        assert_snapshot(app, "harness")
        await pilot.press("escape")
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen.query_one(DataTable).row_count)
        assert_snapshot(app, "sessions")


async def test_a_reasoning_models_thinking_is_shown_dimmed_before_its_answer_and_the_turns_cost_after(
        daemon: Client, project: Path):
    from rich.console import Group

    from agent.testing.openai_server import OpenAIServer, Reply

    with OpenAIServer([Reply(content="Four.", reasoning="Two and two make four.")]) as server:
        app = PrimeApp(daemon, project, new=NewSession("fake", server.base_url))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
            app.query_one("#prompt").load_text("what is two and two?")
            await pilot.press("enter")
            await until(pilot, lambda: app.state == "idle" and any(m.text == "Four." for m in app.query(AssistantMessage)))
            (message,) = app.query(AssistantMessage)
            shown = message.render()._renderable  # the Rich renderable inside Textual's visual
            assert message.reasoning == "Two and two make four." and isinstance(shown, Group)
            thought = shown.renderables[0]
            assert (thought.plain, str(thought.style)) == ("Two and two make four.", "dim italic")
            assert any(str(n.render()).startswith("t1: ") and " in · " in str(n.render()) for n in app.query(Notice))


async def test_an_approval_card_decides_a_request_and_full_access_is_loud(daemon: Client, project: Path,
                                                                          model_server):
    """Denied, the model is told; approved (y), the command ran (a git command: its repository
    writable) and its output reached the model. A full-access session says so in the status bar."""
    app = app_for(daemon, project, model_server)
    ask = "run: print(await request_permission('git init -q && git rev-parse --git-dir', 'to make the repository'))"
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        assert app.query_one(StatusBar).sandbox == "workspace-write"
        for key, answer in (("n", "not approved: the user denied it"), ("y", ".git\n[approved and run: exit code 0]")):
            app.query_one("#prompt").load_text(ask)
            await pilot.press("enter")
            await until(pilot, lambda: any(c.status == "waiting" for c in app.query(ApprovalCard)))
            card = next(c for c in app.query(ApprovalCard) if c.status == "waiting")
            assert card.summary == "git init -q && git rev-parse --git-dir" and "(.git)" in card.runs_in
            await until(pilot, lambda: app.focused is card)  # the card takes the focus as it is shown
            await pilot.press(key)
            await until(pilot, lambda: any(answer in m.text for m in app.query(AssistantMessage)))
        await until(pilot, lambda: [c.status for c in app.query(ApprovalCard)] == ["deny", "approve"])
        assert (project / ".git" / "HEAD").exists()
        app.save_screenshot(str(project / "approval.svg"))
    loud = app_for(daemon, project, model_server)
    loud.new.sandbox = "full-access"
    async with loud.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: loud.query_one(StatusBar).sandbox.startswith("full-access"))
        assert "FULL-ACCESS: NO SANDBOX" in str(loud.query_one(StatusBar).render())


async def test_the_approval_card_decides_an_mcp_call_under_policy_ask_too(daemon: Client, project: Path,
                                                                          model_server):
    """`a` approves every later call of that tool in the session: the next one is the rule's, unasked."""
    from tests.daemon.test_mcp import mcp_project

    mcp_project(project, policy="ask")
    app = app_for(daemon, project, model_server)
    call = "run: print((await mcp.time.get_current_time(timezone='UTC'))['timezone'] * 2)"
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text(call)
        await pilot.press("enter")
        await until(pilot, lambda: any(c.status == "waiting" for c in app.query(ApprovalCard)))
        card = next(c for c in app.query(ApprovalCard) if c.status == "waiting")
        assert (card.kind, card.summary) == ("mcp", "time.get_current_time(timezone='UTC')") and app.focused is card
        await pilot.press("a")
        await until(pilot, lambda: any("UTCUTC" in m.text for m in app.query(AssistantMessage)))
        app.query_one("#prompt").load_text(call)
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and len([m for m in app.query(AssistantMessage)
                                                                 if "UTCUTC" in m.text]) == 2)
        assert [c.status for c in app.query(ApprovalCard)] == ["always", "always (by an earlier always)"]


async def test_plan_mode_shows_the_plan_as_a_card_and_y_carries_it_out(daemon: Client, project: Path, model_server):
    """/plan puts the session in plan mode between turns (the same session, not a new one); the plan
    is a card; n rejects it with the prompt's text as the note, y approves the next one and the same
    kernel carries it out."""
    from tui.widgets.plan_card import PlanCard

    app = app_for(daemon, project, model_server)
    plan = "run: open('p.txt', 'w').write(str(v))"
    task = f"run: v = 5\npropose_plan({plan!r})"
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        first = app.session_id
        app.query_one("#prompt").load_text("/plan " + task)
        await pilot.press("enter")
        await until(pilot, lambda: any(c.status == "waiting" for c in app.query(PlanCard)))
        assert app.session_id == first and (await daemon.session(first)).planning
        card = app.query(PlanCard).last()
        assert card.plan == plan
        app.query_one("#prompt").load_text("not yet")
        card.focus()
        await pilot.press("n")
        await until(pilot, lambda: card.status == "rejected")
        assert not (project / "p.txt").exists() and app.query_one("#prompt").text == ""
        records = (await daemon.transcript(app.session_id)).records
        steps = [(r.step, r.note) for r in records if isinstance(r, PlanRecord)]
        assert steps == [("entered", None), ("proposed", None), ("rejected", "not yet")]
        app.query_one("#prompt").load_text(task)
        await pilot.press("enter")
        await until(pilot, lambda: len([c for c in app.query(PlanCard) if c.status == "waiting"]) == 1)
        app.query(PlanCard).last().focus()
        await pilot.press("y")
        await until(pilot, lambda: (project / "p.txt").exists())
        assert (project / "p.txt").read_text() == "5"


def test_every_slash_command_names_a_method():
    assert {name: c.method for name, c in COMMANDS.items()
            if not callable(getattr(SlashCommands, c.method, None))} == {}
