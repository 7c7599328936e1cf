"""A newcomer's first minutes in the app (issue 38): the welcome panel, the ways out, slash commands
that are not sent to the model, the sessions screen that asks before deleting, tracebacks that show
their exception, and the status line while the model answers. Real daemon, real kernels, the fake
model server."""

from __future__ import annotations

import re
from pathlib import Path

from textual.widgets import DataTable

from agent.testing.openai_server import OpenAIServer, Reply
from daemon.client import Client
from tests.tui.test_app import SIZE, app_for, type_and_send, until
from tui.app import NewSession, PrimeApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.sessions import SessionsScreen
from tui.widgets.cell_view import CellView
from tui.widgets.file_menu import FileMenu, attach
from tui.widgets.message import AssistantMessage, Notice, UserMessage
from tui.widgets.status_bar import StatusBar
from tui.widgets.welcome import Welcome


def notices(app: PrimeApp) -> list[str]:
    return [str(n.render()) for n in app.query(Notice)]


def shown(widget) -> str:
    """What a Static shows, as plain text (a Rich renderable rendered at the app's width)."""
    from rich.console import Console

    console = Console(width=SIZE[0], record=True, file=open("/dev/null", "w"))
    console.print(widget.render()._renderable)
    return console.export_text()


async def test_the_welcome_panel_names_the_model_its_source_the_server_the_sandbox_and_the_keys(
        daemon: Client, project: Path, model_server):
    app = PrimeApp(daemon, project, new=NewSession("fake", model_server.base_url, model_source="--model"))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and len(app.query(Welcome)) == 1)
        welcome = app.query_one(Welcome)
        assert (welcome.model, welcome.source, welcome.base_url, welcome.cwd) == (
            "fake", "--model", model_server.base_url, str(project))
        assert welcome.sandbox.startswith("workspace-write")
        text = shown(welcome)
        for words in ("fake  (from --model)", model_server.base_url, "workspace-write", str(project),
                      "/help", "Ctrl-D or /exit quits", "Ctrl-C or Esc interrupts"):
            assert words in text, (words, text)
        assert app.conversation.children[0] is welcome  # the first thing on the screen


async def test_a_resumed_closed_session_says_so_and_the_sandbox_it_wakes_in(daemon: Client, project: Path,
                                                                          model_server):
    """A session another front closed (`prime-agent run`'s, one closed with `sessions close`): its
    welcome names the sandbox it wakes in (not "-") and says it was resumed, not started."""
    s = await daemon.create_session(project, model="fake", base_url=model_server.base_url)
    accepted = await daemon.send(s.id, "hello")
    await daemon.wait_turn(s.id, accepted.turn_id)
    await daemon.close_session(s.id)
    app = PrimeApp(daemon, project, session_id=s.id)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id == s.id and len(app.query(Welcome)) == 1)
        text = " ".join(shown(app.query_one(Welcome)).split())  # as one line: the panel wraps at the app's width
        for words in ("fake (from the resumed session)", "sandbox workspace-write", f"{s.id}, closed, 1 turn",
                      "wakes at your next prompt, in a new kernel"):
            assert words in text, (words, text)


async def test_ctrl_d_deletes_forward_in_a_prompt_and_quits_on_an_empty_one(daemon: Client, project: Path,
                                                                            model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        prompt = app.query_one("#prompt")
        prompt.load_text("xab")
        prompt.move_cursor((0, 0))
        await pilot.press("ctrl+d")
        assert prompt.text == "ab" and app.is_running
        prompt.clear()
        await pilot.press("ctrl+d")
        await until(pilot, lambda: app.return_value is not None)
    assert app.return_value == app.session_id
    assert (await daemon.session(app.session_id)).state == "idle"  # the session goes on


async def test_exit_and_quit_leave_the_app_and_are_never_sent(daemon: Client, project: Path, model_server):
    for word in ("/exit", "/quit"):
        app = app_for(daemon, project, model_server)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session_id is not None)
            await type_and_send(pilot, word)
            await until(pilot, lambda: app.return_value is not None)
        assert app.return_value == app.session_id
        assert (await daemon.session(app.session_id)).turns == 0
    assert model_server.requests == []


