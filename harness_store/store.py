"""One scope of the harness: a git repository of entries, where every change is one commit.

Changes are atomic (all of a change's edits land in one commit, or none), serialised by a lock
file shared across processes, and checked optimistically: an edit planned against a version of
an entry that has since changed is refused with `Conflict`. History is never rewritten;
rollbacks are new commits.

A scope's repository (its folder, too) is created by the first write, never by a read: listing,
showing, a log, a diff or the version of a scope that nothing has been written to yet finds it
empty and leaves the disk as it was (a project is not littered by looking at its harness).

Git runs inert (harness_store.gitenv), and only in a repository that looks as the host made it:
a scope whose repository has hooks, config keys the host never writes, or a `.git` pointing
elsewhere is refused (`problem()` says why) and git never runs there.

One concern, and one class for it: a scope's repository, read, changed, and its history (log, diff,
rollback) and a person's own edits committed; every method shares its lock, its git and its cache
of entries, so it is not split (entries, skill folders and git's environment are modules of their own).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from harness_store import safefs
from harness_store.entries import (KINDS, MAX_DESCRIPTION_CHARS, MAX_ENTRY_CHARS, Blob, Edit, Entry, HarnessError,
                                   InvalidEntry, SkillLimits, Source, check_id, check_size, entry_path, locate, now,
                                   parse, safe_relative, version)
from harness_store.gitenv import GIT_IDENTITY, GITATTRIBUTES, GITIGNORE, fingerprint, foreign, parse_batch, run_git

Scope = Literal["user", "project", "session"]
OWN_FILES = (".gitignore", ".gitattributes")
"""The store's own files: no rollback takes them away."""
STAGE = object()
"""A write that commits the file as it is on disk (a person's own bytes, never rewritten)."""
Write = "str | bytes | Blob | None | object"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's id of the empty tree
TRAILERS = ("Refinement-Id", "Trigger", "Session", "Evidence", "Reverts", "Restores", "Round", "Run")


class Conflict(HarnessError):
    """An entry changed after the edit was planned against it."""


class NotFound(HarnessError):
    pass


class ForeignRepository(HarnessError):
    """A scope's repository is not one the host made: git is not run in it."""


class Change(BaseModel):
    """A committed change, as `log()` reports it (and the daemon's API: GET /v1/harness/log)."""

    commit: str
    refinement_id: str
    trigger: str
    summary: str
    date: datetime
    entries: list[str]
    trailers: dict[str, str] = Field(default_factory=dict)


