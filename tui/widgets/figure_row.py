"""A figure a cell displayed, under the cell: drawn with the terminal's graphics where it has them
(the app is handed textual-image's widget for them: tui/images.py), and a row saying what it is;
`o` (or Enter, or a click) opens it with the system's viewer, or saves it and says where."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from tui.images import Figure

HEIGHT = 16
"""Rows a drawn figure takes (its width follows its aspect)."""


class FigureRow(Vertical):
    can_focus = True
    BINDINGS = [Binding("o", "open", "open image", show=False), Binding("enter", "open", show=False)]

    def __init__(self, figure: Figure, name: str, graphics: type | None = None):
        """`name`: what a saved copy is called; `graphics`: the widget that draws images in this
        terminal (None: the row alone)."""
        super().__init__(classes="figure")
        self.figure, self.name_ = figure, name
        self.image = figure.pil() if graphics is not None else None
        self.drawn = self.image is not None
        self.graphics = graphics
        self.row = Static(self._line(""), classes="figure-row")

    def compose(self):
        if self.graphics is not None and self.image is not None:
            picture = self.graphics(self.image)
            picture.styles.height, picture.styles.width = HEIGHT, "auto"
            yield picture
        yield self.row

    def _line(self, said: str) -> Text:
        return Text.assemble("└─ ", (self.figure.describe(), "bold"), (" — o opens it", "dim"),
                             *(((f"  {said}", "italic"),) if said else ()))

    def action_open(self) -> None:
        try:
            said = self.figure.open(self.name_)
        except OSError as e:
            said = f"could not be saved: {e.strerror or e}"
        self.row.update(self._line(said))

    def on_click(self, event: events.Click) -> None:
        event.stop()  # not a click on the cell around it
        self.action_open()