async def test_an_unknown_slash_command_is_answered_here_and_not_sent(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        await type_and_send(pilot, "/foo")
        await until(pilot, lambda: any(n.startswith("/foo: no such command") for n in notices(app)))
        app.query_one("#prompt").load_text("/mdoel")  # the menu has nothing for it: Enter sends it as typed
        await pilot.press("enter")
        await until(pilot, lambda: any("did you mean /model?" in n for n in notices(app)))
        assert (await daemon.session(app.session_id)).turns == 0 and model_server.requests == []
        assert not app.query(UserMessage)
        app.query_one("#prompt").load_text("//foo is a path I mean")  # the escape: sent with one slash
        await pilot.press("enter")
        await until(pilot, lambda: any(m.text == "echo: /foo is a path I mean" for m in app.query(AssistantMessage)))


async def test_enter_takes_the_highlighted_completion(daemon: Client, project: Path, model_server):
    """`/mo` + Enter with /model highlighted runs /model; Up moves the highlight (not the history)."""
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").sent.append("an earlier prompt")  # Down must not walk into the history
        await type_and_send(pilot, "/mo")
        await until(pilot, lambda: any(n.startswith("model: fake; /model NAME switches") for n in notices(app)))
        for key in ["/", "h", "up"]:  # /harness, /help: Up moves the highlight (round to /help), not the history
            await pilot.press(key)
        assert app.query_one("#prompt").text == "/h"
        await pilot.press("enter")
        await until(pilot, lambda: any("/interrupt" in n for n in notices(app)))  # /help ran
        assert app.query_one("#prompt").sent[-2:] == ["/model", "/help"]  # the history has what ran
        assert (await daemon.session(app.session_id)).turns == 0 and model_server.requests == []


async def test_clear_empties_the_view_and_the_session_goes_on(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("run: x = 41")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and app.query(CellView))
        await type_and_send(pilot, "/clear")
        await until(pilot, lambda: not app.query(CellView) and not app.query(UserMessage))
        assert any("cleared the view" in n for n in notices(app))
        app.query_one("#prompt").load_text("run: print(x + 1)")  # the kernel (and the context) kept x
        await pilot.press("enter")
        await until(pilot, lambda: any(m.text == "ran: 42" for m in app.query(AssistantMessage)))
        assert (await daemon.session(app.session_id)).turns == 2


async def test_an_initial_prompt_is_sent_once_the_session_is_open_with_the_config_overrides(
        daemon: Client, project: Path, model_server):
    """`prime-agent "fix the bug" --set model.action_format=text --set model.temperature=0.3`."""
    new = NewSession("fake", model_server.base_url, config={"model": {"action_format": "text", "temperature": 0.3}})
    app = PrimeApp(daemon, project, new=new, prompt="fix the bug")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: any(m.text == "echo: fix the bug" for m in app.query(AssistantMessage)))
        assert [m.text for m in app.query(UserMessage)] == ["fix the bug"]
        assert app.query_one("#prompt").sent[-1] == "fix the bug"  # Up brings it back
    (request,) = model_server.requests
    assert "tools" not in request and request["temperature"] == 0.3  # text mode: no tools offered


async def test_d_on_the_sessions_screen_asks_before_it_deletes(daemon: Client, project: Path, model_server):
    other = await daemon.create_session(project, model="fake", base_url=model_server.base_url, title="other")
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(DataTable).row_count == 2)
        table = app.screen.query_one(DataTable)
        table.move_cursor(row=table.get_row_index(other.id))
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert other.id in app.screen.question
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        assert other.id in [s.id for s in await daemon.sessions()]
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and table.row_count == 1)
        assert other.id not in [s.id for s in await daemon.sessions()]
        assert not Path(other.dir).exists()  # its files went with it


