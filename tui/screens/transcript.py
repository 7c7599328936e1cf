"""A subagent's transcript, read-only."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static


class TranscriptScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "back")]

    def __init__(self, title: str, records: list[dict]):
        super().__init__()
        self.title_text, self.records = title, records

    def compose(self) -> ComposeResult:
        yield Static(self.title_text, classes="title")
        with VerticalScroll():
            for r in self.records:
                if r["kind"] == "message" and r["message"]["role"] != "system":
                    m = r["message"]
                    body = m["content"] + "".join(f"\n[code] {c['arguments']}" for c in m.get("tool_calls") or [])
                    yield Static(Text.assemble((f"{m['role']}: ", "bold"), body[:4000]))
                elif r["kind"] == "turn_finished":
                    yield Static(Text(f"turn {r['outcome']}: {r.get('answer') or r.get('error') or ''}", style="dim"))
        yield Footer()
