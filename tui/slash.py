"""What each slash command does: one method each, given the text after the command's name (the table
in tui/commands.py names them), with the narrow face of the app they need (`App`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from agent.notebook import NotebookError, read_notebook
from agent.prompt import render
from daemon.client import Client
from tui.commands import COMMANDS, KEYS, GoalLine, parse_goal
from tui.screens.harness import HarnessScreen
from tui.screens.rewind import RewindScreen
from tui.widgets.conversation import Conversation
from tui.widgets.files_row import FilesRow
from tui.widgets.refinement_card import RefinementCard
from tui.widgets.status_bar import StatusBar


class App(Protocol):
    """What the commands need of the app (tui.app.PrimeApp)."""

    client: Client
    session_id: str | None
    workspace: Path
    state: str
    goal: GoalLine | None
    status_bar: StatusBar
    conversation: Conversation

    async def say(self, text: str, kind: str = "info") -> None: ...
    async def new_session(self, mode: str | None = None) -> None: ...
    async def attach(self, session_id: str) -> None: ...
    async def send(self, text: str) -> None: ...
    def action_sessions(self) -> None: ...
    async def action_interrupt(self) -> None: ...
    def push_screen(self, screen: Any) -> Any: ...
    def exit(self, result: Any = None) -> None: ...


class SlashCommands:
    def __init__(self, app: App):
        self.app = app

    async def new_command(self, arg: str) -> None:
        await self.app.new_session()

    async def plan_command(self, arg: str) -> None:
        """Plan mode for this session from its next turn (between turns; its kernel restarts), or a new
        session in plan mode if there is none; `arg`, if given, is the next prompt."""
        app = self.app
        if app.session_id is None:
            await app.new_session(mode="plan")
        elif (await app.client.session(app.session_id)).planning:
            await app.say("this session is in plan mode already")
        else:
            await app.client.update(app.session_id, plan=True)  # the daemon's note says so
        if arg and app.session_id:
            await app.client.send(app.session_id, arg)

    async def resume_command(self, arg: str) -> None:
        if arg:
            await self.app.attach(arg)
        else:
            self.app.action_sessions()

    async def sessions_command(self, arg: str) -> None:
        self.app.action_sessions()

    async def model_command(self, arg: str) -> None:
        """`/model NAME` switches from the next turn; `/model` says which, and what the server offers."""
        app = self.app
        if arg and app.session_id:
            info = await app.client.update(app.session_id, model=arg)
            app.status_bar.model = info.model
            await app.say(f"model: {info.model} (from the next turn)")
            return
        offered = ""
        if app.session_id:
            try:
                names = await app.client.server_models(app.session_id)
                offered = "\nthe server offers: " + (", ".join(names) if names else "(no models listed)")
            except Exception as e:  # noqa: BLE001 - a server that cannot list them is said, not fatal
                offered = f"\n(the server's models could not be listed: {getattr(e, 'message', e)})"
        await app.say(f"model: {app.status_bar.model}; /model NAME switches" + offered)

    async def refine_command(self, arg: str) -> None:
        app = self.app
        await app.say((await app.client.refine(app.session_id or "", instructions=arg or None)).message)

    async def harness_command(self, arg: str) -> None:
        self.app.push_screen(HarnessScreen(self.app.client, self.app.session_id))

    async def rollback_command(self, arg: str) -> None:
        await self.rollback(arg or None)

    async def rewind_command(self, arg: str) -> None:
        if self.app.state in ("running", "queued"):
            await self.app.say("/rewind: a turn is running; interrupt it (Esc) or wait", "error")
            return
        self.app.push_screen(RewindScreen(self.app.client, self.app.session_id))

    async def compact_command(self, arg: str) -> None:
        await self.app.say((await self.app.client.compact(self.app.session_id or "")).message)

    async def reprompt_command(self, arg: str) -> None:
        await self.app.say((await self.app.client.rebuild_prompt(self.app.session_id or "")).message)

    async def interrupt_command(self, arg: str) -> None:
        await self.app.action_interrupt()

    async def goal_command(self, arg: str) -> None:
        await self.start_goal(arg, autonomous=False)

    async def autonomous_command(self, arg: str) -> None:
        await self.start_goal(arg, autonomous=True)

    async def start_goal(self, arg: str, autonomous: bool) -> None:
        name = "/autonomous" if autonomous else "/goal"
        try:
            text, check, budget = parse_goal(arg, autonomous)
        except ValueError as e:
            await self.app.say(f"{name}: {e}", "error")
            return
        g = await self.app.client.start_goal(self.app.session_id or "", text, check=check, budget=budget)
        await self.app.say(f"{name} {g.id} started: Esc stops it; the status bar shows its progress")

    async def mcp_command(self, arg: str) -> None:
        servers = await self.app.client.mcp(self.app.session_id or "", start=True)
        if not servers:
            await self.app.say("no MCP servers configured (prime-agent mcp add NAME -- COMMAND ARGS..., "
                               "or the project's .mcp.json)")
            return
        await self.app.say("\n".join(line for s in servers for line in s.lines()))

    async def cost_command(self, arg: str) -> None:
        """The session's spend, every model call counted (compaction, refinement, subagents too)."""
        info = await self.app.client.session(self.app.session_id or "")
        u = info.usage
        cost = f"${u.cost:.4f}" if u.cost else "$0 (no price known: model.prices, or a server that reports cost)"
        await self.app.say(f"cost: {cost}\ntokens: {u.prompt_tokens:,} in ({u.cached_tokens:,} from the prompt "
                           f"cache), {u.completion_tokens:,} out ({u.reasoning_tokens:,} reasoning)\n"
                           f"turns: {info.turns}")

    async def status_command(self, arg: str) -> None:
        """The session, the model and server, the sandbox, the context, the harness and the daemon."""
        app = self.app
        info, daemon = await app.client.session(app.session_id or ""), await app.client.status()
        bar = app.status_bar
        context = f"{bar.context_used:,} of {bar.context_window:,} tokens" if bar.context_window else "not known yet"
        mode = "plan mode (read-only until you approve a plan)" if info.planning else (info.sandbox or "-")
        await app.say("\n".join([
            f"daemon    prime-agent {daemon.version}, pid {daemon.pid}, up {daemon.uptime / 60:.0f} min, "
            f"{daemon.live_sessions} of {daemon.sessions} sessions live",
            f"session   {info.id} ({info.state}, {info.turns} turns): {info.title or '(untitled)'}",
            f"cwd       {info.cwd}",
            f"model     {info.model} at {info.base_url or 'OpenAI'}",
            f"sandbox   {mode}",
            f"context   {context}",
            f"harness   {info.harness_version or '-'}",
            f"spent     {info.usage.describe()}",
        ]))

    async def diff_command(self, arg: str) -> None:
        """What changed in the workspace since the session began (its first checkpoint), file by file."""
        app = self.app
        files = await app.client.diff(app.session_id or "")
        if files is None:
            await app.say("no changes in the workspace since this session began")
            return
        await app.say(f"since this session began: {files.summary()}")
        await app.conversation.mount(FilesRow(files))  # Enter on it expands it
        app.conversation.scroll_end(animate=False)

    async def init_command(self, arg: str) -> None:
        """Ask the agent to write AGENTS.md for this project (or improve the one there)."""
        app = self.app
        exists = (app.workspace / "AGENTS.md").is_file()
        await app.send(render("init", task="improve the AGENTS.md there" if exists else "write an AGENTS.md",
                              notes=arg or "(none)"))
        await app.say("AGENTS.md is the project's instructions for every session here, once you trust it: "
                      "prime-agent trust, after reading what the agent wrote")

    async def load_command(self, arg: str) -> None:
        """Run a notebook's code cells in this session's kernel, as a turn of their own (agent/notebook.py):
        each goes through the hooks, approvals and sandbox the agent's cells do; the model is told what
        ran, and builds on what they left."""
        app = self.app
        if not arg:
            await app.say("/load FILE.ipynb: the notebook whose code cells to run in this session's kernel", "error")
            return
        path = Path(arg).expanduser()
        try:
            notebook = await asyncio.to_thread(read_notebook, path if path.is_absolute() else app.workspace / path, arg)
        except NotebookError as e:
            await app.say(f"/load: {e}", "error")
            return
        if app.session_id is None:
            await app.new_session()
        await app.client.send(app.session_id or "", notebook.prompt(), notebook=notebook)

    async def exit_command(self, arg: str) -> None:
        self.app.exit(self.app.session_id)

    async def clear_command(self, arg: str) -> None:
        """Empties the view; the session, its context and its kernel go on."""
        await self.app.conversation.clear()
        await self.app.say("cleared the view; the session goes on, with its context (/new starts afresh)")

    async def help_command(self, arg: str) -> None:
        await self.app.say("\n".join([*KEYS, *(f"{name:<11} {c.help}" for name, c in COMMANDS.items())]))

    async def rollback(self, refinement_id: str | None, card: RefinementCard | None = None) -> None:
        app = self.app
        cards = app.conversation.cards
        if card is None:
            applied = [c for c in cards.values() if c.status == "applied"]
            card = cards.get(refinement_id) if refinement_id else (applied[-1] if applied else None)
        if card is None:
            await app.say(f"no applied refinement {refinement_id or ''}".rstrip() + " in this session to roll back",
                          "error")
            return
        if card.status == "rolled back":
            await app.say(f"{card.refinement_id} is rolled back already", "error")
            return
        for scope in card.scopes or ["project"]:
            r = await app.client.rollback(card.refinement_id, scope=scope, session=app.session_id)
            await app.say(f"rolled back {card.refinement_id} in the {scope} scope ({r.refinement_id}); "
                          "in force from the next turn")
        card.set_status("rolled back")
