"""The conversation view follows what the agent does, and leaves a reader who scrolled up where they are.

A slow model's answer grows in place, one fragment a batch, for a minute (SmolLM2 on two cores):
the view stopped following it partway, and every cell after it landed below the screen (seen
driving the app against SmolLM2 in tmux)."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult

from agent import events as ev
from agent.types import CellResult
from tui.widgets.conversation import Conversation


class Host(App):
    """The conversation alone, styled as the app styles it."""

    CSS_PATH = Path(__file__).resolve().parents[2] / "tui" / "app.tcss"

    def compose(self) -> ComposeResult:
        yield Conversation(id="conversation")


async def stream(pilot, conv: Conversation, step: int, fragments: int = 30) -> None:
    """One model call's answer, a fragment a batch (a line every fifth), then its cell."""
    text = [f"word{i} " + ("\n\n" if i % 5 == 4 else "") for i in range(fragments)]
    for piece in text:
        await conv.apply([ev.ModelDelta(turn_id="t1", text=piece)])
        await pilot.pause(0.005)
    cell = f"c{step}"
    await conv.apply([ev.ModelCompleted(turn_id="t1", text="".join(text)),
                      ev.CellStarted(turn_id="t1", cell_id=cell, code="x"),
                      ev.CellFinished(turn_id="t1", cell_id=cell, result=CellResult(stdout=f"out {step}\n"))])
    await pilot.pause()


async def test_a_slow_stream_and_the_cells_after_it_stay_in_view():
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        conv = app.query_one(Conversation)
        await conv.apply([ev.TurnStarted(turn_id="t1", prompt="go")])
        for step in range(5):
            await stream(pilot, conv, step)
            await pilot.pause(0.05)
            assert conv.is_vertical_scroll_end, (step, conv.scroll_y, conv.max_scroll_y)
        assert conv.max_scroll_y > 30  # five answers and cells: far taller than the screen


async def test_a_reader_who_scrolled_up_stays_there_and_following_resumes_at_the_end():
    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        conv = app.query_one(Conversation)
        await conv.apply([ev.TurnStarted(turn_id="t1", prompt="go")])
        for step in range(3):
            await stream(pilot, conv, step)
        await pilot.pause(0.05)
        assert conv.max_scroll_y > 0
        conv.scroll_home(animate=False)
        await pilot.pause(0.05)
        await stream(pilot, conv, 3)
        await pilot.pause(0.05)
        assert conv.scroll_y == 0  # reading from the top: left there as the answer grows
        conv.scroll_end(animate=False)
        await pilot.pause(0.05)
        await stream(pilot, conv, 4)
        await pilot.pause(0.05)
        assert conv.is_vertical_scroll_end


async def test_a_text_mode_cell_is_shown_as_the_cell_not_twice():
    """A text-mode model (SmolLM2) writes its cell as a ```python block: the block leaves the message
    once the cell starts (the cell shows the code); a block that ran no cell stays."""
    from tui.widgets.message import AssistantMessage

    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        conv = app.query_one(Conversation)
        said = "Let me add them.\n```python\nprint(2 + 3)\n```\nThis prints 5.\n```python\nnot_run()\n```\n"
        await conv.apply([ev.TurnStarted(turn_id="t1", prompt="go"), ev.ModelDelta(turn_id="t1", text=said),
                          ev.ModelCompleted(turn_id="t1", text=said),
                          ev.CellStarted(turn_id="t1", cell_id="c1", code="print(2 + 3)\n")])
        await pilot.pause()
        [message] = conv.query(AssistantMessage)
        assert message.text == "Let me add them.\n\nThis prints 5.\n```python\nnot_run()\n```\n" and message.display
        only = "```python\nprint(1)\n```"
        await conv.apply([ev.ModelCompleted(turn_id="t1", text=only),
                          ev.CellStarted(turn_id="t1", cell_id="c2", code="print(1)\n")])
        await pilot.pause()
        assert not conv.query(AssistantMessage).last().display  # nothing left to say: hidden


async def test_a_diff_opened_at_the_bottom_grows_from_where_it_is():
    """Enter on the newest diff (Shift+Tab from the prompt) with the view following: the view stays
    on the diff's first lines, not at the end of what opened."""
    from agent.types import FileDiff, FilesChanged
    from tui.widgets.files_row import FilesRow

    app = Host()
    async with app.run_test(size=(100, 30)) as pilot:
        conv = app.query_one(Conversation)
        await conv.apply([ev.TurnStarted(turn_id="t1", prompt="go")])
        for step in range(3):
            await stream(pilot, conv, step)
        diff = "".join(f"+line {i}\n" for i in range(60))
        files = FilesChanged(files=[FileDiff(path="notes.md", change="created", added=60, removed=0,
                                              diff="@@ -0,0 +1,60 @@\n" + diff)])
        await conv.apply([ev.CellStarted(turn_id="t1", cell_id="c9", code="write()"),
                          ev.CellFinished(turn_id="t1", cell_id="c9", result=CellResult(), files=files)])
        await pilot.pause(0.05)
        assert conv.is_vertical_scroll_end
        row = conv.query_one(FilesRow)
        row.focus()
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert row.expanded and "+line 59" in row.content.plain
        assert 0 <= row.region.y < conv.size.height  # its first lines in view (the screen is the view)
