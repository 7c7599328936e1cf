"""A daemon session's turn queue: prompts run one after another, each in a daemon-wide turn slot.

The queue lives in `session.json` (`queued`, `running_turn`), so a restart knows what a crash
cut and what never ran; every turn that never runs still gets its `turn.finished`, saying why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from typing import Protocol

from agent import events as ev
from agent.layout import SessionLayout
from agent.notebook import Notebook
from agent.session import Session
from agent.trajectory import begun, finish_cut_turn, read_records
from agent.types import TurnOutcome, TurnResult
from daemon.errors import Refused
from daemon.journal import EventJournal
from daemon.meta import QueuedTurn, SessionMeta
from daemon.schemas import Interrupted, MessageAccepted

log = logging.getLogger(__name__)


class Host(Protocol):
    """What the queue needs of its daemon session (daemon.managed.ManagedSession)."""

    id: str
    meta: SessionMeta
    layout: SessionLayout
    journal: EventJournal
    session: Session | None
    closed: bool
    turn_slots: asyncio.Semaphore
    last_active: float

    def stopping(self) -> bool: ...
    def save(self) -> None: ...
    def emit(self, event: ev.Event) -> None: ...
    async def wake(self) -> Session: ...


class TurnQueue:
    def __init__(self, host: Host):
        self.host = host
        self.running: str | None = None
        """The turn the worker has taken up (waiting for a turn slot, waking, or running)."""
        self.worker: asyncio.Task | None = None
        self.cancelled_because = "interrupted before it began"
        """Why the worker was cancelled, for a turn it had not begun."""
        self.waiting: dict[str, asyncio.Future[TurnResult]] = {}
        """Turns someone waits for (a goal's, a heartbeat's), by id: resolved with the result (an interrupted one
        for a turn that never ran)."""

    def busy(self) -> bool:
        return self.running is not None or bool(self.host.meta.queued)

    async def run(self, text: str, goal_id: str, continuation: int) -> TurnResult:
        """A goal's turn, queued like any prompt (a user's prompts and a goal's turns never overlap);
        returns when it ends."""
        return await self.watch(self.send(text, "prompt", goal=(goal_id, continuation)).turn_id)

    def watch(self, turn_id: str) -> Awaitable[TurnResult]:
        """The result of the queued turn `turn_id` once it ends (or never runs); call before any await after `send`."""
        future = self.waiting[turn_id] = asyncio.get_running_loop().create_future()
        return self._ended(turn_id, future)

    async def _ended(self, turn_id: str, future: asyncio.Future[TurnResult]) -> TurnResult:
        try:
            return await future
        finally:
            self.waiting.pop(turn_id, None)

    def send(self, text: str, mode: str, goal: tuple[str, int] | None = None,
             notebook: Notebook | None = None) -> MessageAccepted:
        h, meta = self.host, self.host.meta
        if h.closed:
            raise Refused("not_found", f"session {h.id} was deleted")
        if notebook is not None and mode != "prompt":
            raise Refused("bad_request", "a notebook's cells are a turn of their own: send them with mode prompt")
        h.last_active = time.monotonic()
        session = h.session
        if mode == "steer" and session is not None and session.turn is not None:
            session.steer(text)
            return MessageAccepted(turn_id=session.turn.id, mode=mode, queued=False)
        meta.assigned += 1
        meta.updated = time.time()  # prompted: the session last used is this one
        turn_id = f"t{meta.assigned}"
        queued = self.running is not None or bool(meta.queued) or h.turn_slots.locked()
        goal_id, continuation = goal or (None, None)
        meta.queued.append(QueuedTurn(turn_id=turn_id, text=text, goal_id=goal_id, continuation=continuation,
                                      notebook=notebook))
        h.save()
        if queued:
            h.emit(ev.TurnQueued(turn_id=turn_id, prompt=text, position=len(meta.queued)))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._work())
        # a steer with no turn running to steer is a prompt: say so
        return MessageAccepted(turn_id=turn_id, mode="prompt" if mode == "steer" else mode, queued=queued)

    async def interrupt(self, drop_queued: bool, turn_id: str | None = None) -> Interrupted:
        """Stop the running turn (or, with `turn_id`, that turn: running, or dropped from the queue)."""
        meta = self.host.meta
        if turn_id is not None and turn_id != self.running:
            if not any(q.turn_id == turn_id for q in meta.queued):
                raise Refused("not_running", f"turn {turn_id} is neither running nor queued")
            self.drop([q for q in meta.queued if q.turn_id == turn_id], "dropped from the queue by an interrupt")
            return Interrupted(turn_id=None, dropped=[turn_id])
        dropped = [q.turn_id for q in meta.queued] if drop_queued else []
        if drop_queued:
            self.drop(meta.queued, "dropped from the queue by an interrupt")
        running = self.running
        session = self.host.session
        if session is not None and session.turn is not None:
            await session.interrupt()
        elif running is not None and self.worker is not None:  # waiting for a turn slot, or waking
            self.cancelled_because = "interrupted before it began"
            self.worker.cancel()
        return Interrupted(turn_id=running, dropped=dropped)

    def drop(self, turns: list[QueuedTurn], why: str) -> None:
        for q in list(turns):
            self.host.meta.queued.remove(q)
            self.never_ran(q.turn_id, why)
        self.host.save()

    def recover(self, ended: str, restarted: str) -> None:
        """After a crash (`ended` says what ended): close the turn it cut, as interrupted, and the turns it left
        queued (`restarted` says why they never ran)."""
        h, meta = self.host, self.host.meta
        turn_id = meta.running_turn
        if turn_id is not None:
            finished = finish_cut_turn(h.layout.trajectory, turn_id, f"{ended} while this turn ran; the turn was cut short")
            seen = any(json.loads(line).get("turn_id") == turn_id
                       for _, line in h.journal.read_after(0) if '"turn.finished"' in line)
            if not seen:
                if finished is None:
                    self.never_ran(turn_id, f"{ended} before this turn began")
                else:
                    h.emit(ev.TurnFinished(turn_id=turn_id, **{f: getattr(finished, f) for f in TurnOutcome.model_fields}))
            records = read_records(h.layout.trajectory, []) if h.layout.trajectory.is_file() else []
            meta.turns = len(begun(records))
            meta.running_turn = None
        for queued in meta.queued:
            self.never_ran(queued.turn_id, f"{restarted} before this turn began")
        meta.queued = []

    def never_ran(self, turn_id: str, why: str) -> None:
        self.host.emit(ev.TurnFinished(turn_id=turn_id, outcome="interrupted", error=why))
        self._resolve(TurnResult(turn_id=turn_id, outcome="interrupted", error=why))

    def _resolve(self, result: TurnResult) -> None:
        future = self.waiting.get(result.turn_id)
        if future is not None and not future.done():
            future.set_result(result)

    async def _work(self) -> None:
        h, meta = self.host, self.host.meta
        while meta.queued and not h.closed and not h.stopping():
            q = meta.queued.pop(0)
            self.running = meta.running_turn = q.turn_id
            h.save()
            began = False
            try:
                async with h.turn_slots:
                    session = await h.wake()
                    if h.closed or h.stopping():
                        self.never_ran(q.turn_id, "the daemon stopped before this turn began")
                        return
                    began = True
                    goal = (q.goal_id, q.continuation or 0) if q.goal_id else None
                    result = await session.prompt(q.text, q.turn_id, goal=goal, notebook=q.notebook)
                    self._resolve(result)
                if late := "\n\n".join(session.take_steering()):  # steering that came too late for its turn
                    if result.outcome == "interrupted":  # the user stopped the turn: handed back, not sent
                        h.emit(ev.SteerReturned(turn_id=q.turn_id, text=late))
                    else:
                        self.send(late, "prompt")
            except asyncio.CancelledError:
                if not began:
                    self.never_ran(q.turn_id, self.cancelled_because)
                if h.closed or h.stopping():
                    raise
                if meta.queued:  # an interrupt of a waiting turn: the queue goes on
                    self.worker = asyncio.create_task(self._work())
                return
            except Refused as e:
                self.never_ran(q.turn_id, e.message)
            except Exception as e:  # the session could not wake (kernel, config): this turn fails, not the daemon
                log.exception("session %s: turn %s could not run", h.id, q.turn_id)
                self.never_ran(q.turn_id, f"the session could not start: {type(e).__name__}: {e}")
            finally:
                self._resolve(TurnResult(turn_id=q.turn_id, outcome="interrupted", error="the turn was cut short"))
                self.running = None
                h.last_active = time.monotonic()
                if meta.running_turn == q.turn_id:
                    meta.running_turn = None
                    try:
                        h.save()
                    except Refused as e:  # the disk is full: the next save writes it; a restart knows the turn ended
                        log.error("session %s: %s", h.id, e.message)

    async def stop(self, why: str, timeout: float) -> None:
        """Drop what is queued, interrupt what runs, and wait (up to `timeout`) for it to be recorded."""
        if self.host.meta.queued:
            self.drop(self.host.meta.queued, why)
        worker = self.worker
        if worker is None or worker.done():
            return
        session = self.host.session
        if session is not None and session.turn is not None:
            await session.interrupt()
        else:  # waiting for a turn slot, or waking
            self.cancelled_because = why
            worker.cancel()
        await asyncio.wait([worker], timeout=timeout)
        if not worker.done():
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
