"""A refinement of the harness, shown where it happened: its summary and diff, with one key to
roll it back (applied) or to approve or reject it (waiting for review). Its text is shown with control
characters as escapes."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from agent.types import visible

DIFF_LINES = 12


class RefinementCard(Static):
    DEFAULT_CLASSES = "refinement"
    can_focus = True
    BINDINGS = [
        Binding("r", "decide('rollback')", "roll back"),
        Binding("a", "decide('approve')", "approve"),
        Binding("x", "decide('reject')", "reject"),
        Binding("enter", "toggle", "diff", show=False),
    ]

    @dataclass
    class Decided(Message):
        """The user asked to roll back, approve or reject the refinement."""

        card: RefinementCard
        action: str

    def __init__(self, refinement_id: str, status: str, summary: str, diff: str, scopes: list[str], reason: str = ""):
        super().__init__()
        self.refinement_id, self.status, self.summary = refinement_id, status, summary
        self.diff, self.scopes, self.reason = diff, scopes, reason
        self.expanded = False
        self._show()

    def set_status(self, status: str, reason: str = "") -> None:
        self.status, self.reason = status, reason
        self._show()

    def action_toggle(self) -> None:
        self.expanded = not self.expanded
        self._show()

    def action_decide(self, action: str) -> None:
        allowed = {"applied": {"rollback"}, "pending": {"approve", "reject"}}.get(self.status, set())
        if action in allowed:
            self.post_message(self.Decided(self, action))
        else:
            self.notify(f"this refinement is {self.status}: nothing to {action}", severity="warning")

    def _show(self) -> None:
        keys = {"applied": "r: roll back", "pending": "a: approve · x: reject"}.get(self.status, "")
        colour = {"applied": "green", "pending": "yellow", "rolled back": "magenta"}.get(self.status, "red")
        head = Text.assemble(("harness refinement ", "bold"), (self.status, f"bold {colour}"),
                             f"  {self.refinement_id}", ("  " + ", ".join(self.scopes), "dim"))
        parts: list = [head, Text(visible(self.summary))]
        if self.reason:
            parts.append(Text(visible(self.reason), style="dim"))
        lines = visible(self.diff).splitlines()
        if lines:
            shown = lines if self.expanded else lines[:DIFF_LINES]
            parts.append(Syntax("\n".join(shown), "diff", theme="ansi_dark", background_color="default"))
            if len(lines) > DIFF_LINES:
                parts.append(Text(f"… {len(lines) - DIFF_LINES} more lines (enter)" if not self.expanded
                                  else "(enter to fold)", style="dim italic"))
        if keys:
            parts.append(Text(keys, style="dim"))
        self.update(Group(*parts))
