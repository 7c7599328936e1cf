"""`/rewind`: the session's turns (prompt, time, files changed); Enter on one shows what going back
to before it would change, and y (or f, to overwrite a person's changes) does it."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from daemon.client import Client, DaemonError
from daemon.schemas import RewindResult


class RewindScreen(ModalScreen[RewindResult | None]):
    """Dismisses with the rewind done, or None."""

    BINDINGS = [
        Binding("y", "confirm(False)", "rewind", show=False),
        Binding("f", "confirm(True)", "force", show=False),
        Binding("escape", "back", "back"),
    ]

    def __init__(self, client: Client, session_id: str):
        super().__init__()
        self.client, self.session_id = client, session_id
        self.chosen: int | None = None
        """The turn whose checkpoint the confirmation shows."""
        self.preview: RewindResult | None = None

    def compose(self) -> ComposeResult:
        yield Static("Rewind: go back to before a turn (files, conversation, harness, kernel)", classes="title")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="turns")
        yield Static("", id="confirm")
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#confirm").display = False
        table = self.query_one(DataTable)
        table.add_columns("turn", "time", "prompt", "files changed")
        try:
            rows = await self.client.checkpoints(self.session_id)
        except DaemonError as e:
            self.notify(e.message, severity="error")
            return
        for r in rows:
            files = ", ".join(r.files[:4]) + (f" +{len(r.files) - 4}" if len(r.files) > 4 else "")
            prompt = r.prompt.replace("\n", " ")[:50] + ("" if r.checkpoint else "  (no checkpoint)")
            table.add_row(f"before {r.turn}", time.strftime("%H:%M:%S", time.localtime(r.ts)), prompt,
                          files or "-", key=str(r.turn))
        if rows:
            table.add_row("latest", "", f"the state turn {rows[-1].turn} left", "", key=str(len(rows) + 1))
            table.move_cursor(row=len(rows) - 1)
        else:
            self.notify("no turns yet: nothing to rewind to", severity="warning")
        table.focus()

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        turn = int(event.row_key.value)
        try:
            preview = await self.client.rewind(self.session_id, turn, dry_run=True)
        except DaemonError as e:
            self.notify(e.message, severity="error")
            return
        self.chosen, self.preview = turn, preview
        where = f"{'the end of' if preview.after else 'before'} turn {preview.turn}"
        lines = [f"Rewind to {where}?"]
        lines += [f"  {f.change:<9} {f.path}" for f in preview.files[:40]]
        if len(preview.files) > 40:
            lines.append(f"  ... and {len(preview.files) - 40} more")
        if not preview.files:
            lines.append("  no file changes")
        lines += [f"  harness   {scope} scope back to {(c or 'its start')[:12]}"
                  for scope, c in preview.harness.items()]
        kernel = preview.kernel
        lines.append("  kernel    " + ("its namespace from then" if kernel else "a fresh namespace, as then"
                                     if kernel == "" else "no snapshot: the namespace stays as it is"))
        lines.append("  the conversation goes back to that point; later turns stay in the record")
        if preview.conflicts:
            lines.append(f"Changed by you since then (f overwrites them): {', '.join(preview.conflicts)}")
            lines.append("f: rewind anyway   esc: back")
        else:
            lines.append("y: rewind   esc: back")
        confirm = self.query_one("#confirm", Static)
        confirm.update("\n".join(lines))
        confirm.display = True

    async def action_confirm(self, force: bool) -> None:
        if self.chosen is None or self.preview is None or (self.preview.conflicts and not force):
            return
        try:
            done = await self.client.rewind(self.session_id, self.chosen, force=force)
        except DaemonError as e:
            self.notify(e.message, severity="error")
            return
        self.dismiss(done)

    def action_back(self) -> None:
        if self.chosen is not None:
            self.chosen = self.preview = None
            self.query_one("#confirm").display = False
            self.query_one(DataTable).focus()
        else:
            self.dismiss(None)
