"""Conversation entries that are text: the user's prompts, the assistant's words, notices."""

from __future__ import annotations

from rich.console import Group
from rich.markdown import Markdown as RichMarkdown
from rich.text import Text
from textual.widgets import Static


class UserMessage(Static):
    """A prompt (or a steer) as the user sent it; `queued` until its turn begins (a steer: until a
    model call takes it), or `returned()`: never sent, handed back."""

    DEFAULT_CLASSES = "user"

    def __init__(self, text: str, label: str = "you", queued: bool = False):
        super().__init__()
        self.text, self.label = text, label
        self.set_class(queued, "queued")
        self._show(" (queued)" if queued else "")

    def started(self) -> None:
        self.remove_class("queued")
        self._show("")

    def returned(self) -> None:
        self._show(" (not sent: back in your prompt)")

    def _show(self, state: str) -> None:
        head = Text(f"{self.label}{state} ", style="bold")
        self.update(head + Text(self.text))


class AssistantMessage(Static):
    """The model's words, rendered as Markdown, growing as they stream in, after its reasoning
    (dimmed) when it gives any. One widget (Rich's Markdown), not Textual's block-per-paragraph
    Markdown: a long history mounts in a fraction."""

    DEFAULT_CLASSES = "assistant"

    def __init__(self, text: str = "", reasoning: str = ""):
        super().__init__()
        self.text, self.reasoning = text, reasoning
        self._due = False

    def on_mount(self) -> None:
        self._show()

    async def feed(self, fragment: str, reasoning: bool = False) -> None:
        if reasoning:
            self.reasoning += fragment
        else:
            self.text += fragment
        self._redraw()

    async def finish(self, text: str, reasoning: str | None = None) -> None:
        """The whole message, as the model completed it."""
        if text != self.text or (reasoning or "") != self.reasoning:
            self.text, self.reasoning = text, reasoning or ""
            self._redraw()

    def _redraw(self) -> None:
        """Once per refresh however many fragments came: parsing Markdown per fragment is quadratic."""
        if self.is_mounted and not self._due:
            self._due = True
            self.call_after_refresh(self._show)

    def _show(self) -> None:
        self._due = False
        text = RichMarkdown(self.text)
        self.update(Group(Text(self.reasoning.strip(), style="dim italic"), text) if self.reasoning.strip() else text)


class Notice(Static):
    """A line about the session rather than from it: errors, notes, retries, compactions."""

    DEFAULT_CLASSES = "notice"

    def __init__(self, text: str, kind: str = "info"):
        super().__init__(Text(text))
        self.add_class(kind)
