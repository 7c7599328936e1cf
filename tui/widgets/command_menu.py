"""The menu that completes a slash command as the user types `/` (the app's table names the commands)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets.option_list import Option

from tui.widgets.completion_menu import CompletionMenu


class CommandMenu(CompletionMenu):
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
        return self.show([Option(Text.assemble((c, "bold"), "  ", self.commands[c]), id=c)
                          for c in self.commands if c.startswith(word)])
