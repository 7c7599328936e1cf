"""A request for the user's decision: a command to run in a sandbox with more room (what, why, where it
runs, and what the person must know first: a `.git` the agent made, control characters, no sandbox) or
an MCP call under policy ask, and three keys to decide it (y: once, a: always for what the card says
in this session, where it is offered, n: deny). Its text is shown with control characters as escapes."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from agent.types import visible

KEYS = {"y": "approve", "a": "always", "n": "deny"}
QUESTIONS = {"command": "run this command? ", "mcp": "call this MCP tool? ",
             "cell": "run this cell? (your PreToolUse hook asks) "}


class ApprovalCard(Static):
    DEFAULT_CLASSES = "approval"
    can_focus = True
    BINDINGS = [Binding(key, f"decide('{decision}')", decision) for key, decision in KEYS.items()]

    @dataclass
    class Decided(Message):
        """The user approved (once or always) or denied the request."""

        card: ApprovalCard
        decision: str

    def __init__(self, request_id: str, kind: str, summary: str, reason: str, prefix: str | None,
                 notes: list[str] | None = None, runs_in: str = ""):
        super().__init__()
        self.request_id, self.kind, self.summary, self.reason, self.prefix = request_id, kind, summary, reason, prefix
        self.notes, self.runs_in = notes or [], runs_in
        self.status = "waiting"
        self._show()

    def set_status(self, status: str) -> None:
        self.status = status
        self._show()

    def action_decide(self, decision: str) -> None:
        if decision == "always" and self.prefix is None:
            self.notify("`always` is not offered for this command: approve it once (y) or deny it (n)",
                        severity="warning")
        elif self.status == "waiting":
            self.post_message(self.Decided(self, decision))
        else:
            self.notify(f"this request is already decided ({self.status})", severity="warning")

    def _show(self) -> None:
        colour = {"waiting": "bold yellow", "deny": "bold red"}.get(self.status, "bold green")
        parts: list = [
            Text.assemble((QUESTIONS[self.kind], "bold"), (self.status, colour), f"  {self.request_id}"),
            Text(visible(self.summary), style="bold"),
        ]
        if self.reason:
            parts.append(Text(visible(self.reason), style="dim"))
        if self.runs_in:
            parts.append(Text(f"runs {visible(self.runs_in)}", style="dim"))
        parts += [Text(f"warning: {visible(note)}", style="bold red") for note in self.notes]
        if self.status == "waiting":
            always = f"a: always `{visible(self.prefix)}` in this session" if self.prefix else "no always for this command"
            parts.append(Text(f"y: once · {always} · n: deny", style="dim"))
        self.update(Group(*parts))
