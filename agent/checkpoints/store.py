"""The workspace's files: trees in a shadow git repository under $PRIME_AGENT_HOME/checkpoints whose
work tree is the workspace. It never touches the user's own repository (no commit, branch, stash,
ref or index change there), reads the workspace's .gitignore files, copies no file over the size
caps (and says which it skipped), and sees every change on disk, whoever made it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from harness_store import safefs
from agent.config import home
from agent.config_models import CheckpointConfig
from agent.trajectory import SkippedFile
from harness_store.gitenv import parse_batch, run_git

EXCLUDE = f"*{safefs.TMP_SUFFIX}\n/.prime-agent/harness/\n"
"""Never checkpointed: files a rewind is writing, and the project harness (rewound as harness)."""
WALK_LIMIT = 2000
"""Entries a workspace may have for `unchanged` to stat them all; past it, git is asked every time."""
RACY_NS = 200_000_000
"""A stamp holding a time this recent (ns) cannot tell a change made within the same clock tick."""
Stamp = tuple[tuple[str, int, int, int, int, int], ...]



def _inside(path: Path, workspace: Path) -> list[str]:
    """`path` relative to the workspace, as a one-item list, where it is inside it (and not it)."""
    try:
        rel = path.resolve().relative_to(workspace)
    except ValueError:
        return []
    return [rel.as_posix()] if rel.parts else []


def _glob_escape(rel: str) -> str:
    """A path as a gitignore pattern that matches it alone."""
    return "".join("\\" + c if c in "*?[]\\!# " else c for c in rel)


class Change(NamedTuple):
    """A file that differs between two trees: status A|M|D|T, its path, and its mode and blob in
    each (git's zeros where it is absent)."""

    status: str
    path: str
    mode: str
    blob: str
    old_mode: str
    old_blob: str


@dataclass
class Snapshot:
    tree: str
    skipped: list[SkippedFile]
    stored_bytes: int


class WorkspaceStore:
    """Workspace trees in a shadow git repository (one per workspace, shared by its sessions: a
    file kept by one is stored once). Each session has its own index there, which makes a
    checkpoint cost a scan of the workspace's metadata plus hashing what changed."""

    def __init__(self, workspace: Path, session_id: str, config: CheckpointConfig, root: Path | None = None):
        self.workspace = workspace.resolve()
        self.config = config
        key = hashlib.sha256(str(self.workspace).encode()).hexdigest()[:16]
        store = root or home() / "checkpoints"
        self.git_dir = store / f"{self.workspace.name or 'root'}-{key}"
        self.index = self.git_dir / "indexes" / session_id
        self._exclude = [f"--exclude=/{_glob_escape(rel)}/" for d in {home(), store} for rel in _inside(d, self.workspace)]
        """$PRIME_AGENT_HOME where it is inside the workspace (`PRIME_AGENT_HOME=home`): its records, and
        this store, are never the workspace's files."""
        self._ready = False
        self._tree: str | None = None
        """The tree of this session's index as last written (unchanged while nothing changed)."""
        self._ignored: set[str] | None = None
        """What git ignores in the workspace (folders end with /), as a snapshot last listed it (None: to list).
        Only what `unchanged` reads: one out of date costs a git process, never a change missed."""
        self._stamp: Stamp | None = None
        """The workspace's metadata, read just before the last snapshot scanned it (None: none to trust)."""
        self._walks = True
        """The workspace is small enough to stat whole (WALK_LIMIT)."""

    def _git(self, *args: str, input: bytes | None = None) -> bytes:
        """Git in the store, inert (harness_store.gitenv): the workspace's attributes name no filter
        any config defines, and no hook, fsmonitor or global config runs."""
        done = run_git([f"--git-dir={self.git_dir}", f"--work-tree={self.workspace}", "-c", "core.autocrlf=false",
                        "-c", "core.quotepath=false", *args], self.workspace, input, GIT_INDEX_FILE=str(self.index))
        if done.returncode != 0:
            raise OSError(f"git {args[0]} in the checkpoint store {self.git_dir}: "
                          f"{done.stderr.decode(errors='replace').strip()}")
        return done.stdout

    def _ensure(self) -> None:
        if self._ready:
            return
        if not (self.git_dir / "HEAD").is_file():
            self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.git_dir.with_name(f"{self.git_dir.name}.{secrets.token_hex(4)}.tmp")
            for args in (["init", "-q", "--bare", str(tmp)], [f"--git-dir={tmp}", "config", "core.bare", "false"],
                         [f"--git-dir={tmp}", "config", "gc.auto", "0"]):
                done = run_git(args, self.git_dir.parent)
                if done.returncode != 0:
                    raise OSError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
            (tmp / "info").mkdir(exist_ok=True)
            (tmp / "info" / "exclude").write_text(EXCLUDE)
            (tmp / "workspace").write_text(str(self.workspace) + "\n")
            try:
                tmp.rename(self.git_dir)  # whole or not at all; another session may have won the race
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        self.index.parent.mkdir(exist_ok=True)
        if not self.index.exists():  # start from another session's view of the same files: no rehash
            others = sorted(self.index.parent.glob("*"), key=lambda p: p.stat().st_mtime)
            if others:
                self.index.write_bytes(others[-1].read_bytes())
        self._ready = True

    def snapshot(self) -> Snapshot:
        """The workspace as a tree now: every file git would not ignore, within the size caps."""
        self._ensure()
        c = self.config
        fresh = self._walks and self._ignored is None
        if fresh:
            self._ignored = self._list_ignored()
        stamp = self._walk(fresh)  # before git reads the files: a change made after this shows in the next walk
        listed = self._git("ls-files", "-z", "-t", "-m", "-o", "--exclude-standard", *self._exclude).split(b"\0")
        update, drop, skipped, stored = [], [], [], 0
        for item in filter(None, listed):
            tag, rel = item[:1], os.fsdecode(item[2:])
            tracked = tag != b"?"
            if rel.endswith("/"):  # a folder ls-files does not go into: a git repository of its own
                skipped.append(SkippedFile(path=rel, reason="a git repository of its own"))
                continue
            path = self.workspace / rel
            try:
                st = os.lstat(path)
            except (FileNotFoundError, NotADirectoryError):  # deleted (its folder may be a file now)
                if tracked:
                    drop.append(rel)
                continue
            reason = None
            if stat.S_ISDIR(st.st_mode):  # a file that became a folder: its files are listed on their own
                drop.append(rel)
                continue
            if stat.S_ISLNK(st.st_mode):
                pass
            elif not stat.S_ISREG(st.st_mode):
                reason = "not a regular file"
            elif st.st_size > c.max_file_bytes:
                reason = "over checkpoints.max_file_bytes"
            elif st.st_size > c.max_binary_bytes and _binary(path):
                reason = "binary, over checkpoints.max_binary_bytes"
            elif stored + st.st_size > c.max_checkpoint_bytes:
                reason = "over checkpoints.max_checkpoint_bytes with the files before it"
            if reason is not None:
                skipped.append(SkippedFile(path=rel, bytes=st.st_size, reason=reason))
                if tracked:
                    drop.append(rel)
                continue
            stored += st.st_size if stat.S_ISREG(st.st_mode) else 0
            update.append(rel)
        if drop:
            self._git("update-index", "-z", "--force-remove", "--stdin", input=_paths(drop))
        if update:  # --replace: a folder that became a file (or the other way) takes the place of the old
            self._git("update-index", "-z", "--add", "--remove", "--replace", "--stdin", input=_paths(update))
        if update or drop or self._tree is None:
            self._tree = self._git("write-tree").decode().strip()
        if any(os.path.basename(p) == ".gitignore" for p in update + drop):
            self._ignored = None  # listed again before the next snapshot's walk
        self._stamp = stamp
        return Snapshot(self._tree, skipped, stored)

    def unchanged(self, tree: str) -> bool:
        """True only when the workspace is provably still `tree`: the last snapshot made it, and no
        file or folder git would read has changed since (each one's lstat, ctime included, which no
        cell can set back). The person's editor, a subprocess, a cell: every write changes a file's
        ctime, every file made, removed or renamed its folder's. A stamp read within a clock tick of a
        write (`RACY_NS`) proves nothing, as git's own "racily clean" index entries; nor does one of a
        workspace past `WALK_LIMIT` entries: then git is asked."""
        return self._stamp is not None and self._tree == tree and self._walk() == self._stamp

    def _list_ignored(self) -> set[str]:
        out = self._git("ls-files", "-z", "-o", "-i", "--directory", "--exclude-standard", *self._exclude)
        return {os.fsdecode(p) for p in out.split(b"\0") if p}

    def _walk(self, listed: bool = False) -> Stamp | None:
        """The lstat of the workspace and of every entry in it git reads (not `.git`, not what it
        ignores), in order; None past WALK_LIMIT entries, or when an entry is too recent to tell (RACY_NS).
        Past WALK_LIMIT with what git ignores just `listed`, the workspace is too big to walk: it is not
        walked again (else the list is read again first: a new `.venv` may be what made it big)."""
        if not self._walks:
            return None
        start = time.time_ns()
        ignored = self._ignored or set()
        out: list[tuple[str, int, int, int, int, int]] = []
        folders = [""]
        while folders:
            rel = folders.pop()
            try:
                st = os.lstat(self.workspace / rel)
                entries = sorted(os.scandir(self.workspace / rel), key=lambda e: e.name)
            except OSError:
                return None
            out.append((rel, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            for e in entries:
                path = rel + e.name
                if e.name == ".git" or path in ignored or path + "/" in ignored:
                    continue
                if e.is_dir(follow_symlinks=False):
                    folders.append(path + "/")
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    return None
                out.append((path, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            if len(out) > WALK_LIMIT:
                if listed:
                    self._walks = False
                else:
                    self._ignored = None
                return None
        if max(max(e[3], e[4]) for e in out) >= start - RACY_NS:
            return None
        return tuple(out)

    def changes(self, a: str, b: str) -> list[Change]:
        """What changes from tree `a` to tree `b`."""
        if a == b:
            return []
        fields = self._git("diff-tree", "-r", "-z", "--no-renames", a, b).split(b"\0")
        out = []
        for meta, rel in zip(fields[0::2], fields[1::2]):
            if not meta.startswith(b":"):
                continue
            old_mode, mode, old_blob, blob, status = meta[1:].decode().split(" ")
            out.append(Change(status[0], os.fsdecode(rel), mode, blob, old_mode, old_blob))
        return out

    def changed_paths(self, a: str, b: str) -> set[str]:
        return {c.path for c in self.changes(a, b)}

    def restore(self, current: str, target: str, keep: set[str]) -> None:
        """Make the workspace's files, as they are in tree `current`, those of tree `target`.
        Paths in `keep` (the target's skipped files) and everything ignored are left alone. Nothing
        is written or removed through a link (harness_store/safefs.py): each file is replaced whole (written
        beside it, then renamed over it; a link at its path is replaced), a link on the way to it is
        replaced by a real folder, and a file to remove behind a link is not the workspace's: it stays."""
        ws = self.workspace
        self._stamp = None
        changes = [c for c in self.changes(current, target) if c.path not in keep]
        for status, rel, *_ in changes:
            if status == "D":
                try:
                    safefs.unlink(ws, Path(rel))
                except (safefs.UnsafePath, IsADirectoryError):  # behind a link, or a folder now: not this file
                    continue
                _prune(ws, rel)
        writes = [(c.path, c.mode, c.blob) for c in changes if c.status != "D" and c.mode != "160000"]
        contents = self.blobs([blob for _, _, blob in writes])
        for rel, mode, blob in writes:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError, safefs.UnsafePath):
                safefs.rmdir(ws, Path(rel))  # a folder where the file was (its files were deleted above)
            if mode == "120000":
                safefs.symlink(ws, Path(rel), os.fsdecode(contents[blob]), replace_links=True)
            else:
                safefs.write_bytes(ws, Path(rel), contents[blob], 0o755 if mode == "100755" else 0o644,
                                   replace_links=True)

    def blobs(self, ids: list[str]) -> dict[str, bytes]:
        """The contents of blobs, by id."""
        if not ids:
            return {}
        return parse_batch(self._git("cat-file", "--batch", input=("\n".join(ids) + "\n").encode()))

    def sizes(self, ids: list[str]) -> dict[str, int]:
        """The sizes of blobs, by id."""
        if not ids:
            return {}
        out = self._git("cat-file", "--batch-check", input=("\n".join(ids) + "\n").encode())
        return {sha: int(size) for sha, _, size in (line.split(" ") for line in out.decode().splitlines())}

    def disk_bytes(self) -> int:
        """What the store takes on disk (for bench/rewind.py)."""
        return sum(p.stat().st_size for p in self.git_dir.rglob("*") if p.is_file())


def _paths(paths: list[str]) -> bytes:
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def _binary(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(8192)
    except OSError:
        return False


def _prune(root: Path, rel: str) -> None:
    """Remove the folders above `rel` while they are empty (never the workspace itself, never through a link)."""
    for folder in Path(rel).parents[:-1]:
        try:
            safefs.rmdir(root, folder)
        except OSError:
            return


# --- finding a checkpoint ----------------------------------------------------------------------
