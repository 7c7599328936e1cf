"""`/rewind` in the app, driven with Pilot against a real daemon, real kernels and the fake model."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, Static

from daemon.client import Client
from tests.tui.test_app import SIZE, app_for, until
from tui.screens.rewind import RewindScreen
from tui.widgets.message import AssistantMessage, Notice


async def test_rewind_lists_turns_confirms_the_files_and_restores(daemon: Client, project: Path, model_server):
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        for n, text in enumerate(["one", "two"], 1):
            app.query_one("#prompt").load_text(f"run: open('a.txt', 'w').write('{text}'); print('{text}')")
            await pilot.press("enter")
            await until(pilot, lambda: sum(m.text.startswith("ran: ") for m in app.query(AssistantMessage)) == n)
            await until(pilot, lambda: app.state == "idle")
        app.query_one("#prompt").load_text("/rewind")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RewindScreen) and app.screen.query_one(DataTable).row_count)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 3  # before 1, before 2, latest
        assert "a.txt" in str(table.get_row_at(1)[3]) and "run: open" in str(table.get_row_at(0)[2])
        table.move_cursor(row=1)
        await pilot.press("enter")
        confirm = app.screen.query_one("#confirm", Static)
        await until(pilot, lambda: confirm.display)
        text = str(confirm.render())
        assert "before turn 2" in text and "restored  a.txt" in text and "y: rewind" in text
        assert (project / "a.txt").read_text() == "two"  # only shown so far
        await pilot.press("y")
        await until(pilot, lambda: not isinstance(app.screen, RewindScreen))
        await until(pilot, lambda: any("rewound to before turn 2" in str(n.render()) for n in app.query(Notice)))
        assert (project / "a.txt").read_text() == "one"
