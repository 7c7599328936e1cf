"""The session's side of the harness: its scopes, its prompt view, and the kernel's `harness` API.

Scopes, widest first: user ($PRIME_AGENT_HOME/harness), project (<project>/.prime-agent/harness)
and session (<session dir>/harness). A scope's repository is created the first time something
is written to it, so reading never litters a project.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

from agent.kernel.sandbox import unconfined_running
from agent.layout import SessionLayout
from harness_store.entries import KINDS, Kind, SkillLimits, Source
from harness_store.refiner import ProposedEdit
from harness_store.store import Edit, HarnessStore, Scope
from harness_store.view import HarnessView

NOTICE_ENTRY_CHARS = 2000
"""Characters of one changed entry a harness notice carries (the rest is one `harness.show(id)` away)."""
NOTICE_CHARS = 12_000
"""Characters of changed entries one notice carries in all."""
Propose = Callable[[ProposedEdit, str], Awaitable[str]]
"""A cell's edit of a wider scope than its session's, and its summary -> what the cell is told."""
NOUNS = {"prompt": "prompt note", "memory": "memory", "skill": "skill", "subagent": "subagent"}


def told(view: HarnessView) -> dict[str, tuple[str, str, str, str]]:
    """What the model is told of each entry in the view: id -> (kind, scope, title, text)."""
    out = {}
    for v in view.entries():
        e = v.entry
        text = e.body if e.kind in ("prompt", "memory") else e.description if e.kind == "skill" else e.summary
        out[e.id] = (e.kind, v.scope, e.title, text.strip())
    return out


def changes(before: dict[str, tuple[str, str, str, str]], after: dict[str, tuple[str, str, str, str]]) -> str:
    """The entries that differ between two `told` snapshots, as the lines of a harness notice ('' if none)."""
    lines: list[str] = []
    used = 0
    ids = [i for i in after if after[i] != before.get(i)] + [i for i in before if i not in after]
    for n, id in enumerate(ids):
        if used > NOTICE_CHARS:
            lines.append(f"- ... and {len(ids) - n} more changes: `harness.list()` lists every entry")
            break
        if id not in after:
            kind, scope, title, _ = before[id]
            lines.append(f"- removed {NOUNS[kind]} {title!r} [{id}] ({scope} scope)")
            continue
        kind, scope, title, text = after[id]
        if len(text) > NOTICE_ENTRY_CHARS:
            text = text[:NOTICE_ENTRY_CHARS] + f"\n[... {len(text) - NOTICE_ENTRY_CHARS:,} more characters: harness.show({id!r})]"
        verb = "updated" if id in before else "added"
        block = f"- {verb} {NOUNS[kind]} {title!r} [{id}] ({scope} scope)" + (f":\n{text}" if text else "")
        lines.append(block)
        used += len(block)
    return "\n".join(lines)


def edits_by() -> Source:
    """Who made an edit found on a harness scope's disk: a person, unless an unsandboxed kernel ran
    (then anything could have: `external`)."""
    return "external" if unconfined_running() else "user"


def scope_roots(home: Path, project: Path, session_dir: Path | None) -> dict[Scope, Path]:
    roots: dict[Scope, Path] = {"user": home / "harness", "project": project / ".prime-agent" / "harness"}
    if session_dir is not None:
        roots["session"] = SessionLayout(session_dir).harness
    return roots


class SessionHarness:
    """The harness as one session sees it: its scopes' stores and their merged view."""

    def __init__(self, roots: dict[Scope, Path], session_id: str | None = None, limits: SkillLimits | None = None,
                 edits_by: Callable[[], Source] = lambda: "user"):
        """`edits_by()`: who made an edit found on disk (`HarnessStore`'s)."""
        self.stores: dict[Scope, HarnessStore] = {scope: HarnessStore(root, scope, limits, edits_by)
                                                  for scope, root in roots.items()}
        self.view = HarnessView(list(self.stores.values()))
        self.session_id = session_id

    def skill_dirs(self) -> list[str]:
        """Where skill packages live, narrowest scope first (so it wins an import)."""
        return [str(s.root / "skill") for s in reversed(list(self.stores.values()))]

    def store(self, scope: str) -> HarnessStore:
        if scope not in self.stores:
            raise ValueError(f"unknown scope {scope!r}; one of {', '.join(self.stores)}")
        return self.stores[scope]  # type: ignore[index]

    # --- reads (the kernel's `harness.list`, `show`, `skill_path`; the CLI's and the daemon's) -----------

    def list(self, kind: Kind | None = None) -> list[dict[str, Any]]:
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        return [
            {"id": v.entry.id, "kind": v.entry.kind, "scope": v.scope, "title": v.entry.title, "summary": v.entry.summary}
            for v in self.view.entries(kind)
        ]

    def show(self, id: str) -> str:
        v = self.view.get(id)
        return f"[{v.entry.kind} {v.entry.id}, {v.scope} scope]\n" + v.entry.render()

    def skill_path(self, id: str) -> str:
        """The folder of the skill in force: its SKILL.md and every file it ships."""
        v = self.view.get(id)
        if v.entry.kind != "skill":
            raise ValueError(f"{id!r} is a {v.entry.kind}, not a skill")
        return str(self.store(v.scope).root / "skill" / id)


