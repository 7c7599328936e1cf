"""`harness` in the kernel: read and edit the agent's own notes, memories, skills and subagents,
and import skill packages from every scope."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

from agent.kernel.runtime.bridge import Host


class Text(str):
    """A string that displays as itself (no quotes or escapes) as a cell's result."""

    def __repr__(self) -> str:
        return str(self)


class Harness:
    """The versioned harness. Changes are committed at once and reach the prompt next turn."""

    def __init__(self, host: Host):
        self._host = host

    def list(self, kind: str | None = None) -> Text:
        """Entries in force (narrowest scope wins), one per line: kind, id, scope, title, summary."""
        rows = self._host.call("harness.list", kind=kind)
        lines = [f"{r['kind']:<8} {r['id']:<24} [{r['scope']}] {r['title']}" + (f": {r['summary']}" if r["summary"] else "")
                 for r in rows]
        return Text("\n".join(lines) or "(the harness is empty)")

    def show(self, id: str) -> Text:
        """One entry in full: front matter and body."""
        return Text(self._host.call("harness.show", id=id))

    def skill_path(self, id: str) -> str:
        """The folder of a skill (its SKILL.md, scripts, references and assets such as fonts or
        templates), to open its files or run its scripts: `f"{harness.skill_path('pdf')}/scripts/fill.py"`."""
        return self._host.call("harness.skill_path", id=id)

    def create(self, kind: str, id: str, content: str, *, title: str | None = None, description: str | None = None,
               scope: str = "session", metadata: dict | None = None, files: dict | None = None) -> str:
        """Add an entry. kind: prompt | memory | skill | subagent. A skill needs a `description` and
        may carry `files` ({relative path: text}) forming a package importable here."""
        return self._host.call("harness.create", kind=kind, id=id, content=content, title=title,
                               description=description, scope=scope, metadata=metadata, files=files)

    def update(self, id: str, content: str | None = None, **fields) -> str:
        """Change an entry's content and/or title, description, metadata, files, in its scope."""
        return self._host.call("harness.update", id=id, content=content, **fields)

    def delete(self, id: str, scope: str | None = None) -> str:
        return self._host.call("harness.delete", id=id, scope=scope)

    def __repr__(self) -> str:
        return ("harness: list(kind=None), show(id), skill_path(id), create(kind, id, content, ...), update(id, ...), "
                "delete(id)")


class SkillFinder(importlib.abc.MetaPathFinder):
    """Finds packages inside skill folders (<scope>/skill/<skill-id>/<package>), narrowest scope
    first, looking again at every import so skills added mid-session import at once."""

    def __init__(self, skill_dirs: list[str]):
        self.skill_dirs = skill_dirs

    def find_spec(self, name, path=None, target=None):
        if path is not None:  # submodules are found through their package's own __path__
            return None
        folders = []
        for root in self.skill_dirs:
            try:
                folders += [os.path.join(root, d) for d in sorted(os.listdir(root))]
            except OSError:
                continue
        return importlib.machinery.PathFinder.find_spec(name, folders) if folders else None


def install_skill_finder(skill_dirs: list[str]) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, SkillFinder)]
    sys.meta_path.append(SkillFinder(skill_dirs))
