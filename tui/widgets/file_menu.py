"""The menu that completes an `@` mention with a file of the project: shown while the word at the
cursor starts with `@`; Tab or Enter puts the highlighted path in its place."""

from __future__ import annotations

import os
from pathlib import Path

from rich.text import Text
from textual.widgets.option_list import Option

from tui.widgets.completion_menu import CompletionMenu

SKIPPED = {"node_modules", "__pycache__", "venv", "site-packages", "dist", "build"}
"""Folders whose files nobody mentions (hidden ones, `.git` and `.venv` among them, are skipped too)."""
MOST_FILES = 20_000
"""A listing stops here: a huge tree costs one bounded walk, not a frozen app."""
SHOWN = 8


class FileMenu(CompletionMenu):
    def __init__(self, root: Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.root = root
        self._files: list[str] | None = None
        """The project's files, relative, listed when a mention begins (and again at the next)."""

    def filter(self, word: str | None) -> bool:
        """Show the files `word` (the mention without its @) could name; None hides the menu."""
        if word is None:
            self.display = False
            self._files = None  # the next mention lists the tree as it is then
            return False
        if self._files is None:
            self._files = list_files(self.root)
        return self.show([Option(Text(path), id=path) for path in rank(self._files, word)[:SHOWN]])


def list_files(root: Path) -> list[str]:
    """Files under `root`, relative, shallow ones first; links are not followed."""
    out: list[str] = []
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if not f.startswith(".") and f not in SKIPPED)
        rel = os.path.relpath(folder, root)
        out += [name if rel == "." else f"{rel}/{name}" for name in sorted(files)]
        if len(out) >= MOST_FILES:
            break
    return out


def rank(files: list[str], word: str) -> list[str]:
    """The files whose path holds `word` (any case): a name that starts with it first, then a path
    that does, then the shorter."""
    q = word.lower()
    hits = [f for f in files if q in f.lower()]
    return sorted(hits, key=lambda f: (not f.rsplit("/", 1)[-1].lower().startswith(q), not f.lower().startswith(q),
                                       f.count("/"), len(f)))
