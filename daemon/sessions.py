"""The daemon's sessions: each an agent `Session` plus what outlives it.

On disk, `$PRIME_AGENT_HOME/sessions/<id>/` holds `session.json` (what the daemon knows about the
session, rewritten atomically), `events.jsonl` (every event, see daemon.journal), the agent's own
`trajectory.jsonl` and `harness/`, and children under `sub-*/`. A session is *live* when its agent
session and kernel run in this process, *dormant* when only its files do (after a daemon restart):
a dormant session wakes, with a new kernel, on its next prompt.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from agent.config import Config, ConfigError, load_config
from agent.kernel import KernelPool
from agent.model import OpenAIModel
from agent.session import Session, new_session_id
from agent.trajectory import SessionRecord, finish_cut_turn, read_records
from agent.types import Event, EventType, Usage
from daemon.journal import EventJournal
from daemon.schemas import CreateSession, Interrupted, MessageAccepted, SessionInfo

log = logging.getLogger(__name__)
SCHEMA = 1
RESTARTED = "The daemon restarted"
SLEPT = "The session was idle and its kernel was stopped to free memory"


class ApiError(Exception):
    """A request the daemon refuses; becomes `{"error": {"code", "message"}}` with `status`."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class QueuedTurn(BaseModel):
    turn_id: str
    text: str


