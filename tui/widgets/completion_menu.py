"""What the prompt's menus of completions share (slash commands, `@` mentions)."""

from __future__ import annotations

from textual.widgets import OptionList
from textual.widgets.option_list import Option


class CompletionMenu(OptionList):
    """A menu of completions under the prompt: `show` fills it (hidden when there is none), the first
    highlighted; `chosen` is the highlighted one's id while it is shown."""

    def show(self, options: list[Option]) -> bool:
        self.clear_options()
        self.add_options(options)
        self.display = bool(options)
        if options:
            self.highlighted = 0
        return bool(options)

    def chosen(self) -> str | None:
        if not self.display or self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id
