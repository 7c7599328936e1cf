"""Every session of the daemon: loading them at start (recovering what a crash cut), creating them
(validating the request), the warm kernel pool, the daemon-wide limits and the idle sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from agent.config import MAX_DEPTH, SANDBOX_ORDER, ConfigError, check_values, home, load_config, project_root, shorten
from agent.config_models import Config
from agent.goals import GoalSpec, GoalState
from agent.harness import SessionHarness, scope_roots
from agent.kernel import KernelPool
from agent.layout import SessionLayout, session_layouts
from agent.model import preload
from agent.notebook import Notebook
from agent.kernel.reaper import reap_orphans
from agent.refine import GateFactory
from agent.kernel.sandbox import Launch
from agent.session import new_session_id
from daemon import meta as meta_file
from daemon import prune
from daemon.errors import Refused
from daemon.managed import ManagedSession
from daemon.meta import SCHEMA, SessionMeta, own_key_only
from daemon.models import model_in_force
from daemon.registry import InUse, adopt, held_by
from daemon.schedules import Scheduler
from daemon.schemas import (
    CreateSession,
    MessageAccepted,
    ModelKey,
    Pruned,
    PrunedSession,
    PruneSessions,
    Rollback,
    RolledBack,
    SessionInfo,
)
from harness_store.entries import HarnessError
from harness_store.store import HarnessStore

log = logging.getLogger(__name__)
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
"""What a session id may be (a directory name under sessions/, never a path)."""

# The regression gate for a session (agent.refine.GateFactory). The daemon cannot build one itself
# (gates run task sets, a layer above it); the command line that starts it hands it `evals.gate.gate_for`.


class SessionManager:
    def __init__(self, config: Config, root: Path, gate_factory: GateFactory | None = None):
        self.config = config
        self.root = root
        self.gate_factory = gate_factory
        self.sessions: dict[str, ManagedSession] = {}
        self.pool = KernelPool(config.daemon.pool_size, config.kernel, Launch.of(config.sandbox))
        self.turn_slots = asyncio.Semaphore(config.daemon.max_running_turns)
        self.subagent_slots: dict[int, asyncio.Semaphore] = {}
        self.stopping = False
        self.write_error: str | None = None
        """The last write the disk refused (a full disk), until a turn's records are written again."""
        self._sweeper: asyncio.Task | None = None
        self._preloading: asyncio.Future | None = None
        self._gone: set[str] = set()
        """Deleted sessions, whose files stay: never taken up again."""
        self.scheduler = Scheduler(self, root)

    async def start(self) -> None:
        """Load every session on disk (closing turns a crash cut) and fill the kernel pool."""
        reap_orphans(self.root)  # what the kernels of a killed daemon (or `prime-agent run`) left running
        self.scan()
        self.pool.fill()
        self._preloading = asyncio.ensure_future(asyncio.to_thread(preload))

        def room() -> bool:
            return sum(1 for s in self.sessions.values() if s.goal.pursued()) < self.config.daemon.max_goals

        for managed in sorted(self.sessions.values(), key=lambda m: m.goal.state.started if m.goal.state else 0):
            managed.goal.resume(room)
        self.scheduler.start()
        self._sweeper = asyncio.create_task(self.sweep(min(30.0, self.config.daemon.idle_timeout / 2)))

    def write_failed(self, error: OSError) -> None:
        self.write_error = f"{time.strftime('%H:%M:%S')}: {error}"
        log.error("a write failed: %s", error)

    def live(self) -> int:
        return sum(1 for s in self.sessions.values() if s.awake())

    def running_goals(self) -> int:
        return sum(1 for s in self.sessions.values() if s.goal.running())

    def running_turns(self) -> int:
        return sum(1 for s in self.sessions.values() if s.turn_running())

    async def make_room(self) -> bool:
        """Put the idle session unused longest to sleep; False when every live one is busy."""
        idle = [s for s in self.sessions.values() if s.idle()]
        if not idle:
            return False
        await min(idle, key=lambda s: s.last_active).sleep()
        return True

    async def sweep(self, every: float = 30.0) -> None:
        """Put sessions idle past `daemon.idle_timeout` to sleep, for as long as the daemon runs."""
        while not self.stopping:
            await asyncio.sleep(every)
            limit = time.monotonic() - self.config.daemon.idle_timeout
            for s in list(self.sessions.values()):
                if s.idle() and s.last_active < limit:
                    log.info("session %s idle since %.0f s: its kernel stops", s.id, time.monotonic() - s.last_active)
                    await s.sleep()

    def get(self, session_id: str) -> ManagedSession:
        """A session of the registry: one this daemon hosts, or one another process made since (and has
        ended: one it still hosts is refused, `in_use`)."""
        managed = self.sessions.get(session_id)
        if managed is None and SESSION_ID.fullmatch(session_id) and session_id not in self._gone:
            layout = SessionLayout.of(session_id, self.root)
            if not layout.meta.exists() and layout.trajectory.is_file() and held_by(layout) is None:
                self._adopt(layout)
            if layout.meta.is_file():
                pid = held_by(layout)
                if pid is not None:
                    raise Refused("in_use", str(InUse(session_id, pid)))
                managed = self._load(layout)
        if managed is None:
            raise Refused("not_found", f"no session {session_id!r}")
        return managed

    def info(self, session_id: str) -> SessionInfo:
        """What `get` finds, and a session another process hosts now as it is (not refused)."""
        try:
            return self.get(session_id).info()
        except Refused as e:
            if e.code != "in_use":
                raise
        layout = SessionLayout.of(session_id, self.root)
        pid = held_by(layout)
        info = _elsewhere(layout, pid) if pid is not None else None
        return info or self.get(session_id).info()  # it ended meanwhile

    def listing(self, cwd: str | None = None) -> list[SessionInfo]:
        """Every session of the registry (with `cwd`: of that directory or one below it), oldest first:
        this daemon's, and those other processes made (`prime-agent run`), taken up once they have
        ended, listed as they are while they run."""
        elsewhere = self.scan()  # first: what it takes up is listed with the rest
        rows = [s.info() for s in self.sessions.values() if under(s.meta.cwd, cwd)]
        return sorted(rows + [i for i in elsewhere if under(i.cwd, cwd)], key=lambda i: i.created)

    def scan(self) -> list[SessionInfo]:
        """Take up the sessions on disk this daemon does not host yet (closing the turns a crash cut);
        those another process hosts now are left alone, and returned as they are."""
        elsewhere = []
        for layout in session_layouts(self.root, having="trajectory"):  # what older `run`s left: entered first
            if not layout.meta.exists() and layout.dir.name not in self._gone and held_by(layout) is None:
                self._adopt(layout)
        for layout in session_layouts(self.root, having="meta"):
            session_id = layout.dir.name
            if session_id in self.sessions or session_id in self._gone:
                continue
            pid = held_by(layout)
            if pid is None:
                self._load(layout)
            elif (info := _elsewhere(layout, pid)) is not None:
                elsewhere.append(info)
        return elsewhere

    def _adopt(self, layout: SessionLayout) -> None:
        """A session an older `prime-agent run` left, entered in the registry (or never looked at again)."""
        try:
            if adopt(layout) is None:
                self._gone.add(layout.dir.name)
        except (OSError, ValueError) as e:
            log.error("%s could not be entered in the registry: %s", layout.dir, e)
            self._gone.add(layout.dir.name)

    def _load(self, layout: SessionLayout) -> ManagedSession | None:
        """A session from its files, recovered; None for a deleted one, or one that cannot be read."""
        try:
            meta = meta_file.load(layout)
        except (ValidationError, ValueError, OSError) as e:
            log.error("skipping %s: %s", layout.meta, e)
            return None
        if meta.deleted:
            self._gone.add(meta.session_id)
            return None
        managed = ManagedSession(self, meta, layout)
        try:
            managed.recover()
        except Exception:
            log.exception("session %s could not be recovered", meta.session_id)
        self.sessions[meta.session_id] = managed
        return managed

    async def create(self, req: CreateSession, may_loosen: bool = True) -> ManagedSession:
        """A new session, awake. `may_loosen`: False for a client that may not give it a looser
        sandbox than the configuration's (over TCP, unless the daemon was started to allow it)."""
        if self.stopping:
            raise Refused("stopping", "the daemon is stopping")
        cwd, overrides, config = validate(req)
        if not may_loosen and (looser := loosened(config, cwd)):
            raise Refused("remote_loosening", f"over TCP a session cannot be less confined than the configuration "
                          f"says ({'; '.join(looser)}): create it over the daemon's Unix socket, or start the "
                          "daemon with --allow-remote-unsandboxed")
        session_id = new_session_id()
        layout = SessionLayout.of(session_id, self.root)
        layout.dir.mkdir(mode=0o700, parents=True)
        meta = SessionMeta(schema_version=SCHEMA, session_id=session_id, cwd=str(cwd.resolve()), title=req.title,
                           overrides=overrides, created=time.time())
        meta.save(layout)
        managed = ManagedSession(self, meta, layout)
        managed.use_key(req.key, config)
        self.sessions[session_id] = managed
        try:
            await managed.wake(config)  # the config validated above: loaded once
        except BaseException:
            self.sessions.pop(session_id, None)
            await managed.delete()
            raise
        return managed

    async def delete(self, session_id: str, files: bool = False) -> None:
        """Out of the registry (its turns and kernel stop); `files`: its files removed too (daemon/prune.py)."""
        managed = self.get(session_id)
        del self.sessions[session_id]
        self._gone.add(session_id)
        await managed.delete()
        if files:
            await asyncio.to_thread(prune.remove, managed.layout, managed.meta.cwd, self.config.checkpoints,
                                    self._works_in(managed.meta.cwd))

    def _works_in(self, cwd: str) -> bool:
        """Whether a session of the registry (not deleted) works in `cwd`: its checkpoint store is in use."""
        return any(s.meta.cwd == cwd for s in self.sessions.values())

    async def prune(self, req: PruneSessions) -> Pruned:
        """Remove, with their files: sessions deleted whose files stayed, sessions never prompted, and with
        `older_than_days` those not used for that long. Live sessions (a kernel up: someone may be at
        it), busy ones and those another process hosts stay."""
        self.scan()
        cutoff = time.time() - req.older_than_days * 86400 if req.older_than_days else None
        found: list[tuple[PrunedSession, SessionLayout]] = []
        for managed in list(self.sessions.values()):
            m = managed.meta
            if not under(m.cwd, req.cwd) or managed.awake() or managed.busy():
                continue
            why = "empty" if m.turns == 0 else "unused" if cutoff and (m.updated or m.created) < cutoff else None
            if why:
                found.append((PrunedSession(id=m.session_id, cwd=m.cwd, title=m.title, turns=m.turns, why=why, bytes=0),
                              managed.layout))
        for layout in session_layouts(self.root, having="meta"):
            meta = prune.left_behind(layout) if layout.dir.name not in self.sessions else None
            if meta and under(meta["cwd"], req.cwd) and held_by(layout) is None:
                found.append((PrunedSession(id=layout.dir.name, cwd=meta["cwd"], title=meta.get("title"),
                                            turns=meta.get("turns", 0), why="deleted", bytes=0), layout))
        for row, layout in found:
            row.bytes = await asyncio.to_thread(prune.bytes_of, layout, row.cwd, self.config.checkpoints)
        done = []
        for row, layout in found:
            if req.dry_run:
                pass
            elif row.why == "deleted":
                await asyncio.to_thread(prune.remove, layout, row.cwd, self.config.checkpoints, self._works_in(row.cwd))
            elif (managed := self.sessions.get(row.id)) is None or managed.awake() or managed.busy():
                continue  # prompted (or gone) since it was found
            else:
                await self.delete(row.id, files=True)
            done.append(row)
        return Pruned(sessions=done, bytes=sum(row.bytes for row in done))

    def send(self, session_id: str, text: str, mode: str, key: ModelKey | None = None,
             notebook: Notebook | None = None) -> MessageAccepted:
        """Queue a prompt (or a notebook's cells) in a session, or steer its running turn, unless the
        daemon is stopping."""
        if self.stopping:
            raise Refused("stopping", "the daemon is stopping")
        return self.get(session_id).send(text, mode, key, notebook)

    def start_goal(self, session_id: str, spec: GoalSpec) -> GoalState:
        """Pursue a goal in a session, within the daemon's limit of goals running at once."""
        managed = self.get(session_id)
        if self.stopping:
            raise Refused("stopping", "the daemon is stopping")
        if not managed.goal.running() and self.running_goals() >= self.config.daemon.max_goals:
            raise Refused("too_many_goals", f"{self.running_goals()} goals are running (daemon.max_goals); "
                          "stop one, or raise the limit")
        return managed.goal.start(spec)

    # --- the harness -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def harness(self, session_id: str | None, project: str | None) -> Iterator[SessionHarness]:
        """The harness a session sees (its own, when live), or the user's and a project's. A project path
        the file system refuses (too long, a loop) is the request's problem (`bad_project`), whether found
        checking it or reading under it."""
        managed = self.get(session_id) if session_id is not None else None
        if managed is not None and managed.awake():
            yield managed.harness()
            return
        cwd = Path(managed.meta.cwd if managed is not None else project or home())
        try:
            if project is not None and not Path(project).is_dir():
                raise Refused("bad_project", f"project {shorten(project)!r} is not a directory")
            harness = managed.harness() if managed is not None else SessionHarness(
                scope_roots(home(), project_root(cwd), None), None)
        except OSError as e:
            raise Refused("bad_project", f"project {shorten(str(project or cwd))!r}: {e.strerror or e}") from None
        try:
            yield harness
        except OSError as e:
            if e.errno not in _BAD_PATH:
                raise
            raise Refused("bad_project", f"{shorten(str(e.filename or project or cwd))!r}: {e.strerror}") from None

    async def rollback(self, req: Rollback) -> RolledBack:
        """Undo one harness change (or restore a whole earlier state), through the live session named if
        there is one; every other live session on that scope picks it up at its next turn, and what
        they had planned before it is stale."""
        managed = self.get(req.session) if req.session else None
        try:
            with self.harness(req.session, req.project) as harness:
                store = harness_scope(harness, req.scope)
                root = store.root
                change = managed.rollback(req.ref, req.scope, req.to) if managed is not None else None
                if change is None:  # no live session to do it
                    rollback = store.rollback_to if req.to else store.rollback
                    change = await asyncio.to_thread(rollback, req.ref, session=req.session)
        except HarnessError as e:
            raise Refused("harness", str(e)) from None
        for other in self.sessions.values():
            if other is not managed:
                other.harness_changed(root, "a rollback")
        return RolledBack(scope=req.scope, **dict(change))

    async def stop(self, timeout: float) -> None:
        """Interrupt every turn and wait (up to `timeout`) for each to be recorded; then close all.
        A session whose drain fails (its files went with a deleted home) is still closed, and the
        pool's kernels stop whatever the sessions did."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        why = "the daemon stopped before this turn began"
        sessions = list(self.sessions.values())
        await self.scheduler.stop()
        try:
            # Goals stay `running` on disk: the next daemon resumes them within their budget.
            closed = await asyncio.gather(*(s.close(why, drain=timeout) for s in sessions), return_exceptions=True)
            for s, result in zip(sessions, closed):
                if isinstance(result, BaseException):
                    log.error("session %s: its drain failed: %s", s.id, result, exc_info=result)
        finally:
            await self.pool.close()


def harness_scope(harness: SessionHarness, scope: str) -> HarnessStore:
    """One scope's store of `harness`; a scope it does not have is the request's problem (`bad_scope`)."""
    try:
        return harness.store(scope)
    except ValueError as e:
        raise Refused("bad_scope", str(e)) from None


_BAD_PATH = {errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR}
"""Errors of a path's shape, not of the disk: a request naming such a path gets a 400."""


