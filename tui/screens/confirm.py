"""A yes/no question over the screen beneath: y answers yes; n or Esc, no."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (y) or False (n, Esc)."""

    BINDINGS = [
        Binding("y", "dismiss(True)", "yes"),
        Binding("n", "dismiss(False)", "no"),
        Binding("escape", "dismiss(False)", "no"),
    ]

    def __init__(self, question: str):
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(self.question, id="question")
            yield Static("y: yes · n or Esc: no", classes="keys")
