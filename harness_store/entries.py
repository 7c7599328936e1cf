"""Harness entries: Markdown files with YAML front matter, validated with pydantic.

Layout inside a scope's repository:

    prompt/<id>.md          supplemental prompt notes
    memory/<id>.md          facts, decisions, failures, preferences
    subagent/<id>.md        reusable delegation specs (instructions in the body)
    skill/<id>/SKILL.md     Agent-Skills-compatible skills; the folder keeps every file the skill
                            ships (scripts, a Python package, references, fonts, templates, archives)
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Kind = Literal["prompt", "memory", "skill", "subagent"]
Source = Literal["refine", "agent", "user", "external"]
"""external: edited on disk while a kernel ran unsandboxed, so a person or the agent's code."""
KINDS: tuple[Kind, ...] = ("prompt", "memory", "skill", "subagent")
BASE_PROMPT_ID = "base_prompt"
ID_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,62}[a-z0-9])?$")
MAX_ENTRY_CHARS = 32 * 1024
"""Cap on an entry's Markdown body as the refiner or the agent writes it (prompt space is precious);
what a person writes (an import, an edit by hand) has none: a long published skill is normal."""
MAX_DESCRIPTION_CHARS = 1024
"""The Agent Skills limit on a description: what the refiner or the agent writes stays within it, a
person's longer one is kept (with a warning at import) and the prompt view shows no more of it."""
FRONT = re.compile(r"\A---[ \t]*\n(.*?\n)?---[ \t]*\n?(.*)\Z", re.DOTALL)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True)
class SkillLimits:
    """Caps on the files of a skill folder (any source); the defaults take the published collections."""

    max_file_bytes: int = 20 * 1024 * 1024
    """One file of a skill (a font, a PDF, an archive)."""
    max_skill_bytes: int = 50 * 1024 * 1024
    """All the files of one skill together, SKILL.md included."""


@dataclass(frozen=True)
class Blob:
    """A file's bytes and whether it is executable (a skill's script run as `./scripts/x.sh`)."""

    data: bytes
    executable: bool = False


@dataclass
class Edit:
    """One create, update or delete of one entry."""

    action: Literal["create", "update", "delete"]
    id: str
    kind: Kind | None = None
    """Required for create; found from the store otherwise."""
    title: str | None = None
    description: str | None = None
    body: str | None = None
    metadata: dict[str, Any] | None = None
    files: dict[str, str | bytes | Blob] | None = None
    """Skills only: every file of the folder besides SKILL.md (path within the folder -> text, bytes,
    or a Blob to keep the executable bit); replaces the old set."""
    base: str | None = None
    """The entry's version (`Entry` file hash) the edit was planned against; checked at apply time."""


class HarnessError(Exception):
    """Base of every refusal by the store; the message says what and why."""


class InvalidEntry(HarnessError):
    pass


def check_size(limits: SkillLimits, where: str, size: int, total: int) -> None:
    """Refuse a skill file over the per-file cap, or a skill whose files together pass the per-skill cap."""
    if size > limits.max_file_bytes:
        big, cap = size_text(size), size_text(limits.max_file_bytes)
        if big == cap:
            big, cap = f"{size:,} B", f"{limits.max_file_bytes:,} B"
        raise InvalidEntry(f"{where}: {big}, over the cap of {cap} per file (harness.max_skill_file_bytes)")
    if total > limits.max_skill_bytes:
        raise InvalidEntry(f"{where}: the skill's files pass {size_text(limits.max_skill_bytes)}, the cap per skill "
                           "(harness.max_skill_bytes)")


def size_text(n: int) -> str:
    """A size for people: 812 B, 14.2 KB, 3.1 MB."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class ImmutableEntry(HarnessError):
    pass


def now() -> datetime:
    """Timestamps keep microseconds: entries sort by creation, and several land in one second."""
    return datetime.now(timezone.utc)


def check_id(entry_id: str) -> str:
    if entry_id == BASE_PROMPT_ID:
        raise ImmutableEntry("the base prompt ships with the package and is never edited; "
                             "add a `prompt` entry with another id instead")
    if not ID_PATTERN.match(entry_id or ""):
        raise InvalidEntry(f"invalid id {entry_id!r}: use 1-64 lowercase letters, digits, '-' or '_', "
                           "starting and ending with a letter or digit")
    return entry_id


def entry_path(kind: Kind, entry_id: str) -> str:
    """The entry's Markdown file, relative to the scope root."""
    check_id(entry_id)
    return f"skill/{entry_id}/SKILL.md" if kind == "skill" else f"{kind}/{entry_id}.md"


def locate(path: str) -> tuple[Kind, str] | None:
    """(kind, id) of the entry that owns `path` (relative, POSIX), or None if no entry does."""
    parts = PurePosixPath(path).parts
    if len(parts) >= 2 and parts[0] == "skill":
        return "skill", parts[1]
    if len(parts) == 2 and parts[0] in KINDS and parts[1].endswith(".md"):
        return parts[0], parts[1][:-3]  # type: ignore[return-value]
    return None