def under(cwd: str, root: str | None) -> bool:
    """Whether a session working in `cwd` is one of directory `root` (or one below it); any, without one."""
    return root is None or Path(cwd).is_relative_to(Path(root).resolve())


def _elsewhere(layout: SessionLayout, pid: int) -> SessionInfo | None:
    """A session another process (`pid`) hosts, as its `session.json` says it is; None if unreadable."""
    try:
        meta = meta_file.load(layout)
    except (ValidationError, ValueError, OSError) as e:
        log.error("skipping %s: %s", layout.meta, e)
        return None
    model, base_url = model_in_force(None, meta.overrides)  # its own process has its configuration
    return SessionInfo(id=meta.session_id, cwd=meta.cwd, model=model, base_url=base_url, title=meta.title, created=meta.created, updated=meta.updated or meta.created,
                       state="running" if meta.running_turn else "idle", turns=meta.turns, queued=0, last_seq=0,
                       usage=meta.usage, dir=str(layout.dir), elsewhere=pid)


def validate(req: CreateSession) -> tuple[Path, dict[str, Any], Config]:
    """A create request's directory, its config overrides (as `session.json` keeps them) and the config.

    Anything wrong with the request is a `Refused` (a 4xx), raised before anything is written:
    a path the file system cannot check is the path's problem, and no error of the checking
    itself (a RecursionError, an OSError) escapes as a 500."""
    try:
        return _validate(req)
    except RecursionError:
        raise Refused("bad_config", f"the request is nested too deeply to check (at most {MAX_DEPTH} levels)") from None
    except OSError as e:
        raise Refused("bad_config", f"the request could not be checked: {shorten(e.filename or '')}: "
                      f"{e.strerror or e}") from None


