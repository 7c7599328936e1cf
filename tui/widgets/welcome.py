"""The panel the app opens with: what the session runs on (model and where that setting came
from, server, sandbox, directory) and the keys a newcomer needs first."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

KEYS = Text.assemble(("/help", "bold"), " commands and keys · ", ("Ctrl-D", "bold"), " or ", ("/exit", "bold"),
                     " quits (the session goes on) · ", ("Ctrl-C", "bold"), " or ", ("Esc", "bold"),
                     " interrupts the agent")
"""The three keys that matter, on the panel's last line."""


class Welcome(Static):
    def __init__(self, *, model: str, source: str | None, base_url: str | None, sandbox: str | None, cwd: str,
                 resumed: str | None = None):
        """`resumed`: a line on the resumed session (its state, and what waking it means)."""
        super().__init__()
        self.model, self.source, self.base_url, self.sandbox, self.cwd = model, source, base_url, sandbox, cwd
        self.resumed = resumed
        self.update(self.panel())

    def panel(self) -> Table:
        rows = Table.grid(padding=(0, 2))
        rows.add_column(style="dim")
        rows.add_column()
        rows.add_row("model", Text.assemble((self.model or "-", "bold"),
                                            (f"  (from {self.source})", "dim") if self.source else ""))
        rows.add_row("server", self.base_url or "OpenAI (no base URL set)")
        sandbox = self.sandbox or "-"
        loud = not sandbox.startswith(("workspace-write", "read-only", "-"))
        rows.add_row("sandbox", Text(sandbox, style="bold white on red" if loud else ""))
        rows.add_row("cwd", self.cwd)
        if self.resumed:
            rows.add_row("session", self.resumed)
        grid = Table.grid()
        grid.add_row(Text("Prime Agent", style="bold"))
        grid.add_row(rows)
        grid.add_row(KEYS)
        return grid

