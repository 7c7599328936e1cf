"""File helpers bound into the kernel namespace: read, write, edit, grep, glob.

Standard library only: this module is imported inside every kernel.
Relative paths resolve against the kernel's working directory (the session's cwd).
"""

from __future__ import annotations

import difflib
import glob as _glob
import os
import re
from pathlib import Path

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".tox", ".prime-agent"}
MAX_GREP_MATCHES = 500


class Lines(list):
    """A list of strings that displays one per line (grep and glob results)."""

    def __repr__(self) -> str:
        return "\n".join(self) if self else "(no matches)"


def read(path: str | os.PathLike, start: int | None = None, end: int | None = None) -> str:
    """Return the text of `path`, or lines `start`..`end` of it (1-based, inclusive)."""
    text = Path(path).read_text(errors="replace")
    if start is None and end is None:
        return text
    lines = text.splitlines(keepends=True)
    first = max(start or 1, 1)
    return "".join(lines[first - 1 : end])


def write(path: str | os.PathLike, text: str) -> str:
    """Write `text` to `path` (creating parent directories); return a one-line summary."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return f"wrote {len(text)} characters to {path}"


def edit(path: str | os.PathLike, old: str, new: str) -> str:
    """Replace the one exact occurrence of `old` in `path` with `new`.

    Raises ValueError when `old` is absent or occurs more than once (with the line numbers),
    so an ambiguous edit never lands.
    """
    p = Path(path)
    with open(p, encoding="utf-8", errors="surrogateescape", newline="") as f:  # keep CRLF and odd bytes as they are
        text = f.read()
    if "\r\n" in text:  # read() gave the model "\n" line ends: match and write the file's own
        old, new = (s.replace("\r\n", "\n").replace("\n", "\r\n") for s in (old, new))
    count = text.count(old)
    if not old:
        raise ValueError("edit: `old` is empty; use write() to replace a whole file")
    if count == 0:
        hint = _closest_line(text, old)
        raise ValueError(f"edit: text not found in {path}" + (f"; closest line: {hint!r}" if hint else ""))
    if count > 1:
        lines = [text.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(old), text)]
        raise ValueError(
            f"edit: text occurs {count} times in {path} (lines {', '.join(map(str, lines))}); "
            "include more surrounding text to make it unique"
        )
    with open(p, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
        f.write(text.replace(old, new, 1))
    line = text.count("\n", 0, text.index(old)) + 1
    return f"edited {path} at line {line}"


def grep(pattern: str, path: str | os.PathLike = ".", *, ignore_case: bool = False) -> Lines:
    """Lines matching the regular expression `pattern` under `path`, as 'file:line: text'."""
    rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    out = Lines()
    for f in _walk(Path(path)):
        try:
            with open(f, errors="strict") as fh:
                for n, line in enumerate(fh, 1):
                    if rx.search(line):
                        out.append(f"{f}:{n}: {line.rstrip()}")
                        if len(out) >= MAX_GREP_MATCHES:
                            out.append(f"... stopped at {MAX_GREP_MATCHES} matches; narrow the pattern or path")
                            return out
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text to search
    return out


def glob(pattern: str) -> Lines:
    """Paths matching `pattern` (`**` crosses directories; absolute patterns work), sorted,
    skipping VCS and cache directories."""
    found = _glob.glob(pattern, recursive=True)
    return Lines(sorted(p for p in found if not SKIP_DIRS.intersection(Path(p).parts)))


def _walk(path: Path):
    if path.is_file():
        yield path
        return
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            yield Path(dirpath, name) if dirpath != "." else Path(name)


def _closest_line(text: str, old: str) -> str | None:
    first = old.strip().splitlines()[0].strip() if old.strip() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = difflib.get_close_matches(first, lines, n=1, cutoff=0.6)
    return match[0] if match else None