class HarnessStore:
    def __init__(self, root: Path, scope: Scope = "user", limits: SkillLimits | None = None,
                 edits_by: Callable[[], Source] = lambda: "user"):
        """`edits_by()`: who made an edit found on disk (`external` while an unsandboxed kernel could
        have: the session says)."""
        self.root = root
        self.scope = scope
        self.limits = limits or SkillLimits()
        self._parsed: dict[str, tuple[tuple[int, int], Entry | None]] = {}
        self._thread_lock = threading.RLock()
        self._vetted: tuple | None = None
        """The repository's `fingerprint` when `foreign()` last found nothing wrong with it."""
        self._depth = 0
        self._fd = -1
        self.edits_by = edits_by

    # --- repository ----------------------------------------------------------------------------

    def ensure(self) -> None:
        """The scope's repository, created (with a first commit) if it has none: for writes only."""
        if not self.exists():
            self._init()
        if not (self.root / ".gitattributes").is_file():
            self._add_attributes()

    def exists(self) -> bool:
        """Whether the scope has its repository (something was written to it), or something in its place."""
        try:
            os.lstat(self.root / ".git")
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True  # another error (a path too long to read under) is the caller's to see

    def problem(self) -> str | None:
        """Why git is not run in this scope (a repository the host did not make), or None."""
        seen = fingerprint(self.root)
        if seen == self._vetted:
            return None
        why = foreign(self.root)
        if why is None:
            self._vetted = seen
            return None
        return (f"the {self.scope} scope is refused: {why}. It was made or changed outside prime-agent "
                f"(perhaps by a cell); move {self.root} aside and the next write starts it afresh")

    def _init(self) -> None:
        with self._lock():
            if self.exists():
                return
            done = run_git(["init", "-q", str(self.root)], self.root)
            if done.returncode != 0:
                raise HarnessError(f"git init failed in {self.root}: {done.stderr.decode(errors='replace').strip()}")
            (self.root / ".gitignore").write_text(GITIGNORE)
            (self.root / ".gitattributes").write_text(GITATTRIBUTES)
            self._land({".gitignore": STAGE, ".gitattributes": STAGE}, f"harness: create the {self.scope} scope",
                       {"Trigger": "init"}, [])

    def _add_attributes(self) -> None:
        """A scope made before skills kept binary files gets its .gitattributes in a commit of its own."""
        with self._lock():
            if not (self.root / ".gitattributes").is_file():
                self._land({".gitattributes": GITATTRIBUTES}, "harness: keep every file byte for byte",
                           {"Trigger": "init"}, [])

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """Exclusive across threads and processes; re-entrant within one thread of this store."""
        with self._thread_lock:
            if self._depth == 0:
                self.root.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.root / ".harness.lock", os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    os.close(self._fd)

    def _run(self, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        """Run git, inert (harness_store.gitenv), in the scope's own repository, never in one around
        it (a project's, for the project scope), and only in one the host made."""
        if not self.exists():
            raise HarnessError(f"the {self.scope} scope has no repository yet ({self.root})")
        if (why := self.problem()) is not None:
            raise ForeignRepository(why)
        done = run_git(list(args), self.root, input=input)
        if check and done.returncode != 0:
            raise HarnessError(f"git {args[0] if args else ''} failed in {self.root}: "
                               f"{done.stderr.decode(errors='replace').strip()}")
        return done.stdout if done.returncode == 0 else b""

    def _git(self, *args: str) -> str:
        return self._run(*args).decode("utf-8", errors="replace")

    def _dirty_paths(self) -> set[str]:
        """Paths whose working-tree state differs from HEAD (changed, new or deleted)."""
        out = self._git("status", "--porcelain", "-z", "--untracked-files=all", "--no-renames")
        return {item[3:] for item in out.split("\0") if len(item) > 3}

    def checkout(self, ref: str, dest: Path) -> HarnessStore:
        """A private copy of this scope as it was at `ref` (a commit, a refinement id, a tag, HEAD~2) in
        `dest` (absent or empty): its history up to `ref` and nothing uncommitted. Running sessions on
        it, or changing it, leaves this scope as it is."""
        sha = self.resolve(ref)
        with self._lock():
            shutil.copytree(self.root / ".git", dest / ".git", symlinks=True)
        copy = HarnessStore(dest, self.scope, self.limits)
        copy._git("reset", "-q", "--hard", sha)
        return copy

    def tree(self, ref: str = "HEAD") -> str:
        """The id of the entries as they are at `ref`: equal for two commits whose files are the same."""
        return self._git("rev-parse", f"{self.resolve(ref)}^{{tree}}").strip()

    def head(self) -> str | None:
        """The commit the scope is at (its harness version); None before anything was written to it,
        and for a refused repository (`problem()` says why)."""
        if not self.exists() or self.problem() is not None:
            return None
        return self._git("rev-parse", "--verify", "-q", "HEAD").strip() or None

    # --- reading -------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Every valid entry in the working tree (parsed once per file version)."""
        out = []
        for kind in KINDS:
            d = self.root / kind
            if not d.is_dir():
                continue
            for item in os.scandir(d):
                rel = f"{kind}/{item.name}/SKILL.md" if kind == "skill" else f"{kind}/{item.name}"
                if kind != "skill" and not item.name.endswith(".md"):
                    continue
                entry = self._cached(rel)
                if entry is not None:
                    out.append(entry)
        return out

    def _read(self, rel: str) -> bytes | None:
        """The scope's file `rel` (None when absent), never through a link: a kernel may have written
        the scope's folder (UnsafePath for a link, a FIFO, a file over harness.max_skill_file_bytes)."""
        try:
            return safefs.read_bytes(self.root, Path(rel), self.limits.max_file_bytes)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _cached(self, rel: str) -> Entry | None:
        path = self.root / rel
        try:
            st = os.lstat(path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size)
        hit = self._parsed.get(rel)
        if hit is not None and hit[0] == key:
            return hit[1]
        try:
            data = self._read(rel)
            if data is None:
                return None
            entry: Entry | None = parse(data.decode("utf-8"), rel)
        except (HarnessError, UnicodeDecodeError, OSError):  # a link or a FIFO too
            entry = self._committed(rel)  # a broken edit is not in force: the last committed version is
        self._parsed[rel] = (key, entry)
        return entry

    def _committed(self, rel: str) -> Entry | None:
        try:
            return parse(self._git("show", f"HEAD:{rel}"), rel)
        except HarnessError:
            return None

    def get(self, entry_id: str) -> Entry:
        for kind in KINDS:
            entry = self._cached(entry_path(kind, entry_id))
            if entry is not None:
                return entry
        raise NotFound(f"no entry {entry_id!r} in the {self.scope} scope")

    def version_of(self, entry_id: str) -> str | None:
        """The current version of an entry's file (pass it as `Edit.base`), None if absent."""
        for kind in KINDS:
            try:
                data = self._read(entry_path(kind, entry_id))
            except safefs.UnsafePath as e:
                raise InvalidEntry(str(e)) from e
            if data is not None:
                return version(data)
        return None

    # --- changing ------------------------------------------------------------------------------

    def apply(
        self,
        edits: list[Edit],
        *,
        summary: str,
        trigger: str,
        source: Source,
        refinement_id: str | None = None,
        session: str | None = None,
        evidence: str | None = None,
        trailers: dict[str, str] | None = None,
    ) -> Change:
        """Validate every edit, then land them all in one commit; nothing is written on refusal.
        `trailers`: more provenance (the refine loop's `Round` and `Run`)."""
        if not edits:
            raise InvalidEntry("a change needs at least one edit")
        if not self.exists():
            self._planned(edits, source)  # a refused first change creates no scope, not even its folder
        with self._lock():
            self.ensure()
            self._commit_user_edits()  # a person's unsaved-to-git edit lands in history before ours
            writes, touched = self._planned(edits, source)
            rid = refinement_id or new_refinement_id()
            said = {"Refinement-Id": rid, "Trigger": trigger, "Session": session, "Evidence": evidence, **(trailers or {})}
            return self._land(writes, summary, said, touched)

    def record(self, summary: str, trailers: dict[str, str]) -> Change:
        """A commit that changes no entry: an event of the scope's history (a refinement the refine
        loop measured and rejected, with why), shown by `log()`."""
        with self._lock():
            self.ensure()
            return self._land({}, summary, trailers, [])

    def _planned(self, edits: list[Edit], source: Source) -> tuple[dict[str, Write], list[str]]:
        """The writes of a change and the entries it touches; raises what makes it refused."""
        writes: dict[str, Write] = {}
        touched: list[str] = []
        for e in edits:
            if e.id in touched:
                raise InvalidEntry(f"entry {e.id!r} is edited twice in one change")
            touched.append(e.id)
            writes.update(self._plan(e, source))
        _check_layout(writes)
        return writes, touched

    def dry_run(self, edit: Edit, source: Source = "refine") -> None:
        """Raise what `apply` would raise for this edit alone; write nothing."""
        self._plan(edit, source)

    def _plan(self, e: Edit, source: Source) -> dict[str, Write]:
        check_id(e.id)
        current_kind = next((k for k in KINDS if (self.root / entry_path(k, e.id)).is_file()), None)
        if e.action == "create":
            if current_kind is not None:
                raise Conflict(f"entry {e.id!r} already exists in the {self.scope} scope ({current_kind})")
            if e.kind is None:
                raise InvalidEntry(f"creating {e.id!r} needs a kind: one of {', '.join(KINDS)}")
            kind, old = e.kind, None
        else:
            if current_kind is None:
                raise NotFound(f"no entry {e.id!r} in the {self.scope} scope to {e.action}")
            if e.kind is not None and e.kind != current_kind:
                raise InvalidEntry(f"entry {e.id!r} is a {current_kind}, not a {e.kind}")
            kind = current_kind
            try:
                text = (self._read(entry_path(kind, e.id)) or b"").decode("utf-8")
            except (safefs.UnsafePath, UnicodeDecodeError) as err:
                raise InvalidEntry(f"entry {e.id!r}: {err}") from err
            if e.base is not None and version(text) != e.base:
                raise Conflict(f"entry {e.id!r} changed since this edit was planned; re-read it and plan again")
            old = parse(text, entry_path(kind, e.id))
        path = entry_path(kind, e.id)
        folder = f"skill/{e.id}/"
        if e.action == "delete":
            writes: dict[str, Write] = {path: None}
            if kind == "skill":
                writes.update({p: None for p in self._files_under(folder)})
            return writes
        if e.files is not None and kind != "skill":
            raise InvalidEntry(f"only skills carry package files; {e.id!r} is a {kind}")
        if source != "user":  # what a person imports or writes is theirs; the agent and the refiner keep to the caps
            if e.body is not None and len(e.body) > MAX_ENTRY_CHARS:
                raise InvalidEntry(f"{path}: the body has {len(e.body):,} characters; the limit is {MAX_ENTRY_CHARS:,}")
            if e.description is not None and len(e.description) > MAX_DESCRIPTION_CHARS:
                raise InvalidEntry(f"{path}: the description has {len(e.description):,} characters; "
                                   f"the limit is {MAX_DESCRIPTION_CHARS:,}")
        stamp = now()
        fields: dict[str, Any] = old.model_dump() if old else {"id": e.id, "kind": kind, "created": stamp}
        for name in ("title", "description", "body", "metadata"):
            value = getattr(e, name)
            if value is not None:
                fields[name] = value
        fields.update(updated=stamp, source=source)
        fields.setdefault("title", e.id)
        try:
            entry = Entry.model_validate(fields)
        except ValueError as err:
            raise InvalidEntry(f"{path}: {err}") from None
        text = entry.render()
        writes: dict[str, Write] = {path: text}
        if e.files is not None:
            writes.update({p: None for p in self._files_under(folder) if p != path})
            total = len(text.encode())
            for rel, data in e.files.items():
                rel = safe_relative(rel)
                blob = data if isinstance(data, Blob) else Blob(data.encode() if isinstance(data, str) else data)
                total += len(blob.data)
                check_size(self.limits, f"{folder}{rel}", len(blob.data), total)
                writes[folder + rel] = blob
        return writes

    def skill_files(self, entry_id: str) -> dict[str, Blob]:
        """The committed files of a skill's folder besides its SKILL.md, by path within the folder."""
        folder = f"skill/{check_id(entry_id)}"
        if self.head() is None:
            return {}
        return {rel[len(folder) + 1:]: blob for rel, blob in self._blobs("HEAD", [folder]).items()
                if rel != f"{folder}/SKILL.md"}

    def _blobs(self, commit: str, paths: list[str]) -> dict[str, Blob]:
        """The files at `paths` (files, or folders: every file under them) in `commit`."""
        listed = [item.split(b"\t", 1) for item in self._run("ls-tree", "-r", "-z", commit, "--", *paths).split(b"\0")
                  if item]
        files = [(os.fsdecode(rel), meta.split(b" ")) for meta, rel in listed]
        files = [(rel, mode, sha.decode()) for rel, (mode, kind, sha) in files if kind == b"blob"]
        data = parse_batch(self._run("cat-file", "--batch", input="".join(f"{sha}\n" for *_, sha in files).encode())
                           ) if files else {}
        return {rel: Blob(data[sha], mode == b"100755") for rel, mode, sha in files}

    def _files_under(self, folder: str) -> list[str]:
        """The committed files of a skill folder (never a person's untracked files or caches)."""
        if not self.exists() or not (self.root / folder).is_dir():
            return []
        return sorted(p for p in self._git("ls-files", "-z", "--", folder).split("\0") if p)

    def _land(self, writes: dict[str, Write], summary: str, trailers: dict[str, str | None],
              entries: list[str]) -> Change:
        """Write the files and commit exactly them, or, if anything fails, put them back as at HEAD."""
        summary = _printable(summary)
        try:
            for rel, data in writes.items():
                path = self.root / rel
                if data is None:  # never through a link a kernel may have made in the scope's folder
                    safefs.unlink(self.root, Path(rel))
                    _prune_empty(path.parent, self.root)
                elif data is not STAGE:
                    blob = data if isinstance(data, Blob) else Blob(data.encode() if isinstance(data, str) else data)
                    safefs.write_bytes(self.root, Path(rel), blob.data, 0o755 if blob.executable else 0o644)
            lines = [summary.strip().splitlines()[0] if summary.strip() else "harness change"]
            rest = "\n".join(summary.strip().splitlines()[1:]).strip()
            if rest:
                lines += ["", rest]
            kept = {k: " ".join(str(v).split()) for k, v in trailers.items() if v}
            lines += ["", *(f"{k}: {v}" for k, v in kept.items())]
            if writes:  # forced: a skill keeps every file it ships, whatever .gitignore says of editors' files
                self._git("add", "-A", "-f", "--", *writes)
            self._git(*GIT_IDENTITY, "commit", "-q", "--no-verify", "--allow-empty", "--cleanup=whitespace",
                      "-m", "\n".join(lines))
        except BaseException:
            self._restore(list(writes))
            raise
        commit, date = self._git("log", "-1", "--format=%H%x1f%cI", "HEAD").strip().split("\x1f")
        return Change(
            commit=commit, refinement_id=kept.get("Refinement-Id", ""), trigger=kept.get("Trigger", ""),
            summary=lines[0], date=datetime.fromisoformat(date), entries=entries, trailers=kept,
        )

    def _restore(self, paths: list[str]) -> None:
        """Undo a failed change: tracked paths back to HEAD, new files removed, nothing staged."""
        tracked = {p for p in self._git("ls-files", "-z", "--", *paths).split("\0") if p} if paths else set()
        self._run("reset", "-q", "--", *paths, check=False)
        if tracked:
            self._run("checkout", "-q", "HEAD", "--", *tracked, check=False)
        for rel in set(paths) - tracked:
            (self.root / rel).unlink(missing_ok=True)

    # --- history -------------------------------------------------------------------------------

    def log(self, limit: int | None = None) -> list[Change]:
        """Changes, newest first (none before anything was written to the scope)."""
        if self.head() is None:
            return []
        with self._lock():
            out = self._git("log", *([f"-n{limit}"] if limit else []), "--format=%x1e%H%x1f%cI%x1f%B%x1f",
                            "--name-only", "-z")
        changes = []
        for chunk in filter(None, out.split("\x1e")):
            sha, date, rest = chunk.split("\x1f", 2)
            message, names = rest.rsplit("\x1f", 1)
            trailers = _trailers(message)
            entries = sorted({loc[1] for p in names.split("\0") if (loc := locate(p.strip("\n")))})
            changes.append(Change(
                commit=sha, refinement_id=trailers.get("Refinement-Id", ""), trigger=trailers.get("Trigger", ""),
                summary=message.split("\n", 1)[0], date=datetime.fromisoformat(date).astimezone(timezone.utc),
                entries=entries, trailers=trailers,
            ))
        return changes

    def resolve(self, ref: str) -> str:
        """A commit from a refinement id, a commit id (or prefix), or a git revision such as HEAD~2."""
        if self.head() is None:
            raise NotFound(f"no change {ref!r} in the {self.scope} scope: it has no history yet")
        for chunk in filter(None, self._git("log", "--format=%H%x1f%B%x1e").split("\x1e")):
            sha, _, message = chunk.strip("\n").partition("\x1f")
            if _trailers(message).get("Refinement-Id") == ref:
                return sha
        sha = "" if ref.startswith("-") else self._run("rev-parse", "--verify", "-q", f"{ref}^{{commit}}",
                                                       check=False).decode().strip()
        if not sha:
            raise NotFound(f"no change {ref!r} in the {self.scope} scope (give a refinement id or a commit)")
        return sha

    def _commit(self, sha: str) -> tuple[list[str], str]:
        """A commit's parents and message."""
        parents, _, message = self._git("log", "-1", "--format=%P%x1f%B", sha).partition("\x1f")
        return parents.split(), message

    def _changed(self, a: str, b: str) -> list[str]:
        """The files that differ between commits `a` and `b`."""
        return [p for p in self._git("diff-tree", "-r", "-z", "--no-renames", "--name-only", a, b).split("\0") if p]

    def diff(self, a: str | None = None, b: str | None = None) -> str:
        """Unified diff from `a` to `b` (default: the last change alone; '' before any change)."""
        if self.head() is None:
            if a is not None:
                self.resolve(a)  # raises NotFound
            return ""
        with self._lock():
            if a is None:
                parents, _ = self._commit("HEAD")
                return self._git("diff", parents[0] if parents else EMPTY_TREE, "HEAD")
            return self._git("diff", self.resolve(a), self.resolve(b) if b else "HEAD")

    def rollback(self, ref: str, *, session: str | None = None) -> Change:
        """Undo exactly the files one change touched (a new commit); later changes elsewhere stay."""
        self.resolve(ref)  # a scope with no history has nothing to undo, and is not created for it
        with self._lock():
            target = self.resolve(ref)
            parents, message = self._commit(target)
            if not parents:
                raise InvalidEntry("the first commit of a scope cannot be rolled back")
            touched = [rel for rel in self._changed(parents[0], target) if rel not in OWN_FILES]
            if not touched:
                raise InvalidEntry(f"{ref} changed no entry: there is nothing of it to roll back")
            after, before = self._blobs(target, touched), self._blobs(parents[0], touched)
            writes: dict[str, Write] = {}
            for rel in touched:
                try:
                    current = self._read(rel)
                except safefs.UnsafePath as e:
                    raise Conflict(f"{rel}: {e}") from e
                if current != (after[rel].data if rel in after else None):
                    if all(self._read(r) == (before[r].data if r in before else None) for r in touched):
                        raise InvalidEntry(f"{ref} is rolled back already: its entries are as they were before it")
                    raise Conflict(f"{rel} changed again after {ref}; roll back the later change first, "
                                   "or restore a whole earlier state with --to")
                writes[rel] = before.get(rel)
            _check_layout(writes)
            rid = _trailers(message).get("Refinement-Id", target[:12])
            entries = sorted({loc[1] for rel in writes if (loc := locate(rel))})
            return self._land(writes, f"rollback: {message.split(chr(10), 1)[0]}", {
                "Refinement-Id": new_refinement_id("rb"), "Trigger": "rollback", "Session": session, "Reverts": rid,
            }, entries)

    def rollback_to(self, ref: str, *, session: str | None = None) -> Change:
        """Restore the whole scope as it was at `ref` (a new commit)."""
        self.resolve(ref)  # a scope with no history has nothing to restore, and is not created for it
        self.ensure()
        with self._lock():
            target = self.resolve(ref)
            touched = [rel for rel in self._changed(target, "HEAD") if rel not in OWN_FILES]
            if not touched:
                raise InvalidEntry(f"the {self.scope} scope is already as it was at {ref}")
            then = self._blobs(target, touched)
            writes: dict[str, Write] = {rel: then.get(rel) for rel in touched}
            _check_layout(writes)
            entries = sorted({loc[1] for rel in writes if (loc := locate(rel))})
            _, message = self._commit(target)
            return self._land(writes, f"rollback to {ref}: {message.split(chr(10), 1)[0]}", {
                "Refinement-Id": new_refinement_id("rb"), "Trigger": "rollback", "Session": session,
                "Restores": target,
            }, entries)

    # --- a person's own edits --------------------------------------------------------------------

    def commit_user_edits(self) -> tuple[Change | None, list[str]]:
        """Commit working-tree edits a person made (validated, marked with `edits_by()`: `source: user`,
        or `external` where no sandbox vouches that a person made them).

        Returns the change (None when nothing valid changed) and a message per refused file;
        refused files stay uncommitted, and the prompt view keeps the last committed version.
        A scope with no repository and no files stays as it is (nothing to commit).
        """
        if not self.exists() and not (self.root.is_dir() and any(p.is_file() for p in self.root.rglob("*"))):
            return None, []
        with self._lock():
            self.ensure()
            return self._commit_user_edits()

    def _commit_user_edits(self) -> tuple[Change | None, list[str]]:
        source = self.edits_by()
        writes: dict[str, Write] = {}
        problems: list[str] = []
        for rel in sorted(self._dirty_paths()):
            if rel in OWN_FILES:
                continue
            path = self.root / rel
            try:
                loc = locate(rel)
                if loc is None:
                    raise InvalidEntry(f"{rel}: not part of any entry; left uncommitted")
                if path.is_symlink():
                    raise InvalidEntry(f"{rel}: a symlink; a skill keeps files, not links (copy the file in)")
                if not os.path.lexists(path):
                    writes[rel] = None
                elif not path.is_file():
                    raise InvalidEntry(f"{rel}: not a regular file; left uncommitted")
                elif rel != entry_path(*loc):
                    check_size(self.limits, rel, path.stat().st_size, 0)
                    writes[rel] = STAGE  # a skill's file: committed as the person wrote it
                else:
                    entry = parse((self._read(rel) or b"").decode("utf-8"), rel)
                    writes[rel] = entry.model_copy(update={"source": source, "updated": now()}).render()
            except (HarnessError, UnicodeDecodeError, safefs.UnsafePath) as e:
                problems.append(str(e))
        if not writes:
            return None, problems
        entries = sorted({loc[1] for rel in writes if (loc := locate(rel))})
        by = "edit by hand" if source == "user" else "edit from outside (an unsandboxed kernel was running)"
        change = self._land(writes, f"{by}: {', '.join(entries)}", {
            "Refinement-Id": new_refinement_id(source), "Trigger": f"{source}-edit",
        }, entries)
        return change, problems


def new_refinement_id(prefix: str = "r") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _trailers(message: str) -> dict[str, str]:
    out = {}
    for line in message.strip().splitlines()[1:]:
        key, sep, value = line.partition(": ")
        if sep and key in TRAILERS:
            out[key] = value.strip()
    return out


def _printable(text: str) -> str:
    """A commit message without control characters (they would break `log()`'s parsing)."""
    return "".join(c for c in text if c in "\n\t" or c >= " ")


def _check_layout(writes: dict[str, Write]) -> None:
    """Refuse a change in which one path would be both a file and a folder."""
    files = {rel for rel, data in writes.items() if data is not None}
    for rel in files:
        parts = rel.split("/")
        for k in range(1, len(parts)):
            if "/".join(parts[:k]) in files:
                raise InvalidEntry(f"{'/'.join(parts[:k])} cannot be both a file and the folder of {rel}")


def _prune_empty(folder: Path, root: Path) -> None:
    while folder != root and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