async def test_a_collapsed_traceback_shows_its_exception(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        app.query_one("#prompt").load_text("run: for i in range(12): print('line', i)\n1 / 0")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and any(c.result for c in app.query(CellView)))
        cell = app.query_one(CellView)
        collapsed = shown(cell._out).splitlines()
        assert "more lines (enter to expand)" in collapsed[-3] and "line 0" in collapsed[0]
        assert collapsed[-2] == "ZeroDivisionError: division by zero"
        cell.action_toggle()
        expanded = shown(cell._out)
        assert "line 11" in expanded and "Traceback" in expanded and "(enter to collapse)" in expanded


async def test_the_status_line_shows_the_model_at_work_and_the_context_filled(daemon: Client, project: Path):
    with OpenAIServer([Reply(content="hello", prompt_tokens=2600), Reply(hang=True)]) as server:
        server.models = [{"id": "fake", "object": "model", "max_model_len": 4000}]
        app = PrimeApp(daemon, project, new=NewSession("fake", server.base_url))
        async with app.run_test(size=SIZE) as pilot:
            status = app.query_one(StatusBar)
            await until(pilot, lambda: app.session_id is not None and status.context_window == 4000)
            app.query_one("#prompt").load_text("hi")
            await pilot.press("enter")
            await until(pilot, lambda: app.state == "idle" and status.context_used > 2600)
            line = str(status.render())
            share = f"{status.context_used / 4000:.0%}"
            assert f"ctx {status.context_used / 1000:.1f}k/4k {share}" in line, line  # past half: the share too
            app.query_one("#prompt").load_text("again")
            await pilot.press("enter")
            await until(pilot, lambda: status.model_since > 0 and " model " in str(status.render()))
            await until(pilot, lambda: re.search(r"model [1-9]\d*s", str(status.render())))
            await pilot.press("escape")
            await until(pilot, lambda: app.state == "idle")
            assert status.model_since == 0 and " model " not in str(status.render())


async def test_the_token_count_grows_during_a_long_turn_and_is_counted_once_when_it_ends(daemon: Client,
                                                                                          project: Path):
    """A weak model can loop on cells for minutes: the status line's total grows with each model call
    (it read "0 tok" until the turn ended), and the turn's end counts those calls once, not twice."""
    script = [Reply(code=["1"], prompt_tokens=100), Reply(code=["2"], prompt_tokens=200), Reply(hang=True)]
    with OpenAIServer(script) as server:
        app = PrimeApp(daemon, project, new=NewSession("fake", server.base_url))
        async with app.run_test(size=SIZE) as pilot:
            status = app.query_one(StatusBar)
            await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
            app.query_one("#prompt").load_text("loop")
            await pilot.press("enter")
            await until(pilot, lambda: len(server.requests) == 3 and status.model_since > 0)
            during = status.tokens + status.turn_tokens
            assert during >= 300 and f"{during:,} tok" in str(status.render())
            await pilot.press("escape")
            await until(pilot, lambda: app.state == "idle")
            assert (status.tokens, status.turn_tokens) == (during, 0)


async def test_an_at_mention_completes_a_path_of_the_project(daemon: Client, project: Path, model_server):
    (project / "src").mkdir()
    (project / "src" / "parser.py").write_text("x = 1\n")
    (project / "src" / "printer.py").write_text("")
    (project / "PARSING.md").write_text("")
    (project / ".git" / "parsed").write_text("")  # hidden folders are not offered
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        menu = app.query_one(FileMenu)
        for key in "look at @pars":
            await pilot.press(key if key != " " else "space")
        offered = [menu.get_option_at_index(i).id for i in range(menu.option_count)]
        assert menu.display and offered == ["PARSING.md", "src/parser.py"]  # a name that starts so, first
        await pilot.press("down", "enter")  # Enter with the menu open takes the path; it sends nothing
        assert not menu.display  # the mention is done
        assert app.query_one("#prompt").text == "look at @src/parser.py "
        for key in ["a", "n", "d", "space", "@", "p", "r", "i"]:
            await pilot.press(key)
        assert menu.display and [menu.get_option_at_index(i).id for i in range(menu.option_count)] == [
            "src/printer.py"]
        await pilot.press("tab")
        assert app.query_one("#prompt").text == "look at @src/parser.py and @src/printer.py "
        assert not menu.display and (await daemon.session(app.session_id)).turns == 0
        await pilot.press("enter")  # no menu open: Enter sends, the paths as typed and each file's content

        def sent() -> str:  # the prompt as the model got it
            asked = [r["messages"][-1]["content"] for r in model_server.requests if r["messages"][-1]["role"] == "user"]
            return asked[-1] if asked else ""

        await until(pilot, lambda: "look at @src/parser.py and @src/printer.py" in sent())
        assert "[@src/parser.py]\n```\nx = 1\n```" in sent() and "[@src/printer.py]\n```\n\n```" in sent()


