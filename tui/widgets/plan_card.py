"""Plan mode: the plan the model proposed, for a person to decide (y: approve, and the same session
goes on with the workspace writable; n: reject, with what is typed in the prompt as the note), shown
with control characters as escapes."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.markdown import Markdown
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Static

from agent.types import visible


class PlanCard(Static):
    DEFAULT_CLASSES = "approval"
    can_focus = True
    BINDINGS = [Binding("y", "decide(True)", "approve"), Binding("n", "decide(False)", "reject")]

    @dataclass
    class Decided(Message):
        """The person approved the plan or rejected it."""

        card: PlanCard
        approve: bool

    def __init__(self, plan: str):
        super().__init__()
        self.plan, self.status = plan, "waiting"
        self._show()

    def set_status(self, status: str) -> None:
        self.status = status
        self._show()

    def action_decide(self, approve: bool) -> None:
        if self.status == "waiting":
            self.post_message(self.Decided(self, approve))
        else:
            self.notify(f"this plan is already decided ({self.status})", severity="warning")

    def _show(self) -> None:
        colour = {"waiting": "bold yellow", "rejected": "bold red"}.get(self.status, "bold green")
        parts: list = [Text.assemble(("plan: ", "bold"), (self.status, colour)), Markdown(visible(self.plan))]
        if self.status == "waiting":
            parts.append(Text("y: approve (the workspace becomes writable) · n: reject, with the text in the prompt "
                              "as your note", style="dim"))
        self.update(Group(*parts))
