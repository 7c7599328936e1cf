"""Ctrl-R: search what you sent before (newest first); Enter puts the chosen one in the prompt to
edit or send, Esc goes back."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

SHOWN = 50


class HistorySearch(ModalScreen[str | None]):
    """Dismisses with the chosen prompt, or None."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "back"),
        Binding("up", "move(-1)", priority=True, show=False),
        Binding("down", "move(1)", priority=True, show=False),
        Binding("ctrl+r", "move(1)", priority=True, show=False),  # again: the next older match, as a shell does
    ]

    def __init__(self, history: list[str]):
        super().__init__()
        seen: set[str] = set()
        self.history = [t for t in reversed(history) if not (t in seen or seen.add(t))]
        """What was sent, newest first, each once."""

    def compose(self) -> ComposeResult:
        with Vertical(id="history"):
            yield Static("Search what you sent  (Enter: into the prompt · Esc: back)", classes="title")
            yield Input(placeholder="type to search", id="query")
            yield OptionList(id="matches")

    def on_mount(self) -> None:
        self.fill("")
        self.query_one(Input).focus()

    @on(Input.Changed)
    def changed(self, event: Input.Changed) -> None:
        self.fill(event.value)

    def fill(self, query: str) -> None:
        q = query.lower()
        matches = [t for t in self.history if q in t.lower()][:SHOWN]
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options([Option(_one_line(t), id=str(i)) for i, t in enumerate(matches)])
        self.matches = matches
        if matches:
            options.highlighted = 0

    def action_move(self, step: int) -> None:
        options = self.query_one(OptionList)
        options.action_cursor_down() if step > 0 else options.action_cursor_up()

    @on(Input.Submitted)
    def submitted(self) -> None:
        index = self.query_one(OptionList).highlighted
        self.dismiss(self.matches[index] if index is not None and self.matches else None)

    @on(OptionList.OptionSelected)
    def selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.matches[event.option_index])


def _one_line(text: str) -> str:
    first, *more = text.splitlines() or [""]
    return first[:200] + (" …" if more or len(first) > 200 else "")
