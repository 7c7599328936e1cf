"""Skill folders as people publish them (Agent Skills: a folder holding a SKILL.md and every file
the skill ships: scripts, references, fonts, templates, archives), in and out of a scope.

    report = import_skills(store, skill_folders(path))   # each skill imported or refused alone; one commit
    rows = export_skills([(entry, store.skill_files(entry.id)), ...], dest)

Reading a folder refuses only what is unsafe or too big, naming the file and why: a symlink that
points outside the folder (or to a folder), a FIFO, socket or device, a file name that is not
UTF-8, a file over the per-file cap, a skill over the per-skill cap. Everything else is kept byte
for byte, executable bits included; bytecode caches and a `.git` folder are left out.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from harness_store.entries import (
    MAX_DESCRIPTION_CHARS,
    Entry,
    HarnessError,
    InvalidEntry,
    SkillLimits,
    check_id,
    check_size,
    parse,
    safe_relative,
)
from harness_store.store import Blob, Change, Edit, HarnessStore

SKIPPED_DIRS = frozenset({".git", "__pycache__"})
SKIPPED_SUFFIXES = (".pyc",)
NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


@dataclass
class SkillFolder:
    """A skill folder read from disk."""

    id: str
    text: str
    """SKILL.md."""
    files: dict[str, Blob]
    """Every other file, by path within the folder."""
    size: int
    """Bytes of all its files, SKILL.md included."""


@dataclass
class SkillRow:
    """One line of an import's or an export's table."""

    id: str
    files: int = 0
    size: int = 0
    status: Literal["new", "updated", "unchanged", "refused"] = "new"
    reason: str = ""
    """Why it was refused."""
    warnings: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    rows: list[SkillRow]
    change: Change | None = None
    """The commit of the skills that imported (None on a dry run, or when none changed)."""

    @property
    def ok(self) -> bool:
        """Whether anything could be imported (unchanged skills count: they are in the store)."""
        return any(r.status != "refused" for r in self.rows)


def skill_folders(src: Path) -> list[Path]:
    """`src` itself when it holds a SKILL.md, else its subfolders that do (a `.claude/skills`,
    `.agents/skills` or a repository's `skills/`)."""
    if (src / "SKILL.md").is_file():
        return [src]
    return sorted(p.parent for p in src.glob("*/SKILL.md"))


def folder_name(src: Path) -> str:
    """The skill's name: its folder's, as the person named it (a link's name, not its target's)."""
    return Path(os.path.abspath(src)).name


def read_skill_folder(src: Path, limits: SkillLimits) -> SkillFolder:
    """Every file of a skill folder, or InvalidEntry naming the first file refused and why."""
    skill_id = check_id(folder_name(src))
    root = os.path.realpath(src)
    text, files, total = None, {}, 0
    for here, dirs, names in os.walk(root, onerror=_raise):  # an unreadable folder refuses the skill, not skipped
        dirs.sort()
        for d in list(dirs):
            path = os.path.join(here, d)
            if d in SKIPPED_DIRS:
                dirs.remove(d)
            elif os.path.islink(path):
                target = os.path.realpath(path)
                where = "outside the skill folder" if not _inside(target, root) else "to a folder"
                raise InvalidEntry(f"{_rel(path, root)}: a symlink pointing {where} ({target}); "
                                   "put the folder itself in the skill")
        for name in sorted(names):
            path = os.path.join(here, name)
            rel = _rel(path, root)
            if name in SKIPPED_DIRS or name.endswith(SKIPPED_SUFFIXES):
                continue
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                shown = os.fsencode(rel).decode("utf-8", "replace")
                raise InvalidEntry(f"{shown}: the file name is not UTF-8") from None
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(path)
                if not _inside(target, root):
                    raise InvalidEntry(f"{rel}: a symlink pointing outside the skill folder ({target})")
                try:
                    st = os.stat(path)  # a link within the folder: the skill keeps a copy of its file
                except OSError:
                    raise InvalidEntry(f"{rel}: a symlink to nothing ({target})") from None
            what = next((w for test, w in NOT_REGULAR if test(st.st_mode)), None)
            if what is not None:
                raise InvalidEntry(f"{rel}: {what}, not a regular file")
            total += st.st_size
            check_size(limits, rel, st.st_size, total)  # before reading it: a huge file is refused, not loaded
            with open(path, "rb") as f:
                data = f.read()
            if rel == "SKILL.md":
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InvalidEntry(f"SKILL.md is not UTF-8 text ({e.reason} at byte {e.start})") from None
            else:
                files[safe_relative(rel)] = Blob(data, bool(st.st_mode & stat.S_IXUSR))
    if text is None:
        raise InvalidEntry(f"{src}: no SKILL.md")
    return SkillFolder(skill_id, text, files, total)


def import_skills(store: HarnessStore, folders: list[Path], *, summary: str, dry_run: bool = False,
                  session: str | None = None) -> ImportReport:
    """Import each skill folder on its own (refused ones are reported, the rest land in one commit);
    a skill already in the scope is updated when it differs and left alone when it does not."""
    rows: list[SkillRow] = []
    edits: list[Edit] = []
    for folder in folders:
        row = SkillRow(folder_name(folder))
        try:
            skill = read_skill_folder(folder, store.limits)
            row.files, row.size = len(skill.files) + 1, skill.size
            entry = parse(skill.text, f"skill/{skill.id}/SKILL.md")
            if len(entry.description) > MAX_DESCRIPTION_CHARS:
                row.warnings.append(f"the description has {len(entry.description):,} characters, over the Agent "
                                    f"Skills limit of {MAX_DESCRIPTION_CHARS:,}; the prompt view shows the first "
                                    f"{MAX_DESCRIPTION_CHARS:,}")
            exists = store.version_of(entry.id) is not None
            edit = Edit("update" if exists else "create", entry.id, kind="skill", title=entry.title,
                        description=entry.description, body=entry.body, metadata=entry.metadata, files=skill.files)
            if exists:
                if _same(store.get(entry.id), entry) and store.skill_files(entry.id) == skill.files:
                    row.status = "unchanged"
                    rows.append(row)
                    continue
                row.status = "updated"
            store.dry_run(edit, "user")
            edits.append(edit)
        except (HarnessError, OSError) as e:
            row.status, row.reason = "refused", str(e)
        rows.append(row)
    change = None
    if edits and not dry_run:
        change = store.apply(edits, summary=summary, trigger="import", source="user", session=session)
    return ImportReport(rows, change)


def export_skills(skills: list[tuple[Entry, dict[str, Blob]]], dest: Path, *, force: bool = False,
                  dry_run: bool = False) -> list[SkillRow]:
    """Write each skill as `dest/<name>/` (SKILL.md as Agent Skills tools read it, every other file byte
    for byte). A folder already there is left alone when it matches, and refused when it differs,
    unless `force`, which makes it exactly the skill (files the skill lacks are removed)."""
    rows = []
    for entry, files in skills:
        wanted = {"SKILL.md": Blob(entry.render_published().encode()), **files}
        row = SkillRow(entry.id, len(wanted), sum(len(b.data) for b in wanted.values()), "new")
        target = dest / entry.id
        try:
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                raise InvalidEntry(f"{target} is in the way: not a folder")
            present = _present(target) if target.is_dir() else None
            for rel in wanted:  # nothing is written through a link to somewhere else
                for parent in list(PurePosixPath(rel).parents)[:-1]:
                    if (target / parent).is_symlink():
                        raise InvalidEntry(f"{target / parent} is a symlink; the export writes no file through it")
            if present == wanted:
                row.status = "unchanged"
            elif present is not None and not force:
                raise InvalidEntry(f"{target} exists and differs; --force replaces it")
            else:
                row.status = "updated" if present is not None else "new"
                if not dry_run:
                    _write_folder(target, wanted, present or {})
        except (HarnessError, OSError) as e:
            row.status, row.reason = "refused", str(e)
        rows.append(row)
    return rows


def _same(a: Entry, b: Entry) -> bool:
    """The same skill as far as an import is concerned (timestamps and source aside)."""
    def body(e: Entry) -> str:
        return e.body if e.body.endswith("\n") or not e.body else e.body + "\n"

    return all(getattr(a, f) == getattr(b, f) for f in ("kind", "title", "description", "metadata")) and body(a) == body(b)


def _present(folder: Path) -> dict[str, Blob]:
    """The regular files of a folder on disk (caches aside), as an export compares them."""
    out = {}
    for here, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        for name in names:
            path = os.path.join(here, name)
            if not name.endswith(SKIPPED_SUFFIXES) and os.path.isfile(path) and not os.path.islink(path):
                out[_rel(path, str(folder))] = Blob(Path(path).read_bytes(), bool(os.stat(path).st_mode & stat.S_IXUSR))
    return out


def _write_folder(target: Path, wanted: dict[str, Blob], present: dict[str, Blob]) -> None:
    for rel, blob in wanted.items():
        if present.get(rel) != blob:
            write_file(target / rel, blob)
    for rel in set(present) - set(wanted):
        (target / rel).unlink()
        folder = (target / rel).parent
        while folder != target and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def _raise(error: OSError) -> None:
    raise error


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _rel(path: str, root: str) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def write_file(path: Path, blob: Blob) -> None:
    """Replace `path` with `blob` at once (a reader sees the old file or the new, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(blob.data)
    if blob.executable:
        mode = tmp.stat().st_mode
        tmp.chmod(mode | (mode & 0o444) >> 2)  # executable wherever readable
    os.replace(tmp, path)
