"""A subagent's transcript, read-only."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from agent.context import message_text
from agent.trajectory import MessageRecord, Record, TurnFinishedRecord


class TranscriptScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "back")]

    def __init__(self, title: str, records: list[Record]):
        super().__init__()
        self.title_text, self.records = title, records

    def compose(self) -> ComposeResult:
        yield Static(self.title_text, classes="title")
        with VerticalScroll():
            for r in self.records:
                if isinstance(r, MessageRecord) and r.message.role != "system":
                    role, _, body = message_text(r.message, limit=4000).partition(" ")
                    yield Static(Text.assemble((role + " ", "bold"), body))
                elif isinstance(r, TurnFinishedRecord):
                    yield Static(Text(f"turn {r.outcome}: {r.answer or r.error or ''}", style="dim"))
        yield Footer()
