"""The sessions of this project (running, idle, saved): Enter attaches, d deletes one with its files (after
y/n), n starts a new one."""

from __future__ import annotations

import time
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from daemon.client import Client, DaemonError
from tui.screens.confirm import ConfirmScreen


class SessionsScreen(Screen[str | None]):
    """Dismisses with the chosen session id, "new" for a new session, or None."""

    BINDINGS = [
        Binding("enter", "attach", "attach"),
        Binding("d", "delete", "delete (asks)"),
        Binding("n", "new", "new session"),
        Binding("escape", "dismiss(None)", "back"),
    ]

    def __init__(self, client: Client, project: Path, current: str | None = None):
        super().__init__()
        self.client, self.project, self.current = client, project, current

    def compose(self) -> ComposeResult:
        yield Static(f"Sessions in {self.project}  (enter: attach)", classes="title")
        yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Footer()

    async def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("session", "state", "turns", "tokens", "model", "created", "title")
        await self.refresh_rows()
        table.focus()

    async def refresh_rows(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        try:
            here = await self.client.sessions(self.project)  # this project's, and its folders'
        except DaemonError as e:
            self.notify(e.message, severity="error")
            return
        for s in sorted(here, key=lambda s: -s.created):
            mark = "▶ " if s.id == self.current else "  "
            table.add_row(mark + s.id, s.state, str(s.turns), f"{s.usage.total_tokens:,}", s.model,
                          time.strftime("%m-%d %H:%M", time.localtime(s.created)), s.title or "", key=s.id)

    def _selected(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def action_attach(self) -> None:
        if chosen := self._selected():
            self.dismiss(chosen)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(event.row_key.value)

    def action_new(self) -> None:
        self.dismiss("new")

    def action_delete(self) -> None:
        """d asks first (y/n); yes deletes the session and its files."""
        chosen = self._selected()
        if chosen is None:
            return
        if chosen == self.current:
            self.notify("this is the session you are in: attach another (or n for a new one) first", severity="warning")
            return

        async def answered(yes: bool | None) -> None:
            if yes:
                await self.delete(chosen)

        self.app.push_screen(ConfirmScreen(f"Delete session {chosen} and its files? Its kernel stops."), answered)

    async def delete(self, session_id: str) -> None:
        try:
            await self.client.delete(session_id, files=True)
        except DaemonError as e:
            self.notify(e.message, severity="error")
        else:
            self.notify(f"deleted {session_id} and its files")
        await self.refresh_rows()