def _validate(req: CreateSession) -> tuple[Path, dict[str, Any], Config]:
    cwd = Path(req.cwd)
    if not cwd.is_absolute():
        raise Refused("bad_cwd", f"cwd must be an absolute path, not {shorten(req.cwd)!r}")
    try:
        is_dir = cwd.is_dir()
    except OSError as e:
        raise Refused("bad_cwd", f"cwd {shorten(req.cwd)!r}: {e.strerror or e}") from None
    if not is_dir:
        raise Refused("bad_cwd", f"cwd {shorten(req.cwd)!r} is not a directory")
    if req.config and "daemon" in req.config:
        raise Refused("bad_config", "[daemon] settings are the daemon's own, not a session's")
    try:
        check_values(req.config or {}, "config")  # before the deep copy below, or anything else that recurses
    except ConfigError as e:
        raise Refused("bad_config", str(e)) from None
    overrides: dict[str, Any] = copy.deepcopy(req.config or {})
    model = overrides.setdefault("model", {})
    if not isinstance(model, dict):
        raise Refused("bad_config", "config.model must be a table of model settings")
    model.update({k: v for k, v in (("name", req.model), ("base_url", req.base_url)) if v})
    if req.sandbox is not None or req.mode == "plan":
        sandbox = overrides.setdefault("sandbox", {})
        if not isinstance(sandbox, dict):
            raise Refused("bad_config", "config.sandbox must be a table of sandbox settings")
        if req.sandbox is not None:
            sandbox["mode"] = req.sandbox
        if req.mode == "plan":
            sandbox["plan"] = True
    own_key_only(model, _configured_base_url(cwd))
    try:
        if req.budget is not None:
            overrides["budget"] = req.budget.model_dump(exclude_unset=True)
            check_values({"budget": overrides["budget"]}, "config")
        # loaded as a restarted daemon will load it: from what session.json keeps
        config = load_config(cwd, as_saved(overrides), source="config")
    except ConfigError as e:
        raise Refused("bad_config", str(e)) from None
    keyed = req.key is not None and req.key.fits(config.model.base_url)  # the model client gets it, not the config
    if not (config.model.configured or (keyed and config.model.name)):
        raise Refused("no_model", "no model configured: pass `model` and `base_url` (and `key`), or set them in "
                      "the daemon's environment (PRIME_AGENT_MODEL, OPENAI_BASE_URL, OPENAI_API_KEY) or config.toml")
    return cwd, overrides, config


