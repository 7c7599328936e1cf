"""The menu that completes an `@` mention with a file of the project: shown while the word at the
cursor starts with `@`; Tab or Enter puts the highlighted path in its place. On sending, each file
mentioned goes with the message (`attach`)."""

from __future__ import annotations

import errno
import os
import re
import stat
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


ATTACHED_BYTES = 64 * 1024
"""A mentioned file larger than this is named, not attached (the model can read it from its kernel)."""
MENTION = re.compile(r"(?<!\S)@([^\s@`'\"]*[^\s@`'\".,;:!?)])")


def attach(text: str, root: Path) -> str:
    """`text` with each project file it mentions (`@path`) after it: its content, or why not. Only
    regular files that really lie in `root` are read: the kernel writes there, and a link it made to
    a file outside (a key in the person's home) must not send that file to the model."""
    blocks = [block for rel in dict.fromkeys(MENTION.findall(text)) if (block := _block(root, rel))]
    return "\n\n".join([text, *blocks])


def _block(root: Path, rel: str) -> str | None:
    """File `rel` of `root` as it goes with a message; None when it names no file there."""
    real_root = os.path.realpath(root)
    try:
        fd = os.open(os.path.join(real_root, rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:  # a link as the last step is not followed (a kernel could have made it)
        return f"[@{rel}: a link, not attached]" if e.errno == errno.ELOOP else None
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")  # where the path led, through any links on the way
        st = os.fstat(fd)
        if os.path.commonpath([opened, real_root]) != real_root or not stat.S_ISREG(st.st_mode):
            return f"[@{rel}: not a file of the project, not attached]"
        if st.st_size > ATTACHED_BYTES:
            return f"[@{rel}: {st.st_size:,} bytes, not attached]"
        data = os.read(fd, ATTACHED_BYTES + 1)
    finally:
        os.close(fd)
    if b"\0" in data:
        return f"[@{rel}: binary, not attached]"
    return f"[@{rel}]\n```\n{data.decode(errors='replace').rstrip()}\n```"
