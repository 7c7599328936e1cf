"""One code cell: its code highlighted, its output (collapsed past a few lines), errors, run time,
and under it the subagents it spawned and the MCP tools it called."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.markdown import Markdown
from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

from agent import events as ev
from agent.types import CellResult
from tui.widgets.scrolling import hold_view

COLLAPSED_LINES = 8


class CellView(Vertical):
    """Enter (or a click) expands and collapses a long output."""

    DEFAULT_CLASSES = "cell"
    can_focus = True
    BINDINGS = [Binding("enter", "toggle", "expand/collapse", show=False)]

    def __init__(self, cell_id: str, code: str):
        super().__init__()
        self.cell_id, self.code = cell_id, code
        self.output: list[tuple[str, str]] = []
        self.result: CellResult | None = None
        self.never_finished: str | None = None
        """Why the cell has no result: the turn ended under it (a daemon that died, a closed session)."""
        self.expanded = False
        self._code = Static(Syntax(code, "python", theme="ansi_dark", background_color="default", word_wrap=True),
                            classes="code")
        self._out = Static(classes="output")
        self.rows: list[Widget] = []
        """Under the cell: a row per subagent it spawned, per MCP call it made, per figure it showed."""

    def compose(self):
        yield self._code
        yield self._out
        yield from self.rows  # rows added before the cell was on screen

    def on_mount(self) -> None:
        self._render_output()

    def add_output(self, stream: str, text: str) -> None:
        self.output.append((stream, text))
        if self.is_mounted:
            self._render_output()

    def finish(self, result: CellResult) -> None:
        self.result = result
        if self.is_mounted:
            self._render_output()

    def abandon(self, why: str) -> None:
        self.never_finished = why
        self.finish(CellResult(kernel_message=f"the cell never finished: {why}"))

    async def add_row(self, row: Widget) -> None:
        self.rows.append(row)
        if self.is_mounted:
            await self.mount(row)

    def action_toggle(self) -> None:
        hold_view(self)
        self.expanded = not self.expanded
        self._render_output()

    def on_click(self) -> None:
        self.action_toggle()

    def _render_output(self) -> None:
        text = Text()
        for stream, chunk in self.output:
            text.append(chunk, style="red" if stream == "stderr" else "")
        r = self.result
        if r is not None:
            if r.result is not None:
                text.append(r.result + "\n")
            if r.traceback:
                text.append(r.traceback.rstrip("\n") + "\n", style="red")
            elif r.error_name:
                text.append(f"{r.error_name}: {r.error_value}\n", style="red")
        lines = text.split("\n", allow_blank=True)
        if lines and not lines[-1].plain:
            lines = lines[:-1]
        hidden = len(lines) - COLLAPSED_LINES
        running = r is None
        # A failed cell keeps its last line (the exception) in sight when collapsed: it says what went wrong.
        last = lines[-1] if hidden > 0 and r is not None and not self.expanded and r.error_name else None
        if hidden > 0 and not self.expanded:  # running: the latest lines (progress); done: the first
            lines = lines[-COLLAPSED_LINES:] if running else lines[:COLLAPSED_LINES - (last is not None)]
        parts: list = []
        if hidden > 0 and running and not self.expanded:
            parts.append(Text(f"… {hidden} earlier lines", style="dim italic"))
        if lines:
            parts.append(Text("\n").join(lines))
        if hidden > 0 and not running:
            parts.append(Text(f"… {hidden} more lines (enter to expand)" if not self.expanded
                              else "(enter to collapse)", style="dim italic"))
        if last is not None:
            parts.append(last)
        if r is not None:
            parts += [Markdown(a.data) for a in r.attachments if a.is_text]  # a table (a DataFrame) or Markdown
            if r.kernel_message:
                parts.append(Text("kernel: " + r.kernel_message, style="yellow"))
            cut = sum(r.truncated.values())
            if self.never_finished is None:
                parts.append(Text(f"{r.duration:.2f}s" + (f" · {cut:,} characters cut" if cut else ""), style="dim"))
        else:
            parts.append(Text("running…", style="dim italic"))
        self._out.update(Group(*parts))
        self.set_class(r is not None and not r.ok, "failed")


class SubagentRow(Static):
    """A child agent under the cell that spawned it; Enter opens its transcript."""

    can_focus = True
    BINDINGS = [Binding("enter", "open", "open transcript", show=False)]

    @dataclass
    class Open(Message):
        child_id: str

    def __init__(self, child_id: str, name: str):
        super().__init__(classes="subagent")
        self.child_id, self.name_, self.status = child_id, name, "running"
        self._show()

    def finished(self, outcome: str, answer: str | None) -> None:
        self.status = outcome
        self.answer = answer
        self._show()

    def _show(self) -> None:
        colour = {"running": "yellow", "completed": "green"}.get(self.status, "red")
        self.update(Text.assemble("└─ subagent ", (self.name_, "bold"), " ", (self.status, colour),
                                  ("  (enter: transcript)", "dim")))

    def action_open(self) -> None:
        self.post_message(self.Open(self.child_id))

    def on_click(self, event: events.Click) -> None:
        event.stop()  # not a click on the cell around it
        self.action_open()


class McpRow(Static):
    """An MCP tool call (or resource read) under the cell that made it, and how it went."""

    def __init__(self, e: ev.McpCalled):
        super().__init__(classes="mcp")
        args = ", ".join(f"{k}={v!r}" for k, v in e.arguments.items())
        call = f"{e.server}.{e.tool}({args if len(args) <= 80 else args[:79] + '…'})"
        colour = {"ok": "green", "cancelled": "yellow"}.get(e.outcome, "red")
        why = (e.error or "").strip().splitlines()[:1]
        self.update(Text.assemble("└─ mcp ", (call, "bold"), " ", (e.outcome, colour),
                                  *((f": {why[0][:120]}", "dim"),) if why else ()))
