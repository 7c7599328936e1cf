"""What a cell or a turn changed in the workspace: two trees of the checkpoint store compared, each
changed file as a bounded diff (`FilesChanged`), computed once, on the host, for every front (the
app, `run`'s output, ACP) to show."""

from __future__ import annotations

import difflib

from agent.checkpoints.store import Change, WorkspaceStore
from agent.types import FileDiff, FilesChanged

MAX_FILES = 50
"""Files listed; past it they are counted (`FilesChanged.more`)."""
DIFF_BYTES = 128 << 10
"""A file bigger than this (before or after) is summarised by its sizes, not diffed."""
DIFF_LINES = 200
"""Lines of one file's diff kept; the rest are counted (`FileDiff.cut`)."""
WHOLE_BYTES = 16 << 10
"""A text file at most this big on both sides carries its whole old and new text (an editor's diff view)..."""
WHOLE_TOTAL = 128 << 10
"""...while the cell's whole texts stay under this many bytes in all."""
NO_BLOB = "0" * 40
GITLINK = "160000"
KINDS = {"A": "created", "D": "deleted"}


def files_changed(store: WorkspaceStore, a: str, b: str) -> FilesChanged | None:
    """What changed from tree `a` to tree `b` (None: nothing). Three git processes when anything did:
    the trees compared, the blobs' sizes, the small blobs' contents."""
    changes = store.changes(a, b)
    if not changes:
        return None
    listed = changes[:MAX_FILES]
    ids = list({blob for c in listed if GITLINK not in (c.mode, c.old_mode)
                for blob in (c.old_blob, c.blob) if blob != NO_BLOB})
    sizes = store.sizes(ids)
    contents = store.blobs([i for i in ids if sizes[i] <= DIFF_BYTES])
    whole_left = WHOLE_TOTAL
    files = []
    for c in listed:
        diff = _diff(c, sizes, contents)
        if diff.whole:
            whole_left -= len(diff.old_text) + len(diff.new_text)
            if whole_left < 0:
                diff.whole, diff.old_text, diff.new_text = False, "", ""
        files.append(diff)
    return FilesChanged(files=files, more=len(changes) - len(listed))


def _diff(c: Change, sizes: dict[str, int], contents: dict[str, bytes]) -> FileDiff:
    out = FileDiff(path=c.path, change=KINDS.get(c.status, "modified"))  # type: ignore[arg-type]
    if GITLINK in (c.mode, c.old_mode):
        out.note = "a git repository of its own"
        return out
    old_size, new_size = sizes.get(c.old_blob, 0), sizes.get(c.blob, 0)
    if c.old_blob != NO_BLOB and c.old_blob not in contents or c.blob != NO_BLOB and c.blob not in contents:
        out.note = f"large: {old_size:,} -> {new_size:,} bytes"
        return out
    old, new = contents.get(c.old_blob, b""), contents.get(c.blob, b"")
    if b"\0" in old or b"\0" in new:  # binary (a NUL anywhere: no text a terminal or a JSON journal should carry)
        out.note = f"binary: {old_size:,} -> {new_size:,} bytes"
        return out
    old_text, new_text = old.decode(errors="replace"), new.decode(errors="replace")
    lines = list(difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), lineterm="", n=3))[2:]
    out.added = sum(1 for line in lines if line.startswith("+"))
    out.removed = sum(1 for line in lines if line.startswith("-"))
    out.diff, out.cut = "\n".join(lines[:DIFF_LINES]), max(0, len(lines) - DIFF_LINES)
    if not lines and NO_BLOB not in (c.old_blob, c.blob) and c.old_mode != c.mode:
        out.note = f"mode {c.old_mode} -> {c.mode}"
    if len(old) <= WHOLE_BYTES and len(new) <= WHOLE_BYTES:
        out.whole, out.old_text, out.new_text = True, old_text, new_text
    return out


def since_first(store: WorkspaceStore, first: str) -> FilesChanged | None:
    """What changed in the workspace from tree `first` (the session's first checkpoint) to now: a
    snapshot taken now, compared (`/diff` in the app). None: nothing."""
    return files_changed(store, first, store.snapshot().tree)


def counts_only(files: FilesChanged) -> FilesChanged:
    """A turn's summary: each file's change and line counts, not its diff."""
    return FilesChanged(files=[FileDiff(path=f.path, change=f.change, added=f.added, removed=f.removed, note=f.note)
                               for f in files.files], more=files.more)
