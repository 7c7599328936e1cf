"""The merged harness view (user < project < session) and its rendering into the system prompt.

The rendering is deterministic and stable-first, so a provider's prompt cache keeps hitting:
kinds in a fixed order, entries oldest first (new entries append), and a per-kind size budget
past which entries shrink to a title and one line, then to a count. Full text stays one call
away in the kernel: `harness.show(id)`. Skills disclose themselves progressively, as the Agent
Skills format means them to: the prompt holds each one's name and description (no more than the
format's 1,024 characters of it); SKILL.md and the files beside it are read when the skill is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness_store.entries import MAX_DESCRIPTION_CHARS, Entry, Kind
from harness_store.store import HarnessStore, NotFound, Scope

KIND_ORDER: tuple[Kind, ...] = ("prompt", "skill", "subagent", "memory")
"""Stable first: notes change least, memories most."""
HEADINGS = {"prompt": "Prompt notes", "skill": "Skills", "subagent": "Subagents", "memory": "Memories"}
DEFAULT_BUDGET: dict[Kind, int] = {"prompt": 8000, "skill": 16000, "subagent": 2000, "memory": 6000}
"""Characters per kind in the prompt view."""
FULL_TEXT_KINDS = ("prompt", "memory")
"""Kinds shown in full while their budget lasts; skills show their description, subagents a summary line."""
AGENT_MARK = " (by the agent)"
"""After an entry's title in the prompt when the agent wrote it (not a person, not the refiner)."""
SKILLS_NOTE = ("Before you use a skill, read its instructions with `harness.show(id)` (a long one in parts: "
               "`read(f\"{harness.skill_path(id)}/SKILL.md\", start, end)`); its scripts, references and assets are "
               "in the folder `harness.skill_path(id)`.")


@dataclass
class ViewEntry:
    entry: Entry
    scope: Scope
    shadows: list[Scope] = field(default_factory=list)
    """Wider scopes that hold an entry with the same id, hidden by this one."""


class HarnessView:
    def __init__(self, stores: list[HarnessStore], budget: dict[Kind, int] | None = None):
        """`stores` from widest to narrowest: user, project, session."""
        self.stores = stores
        self.budget = {**DEFAULT_BUDGET, **(budget or {})}
        self._rendered: tuple[tuple, str] | None = None

    def entries(self, kind: Kind | None = None) -> list[ViewEntry]:
        merged: dict[str, ViewEntry] = {}
        for store in self.stores:
            for entry in store.entries():
                prior = merged.get(entry.id)
                shadows = [*prior.shadows, prior.scope] if prior else []
                merged[entry.id] = ViewEntry(entry, store.scope, shadows)
        out = [v for v in merged.values() if kind is None or v.entry.kind == kind]
        return sorted(out, key=lambda v: (KIND_ORDER.index(v.entry.kind), v.entry.created, v.entry.id))

    def get(self, entry_id: str) -> ViewEntry:
        for v in self.entries():
            if v.entry.id == entry_id:
                return v
        raise NotFound(f"no harness entry {entry_id!r} in any scope")

    def version(self) -> str:
        """The harness version in force: each scope's commit (a scope nothing was written to has none)."""
        return " ".join(f"{s.scope}@{head[:12]}" for s in self.stores if (head := s.head()) is not None)

    def render(self) -> str:
        """The harness section of the system prompt ('' when the harness is empty)."""
        entries = self.entries()
        key = tuple((v.scope, v.entry.id, v.entry.updated, len(v.entry.body)) for v in entries)
        if self._rendered is not None and self._rendered[0] == key:
            return self._rendered[1]
        sections = []
        for kind in KIND_ORDER:
            group = [v for v in entries if v.entry.kind == kind]
            if group:
                sections.append(self._section(kind, group))
        text = ""
        if sections:
            text = ("# Harness\n\nNotes, skills, subagents and memories kept from earlier work. "
                    "`harness.show(id)` prints an entry in full; `harness.list()` lists them all.\n\n"
                    + "\n\n".join(sections))
        self._rendered = (key, text)
        return text

    def _section(self, kind: Kind, group: list[ViewEntry]) -> str:
        budget = self.budget[kind]
        lines = [f"## {HEADINGS[kind]}"] + ([SKILLS_NOTE] if kind == "skill" else [])
        used, shown = 0, 0
        for v in group:
            e = v.entry
            label = f"{e.title} [{e.id}]" + (AGENT_MARK if e.source == "agent" else "")
            if kind in FULL_TEXT_KINDS and used + len(e.body) + len(e.title) < budget * 0.75:
                block = f"### {label}\n{e.body.strip()}"
            elif kind == "skill" and used + min(len(e.description), MAX_DESCRIPTION_CHARS) < budget * 0.75:
                block = f"- {label}: " + " ".join(e.description[:MAX_DESCRIPTION_CHARS].split())
            else:
                block = f"- {label}" + (f": {e.summary}" if e.summary else "")
            if used + len(block) > budget:
                break
            lines.append(block)
            used += len(block)
            shown += 1
        if shown < len(group):
            lines.append(f"- ... and {len(group) - shown} more; `harness.list(kind={kind!r})` lists them")
        return "\n".join(lines)