POLICIES = {"deny": 0, "ask": 1, "allow": 2}


def loosened(config: Config, cwd: Path) -> list[str]:
    """How `config` (a request's, for a session in `cwd`) confines less than the configuration alone
    would, or lets the host run more: each way, in words (none: it only tightens or keeps)."""
    try:
        base = load_config(cwd)
    except ConfigError as e:
        raise Refused("bad_config", str(e)) from None
    s, b = config.sandbox, base.sandbox
    why = [f"sandbox.mode {s.mode} (configured: {b.mode})"] if SANDBOX_ORDER[s.mode] > SANDBOX_ORDER[b.mode] else []
    why += ["sandbox.network on (configured: off)"] if s.network and not b.network else []
    why += ["sandbox.required off (configured: on)"] if b.required and not s.required else []
    why += [f"sandbox.approval {s.approval} (configured: never)"] if b.approval == "never" != s.approval else []
    for name in ("hidden", "env_deny"):
        if dropped := [x for x in getattr(b, name) if x not in getattr(s, name)]:
            why.append(f"sandbox.{name} without {', '.join(map(repr, dropped[:3]))}")
    if added := [x for x in s.env_allow if x not in b.env_allow]:
        why.append(f"sandbox.env_allow with {', '.join(map(repr, added[:3]))}")
    if b.memory_mb is not None and (s.memory_mb is None or s.memory_mb > b.memory_mb):
        why.append(f"sandbox.memory_mb {s.memory_mb or 'unlimited'} (configured: {b.memory_mb})")
    for name in ("max_processes", "max_open_files"):
        if getattr(s, name) > getattr(b, name):
            why.append(f"sandbox.{name} {getattr(s, name)} (configured: {getattr(b, name)})")
    for name, server in config.mcp.servers.items():  # a server runs on the host, outside any sandbox
        known = base.mcp.servers.get(name)
        if known is None or known.model_dump(exclude={"policy"}) != server.model_dump(exclude={"policy"}):
            why.append(f"mcp.servers.{name} (not the configured server: it would run on the host)")
        elif POLICIES[server.policy] > POLICIES[known.policy]:
            why.append(f"mcp.servers.{name}.policy {server.policy} (configured: {known.policy})")
    if config.refine.gate_taskset != base.refine.gate_taskset:
        why.append("refine.gate_taskset (a task set the daemon would load)")
    if config.project_instructions != base.project_instructions:
        why.append("project_instructions (files the host would read into the prompt)")
    return why


_SAVED_OVERRIDES = TypeAdapter(dict[str, Any])
"""`SessionMeta.overrides`, written as session.json writes it (pydantic's JSON encoder)."""


def as_saved(overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides as a restarted daemon reads them from session.json; refused unless the same."""
    try:
        saved = json.loads(_SAVED_OVERRIDES.dump_json(overrides))
    except (PydanticSerializationError, ValueError) as e:
        raise Refused("bad_config", f"the config cannot be saved in session.json: {e}") from None
    if saved != overrides:
        raise Refused("bad_config", "the config would not read back the same from session.json "
                      "(JSON has no NaN or infinity)")
    return saved


def _configured_base_url(cwd: Path) -> str | None:
    try:
        return load_config(cwd).model.base_url
    except ConfigError:
        return None
