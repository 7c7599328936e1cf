"""The files a cell changed, under the cell: a line per file (one line in all for one file) and its
coloured diff, collapsed past a few lines; Enter (or a click) expands and collapses it."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widgets import Static

from agent.types import FilesChanged
from tui.widgets.scrolling import hold_view

COLLAPSED_LINES = 8
"""Diff lines shown while collapsed (each file's headline is always shown)."""
STYLES = {"hunk": "cyan", "added": "green", "removed": "red", "context": "", "cut": "dim italic"}


class FilesRow(Static):
    can_focus = True
    BINDINGS = [Binding("enter", "toggle", "expand/collapse", show=False)]

    def __init__(self, files: FilesChanged):
        super().__init__(classes="files")
        self.files = files
        self.expanded = False
        self._show()

    @property
    def diff_lines(self) -> int:
        return sum(len(f.lines()) for f in self.files.files)

    def action_toggle(self) -> None:
        hold_view(self)
        self.expanded = not self.expanded
        self._show()
        if self.expanded:  # the lines it opened are what the person wants to read
            self.call_after_refresh(self.scroll_visible, animate=False)

    def on_click(self, event: events.Click) -> None:
        event.stop()  # not a click on the cell around it
        self.action_toggle()

    def _show(self) -> None:
        only = self.files.files[0] if len(self.files.files) == 1 and not self.files.more else None
        text = Text.assemble("└─ ", (only.headline() if only else self.files.summary(), "bold"))
        left = None if self.expanded else COLLAPSED_LINES
        for f in self.files.files:
            if only is None:
                text.append("\n   " + f.headline(), style="bold")
            for kind, line in f.lines():
                if left is not None and left <= 0:
                    break
                text.append("\n   " + line, style=STYLES[kind])
                left = None if left is None else left - 1
        if self.files.more:
            text.append(f"\n   ... and {self.files.more:,} more files", style="dim")
        hidden = self.diff_lines - COLLAPSED_LINES
        if hidden > 0:
            text.append(f"\n   … {hidden} more lines (enter to expand)" if not self.expanded else
                        "\n   (enter to collapse)", style="dim italic")
        self.update(text)
