"""Project trust: the project's own files the host acts on only once a person trusted their content.

A project's files that change what the host does or what the model is told (PROJECT_FILES, and
the instruction files `project_instructions` names) may have been written by a cell, by a
session run in `full-access`, or by whoever wrote the repository. The host uses one only when a
person trusted that exact content (`prime-agent trust`); a new or changed file is named at the
session's start and ignored.

The store is `$PRIME_AGENT_HOME/trust.json` (never the workspace's, and read-only to every
kernel), keyed by the project's resolved root and the file's path under it, holding each file's
SHA-256; the content last trusted is kept in `trust/<sha256>`, so a changed file can be shown as
a diff. The project files MCP servers and hooks run (agent/hostrun.py: a `tools/server.py`) are
trusted the same way, entries of their own whose `what` names what runs them. Project files are
read with harness_store/safefs.py, never through a link, regular files only, at most MAX_BYTES (or
the `limit` asked), once: what the host hashed is what it uses.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness_store import safefs

PROJECT_FILES = {
    ".prime-agent/config.toml": "project settings",
    ".mcp.json": "MCP servers the host starts",
    ".prime-agent/hooks.json": "hooks: commands the host runs with your rights at each step of a turn",
}
"""Every project file a person trusts before the host acts on it, with what it does (the
instruction files of `project_instructions` come on top). A new kind of file is one line here."""
INSTRUCTIONS = "instructions for the model"
MAX_BYTES = 256 << 10
"""The largest project file the host reads."""
SCHEMA = 1

Status = Literal["trusted", "new", "changed", "unsafe"]


class TrustError(Exception):
    """The trust store cannot be read or written; the message names it and why."""


@dataclass(frozen=True)
class ProjectFile:
    """One project file as it is now, and whether a person trusted this content."""

    path: str
    """Relative to the project's root."""
    what: str
    status: Status
    """`new`: never trusted; `changed`: trusted once, with other content; `unsafe`: a link, not a
    regular file or too large, never read whatever the store says."""
    content: bytes | None = None
    """None when unsafe."""
    why: str = ""
    """Why an unsafe file is never read."""

    @property
    def digest(self) -> str:
        assert self.content is not None
        return hashlib.sha256(self.content).hexdigest()

    def line(self, held: str = "") -> str:
        """How a session's start names it: the file, what it is, why it is not in force (`held`: what
        is held back for it, else the file is ignored), what to do."""
        if self.status == "unsafe":
            return f"{self.path} ({self.what}) is ignored: {self.why}; the host never reads it" + (f", so {held}"
                                                                                                   if held else "")
        state = "new" if self.status == "new" else "changed since you trusted it"
        return f"{self.path} ({self.what}) is {state}" + (f", so {held}" if held else " and ignored") + \
            " until you trust it: prime-agent trust"


def candidates(instructions: Iterable[str]) -> list[str]:
    """The project files a person trusts: PROJECT_FILES, then the instruction files."""
    return list(dict.fromkeys([*PROJECT_FILES, *instructions]))


def _what(path: str) -> str:
    return PROJECT_FILES.get(path, INSTRUCTIONS)


class TrustStore:
    """What a person trusted, under `$PRIME_AGENT_HOME` (pass `home`: agent.config.home())."""

    def __init__(self, home: Path):
        self.path = home / "trust.json"
        self.blobs = home / "trust"

    # --- reading ------------------------------------------------------------------------------

    def projects(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Project root -> path -> {"sha256", "trusted" (a time)}: every trusted file."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise TrustError(f"{self.path}: cannot be read ({getattr(e, 'strerror', None) or e}); fix or remove it "
                             "(nothing is trusted without it)") from None
        projects = data.get("projects") if isinstance(data, dict) else None
        if not isinstance(projects, dict):
            raise TrustError(f"{self.path}: not a trust store (no \"projects\"); fix or remove it")
        return projects

    def check(self, root: Path, path: str, what: str | None = None, limit: int = MAX_BYTES) -> ProjectFile | None:
        """`path` (under project `root`) as it is now, read once (at most `limit` bytes); None when it
        is absent. An OSError other than absence (a path too long for the file system) is raised.
        `what` it is: by default, what PROJECT_FILES says (or instructions)."""
        what = what or _what(path)
        parts = Path(path).parts
        if not parts or Path(path).is_absolute() or ".." in parts:
            return ProjectFile(path, what, "unsafe", why="not a path inside the project")
        try:  # absent, at the cost of one stat (and a name the file system refuses is an error)
            os.lstat(root / path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            content = safefs.read_bytes(root, Path(path), limit)
        except FileNotFoundError:
            return None
        except safefs.UnsafePath as e:
            return ProjectFile(path, what, "unsafe", why=_reason(e))
        entry = self.projects().get(_key(root), {}).get(path)
        digest = hashlib.sha256(content).hexdigest()
        status: Status = "new" if entry is None else "trusted" if entry.get("sha256") == digest else "changed"
        return ProjectFile(path, what, status, content)

    def trusted(self, root: Path, path: str) -> bytes | None:
        """The content of `path` when a person trusted it as it is now, else None."""
        f = self.check(root, path)
        return f.content if f is not None and f.status == "trusted" else None

    def last_trusted(self, root: Path, path: str) -> bytes | None:
        """The content of `path` a person last trusted (to show a change as a diff)."""
        entry = self.projects().get(_key(root), {}).get(path)
        if entry is None:
            return None
        try:
            return (self.blobs / entry["sha256"]).read_bytes()
        except (OSError, KeyError, TypeError):
            return None

    # --- a person's decisions -----------------------------------------------------------------

    def trust(self, root: Path, file: ProjectFile) -> None:
        """Trust `file` with the content it was read with (never read again: what was shown is trusted)."""
        if file.content is None:
            raise TrustError(f"{file.path}: {file.why}; it cannot be trusted")
        with self._editing() as projects:
            self.blobs.mkdir(parents=True, exist_ok=True)
            blob = self.blobs / file.digest
            if not blob.is_file():
                _write(blob, file.content)
            projects.setdefault(_key(root), {})[file.path] = {"sha256": file.digest, "trusted": time.time()}

    def revoke(self, root: Path, paths: Iterable[str] = ()) -> list[str]:
        """Forget the trust of `paths` under `root` (all of the project's when none); the paths revoked."""
        paths = list(paths)
        with self._editing() as projects:
            project = projects.get(_key(root), {})
            revoked = [p for p in (paths or list(project)) if project.pop(p, None) is not None]
            if not project:
                projects.pop(_key(root), None)
        return revoked

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[str, dict[str, dict[str, Any]]]]:
        """The store's projects, to change; written whole when the block ends (one writer at a time),
        with the blobs no entry names any more removed."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name("trust.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            projects = self.projects()
            yield projects
            _write(self.path, json.dumps({"schema": SCHEMA, "projects": projects}, indent=1).encode())
            named = {e.get("sha256") for files in projects.values() for e in files.values()}
            for blob in self.blobs.iterdir() if self.blobs.is_dir() else []:
                if blob.name not in named:
                    blob.unlink(missing_ok=True)


def _key(root: Path) -> str:
    return str(root.resolve())


def _reason(e: safefs.UnsafePath) -> str:
    if isinstance(e.__cause__, OSError) and e.__cause__.errno == errno.ELOOP:
        return "a symbolic link, or reached through one"
    return str(e).split(": ", 1)[-1]


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