def test_a_mention_sends_a_file_of_the_project_and_never_one_a_link_leads_out_to(tmp_path: Path):
    root, secret = tmp_path / "project", tmp_path / "id_rsa"
    root.mkdir()
    secret.write_text("PRIVATE KEY")
    (root / "notes.md").write_text("the plan\n")
    (root / "key").symlink_to(secret)  # links the kernel could have made
    (root / "sub").symlink_to(tmp_path)
    (root / "big.log").write_text("x" * 70_000)
    (root / "blob.bin").write_bytes(b"a\0b")
    sent = attach("see @notes.md, @key and @sub/id_rsa; @big.log @blob.bin @missing.py me@example.com", root)
    assert "PRIVATE KEY" not in sent
    assert sent.split("\n\n")[1:] == [
        "[@notes.md]\n```\nthe plan\n```", "[@key: a link, not attached]",
        "[@sub/id_rsa: not a file of the project, not attached]", "[@big.log: 70,000 bytes, not attached]",
        "[@blob.bin: binary, not attached]"]
    assert attach("no mention here", root) == "no mention here"


async def test_ctrl_r_finds_a_prompt_sent_before_and_puts_it_in_the_prompt(daemon: Client, project: Path,
                                                                          model_server):
    from tui.screens.history_search import HistorySearch

    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        app.query_one("#prompt").sent[:] = ["fix the parser bug", "run the tests", "fix the printer bug", "deploy"]
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, HistorySearch))
        for key in ["b", "u", "g"]:
            await pilot.press(key)
        assert app.screen.matches == ["fix the printer bug", "fix the parser bug"]  # newest first
        await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, HistorySearch))
        assert app.query_one("#prompt").text == "fix the parser bug" and app.query_one("#prompt").has_focus
        assert (await daemon.session(app.session_id)).turns == 0  # back in the prompt, not sent
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, HistorySearch))
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HistorySearch))
        assert app.query_one("#prompt").text == "fix the parser bug"


async def test_ctrl_c_clears_a_typed_prompt_first_and_tab_with_text_keeps_the_focus(daemon: Client, project: Path,
                                                                                  model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None)
        app.query_one("#prompt").load_text("run: print('hi')")
        await pilot.press("enter")
        await until(pilot, lambda: app.state == "idle" and app.query(CellView))
        prompt = app.query_one("#prompt")
        for key in "half a thought":
            await pilot.press(key if key != " " else "space")
        await pilot.press("tab")  # nothing to complete: the focus stays, and Enter would send the text
        assert prompt.has_focus and prompt.text == "half a thought"
        await pilot.press("ctrl+c")
        assert prompt.text == "" and app.is_running
        await pilot.press("up")  # the cleared text is in the history
        assert prompt.text == "half a thought"
        prompt.clear()
        await pilot.press("tab")  # on an empty prompt Tab moves on (to the conversation, then its cells)
        assert not prompt.has_focus


async def test_leaving_the_picker_with_no_session_says_what_to_do(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server, choose=True)  # prime-agent --resume
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await pilot.press("escape")
        await until(pilot, lambda: any(n.startswith("no session yet: what you type starts a new one here")
                                       for n in notices(app)))
        await type_and_send(pilot, "/exit")
        await until(pilot, lambda: not app.is_running)
    assert app.return_value is None
