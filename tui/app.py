"""The Prime Agent app: a terminal coding assistant whose sessions live in the daemon.

    app = PrimeApp(client, cwd, model=..., base_url=...)          # a new session here
    app = PrimeApp(client, cwd, session_id="...")                 # attach to one

The app shows one session at a time. Its events come from the daemon's stream (replayed in full
on attach, then live; the stream resumes by itself after a daemon restart). Closing the app, or
Ctrl-C twice on an idle session, detaches: the session goes on in the daemon.

One concern, a screen's worth of glue: the session it shows, the keys, and each slash command's
method (the table, the help and the goal parsing are in tui/commands.py; what is drawn, in widgets/
and screens/).
"""

from __future__ import annotations

import asyncio
import difflib
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical

from agent import events as ev
from agent.config import home
from agent.events import Event
from agent.types import Attachment
from daemon.client import Client, DaemonError
from tui.commands import COMMANDS, GoalLine
from tui.screens.history_search import HistorySearch
from tui.screens.sessions import SessionsScreen
from tui.screens.transcript import TranscriptScreen
from tui.shell import Shell
from tui.slash import SlashCommands
from tui.widgets.approval_card import ApprovalCard
from tui.widgets.plan_card import PlanCard
from tui.widgets.cell_view import SubagentRow
from tui.widgets.command_menu import CommandMenu
from tui.widgets.conversation import Conversation
from tui.widgets.figure_row import FigureRow
from tui.widgets.file_menu import FileMenu, attach
from tui.widgets.message import Notice, UserMessage
from tui.widgets.prompt_input import PromptInput
from tui.widgets.refinement_card import RefinementCard
from tui.widgets.status_bar import StatusBar
from tui.widgets.welcome import Welcome

BATCH = 10_000
"""Most events shown in one go: a history arrives in a few large batches, each one layout."""
DETACH_WINDOW = 2.0
"""Seconds within which a second Ctrl-C on an idle session detaches."""



@dataclass
class NewSession:
    """How the app makes a session: the model settings of the command line."""

    model: str | None = None
    base_url: str | None = None
    budget: dict | None = None
    sandbox: str | None = None
    config: dict | None = None
    """Config overrides for the session, nested as in config.toml (`--set KEY=VALUE`)."""
    model_source: str | None = None
    """Where the model's setting came from (`--model`, `$PRIME_AGENT_MODEL`, a config file), for the welcome."""


class PrimeApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "Prime Agent"
    BINDINGS = [
        Binding("ctrl+c", "ctrl_c", "interrupt / detach", priority=True, show=False),
        Binding("escape", "interrupt", "interrupt", show=False),
        Binding("ctrl+o", "sessions", "sessions", show=False),
        Binding("ctrl+d", "quit_app", "quit", priority=True, show=False),
        Binding("ctrl+r", "history_search", "search history", priority=True, show=False),
        Binding("up", "menu('up')", priority=True, show=False),
        Binding("down", "menu('down')", priority=True, show=False),
        Binding("pageup", "scroll('up')", show=False, priority=True),
        Binding("pagedown", "scroll('down')", show=False, priority=True),
    ]

    def __init__(self, client: Client, cwd: Path, *, new: NewSession | None = None, session_id: str | None = None,
                 choose: bool = False, prompt: str | None = None, graphics: type | None = None):
        """`graphics`: the widget that draws figures in this terminal (tui/images.py; None: rows)."""
        super().__init__()
        self.graphics = graphics
        self.client, self.cwd, self.new = client, cwd, new or NewSession()
        self.start_with, self.choose = session_id, choose
        self.initial_prompt = prompt
        """Sent as soon as the first session is attached (`prime-agent "fix the bug"`)."""
        self.created: str | None = None
        """The session this app made last (its model's source is known: the welcome says it)."""
        self.session_id: str | None = None
        self.state = "idle"
        self.running_turn: str | None = None
        self.last_ctrl_c = 0.0
        self.events_seen = 0
        self.live_after = 0
        """The session's last event when the app attached: later ones are live, earlier ones history."""
        self.goal: GoalLine | None = None
        """The session's goal as its events tell it (for the status bar); None without one."""
        self.workspace = cwd
        """The directory of the session shown (its own: a resumed one may work elsewhere)."""
        self.slash = SlashCommands(self)
        self.shell = Shell(self.say)

    def compose(self) -> ComposeResult:
        # held, not queried: the event worker may still be applying a batch while the app tears its screen down
        self.conversation = Conversation(self.cell_outputs, self.graphics, id="conversation")
        self.status_bar = StatusBar(id="status")
        self.command_menu = CommandMenu({name: c.help for name, c in COMMANDS.items()}, id="menu")
        self.file_menu = FileMenu(self.cwd, id="files")
        self.prompt_input = PromptInput(id="prompt", history_file=home() / "prompt-history.jsonl",
                                        complete=self._complete)
        yield self.conversation
        with Vertical(id="bottom"):
            yield self.command_menu
            yield self.file_menu
            yield self.prompt_input
            yield self.status_bar

    async def on_mount(self) -> None:
        self.command_menu.display = False
        self.file_menu.display = False
        self.prompt_input.focus()
        if self.start_with:
            await self.attach(self.start_with)
        elif self.choose:
            self.action_sessions()
        else:
            await self.new_session()

    # --- sessions ------------------------------------------------------------------------------

    async def new_session(self, mode: str | None = None) -> None:
        await self.leave()
        try:
            s = await self.client.create_session(self.cwd, model=self.new.model, base_url=self.new.base_url,
                                                 budget=self.new.budget, sandbox=self.new.sandbox, mode=mode,
                                                 config=self.new.config)
        except DaemonError as e:
            await self.say(f"could not start a session: {e.message}", "error")
            return
        self.created = s.id
        await self.attach(s.id)

    async def attach(self, session_id: str) -> None:
        try:
            info = await self.client.session(session_id)
        except DaemonError as e:
            await self.say(e.message, "error")
            return
        if self.session_id != session_id:
            await self.leave()
        self.session_id = session_id
        status = self.status_bar
        status.session_id, status.model, status.state = session_id, info.model, info.state
        status.tokens = status.turn_tokens = status.prompt_tokens = status.cached_tokens = 0  # the replay adds it up
        status.cost = 0.0
        status.context_used, status.model_since, status.streamed = 0, 0.0, 0
        status.harness = info.harness_version or ""
        status.sandbox = info.sandbox or ""
        self.goal = None  # the replay tells it again
        self.state = info.state
        self.sub_title = info.title or info.cwd
        self.workspace = Path(info.cwd)
        await self.conversation.clear()
        resumed = None
        if session_id != self.created:
            resumed = f"{session_id}, {info.state}, {info.turns} turn{'s' if info.turns != 1 else ''} (its history follows)"
            if info.state in ("dormant", "closed"):
                resumed += "; it wakes at your next prompt, in a new kernel: variables from before are gone"
        source = self.new.model_source if session_id == self.created else "the resumed session"
        await self.conversation.mount(Welcome(model=info.model, source=source, base_url=info.base_url,
                                              sandbox=info.sandbox, cwd=info.cwd, resumed=resumed))
        self.events_seen, self.live_after = 0, info.last_seq
        self.follow(session_id)
        if self.initial_prompt:
            prompt, self.initial_prompt = self.initial_prompt, None
            self.prompt_input.send(prompt)

    async def leave(self) -> str | None:
        """Done with the session shown (the app switches, or exits): one this app made that was never
        prompted is not kept (deleted, with its files). The session that goes on, if any."""
        left = self.session_id
        if left is None or left != self.created:
            return left
        try:
            info = await self.client.session(left)
            if info.turns or info.queued or info.state in ("running", "queued") or info.goal:
                return left
            await self.client.delete(left, files=True)
        except DaemonError:
            return left  # the daemon went away, or so did the session: nothing to tidy
        self.created = self.session_id = None
        return None

    @work(exclusive=True, group="events")
    async def follow(self, session_id: str) -> None:
        """Show the session's events: all of its history, then live ones, in batches."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue()

        async def read() -> None:
            async for event in self.client.events(session_id, reconnect=math.inf, on_connection=self._connection):
                queue.put_nowait(event)

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: queue.put_nowait(None))  # the stream ended: say why
        conversation = self.conversation
        try:
            while True:
                batch = [await queue.get()]
                while batch[-1] is not None and not queue.empty() and len(batch) < BATCH:
                    batch.append(queue.get_nowait())
                if batch[-1] is None:
                    batch.pop()
                    await conversation.apply(batch)
                    error = reader.exception() if not reader.cancelled() else None
                    if error is not None:
                        why = error.message if isinstance(error, DaemonError) else f"{type(error).__name__}: {error}"
                        await self.say(f"this session's events stopped: {why}. /sessions or /new to go on", "error")
                    return
                await conversation.apply(batch)
                for e in batch:  # after the screen shows the batch: a turn is idle once its end is on screen
                    self._track(e)
                self.events_seen += len(batch)
        finally:
            reader.cancel()

    def _connection(self, up: bool) -> None:
        self.status_bar.connected = up
        if up:
            self.clear_notifications()
            self.notify("reconnected to the daemon; the event stream goes on where it stopped")
        else:
            self.notify("lost the daemon: waiting for it (started again if it died; after `prime-agent daemon "
                        "stop`, `prime-agent daemon start` brings it back)", severity="error", timeout=10)

    def _track(self, e: Event) -> None:
        """Turn state, tokens and harness version for the status bar."""
        status = self.status_bar
        match e:
            case ev.TurnStarted():
                self.state, self.running_turn = "running", e.turn_id
            case ev.TurnQueued() if self.state == "idle":
                self.state = "queued"
            case ev.ModelStarted():
                status.model_since, status.streamed = e.ts, 0
            case ev.ModelDelta():
                status.streamed += 1
            case ev.ModelCompleted():
                status.model_since = 0.0
                status.context_used = e.usage.total_tokens or status.context_used
                status.turn_tokens += e.usage.total_tokens  # a long turn's spend shows as it grows
            case ev.TurnFinished() if e.turn_id == self.running_turn:
                self.state, self.running_turn = "idle", None
                status.model_since = 0.0
            case ev.TurnFinished() if self.state == "queued" and self.running_turn is None:
                self.state = "idle"
            case ev.HarnessReloaded():
                status.harness = e.harness_version or ""
            case ev.SessionStarted() | ev.SessionResumed():
                status.sandbox = e.sandbox or status.sandbox
                status.context_window = e.context_window or status.context_window
            case ev.SteerReturned() if e.seq > self.live_after:  # handed back now, not in the history
                prompt = self.prompt_input
                prompt.load_text("\n".join(t for t in (e.text, prompt.text) if t.strip()))
                prompt.move_cursor(prompt.document.end)
            case ev.ApprovalRequested():
                self.call_after_refresh(self._focus_approval, e.request_id)
            case ev.PlanProposed():
                self.call_after_refresh(self._focus_plan)
            case ev.GoalStarted():
                self.goal = GoalLine(e.budget.get("max_continuations"), e.budget.get("max_tokens"))
            case ev.GoalContinued() if self.goal:
                self.goal.continuation, self.goal.left = e.continuation, e.budget_left
            case ev.GoalFinished() if self.goal:
                self.goal.state = e.state
        if self.goal is not None and isinstance(e, ev.TurnFinished | ev.UsageCharged):
            self.goal.tokens += e.usage.total_tokens
        status.goal = self.goal.line() if self.goal else ""
        if isinstance(e, ev.TurnFinished):
            status.turn_tokens = 0  # counted in the turn's usage, with what else the turn spent
        if isinstance(e, ev.TurnFinished | ev.UsageCharged):  # every token spent, counted once
            status.tokens += e.usage.total_tokens
            status.prompt_tokens += e.usage.prompt_tokens
            status.cached_tokens += e.usage.cached_tokens
            status.cost += e.usage.cost
        status.state = self.state

    async def say(self, text: str, kind: str = "info") -> None:
        await self.conversation.mount(Notice(text, kind))
        self.conversation.scroll_end(animate=False)

    # --- input ---------------------------------------------------------------------------------

    @on(PromptInput.Edited)
    def follow_menu(self, event: PromptInput.Edited) -> None:
        self._filter_menus(event.text)

    def _filter_menus(self, text: str) -> None:
        self.command_menu.filter(text)
        mention = self._mention()
        self.file_menu.filter(mention[1] if mention else None)

    def _complete(self, prompt: PromptInput) -> bool:
        """Enter in the prompt: with the file menu open, the highlighted path goes in; with the command
        menu open, the highlighted command is sent, not the letters typed so far (True: done). The
        menus follow the text as the prompt has it at this key, not as the app last heard of it."""
        self._filter_menus(prompt.text)
        menu = self._open_menu()
        if isinstance(menu, FileMenu):
            self._take_file()
            return True
        if isinstance(menu, CommandMenu) and prompt.text.strip() not in COMMANDS:
            chosen, menu.display = menu.chosen(), False
            prompt.send(chosen)
            return True
        return False

    def _mention(self) -> tuple[tuple[int, int], str] | None:
        """The `@word` just before the cursor: where it starts, and the word without its @."""
        prompt = self.prompt_input
        row, col = prompt.cursor_location
        before = prompt.document.get_line(row)[:col]
        word = before.rsplit(None, 1)[-1] if before and not before[-1].isspace() else ""
        return ((row, col - len(word)), word[1:]) if word.startswith("@") else None

    def _take_file(self) -> None:
        """The highlighted file in place of the `@word` at the cursor (as `@path `)."""
        prompt, menu = self.prompt_input, self.file_menu
        mention, path = self._mention(), menu.chosen()
        menu.filter(None)
        if mention and path:
            done = prompt.replace(f"@{path} ", mention[0], prompt.cursor_location)
            prompt.move_cursor(done.end_location)

    def on_key(self, event) -> None:
        if self.screen is not self.screen_stack[0]:
            return
        menu, prompt = self.command_menu, self.prompt_input
        if prompt.has_focus and self.file_menu.display and event.key in ("tab", "escape"):
            event.stop()
            event.prevent_default()
            self._take_file() if event.key == "tab" else self.file_menu.filter(None)
            return
        if prompt.has_focus and event.key == "tab" and prompt.text.strip() and not menu.filter(prompt.text):
            event.stop()  # Tab with text typed and nothing to complete keeps the focus: Enter sends that text
            event.prevent_default()
            return
        if prompt.has_focus and menu.filter(prompt.text):  # the menu follows the text as it is now
            if event.key in ("tab", "escape"):
                event.stop()
                event.prevent_default()
            if event.key == "tab" and (chosen := menu.chosen()):
                prompt.load_text(chosen + " ")
                prompt.move_cursor(prompt.document.end)
            elif event.key == "escape":
                menu.display = False
            return
        focused = self.focused
        if event.is_printable and not prompt.has_focus and not (
            isinstance(focused, RefinementCard) and event.key in ("r", "a", "x")
            or isinstance(focused, ApprovalCard) and event.key in ("y", "a", "n")
            or isinstance(focused, PlanCard) and event.key in ("y", "n")
            or isinstance(focused, FigureRow) and event.key == "o"
        ):  # typing goes to the prompt, wherever the focus was
            event.stop()
            event.prevent_default()
            prompt.focus()
            prompt.insert(event.character or "")

    @on(PromptInput.Submitted)
    async def submit(self, event: PromptInput.Submitted) -> None:
        self.command_menu.display = False
        self.file_menu.filter(None)
        text = event.text
        word = text.split(maxsplit=1)[0]
        if word in COMMANDS:
            await self.command(text)
            return
        if re.fullmatch(r"/[A-Za-z][\w-]*", word):  # shaped like a command (a path has a second /)
            close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
            await self.say(f"{word}: no such command" + (f"; did you mean {close[0]}?" if close else ".")
                           + " /help lists them. Nothing was sent (to send text that starts with /, begin it "
                           "with //)", "error")
            return
        if text.startswith("!"):  # a command of yours, not the model's
            self.run_worker(self.shell.run(text[1:].strip(), self.workspace), group="shell")
            return
        if text.startswith("//"):
            text = text[1:]
        if self.session_id is None:  # none chosen (Esc in the chooser): the text starts a new session here
            self.initial_prompt = text
            await self.new_session()
            if self.session_id is None:  # it could not start (said why): the text goes back in the prompt
                self.initial_prompt = None
                self.prompt_input.load_text(text)
            return
        await self.send(attach(text, self.cwd))

    async def cell_outputs(self, turn_id: str, cell_id: str) -> list[Attachment]:
        return await self.client.cell_outputs(self.session_id or "", turn_id, cell_id)

    async def send(self, text: str) -> None:
        """A message to the session: a prompt, or while a turn runs a steer (steer.queued shows it);
        what your `!` commands printed since the last one goes first."""
        mode = "steer" if self.state == "running" else "prompt"
        self.conversation.scroll_end(animate=False)  # what you send, and its answer, are what you want to see
        try:
            await self.client.send(self.session_id or "", self.shell.told() + text, mode)
        except DaemonError as e:
            await self.say(f"not sent: {e.message}", "error")
            return
        self.shell.sent()

    async def command(self, text: str) -> None:
        name, _, arg = text.partition(" ")
        command = COMMANDS[name]
        if command.needs_session and self.session_id is None:
            await self.say(f"{name} needs a session: /new starts one", "error")
            return
        try:
            await getattr(self.slash, command.method)(arg.strip())
        except DaemonError as e:
            await self.say(f"{name}: {e.message}", "error")

    def goal_running(self) -> bool:
        return self.goal is not None and self.goal.state == "running"

    @on(RefinementCard.Decided)
    async def decided(self, event: RefinementCard.Decided) -> None:
        try:
            if event.action == "rollback":
                await self.slash.rollback(None, event.card)
            else:
                r = await self.client.decide_refinement(self.session_id, event.card.refinement_id, event.action == "approve")
                event.card.set_status(r.status)
        except DaemonError as e:
            await self.say(f"refinement {event.card.refinement_id}: {e.message}", "error")

    def _focus_plan(self) -> None:
        """A plan waits on the person: its card takes the keys (y, n) until it is decided."""
        card = self.conversation.plan
        if card is not None and card.status == "waiting":
            card.focus()
            card.scroll_visible()

    def _focus_approval(self, request_id: str) -> None:
        """A request waits on the user: its card takes the keys (y, a, n) until it is decided."""
        card = self.conversation.approvals.get(request_id)
        if card is not None and card.status == "waiting":
            card.focus()
            card.scroll_visible()

    @on(ApprovalCard.Decided)
    async def approval_decided(self, event: ApprovalCard.Decided) -> None:
        try:
            await self.client.decide_approval(self.session_id, event.card.request_id, event.decision)
        except DaemonError as e:
            await self.say(f"approval {event.card.request_id}: {e.message}", "error")
            return
        self.prompt_input.focus()

    @on(PlanCard.Decided)
    async def plan_decided(self, event: PlanCard.Decided) -> None:
        prompt = self.prompt_input
        note = prompt.text.strip() or None
        try:
            await self.client.decide_plan(self.session_id, event.approve, note=note)
        except DaemonError as e:
            await self.say(f"plan: {e.message}", "error")
            return
        if note:
            prompt.clear()
        prompt.focus()

    @on(SubagentRow.Open)
    async def open_child(self, event: SubagentRow.Open) -> None:
        try:
            t = await self.client.child_transcript(self.session_id, event.child_id)
        except DaemonError as e:
            await self.say(e.message, "error")
            return
        self.push_screen(TranscriptScreen(f"subagent {t.child.name}: {t.child.task[:60]}", t.records))

    # --- keys ----------------------------------------------------------------------------------

    async def action_interrupt(self) -> None:
        """Esc: stop your `!` command if one runs, else the running turn; a goal stops with it (the
        daemon ends a goal its interrupt cut)."""
        if self.shell.stop():
            return
        if self.session_id and (self.state in ("running", "queued") or self.goal_running()):
            try:
                await self.client.interrupt(self.session_id)
            except DaemonError as e:
                await self.say(f"interrupt: {e.message}", "error")
            else:
                self.notify("interrupting…")

    async def action_ctrl_c(self) -> None:
        if self.state in ("running", "queued"):
            await self.action_interrupt()
            return
        prompt = self.prompt_input
        if self.screen is self.screen_stack[0] and prompt.text.strip():  # first, what you were typing
            prompt.remember(prompt.text.strip())
            prompt.clear()
            self.notify("cleared the prompt (Up brings it back); Ctrl-C twice on an empty one detaches")
            return
        now = time.monotonic()
        if now - self.last_ctrl_c < DETACH_WINDOW:
            self.exit(self.session_id)
            return
        self.last_ctrl_c = now
        self.notify("Ctrl-C again to detach: the session stays in the daemon (prime-agent --resume)")

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        main = self.screen is self.screen_stack[0]
        if action == "scroll":  # PgUp/PgDn scroll the conversation; on other screens their widgets have them
            return main
        if action == "quit_app":  # on a prompt with text, Ctrl-D deletes forward as editors do
            return main and not self.prompt_input.text
        if action == "menu":  # only while a menu offers something for the prompt's text
            return main and self._open_menu() is not None
        if action == "history_search":
            return main
        return True

    def _open_menu(self) -> CommandMenu | FileMenu | None:
        """The menu the keys go to: files while an @ mention is typed, else slash commands."""
        if not self.prompt_input.has_focus:
            return None
        for menu in (self.file_menu, self.command_menu):
            if menu.display and menu.chosen() is not None:
                return menu
        return None

    def action_quit_app(self) -> None:
        """Ctrl-D on an empty prompt: leave the app; the session goes on in the daemon."""
        self.exit(self.session_id)

    def action_menu(self, direction: str) -> None:
        if menu := self._open_menu():
            menu.action_cursor_up() if direction == "up" else menu.action_cursor_down()

    def action_history_search(self) -> None:
        """Ctrl-R: find something you sent before; it comes back into the prompt to edit or send."""
        prompt = self.prompt_input

        def chosen(text: str | None) -> None:
            if text is not None:
                prompt.load_text(text)
                prompt.move_cursor(prompt.document.end)
            prompt.focus()

        self.push_screen(HistorySearch(prompt.sent), chosen)

    def action_scroll(self, direction: str) -> None:
        conversation = self.conversation
        conversation.scroll_page_up() if direction == "up" else conversation.scroll_page_down()

    def action_sessions(self) -> None:
        def chosen(session_id: str | None) -> None:
            if session_id == "new":
                self.run_worker(self.new_session())
            elif session_id:
                self.run_worker(self.attach(session_id))
            elif self.session_id is None:  # left the picker with nothing attached: say what now
                self.run_worker(self.say("no session yet: what you type starts a new one here; /resume chooses "
                                         "one, Ctrl-D or /exit leaves"))

        self.push_screen(SessionsScreen(self.client, self.cwd, self.session_id), chosen)