def safe_relative(path: str) -> str:
    """A package file path inside a skill folder; refuses absolute paths and `..`."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or path.startswith("~"):
        raise InvalidEntry(f"path {path!r} escapes the skill folder")
    if p.parts[0] == ".git" or (p.name == "SKILL.md" and len(p.parts) == 1):
        raise InvalidEntry(f"path {path!r} is reserved")
    return str(p)


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    kind: Kind
    title: str = Field(min_length=1, max_length=200)
    description: str = ""
    """What the entry is for (a skill: when to use it); the prompt view shows it when space is short."""
    created: datetime
    updated: datetime
    source: Source
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific fields (a subagent's `model` and `budget`, a skill's `license`, ...)."""
    body: str = ""

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        try:
            return check_id(v)
        except HarnessError as e:
            raise ValueError(str(e)) from None

    @field_validator("created", "updated")
    @classmethod
    def _aware(cls, v: datetime) -> datetime:
        return v if v.tzinfo else v.replace(tzinfo=timezone.utc)  # a hand-written date without a zone

    @model_validator(mode="after")
    def _kind_rules(self) -> Entry:
        if self.kind in ("skill", "subagent") and not self.description.strip():
            raise ValueError(f"a {self.kind} needs a `description` saying when to use it")
        return self

    @property
    def path(self) -> str:
        return entry_path(self.kind, self.id)

    @property
    def summary(self) -> str:
        """One line for the prompt view."""
        text = self.description or next((ln.strip("# ").strip() for ln in self.body.splitlines() if ln.strip()), "")
        return text if len(text) <= 160 else text[:157] + "..."

    def render(self) -> str:
        """The file's text: YAML front matter, then the body."""
        front: dict[str, Any] = {"id": self.id, "kind": self.kind, "title": self.title}
        if self.kind == "skill":
            front["name"] = self.id  # Agent Skills require `name` and `description`
        if self.description:
            front["description"] = self.description
        front.update(created=self.created.isoformat(), updated=self.updated.isoformat(), source=self.source)
        if self.metadata:
            front["metadata"] = self.metadata
        return _with_front(front, self.body if self.body.endswith("\n") or not self.body else self.body + "\n")

    def render_published(self) -> str:
        """A skill's SKILL.md as Agent Skills tools (Claude Code, Codex) load it: `name`, `description`
        (with `title` only where it is not the name), the skill's own fields, then the body as it is."""
        front: dict[str, Any] = {"name": self.id, "description": self.description}
        if self.title != self.id:
            front["title"] = self.title
        front.update({k: v for k, v in self.metadata.items() if k not in front})
        return _with_front(front, self.body)


def _with_front(front: dict[str, Any], body: str) -> str:
    dumped = yaml.dump(front, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 30)
    return f"---\n{dumped}---\n{body}"


def version(text: str | bytes | None) -> str | None:
    """The version of a file's content, for optimistic conflict checks (None: the file is absent)."""
    if text is None:
        return None
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha1(data).hexdigest()[:16]


def parse(text: str, path: str, *, default_source: Source = "user") -> Entry:
    """An entry from its file text; `path` supplies the kind and id when the front matter omits them."""
    where = locate(path)
    if where is None:
        raise InvalidEntry(f"{path}: not an entry path (expected prompt/ID.md, memory/ID.md, subagent/ID.md or skill/ID/SKILL.md)")
    kind, entry_id = where
    m = FRONT.match(text)
    if not m:
        raise InvalidEntry(f"{path}: no YAML front matter (the file must start with a '---' line and close it with another)")
    try:
        front = yaml.load(m.group(1) or "", Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise InvalidEntry(f"{path}: front matter is not valid YAML: {e}") from None
    if not isinstance(front, dict):
        raise InvalidEntry(f"{path}: front matter must be a mapping of fields")
    front = dict(front)
    if front.get("id", entry_id) != entry_id or front.get("kind", kind) != kind:
        raise InvalidEntry(f"{path}: front matter says id={front.get('id')!r} kind={front.get('kind')!r}, "
                           f"but the path says id={entry_id!r} kind={kind!r}")
    name = front.pop("name", None)
    if kind == "skill" and name is not None and name != entry_id:
        raise InvalidEntry(f"{path}: skill name {name!r} must equal its folder name {entry_id!r}")
    published = kind == "skill" and not {"id", "kind"} & front.keys()
    # A SKILL.md as published (none of our fields): its `metadata` is one of its own fields, kept as is.
    known = set(Entry.model_fields) - {"body"} - ({"metadata"} if published else set())
    extra = {k: front.pop(k) for k in list(front) if k not in known}
    stamp = now()
    data = {"id": entry_id, "kind": kind, "title": name or entry_id, "created": stamp, "updated": stamp,
            "source": default_source, **front, "body": m.group(2)}
    data["metadata"] = {**extra, **(data.get("metadata") or {})}
    try:
        return Entry.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'entry'}: {err['msg']}" for err in e.errors())
        raise InvalidEntry(f"{path}: {problems}") from None
