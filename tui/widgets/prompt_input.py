"""The multi-line prompt editor: Enter sends (or takes a menu's completion: `complete`), Ctrl+J (or
Shift+Enter) starts a new line, Up and Down on the first or last line walk through what was sent
before (kept across runs, one JSON string per line in `history_file`); a draft comes back when you
walk past the newest."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        text: str

    @dataclass
    class Edited(Message):
        """The text changed (the slash-command menu follows it)."""

        text: str

    KEPT = 500

    def __init__(self, history_file: Path | None = None, complete: Callable[[PromptInput], bool] | None = None, **kw):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kw)
        self.history_file = history_file
        self.complete = complete
        """Asked on Enter, with the text as it is at that key (keys typed before it are all in, whatever
        the app has seen of them): True when it completed the text (a menu's choice) instead of sending."""
        self.sent: list[str] = _load(history_file)[-self.KEPT:] if history_file else []
        self._browsing: int | None = None
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.complete is None or not self.complete(self):
                self.send()
            return
        if event.key in ("ctrl+j", "shift+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and self.cursor_location[0] == 0 and self.sent:
            event.stop()
            event.prevent_default()
            self._browse(-1)
            return
        if event.key == "down" and self.cursor_location[0] == self.document.line_count - 1 and self._browsing is not None:
            event.stop()
            event.prevent_default()
            self._browse(+1)
            return
        await super()._on_key(event)

    def send(self, text: str | None = None) -> None:
        """Send what the prompt holds (or `text` in its place, a completion the menu chose): it joins
        the history, the prompt empties."""
        text = (self.text if text is None else text).strip()
        if not text:
            return
        self.remember(text)
        self.clear()
        self.post_message(self.Submitted(text))

    def remember(self, text: str) -> None:
        """Put `text` at the end of the history (Up brings it back, and it is kept across runs)."""
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
            self._remember(text)
        self._browsing = None

    def _browse(self, step: int) -> None:
        if self._browsing is None:
            self._draft = self.text
        index = len(self.sent) if self._browsing is None else self._browsing
        index = max(0, min(len(self.sent), index + step))
        self._browsing = None if index == len(self.sent) else index
        self.load_text(self._draft if self._browsing is None else self.sent[index])
        self.move_cursor(self.document.end)

    def _remember(self, text: str) -> None:
        if self.history_file is None:
            return
        try:
            self.history_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.history_file, "a") as f:
                f.write(json.dumps(text) + "\n")
        except OSError:
            pass  # a read-only home loses the history, not the prompt

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self.post_message(self.Edited(self.text))


def _load(path: Path) -> list[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line
    return [t for t in out if isinstance(t, str)]