class SessionMeta(BaseModel):
    """`session.json`: written when the session is created and at every turn boundary."""

    schema_version: int = SCHEMA
    id: str
    cwd: str
    model: str
    base_url: str | None = None
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
    updated: float = 0.0
    """When the session was last prompted or finished a turn."""

    def save(self, directory: Path) -> None:
        self.updated = time.time()
        tmp = directory / "session.json.tmp"
        with open(tmp, "w") as f:
            f.write(self.model_dump_json(indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / "session.json")


class Subscriber:
    """One event-stream client: a bounded queue of (seq, JSON line); None ends the stream."""

    def __init__(self, limit: int):
        self.queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue(limit)
        self.dropped = False

    def end(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class ManagedSession:
    def __init__(self, manager: SessionManager, meta: SessionMeta, directory: Path):
        self.manager = manager
        self.meta = meta
        self.dir = directory
        self.journal = EventJournal(directory / "events.jsonl")
        self.session: Session | None = None
        self.model: OpenAIModel | None = None
        self._retired: list[OpenAIModel] = []
        """Models switched away from, closed with the session (background work may still use them)."""
        self.running: str | None = None
        """The turn the worker has taken up (waiting for a turn slot, waking, or running)."""
        self.subscribers: set[Subscriber] = set()
        self._worker: asyncio.Task | None = None
        self._waking = asyncio.Lock()
        self.last_active = time.monotonic()
        self._woken_because = RESTARTED
        """Why a dormant session is dormant, told to the model when it wakes."""
        self._cancelled_because = "interrupted before it began"
        """Why the worker was cancelled, for a turn it had not begun."""
        self.closed = False

    @property
    def id(self) -> str:
        return self.meta.id

    def info(self) -> SessionInfo:
        m = self.meta
        if self.session is not None and self.session.turn is not None:
            state = "running"
        elif self.running or self.meta.queued:
            state = "queued"
        else:
            state = "idle" if self.session is not None else "dormant"
        return SessionInfo(
            id=m.id, cwd=m.cwd, model=m.model, base_url=m.base_url, title=m.title, created=m.created, state=state,
            turns=m.turns, queued=len(m.queued), last_seq=self.journal.last_seq, usage=m.usage, dir=str(self.dir),
            harness_version=self.session.harness_version if self.session else None, updated=m.updated or m.created,
        )

    # --- events ------------------------------------------------------------------------------

    def emit(self, type: EventType, turn_id: str | None, **data: Any) -> None:
        """An event of the daemon's own (queueing, recovery), numbered in the session's sequence."""
        if self.session is not None:
            self.session.emit(type, turn_id, **data)
        else:
            self._on_event(Event(seq=self.journal.last_seq + 1, type=type, session_id=self.id, turn_id=turn_id, data=data))

    def _on_event(self, event: Event) -> None:
        line = event.model_dump_json()
        self.journal.append(event.seq, line)
        if event.type == "turn.started":
            self.meta.turns += 1
        elif event.type == "turn.finished":
            if self.meta.running_turn == event.turn_id:
                self.meta.running_turn = None
            self.meta.usage += Usage.model_validate(event.data.get("usage") or {})
            self.meta.save(self.dir)
            self.journal.sync()
        for sub in list(self.subscribers):
            try:
                sub.queue.put_nowait((event.seq, line))
            except asyncio.QueueFull:  # a client this far behind is dropped; it can resume from its last id
                log.warning("session %s: dropping an event-stream client %d events behind", self.id, sub.queue.qsize())
                sub.dropped = True
                self.unsubscribe(sub)
                sub.end()

    def subscribe(self, after: int) -> tuple[list[tuple[int, str]], Subscriber]:
        """The journal's events after `after`, and a subscriber for every later one: nothing is
        missed or repeated between the two (no await separates them)."""
        if self.manager.stopping:
            raise ApiError(503, "stopping", "the daemon is stopping; reconnect once it is back")
        if self.closed:
            raise ApiError(404, "not_found", f"session {self.id} was deleted")
        sub = Subscriber(self.manager.config.daemon.client_buffer)
        self.subscribers.add(sub)
        return self.journal.read_after(after), sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        self.last_active = time.monotonic()

    # --- lifecycle ---------------------------------------------------------------------------

    def config(self) -> Config:
        return load_config(Path(self.meta.cwd), self.meta.overrides)

    async def wake(self) -> Session:
        """The live agent session: resumed from its trajectory, on a new kernel, if it was dormant."""
        async with self._waking:
            if self.session is not None:
                return self.session
            if self.closed:
                raise ApiError(404, "not_found", f"session {self.id} was deleted")
            if self.manager.stopping:
                raise ApiError(503, "stopping", "the daemon is stopping")
            while self.manager.live() >= self.manager.config.daemon.max_sessions:  # re-checked after each await
                if not await self.manager.make_room():
                    raise ApiError(429, "too_many_sessions", f"{self.manager.live()} sessions are live and busy "
                                   "(daemon.max_sessions); delete one, or raise the limit")
            cwd = Path(self.meta.cwd)
            if not cwd.is_dir():
                raise ApiError(409, "cwd_missing", f"the session's directory {cwd} no longer exists")
            try:
                config = self.config()
            except ConfigError as e:
                raise ApiError(409, "bad_config", str(e)) from None
            trajectory = self.dir / "trajectory.jsonl"
            records = read_records(trajectory) if trajectory.is_file() else []
            model = OpenAIModel(config.model)
            session = Session(
                config, model, cwd=cwd, session_dir=self.dir, session_id=self.id, on_event=self._on_event,
                subagent_slots=self.manager.subagent_slots, kernel_pool=self.manager.pool,
                last_seq=self.journal.last_seq,
            )
            # Live from here: the session numbers every event (the daemon's own too), and counts
            # against max_sessions before the first await.
            self.session, self.model = session, model
            self.last_active = time.monotonic()
            try:
                if any(isinstance(r, SessionRecord) for r in records):
                    session.resume(records, self._woken_because)
                await session.start()
            except BaseException:
                self.session = self.model = None
                await session.close()
                await model.close()
                raise
            return session

    async def close(self, why: str = "the session was deleted") -> None:
        """Stop its turns, kernel and children; the files stay (trajectories are training data)."""
        self.closed = True
        await self.stop_turns(why, self.manager.config.kernel.interrupt_grace + 5)
        async with self._waking:
            if self.session is not None:
                await _close(self.session, [self.model, *self._retired])
            self.session = self.model = None
            self._retired = []
        for sub in list(self.subscribers):
            sub.end()
        self.subscribers.clear()
        self.journal.close()

    def busy(self) -> bool:
        """A turn running or queued, something waking it, or work of its own in the background (a
        refinement being planned, children still running)."""
        s = self.session
        return (self.running is not None or bool(self.meta.queued) or self._waking.locked()
                or (s is not None and (s.turn is not None or (s.refiner.task is not None and not s.refiner.task.done())
                                       or not all(t.done() for t in s.subagents.tasks.values()))))

    def idle(self) -> bool:
        """Live, not busy, and nobody following its events: the sweep may put it to sleep."""
        return self.session is not None and not self.busy() and not self.subscribers

    async def sleep(self) -> None:
        """Stop the kernel of an idle session; it stays listed (dormant) and wakes on its next prompt."""
        async with self._waking:
            if self.session is None:
                return
            session, models = self.session, [self.model, *self._retired]
            self._woken_because = SLEPT
            # Shielded: a cancelled caller (an interrupt of the turn that wanted the room) must not
            # leave a kernel running that nothing refers to any more.
            closing = asyncio.ensure_future(_close(session, models))
            try:
                await asyncio.shield(closing)
            finally:
                self.session = self.model = None
                self._retired = []
                if closing.done():
                    self.journal.close()  # reopened by the next event

    def recover(self) -> None:
        """After a crash: close the turn it cut (as interrupted) and the turns it left queued."""
        turn_id = self.meta.running_turn
        if turn_id is not None:
            why = f"{RESTARTED} while this turn ran; the turn was cut short"
            finished = finish_cut_turn(self.dir / "trajectory.jsonl", turn_id, why)
            seen = any(json.loads(line).get("turn_id") == turn_id
                       for _, line in self.journal.read_after(0) if '"turn.finished"' in line)
            if not seen:
                if finished is None:
                    self._never_ran(turn_id, f"{RESTARTED} before this turn began")
                else:
                    self.emit("turn.finished", turn_id, outcome=finished.outcome, answer=finished.answer,
                              error=finished.error, usage=finished.usage.model_dump(), duration=finished.duration,
                              steps=finished.steps, cells=finished.cells)
            records = read_records(self.dir / "trajectory.jsonl") if (self.dir / "trajectory.jsonl").is_file() else []
            self.meta.turns = sum(1 for r in records if r.kind == "turn_started")
            self.meta.running_turn = None
        for queued in self.meta.queued:
            self._never_ran(queued.turn_id, f"{RESTARTED} before this turn began")
        self.meta.queued = []
        self.meta.save(self.dir)

    async def update(self, title: str | None, model: str | None) -> None:
        """Rename the session, or switch its model (from the next turn on)."""
        if title is not None:
            self.meta.title = title
        if model is not None and model != self.meta.model:
            if self.session is not None and self.session.turn is not None:
                raise ApiError(409, "turn_running", "the model can change between turns; interrupt or wait")
            overrides = {**self.meta.overrides, "model": {**self.meta.overrides.get("model", {}), "name": model}}
            try:
                config = load_config(Path(self.meta.cwd), overrides)
            except ConfigError as e:
                raise ApiError(400, "bad_config", str(e)) from None
            if self.session is not None:
                if self.model is not None:  # a refinement or a child may still be using it: closed with the session
                    self._retired.append(self.model)
                self.model = OpenAIModel(config.model)
                self.session.use_model(self.model, config)
            self.meta.overrides, self.meta.model = overrides, model
        self.meta.save(self.dir)

    # --- turns -------------------------------------------------------------------------------

    def send(self, text: str, mode: str) -> MessageAccepted:
        if self.closed:
            raise ApiError(404, "not_found", f"session {self.id} was deleted")
        self.last_active = time.monotonic()
        if mode == "steer" and self.session is not None and self.session.turn is not None:
            self.session.steer(text)
            return MessageAccepted(turn_id=self.session.turn.id, mode=mode, queued=False)
        self.meta.assigned += 1
        turn_id = f"t{self.meta.assigned}"
        queued = self.running is not None or bool(self.meta.queued) or self.manager.turn_slots.locked()
        self.meta.queued.append(QueuedTurn(turn_id=turn_id, text=text))
        self.meta.save(self.dir)
        if queued:
            self.emit("turn.queued", turn_id, prompt=text, position=len(self.meta.queued))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work())
        # a steer with no turn running to steer is a prompt: say so
        return MessageAccepted(turn_id=turn_id, mode="prompt" if mode == "steer" else mode, queued=queued)

    async def interrupt(self, drop_queued: bool, turn_id: str | None = None) -> Interrupted:
        """Stop the running turn (or, with `turn_id`, that turn: running, or dropped from the queue)."""
        if turn_id is not None and turn_id != self.running:
            if not any(q.turn_id == turn_id for q in self.meta.queued):
                raise ApiError(409, "not_running", f"turn {turn_id} is neither running nor queued")
            self._drop([q for q in self.meta.queued if q.turn_id == turn_id], "dropped from the queue by an interrupt")
            return Interrupted(turn_id=None, dropped=[turn_id])
        dropped = [q.turn_id for q in self.meta.queued] if drop_queued else []
        if drop_queued:
            self._drop(self.meta.queued, "dropped from the queue by an interrupt")
        running = self.running
        if self.session is not None and self.session.turn is not None:
            await self.session.interrupt()
        elif running is not None and self._worker is not None:  # waiting for a turn slot, or waking
            self._cancelled_because = "interrupted before it began"
            self._worker.cancel()
        return Interrupted(turn_id=running, dropped=dropped)

    def _drop(self, turns: list[QueuedTurn], why: str) -> None:
        for q in list(turns):
            self.meta.queued.remove(q)
            self._never_ran(q.turn_id, why)
        self.meta.save(self.dir)

    def _never_ran(self, turn_id: str, why: str) -> None:
        self.emit("turn.finished", turn_id, outcome="interrupted", answer=None, error=why,
                  usage=Usage().model_dump(), duration=0.0, steps=0, cells=0)

    async def _work(self) -> None:
        """Run the queued prompts one after another, each in a daemon-wide turn slot."""
        while self.meta.queued and not self.closed and not self.manager.stopping:
            q = self.meta.queued.pop(0)
            self.running = self.meta.running_turn = q.turn_id
            self.meta.save(self.dir)
            began = False
            try:
                async with self.manager.turn_slots:
                    session = await self.wake()
                    if self.closed or self.manager.stopping:
                        self._never_ran(q.turn_id, "the daemon stopped before this turn began")
                        return
                    began = True
                    result = await session.prompt(q.text, q.turn_id)
                if session.steering:  # steering that came too late for its turn
                    late, session.steering = "\n\n".join(session.steering), []
                    if result.outcome == "interrupted":  # the user stopped the turn: do not start another
                        self.emit("note", q.turn_id, text=f"not delivered (the turn was interrupted): {late}")
                    else:
                        self.send(late, "prompt")
            except asyncio.CancelledError:
                if not began:
                    self._never_ran(q.turn_id, self._cancelled_because)
                if self.closed or self.manager.stopping:
                    raise
                if self.meta.queued:  # an interrupt of a waiting turn: the queue goes on
                    self._worker = asyncio.create_task(self._work())
                return
            except ApiError as e:
                self._never_ran(q.turn_id, e.message)
            except Exception as e:  # the session could not wake (kernel, config): this turn fails, not the daemon
                log.exception("session %s: turn %s could not run", self.id, q.turn_id)
                self._never_ran(q.turn_id, f"the session could not start: {type(e).__name__}: {e}")
            finally:
                self.running = None
                self.last_active = time.monotonic()
                if self.meta.running_turn == q.turn_id:
                    self.meta.running_turn = None
                    self.meta.save(self.dir)

    async def stop_turns(self, why: str, timeout: float) -> None:
        """Drop what is queued, interrupt what runs, and wait (up to `timeout`) for it to be recorded."""
        if self.meta.queued:
            self._drop(self.meta.queued, why)
        worker = self._worker
        if worker is None or worker.done():
            return
        if self.session is not None and self.session.turn is not None:
            await self.session.interrupt()
        else:  # waiting for a turn slot, or waking
            self._cancelled_because = why
            worker.cancel()
        await asyncio.wait([worker], timeout=timeout)
        if not worker.done():
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)


