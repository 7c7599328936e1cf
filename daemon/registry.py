"""The one registry of sessions: `$PRIME_AGENT_HOME/sessions/<id>/session.json`, whichever front made
the session.

The daemon hosts most sessions; `prime-agent run` hosts its own in its process (`Hosted`) and keeps
the same files the daemon keeps (`session.json`, `events.jsonl`, beside the trajectory), so that
`sessions`, `rewind`, `harness rollback --session` and `trajectory export` find it. While a process
other than the daemon hosts a session it holds the session's lock (`session.lock`, an flock with its
pid in the file): the daemon lists the session then but leaves it alone, and takes it up like any
other of its own once that process has ended.
"""

from __future__ import annotations

import copy
import fcntl
import os
import time
from pathlib import Path
from typing import Any

from agent import events as ev
from agent.config_models import Config
from agent.layout import SessionLayout
from agent.trajectory import SessionPlace, SessionRecord, TrajectoryError, TurnFinishedRecord, begun, read_records
from agent.types import Usage
from daemon.journal import EventJournal
from daemon.meta import SCHEMA, SessionMeta, own_key_only, title_of

class InUse(Exception):
    def __init__(self, session_id: str, pid: int | None):
        self.session_id, self.pid = session_id, pid
        super().__init__(f"session {session_id} is running in another process"
                         + (f" (pid {pid})" if pid else "") + ": try again once it has ended")


class Hold:
    """This process hosts the session: an exclusive flock on its `session.lock`, for as long as the
    process lives or until `release`. The descriptor is not inherited, so the kernels it starts do
    not keep it after it ends."""

    def __init__(self, layout: SessionLayout):
        fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InUse(layout.dir.name, held_by(layout)) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor releases the lock


def held_by(layout: SessionLayout) -> int | None:
    """The pid of the process that hosts the session outside this one now (0 if it did not say),
    or None when none does."""
    try:
        fd = os.open(layout.lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class Hosted:
    """A session this process hosts outside the daemon (`prime-agent run`), registered as the daemon
    registers its own: held while it runs, its `session.json` kept at every turn boundary and its events
    in `events.jsonl`; closed (and let go) when the process is done with it.

        hosted = Hosted.register(session.id, session.layout, cwd, config, overrides, title)
        session = Session(..., on_event=hosted.on_event)  # before any other listener
        ...
        hosted.close()
    """

    def __init__(self, layout: SessionLayout, meta: SessionMeta, hold: Hold):
        self.layout, self.meta, self.hold = layout, meta, hold
        self.journal = EventJournal(layout.events)

    @classmethod
    def register(cls, session_id: str, layout: SessionLayout, cwd: Path, config: Config,
                 overrides: dict[str, Any], title: str | None) -> Hosted:
        """Hold the new session and write its `session.json` (FileExistsError where there is one, InUse
        where another process holds the directory). `overrides` are the config overrides it
        runs with (flags, `--set`), kept so that the daemon resumes it as it ran; never a key (see `kept`)."""
        layout.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        hold = Hold(layout)
        if layout.meta.exists():  # `run --session-dir` naming another session's directory
            hold.release()
            raise FileExistsError(f"{layout.dir} is another session's directory (it has a {layout.meta.name})")
        meta = SessionMeta(schema_version=SCHEMA, session_id=session_id, cwd=str(cwd.resolve()), title=title,
                           overrides=kept(overrides, config), created=time.time(), host="run")
        try:
            meta.save(layout)
        except BaseException:
            hold.release()
            raise
        return cls(layout, meta, hold)

    def on_event(self, event: ev.Event) -> None:
        """Journal the event; what `session.json` keeps of it, saved as a turn starts and ends. A journal
        the disk refuses raises, so the session reports it (an error event of its own)."""
        self.journal.append(event.seq, event.model_dump_json())
        if self.meta.account(event):
            self.meta.save(self.layout)
            self.journal.sync()
        elif isinstance(event, ev.TurnStarted):  # running: listed so, and a crash's cut turn is closed later
            self.meta.save(self.layout)

    def close(self) -> None:
        """The process is done with the session: it stays in the registry, closed, for the daemon to
        resume, rewind or roll back (unless it never began a turn)."""
        try:
            self.meta.closed = True
            self.meta.deleted = self.meta.turns == 0  # it never began a turn (it could not start): nothing to list
            self.meta.running_turn = None  # a turn a Ctrl-C cut is in the trajectory as interrupted
            self.meta.save(self.layout)
            self.journal.sync()
        finally:
            self.journal.close()
            self.hold.release()


def kept(overrides: dict[str, Any], config: Config) -> dict[str, Any]:
    """What `session.json` keeps of a session's config overrides: the model and endpoint it ran with,
    never an API key. A key is the daemon's own or a client's, and goes only to an endpoint it was given
    for: `api_key = None` keeps the daemon's key from going to this session's endpoint (a client that
    prompts it, e.g. `prime-agent send`, brings its own)."""
    saved = copy.deepcopy(overrides)
    model = saved.setdefault("model", {})
    model.pop("api_key", None)
    model.update({k: v for k, v in (("name", config.model.name), ("base_url", config.model.base_url)) if v})
    own_key_only(model, None)  # configured for no endpoint of a session `run` hosted: it brings its own
    return saved


def adopt(layout: SessionLayout) -> SessionMeta | None:
    """Enter a session an older `prime-agent run` left (a trajectory, no `session.json`) in the registry:
    its record written from its trajectory, closed. None for a directory that holds no top session."""
    damaged: list[str] = []
    try:
        records = read_records(layout.trajectory, damaged)
    except (OSError, TrajectoryError):
        return None
    start = next((r for r in records if isinstance(r, SessionRecord)), None)
    if start is None or start.parent is not None or start.session_id != layout.dir.name:
        return None
    turns = begun(records)
    base_url = (start.config.get("model") or {}).get("base_url")
    model: dict[str, Any] = {"name": start.model, **({"base_url": base_url} if base_url else {})}
    own_key_only(model, None)  # as `kept` says: the daemon's key stays its own
    usage = Usage()
    for r in records:
        if isinstance(r, TurnFinishedRecord):
            usage += r.usage
    meta = SessionMeta(schema_version=SCHEMA, **start.model_dump(include=set(SessionPlace.model_fields)),
                       title=title_of(turns[0].prompt) if turns else None, overrides={"model": model},
                       created=start.ts, turns=len(turns), assigned=len(turns), usage=usage, closed=True, host="run")
    meta.save(layout)
    return meta
