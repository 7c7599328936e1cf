"""The menu that completes a slash command as the user types `/` (the app's table names the commands)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option


class CommandMenu(OptionList):
    """Shown while the prompt is a partial slash command; Tab takes the highlighted one."""

    def __init__(self, commands: dict[str, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.commands = commands
        """Each command's name and its line of help, in the order shown."""

    def filter(self, text: str) -> bool:
        """Show the commands `text` could become; False (and hidden) when it is not a command prefix."""
        word = text.split(" ", 1)[0]
        if not text.startswith("/") or " " in text or "\n" in text:
            self.display = False
            return False
        matches = [c for c in self.commands if c.startswith(word)]
        self.clear_options()
        self.add_options([Option(Text.assemble((c, "bold"), "  ", self.commands[c]), id=c) for c in matches])
        self.display = bool(matches)
        if matches:
            self.highlighted = 0
        return bool(matches)

    def chosen(self) -> str | None:
        if not self.display or self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id
