"""Slash commands, and the menu that completes them as the user types `/`."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

COMMANDS = {
    "/new": "start a new session here",
    "/resume": "[ID] attach to a session (without ID: choose one)",
    "/sessions": "sessions in this project: attach, delete",
    "/model": "[NAME] show or switch the model (from the next turn)",
    "/refine": "[instructions] refine the harness from this session",
    "/harness": "browse the harness: notes, memories, skills, subagents",
    "/rollback": "[ID] roll back a refinement (default: the last applied)",
    "/compact": "summarise older context at the next model call",
    "/interrupt": "stop the running turn",
    "/help": "commands and keys",
}


class CommandMenu(OptionList):
    """Shown while the prompt is a partial slash command; Tab takes the highlighted one."""

    def filter(self, text: str) -> bool:
        """Show the commands `text` could become; False (and hidden) when it is not a command prefix."""
        word = text.split(" ", 1)[0]
        if not text.startswith("/") or " " in text or "\n" in text:
            self.display = False
            return False
        matches = [c for c in COMMANDS if c.startswith(word)]
        self.clear_options()
        self.add_options([Option(Text.assemble((c, "bold"), "  ", COMMANDS[c]), id=c) for c in matches])
        self.display = bool(matches)
        if matches:
            self.highlighted = 0
        return bool(matches)

    def chosen(self) -> str | None:
        if not self.display or self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id