class SessionManager:
    """Every session of the daemon, the warm kernel pool and the daemon-wide limits."""

    def __init__(self, config: Config, root: Path):
        self.config = config
        self.root = root
        self.sessions: dict[str, ManagedSession] = {}
        self.pool = KernelPool(root / "run" / "pool", config.daemon.pool_size, config.kernel)
        self.turn_slots = asyncio.Semaphore(config.daemon.max_running_turns)
        self.subagent_slots: dict[int, asyncio.Semaphore] = {}
        self.stopping = False
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        """Load every session on disk (closing turns a crash cut) and fill the kernel pool."""
        for stale in (self.root / "run" / "pool").glob("*"):  # a killed daemon's pooled kernels died with it
            shutil.rmtree(stale, ignore_errors=True)
        for meta_file in sorted((self.root / "sessions").glob("*/session.json")):
            try:
                meta = SessionMeta.model_validate_json(meta_file.read_text())
            except (ValidationError, OSError) as e:
                log.error("skipping %s: %s", meta_file, e)
                continue
            if meta.deleted:
                continue
            managed = ManagedSession(self, meta, meta_file.parent)
            try:
                managed.recover()
            except Exception:
                log.exception("session %s could not be recovered", meta.id)
            self.sessions[meta.id] = managed
        self.pool.fill()
        self._sweeper = asyncio.create_task(self.sweep(min(30.0, self.config.daemon.idle_timeout / 2)))

    def live(self) -> int:
        return sum(1 for s in self.sessions.values() if s.session is not None)

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
        managed = self.sessions.get(session_id)
        if managed is None:
            raise ApiError(404, "not_found", f"no session {session_id!r}")
        return managed

    async def create(self, req: CreateSession) -> ManagedSession:
        if self.stopping:
            raise ApiError(503, "stopping", "the daemon is stopping")
        cwd = Path(req.cwd)
        if not cwd.is_absolute():
            raise ApiError(400, "bad_cwd", f"cwd must be an absolute path, not {req.cwd!r}")
        if not cwd.is_dir():
            raise ApiError(400, "bad_cwd", f"cwd {req.cwd!r} is not a directory")
        if req.config and "daemon" in req.config:
            raise ApiError(400, "bad_config", "[daemon] settings are the daemon's own, not a session's")
        overrides: dict[str, Any] = copy.deepcopy(req.config or {})
        model = overrides.setdefault("model", {})
        if not isinstance(model, dict):
            raise ApiError(400, "bad_config", "config.model must be a table of model settings")
        model.update({k: v for k, v in (("name", req.model), ("base_url", req.base_url)) if v})
        if model.get("base_url") and "api_key" not in model \
                and str(model["base_url"]).rstrip("/") != (_configured_base_url(cwd) or "").rstrip("/"):
            model["api_key"] = None  # the daemon's key goes only where it was configured to go
        if req.budget is not None:
            overrides["budget"] = req.budget.model_dump(exclude_unset=True)
        try:
            config = load_config(cwd, overrides)
        except ConfigError as e:
            raise ApiError(400, "bad_config", str(e)) from None
        if not config.model.configured:
            raise ApiError(400, "no_model", "no model configured: pass `model` and `base_url`, or set them in "
                           "the daemon's environment (PRIME_AGENT_MODEL, OPENAI_BASE_URL, OPENAI_API_KEY) or config.toml")
        session_id = new_session_id()
        directory = self.root / "sessions" / session_id
        directory.mkdir(mode=0o700, parents=True)
        meta = SessionMeta(id=session_id, cwd=str(cwd.resolve()), model=config.model.name,
                           base_url=config.model.base_url, title=req.title, overrides=overrides, created=time.time())
        meta.save(directory)
        managed = ManagedSession(self, meta, directory)
        self.sessions[session_id] = managed
        try:
            await managed.wake()
        except BaseException:
            self.sessions.pop(session_id, None)
            meta.deleted = True
            meta.save(directory)
            await managed.close()
            raise
        return managed

    async def delete(self, session_id: str) -> None:
        managed = self.get(session_id)
        del self.sessions[session_id]
        managed.meta.deleted = True
        managed.meta.save(managed.dir)
        await managed.close()

    async def stop(self, timeout: float) -> None:
        """Interrupt every turn and wait (up to `timeout`) for each to be recorded; then close all."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        why = "the daemon stopped before this turn began"
        await asyncio.gather(*(s.stop_turns(why, timeout) for s in self.sessions.values()))
        await asyncio.gather(*(s.close(why) for s in self.sessions.values()), return_exceptions=True)
        await self.pool.close()


async def _close(session: Session, models: list[OpenAIModel | None]) -> None:
    await session.close()
    for model in models:
        if model is not None:
            await model.close()


def _configured_base_url(cwd: Path) -> str | None:
    try:
        return load_config(cwd).model.base_url
    except ConfigError:
        return None
