"""How `prime-agent run` shows events to a person: the files a cell changed, coloured, and bounded."""

from __future__ import annotations

import re

from rich.console import Console

from agent.events import CellFinished, CellOutput, CellStarted, ModelDelta, TurnFinished
from agent.types import CellResult, FileDiff, FilesChanged
from cli.show import Printer


def printed(*events) -> str:
    printer = Printer()
    printer.console = Console(record=True, force_terminal=True, color_system="standard", width=100)
    for e in events:
        printer.show(e)
    return printer.console.export_text(styles=True)


def test_a_cells_diff_is_coloured_and_cut_past_its_lines_and_the_turn_sums_it_up():
    edit = FileDiff(path="calc.py", change="modified", added=1, removed=1,
                    diff="@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b")
    long = FileDiff(path="log.txt", change="created", added=60, removed=0,
                    diff="@@ -0,0 +1,60 @@\n" + "\n".join(f"+{i}" for i in range(60)))
    files = FilesChanged(files=[edit, long], more=2)
    out = printed(CellFinished(cell_id="c1", result=CellResult(duration=0.1), files=files),
                  TurnFinished(outcome="completed", turn_id="t1", files=files))
    assert "\x1b[31m-    return a - b" in out and "\x1b[32m+    return a + b" in out  # red, green
    assert "\x1b[36m@@ -1,2 +1,2 @@" in out  # cyan
    text = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "~ calc.py +1 -1" in text and "~ log.txt (created) +60 -0" in text
    assert "+34" in text and "+35" not in text  # 40 diff lines a cell: calc.py's 4, then log.txt's first 36
    assert "... 25 more lines of diff" in text and "... and 2 more files changed" in text
    assert "[t1: 4 files changed, +61 -1, lines of 2 not counted: calc.py, log.txt and 2 more]" in text


def test_what_a_cell_or_the_model_prints_shows_its_control_characters_as_escapes():
    """E15's kin: a cell's output and the model's text reach the terminal `prime-agent run` writes to;
    `\\x1b[2K` (erase the line), an OSC title, C1's CSI and a bidi override would act there, not show."""
    attack = "ok\r\x1b[2Kfine\x1b]0;pwned\x07 \x9b31m \u202egnp.exe"
    out = printed(CellStarted(cell_id="c1", code="print(1)"), CellOutput(cell_id="c1", stream="stdout", text=attack),
                  ModelDelta(text=attack), CellFinished(cell_id="c1", result=CellResult(duration=0.1, result=attack)))
    text = re.sub(r"\x1b\[[0-9;]*m", "", out)  # without the colours
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]", text)
    assert text.count("ok\\x1b[2Kfine\\x1b]0;pwned\\x07 \\x9b31m \\u202egnp.exe") == 3


def test_a_table_a_cell_displayed_is_drawn_as_a_table():
    from agent.types import Attachment

    table = Attachment(mime="text/markdown", data="|  | city | temp |\n|---|---|---|\n| 0 | Oslo | -3.5 |")
    text = re.sub(r"\x1b\[[0-9;]*m", "", printed(CellFinished(cell_id="c1", result=CellResult(attachments=[table]))))
    assert "city" in text and "Oslo" in text and "|---|" not in text and "─" in text  # rich's table, not the source


def test_without_colours_a_cells_code_is_shown_whole_as_plain_text_and_its_output_bounded():
    """A log (stderr not a terminal) gets the code unhighlighted (its colours would be dropped), every
    character of it, control characters as escapes; the output's lines past MAX_LINES are counted."""
    printer = Printer()
    printer.console = Console(record=True, color_system=None, width=40)
    code = "x = '" + "a" * 60 + "\x1b[2K'\n\tprint(x)"
    for e in (CellStarted(cell_id="c1", code=code),
              CellOutput(cell_id="c1", stream="stdout", text="".join(f"line {i}\n" for i in range(15))),
              CellOutput(cell_id="c1", stream="stdout", text="".join(f"line {i}\n" for i in range(15, 30))),
              CellFinished(cell_id="c1", result=CellResult(duration=0.1))):
        printer.show(e)
    text = printer.console.export_text()
    assert "x = '" + "a" * 60 + "\\x1b[2K'" + "    print(x)" in text.replace("\n", "")  # wrapped, not cut at 40
    assert "line 19" in text and "line 20" not in text and "... 10 more lines" in text
