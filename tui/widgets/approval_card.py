"""A request for the user's decision: a command to run outside the sandbox (what, why) or an MCP
call under policy ask, and three keys to decide it (y: once, a: always for its prefix in this
session, n: deny)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

KEYS = {"y": "approve", "a": "always", "n": "deny"}
QUESTIONS = {"command": "run outside the sandbox? ", "mcp": "call this MCP tool? "}


class ApprovalCard(Static):
    DEFAULT_CLASSES = "approval"
    can_focus = True
    BINDINGS = [Binding(key, f"decide('{decision}')", decision) for key, decision in KEYS.items()]

    @dataclass
    class Decided(Message):
        """The user approved (once or always) or denied the request."""

        card: ApprovalCard
        decision: str

    def __init__(self, request_id: str, kind: str, summary: str, reason: str, prefix: str):
        super().__init__()
        self.request_id, self.kind, self.summary, self.reason, self.prefix = request_id, kind, summary, reason, prefix
        self.status = "waiting"
        self._show()

    def set_status(self, status: str) -> None:
        self.status = status
        self._show()

    def action_decide(self, decision: str) -> None:
        if self.status == "waiting":
            self.post_message(self.Decided(self, decision))
        else:
            self.notify(f"this request is already decided ({self.status})", severity="warning")

    def _show(self) -> None:
        colour = {"waiting": "bold yellow", "deny": "bold red"}.get(self.status, "bold green")
        parts: list = [
            Text.assemble((QUESTIONS[self.kind], "bold"), (self.status, colour), f"  {self.request_id}"),
            Text(self.summary, style="bold"),
        ]
        if self.reason:
            parts.append(Text(self.reason, style="dim"))
        if self.status == "waiting":
            parts.append(Text(f"y: once · a: always `{self.prefix}` in this session · n: deny", style="dim"))
        self.update(Group(*parts))
