"""A cell's rich text output as the model reads it and a person's front end renders it: Markdown, and an
HTML table (a pandas DataFrame's `_repr_html_`) as a Markdown table, each capped. Other HTML is left to
its `text/plain` form. Parsed with the standard library, on the host, from text a cell wrote: nothing
is run, fetched or followed."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

TABLE_LIMIT = 8_000
"""Characters of a table or Markdown output kept; a table is cut between rows, with a line saying how
many were left out."""
HTML_READ = 1_000_000
"""Characters of an HTML output read for its first table (a DataFrame's repr is cut by pandas itself,
at `display.max_rows`)."""


def as_markdown(data: dict[str, Any], limit: int = TABLE_LIMIT) -> str | None:
    """A display's Markdown (`text/markdown`), else its HTML's first table as a Markdown table, cut to
    `limit` characters; None for anything else."""
    text = data.get("text/markdown")
    if isinstance(text, str) and text.strip():
        return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit:,} more characters not shown)"
    page = data.get("text/html")
    if not isinstance(page, str) or "<table" not in page.lower():
        return None
    reader = _Tables()
    reader.feed(page[:HTML_READ])
    reader.close()
    if not reader.rows:
        return None
    return _markdown(reader.rows, reader.header, " ".join(reader.after).strip(), limit)


def _markdown(rows: list[list[str]], header: int, note: str, limit: int) -> str:
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    header = max(1, header)
    # header rows beyond the first (a MultiIndex's, the index name's row) are joined into the first
    head = [" ".join(filter(None, (r[i] for r in rows[:header]))) for i in range(width)]
    lines = [_line(head), "|" + "---|" * width]
    body = rows[header:]
    used = sum(len(line) + 1 for line in lines)
    for n, row in enumerate(body):
        line = _line(row)
        if used + len(line) + 1 > limit:
            lines.append(f"... {len(body) - n:,} more rows not shown")
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("\\", "\\\\").replace("|", "\\|") for c in cells) + " |"


class _Tables(HTMLParser):
    """The first `<table>`'s rows (a cell that spans columns or rows repeated in each: a MultiIndex's
    labels), how many of them head it (in `<thead>`, or of header cells alone), and the text after it
    (pandas' `5 rows × 3 columns`)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.header = 0
        self.after: list[str] = []
        self.depth = 0
        self.done = False
        self.in_head = False
        self.cell: list[str] | None = None
        self.spans = (1, 1)
        """The open cell's (columns, rows)."""
        self.below: dict[int, tuple[str, int]] = {}
        """By column: a cell spanning down into the rows to come, and how many more it fills."""
        self.header_cells = True
        """The row being read has header cells (`<th>`) alone."""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.done:
            return
        if tag == "table":
            self.depth += 1
        elif self.depth != 1:
            return
        elif tag == "thead":
            self.in_head = True
        elif tag == "tr":
            self.rows.append([])
            self.header_cells = True
        elif tag in ("td", "th") and self.rows:
            self.cell, self.header_cells = [], self.header_cells and tag == "th"
            given = dict(attrs)
            self.spans = (_span(given.get("colspan")), _span(given.get("rowspan")))
        elif tag == "br" and self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if self.done:
            return
        if tag == "table":
            self.depth -= 1
            self.done = self.depth == 0
        elif self.depth != 1:
            return
        elif tag == "thead":
            self.in_head = False
            self.header = len(self.rows)
        elif tag == "tr" and self.rows:
            self._fill_from_above(len(self.rows[-1]) + len(self.below))
            if not self.in_head and self.header == len(self.rows) - 1 and self.header_cells:
                self.header = len(self.rows)  # a table with no <thead>: its leading rows of <th> alone head it
        elif tag in ("td", "th") and self.cell is not None:
            self._fill_from_above(len(self.rows[-1]))
            text, (across, down) = " ".join("".join(self.cell).split()), self.spans
            for _ in range(across):
                if down > 1:
                    self.below[len(self.rows[-1])] = (text, down - 1)
                self.rows[-1].append(text)
            self.cell = None

    def _fill_from_above(self, upto: int) -> None:
        """Put the cells spanning down from the rows above into this row, where they stand, up to column `upto`."""
        row = self.rows[-1]
        while len(row) in self.below and len(row) <= upto:
            text, left = self.below.pop(len(row))
            if left > 1:
                self.below[len(row)] = (text, left - 1)
            row.append(text)

    def handle_data(self, data: str) -> None:
        if self.done:
            self.after.append(" ".join(data.split()))
        elif self.cell is not None and self.depth == 1:
            self.cell.append(data)


def _span(value: str | None) -> int:
    return min(int(value), 100) if value and value.isdigit() and int(value) > 0 else 1