class HarnessApi:
    """The handlers behind `harness.*` in a session's kernel: the harness's reads, and edits: of the
    session's own scope at once, of a wider one through `propose` (the session's refiner,
    `SessionRefiner.propose`: a person accepts it)."""

    def __init__(self, harness: SessionHarness, propose: Propose):
        self.harness, self.view, self.propose = harness, harness.view, propose

    def handlers(self) -> dict[str, Any]:
        """Bridge methods for the kernel's `harness` object (git work runs off the event loop)."""

        def threaded(fn):
            async def call(**params: Any) -> Any:
                return await asyncio.to_thread(fn, **params)

            return call

        return {
            "harness.list": threaded(self.harness.list),
            "harness.show": threaded(self.harness.show),
            "harness.skill_path": threaded(self.harness.skill_path),
            "harness.create": self.create,
            "harness.update": self.update,
            "harness.delete": self.delete,
        }

    async def create(self, kind: Kind, id: str, content: str, title: str | None = None,
                     description: str | None = None, scope: str = "session", metadata: dict | None = None,
                     files: dict[str, str] | None = None) -> str:
        edit = ProposedEdit(action="create", kind=kind, id=id, title=title or id, description=description,
                            content=content, metadata=metadata, files=files)
        return await self._apply(scope, edit, f"agent: add {kind} {id}")

    async def update(self, id: str, content: str | None = None, title: str | None = None,
                     description: str | None = None, scope: str | None = None, metadata: dict | None = None,
                     files: dict[str, str] | None = None) -> str:
        scope = scope or (await asyncio.to_thread(self.view.get, id)).scope
        edit = ProposedEdit(action="update", id=id, title=title, description=description, content=content,
                            metadata=metadata, files=files)
        return await self._apply(scope, edit, f"agent: update {id}")

    async def delete(self, id: str, scope: str | None = None) -> str:
        scope = scope or (await asyncio.to_thread(self.view.get, id)).scope
        return await self._apply(scope, ProposedEdit(action="delete", id=id), f"agent: delete {id}")

    async def _apply(self, scope: str, edit: ProposedEdit, summary: str) -> str:
        """The session's own scope takes the edit at once; a wider one only as a proposal a person accepts."""
        store = self.harness.store(scope)
        if scope != "session":
            return await self.propose(edit.model_copy(update={"scope": scope}), summary)
        e = Edit(edit.action, edit.id or "", kind=edit.kind, title=edit.title, description=edit.description,
                 body=edit.content, metadata=edit.metadata, files=edit.files)
        change = await asyncio.to_thread(store.apply, [e], summary=summary, trigger="agent", source="agent",
                                         session=self.harness.session_id)
        return f"{summary} ({scope} scope, change {change.refinement_id}); in the prompt from the next turn"
