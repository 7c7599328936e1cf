"""What the prompt's menus of completions share (slash commands, `@` mentions)."""

from __future__ import annotations

from textual.widgets import OptionList
from textual.widgets.option_list import Option


class CompletionMenu(OptionList):
    """A menu of completions under the prompt: `show` fills it (hidden when there is none), the one
    highlighted before still highlighted if it is offered again, else the first; `chosen` is the
    highlighted one's id while it is shown."""

    def show(self, options: list[Option]) -> bool:
        before = self.chosen()
        self.clear_options()
        self.add_options(options)
        self.display = bool(options)
        if options:
            ids = [o.id for o in options]
            self.highlighted = ids.index(before) if before in ids else 0
        return bool(options)

    def chosen(self) -> str | None:
        if not self.display or self.highlighted is None:
            return None
        return self.get_option_at_index(self.highlighted).id
