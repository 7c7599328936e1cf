"""`session.json`: what the daemon knows about a session, and the forward migrations of its files.

A session directory's files carry the schema of the daemon that wrote them (`schema_version`
in `session.json`). An older one is brought forward when the daemon loads it, by the
migrations below, in order; migrations are only ever appended (STYLE 10).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from agent import events as ev
from agent.events import EVENTS, migrate_v1
from agent.goals import GoalState
from agent.layout import SessionLayout
from agent.notebook import Notebook
from agent.trajectory import SessionPlace
from agent.types import Usage

log = logging.getLogger(__name__)


class QueuedTurn(BaseModel):
    turn_id: str
    text: str
    goal_id: str | None = None
    continuation: int | None = None
    """A goal's turn: which goal, and which of its turns (0 the first)."""
    notebook: Notebook | None = None
    """A notebook's cells, run as the turn (agent/notebook.py)."""


class SessionMeta(SessionPlace):
    """Written when the session is created and at every turn boundary. Its id and directory are the
    trajectory's session record's type (`SessionPlace`); its model and endpoint are its configuration's
    (`overrides` over the configuration files), kept nowhere else."""

    schema_version: int
    title: str | None = None
    overrides: dict[str, Any] = {}
    """Config overrides the session was created with (its `config`, model, base_url, budget)."""
    created: float
    deleted: bool = False
    turns: int = 0
    """Turns begun."""
    assigned: int = 0
    """Turn numbers handed out (queued turns included), so an id is never reused."""
    running_turn: str | None = None
    """Set before a turn begins and cleared when it ends: a restart finds turns a crash cut."""
    queued: list[QueuedTurn] = []
    """Prompts waiting behind the running turn (a restart closes them, said so)."""
    usage: Usage = Usage()
    goal: GoalState | None = None
    """The session's goal, running or the last one to end (a restart resumes one its budget has room for)."""
    updated: float = 0.0
    """When the session was last prompted or began or finished a turn (0: never; its `created` stands in).
    Nothing else moves it, saving the file included: a daemon taking the session up is no use of it."""
    host: Literal["daemon", "run"] = "daemon"
    """What hosts the session now, or did last: the daemon, or the `prime-agent run` that made it."""
    closed: bool = False
    """Closed (`prime-agent sessions close`, or the end of the `prime-agent run` that hosted it): no
    kernel, nothing running; it stays listed, and a prompt opens it again."""

    def save(self, layout: SessionLayout) -> None:
        write_atomically(layout.meta, self.model_dump_json(indent=1))

    def account(self, event: ev.Event) -> bool:
        """Keep what this file says of the session's events (turns, usage, the running turn, a title
        from the first prompt), whichever process hosts it; True at a turn's end, when it is to be saved."""
        if isinstance(event, ev.TurnStarted | ev.TurnFinished):
            self.updated = max(self.updated, event.ts)
        if isinstance(event, ev.TurnStarted):
            self.turns += 1
            self.assigned = max(self.assigned, self.turns)  # the daemon's next turn id follows a run's turns
            self.running_turn = event.turn_id
            if self.title is None:
                self.title = title_of(event.prompt)
        elif isinstance(event, ev.UsageCharged):
            self.usage += event.usage
        elif isinstance(event, ev.TurnFinished):
            if self.running_turn == event.turn_id:
                self.running_turn = None
            self.usage += event.usage
            return True
        return False


def own_key_only(model: dict[str, Any], configured_base_url: str | None) -> None:
    """The daemon's key goes only where it was configured to go: model settings (a session's overrides)
    that name another endpoint than `configured_base_url`, and no key of their own, get `api_key = None`,
    so the key of the daemon's environment or config.toml is never sent there. A client's key for that
    endpoint reaches the model client instead (`ModelKey`, never written into a configuration)."""
    if model.get("base_url") and "api_key" not in model \
            and str(model["base_url"]).rstrip("/") != (configured_base_url or "").rstrip("/"):
        model["api_key"] = None


TITLE_LENGTH = 60


def title_of(prompt: str) -> str | None:
    """A session's title, from its first prompt: the prompt's first line that says something, on one
    line, cut to `TITLE_LENGTH` characters (None for a prompt of blanks)."""
    text = prompt.encode("utf-8", "replace").decode("utf-8")  # lone surrogates (argv's undecodable bytes) as '?'
    for line in text.splitlines():
        line = " ".join(line.split())
        if line:
            return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1].rstrip() + "…"
    return None


def load(layout: SessionLayout) -> SessionMeta:
    """A session's metadata, its directory first brought forward to this daemon's schema."""
    raw = json.loads(layout.meta.read_text())
    version = raw.get("schema_version", 1)
    if version > SCHEMA:
        raise ValueError(f"written by a newer daemon (schema {version}; this one reads up to {SCHEMA})")
    for migrate in MIGRATIONS[version - 1 :]:
        migrate(layout, raw)
    meta = SessionMeta.model_validate({**raw, "schema_version": SCHEMA})
    if version < SCHEMA:
        meta.save(layout)  # written last: a crash mid-migration runs the (idempotent) migrations again
    return meta


# --- migrations: MIGRATIONS[i] brings schema i + 1 to i + 2 (the directory's files, and session.json's
# fields in `fields`, saved by `load`) ---------------------------------------------------------------


def _flat_events(layout: SessionLayout, fields: dict[str, Any]) -> None:
    """1 -> 2: events are typed and flat (agent/events.py); a journal's nested `data` moves up."""
    if not layout.events.is_file():
        return
    lines = []
    for raw in layout.events.read_bytes().split(b"\n")[:-1]:  # after the last newline: nothing, or a torn line
        if not raw.strip():
            continue
        event = migrate_v1(json.loads(raw))
        try:
            lines.append(EVENTS.validate_python(event).model_dump_json())
        except ValueError as e:  # kept as written (flattened) rather than lost
            log.warning("%s: event %s kept untyped: %s", layout.events, event.get("seq"), str(e)[:200])
            lines.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
    write_atomically(layout.events, "".join(line + "\n" for line in lines))


def _one_place(layout: SessionLayout, fields: dict[str, Any]) -> None:
    """2 -> 3: `id` is `session_id`, as in the trajectory's session record; `model` and `base_url` go (the
    configuration says which model the session runs: they were a copy, stale once it changed)."""
    if "id" in fields:
        fields["session_id"] = fields.pop("id")
    fields.pop("model", None)
    fields.pop("base_url", None)


MIGRATIONS: list[Callable[[SessionLayout, dict[str, Any]], None]] = [_flat_events, _one_place]
SCHEMA = len(MIGRATIONS) + 1


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
