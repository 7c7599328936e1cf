"""Text snapshots of the app's screens: the screen as a grid of characters (from Textual's SVG
screenshot), with what changes from run to run (ids, times, token counts, commits) replaced by
placeholders of the same width, compared with `tests/tui/snapshots/NAME.txt`. The SVG itself is
written beside it, for a person to look at.

    UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/tui     # accept the screens as they are now
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

from textual.app import App

HERE = Path(__file__).parent / "snapshots"
VOLATILE = [
    (re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}"), "YYYYMMDD-HHMMSS-xxxxxx"),  # session and refinement ids
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?"), lambda m: "T" * len(m.group())),
    (re.compile(r"\d\d-\d\d \d\d:\d\d"), "MM-DD HH:MM"),
    (re.compile(r"\d+\.\d\ds\b"), lambda m: "9" * (len(m.group()) - 4) + "9.99s"),
    (re.compile(r"ctx [\d.]+k?/"), lambda m: "ctx " + "N" * (len(m.group()) - 5) + "/"),  # the context's fill
    (re.compile(r"127\.0\.0\.1:\d+"), lambda m: "127.0.0.1:" + "P" * (len(m.group()) - 10)),  # the fake server's port
    (re.compile(r"[\d,]+( of [\d,]+)? tok"), lambda m: re.sub(r"[\d,]", "N", m.group())),
    (re.compile(r"\b[\d,]+ (in|out)\b"), lambda m: "N" * (len(m.group()) - len(m.group(1)) - 1) + " " + m.group(1)),
    (re.compile(r"@[0-9a-f]{6,12}"), lambda m: "@" + "c" * (len(m.group()) - 1)),
    (re.compile(r"\b[0-9a-f]{7,40}\b"), lambda m: "h" * len(m.group())),  # commits in diffs
]
_TEXT = re.compile(r'<text[^>]*\bx="([\d.]+)"[^>]*clip-path="url\(#terminal-\d+-line-(\d+)\)">([^<]*)</text>')
_CHAR = re.compile(r'<text[^>]*\bx="([\d.]+)"[^>]*textLength="([\d.]+)"[^>]*>([^<]*)</text>')


def screen_text(svg: str) -> str:
    """The screen's characters, line by line, as the SVG places them."""
    width = next(float(w) / len(html.unescape(t)) for _, w, t in _CHAR.findall(svg) if html.unescape(t))
    rows: dict[int, dict[int, str]] = {}
    for x, line, text in _TEXT.findall(svg):
        row = rows.setdefault(int(line), {})
        for i, ch in enumerate(html.unescape(text).replace("\xa0", " ")):
            row[round(float(x) / width) + i] = ch
    out = []
    for n in range(max(rows, default=-1) + 1):
        row = rows.get(n, {})
        out.append("".join(row.get(c, " ") for c in range(max(row, default=-1) + 1)).rstrip())
    return "\n".join(out).rstrip() + "\n"


def normalize(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def assert_snapshot(app: App, name: str) -> None:
    svg = app.export_screenshot()
    HERE.mkdir(exist_ok=True)
    actual = normalize(screen_text(svg))
    expected_file = HERE / f"{name}.txt"
    if os.environ.get("UPDATE_SNAPSHOTS") or not expected_file.exists():
        expected_file.write_text(actual)
        (HERE / f"{name}.svg").write_text(svg)
        return
    expected = expected_file.read_text()
    if actual != expected:
        (HERE / f"{name}.actual.txt").write_text(actual)
        raise AssertionError(f"the {name} screen changed; see {HERE / (name + '.actual.txt')} "
                             f"(UPDATE_SNAPSHOTS=1 accepts it)\n{actual}")
