"""A daemon session's goal (agent/goals.py): pursued in the background, its turns queued like any
prompt, its state in session.json at every step, so a restart resumes it while its budget has room."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from agent import events as ev
from agent.goals import CheckResult, GoalSpec, GoalState, finish, pursue
from agent.layout import SessionLayout
from agent.session import Session
from agent.trajectory import Record, TurnFinishedRecord, TurnStartedRecord, read_records
from agent.types import TurnResult
from daemon.errors import Refused
from daemon.meta import SessionMeta
from daemon.turns import TurnQueue

log = logging.getLogger(__name__)


class Owner(Protocol):
    """What a goal needs of its daemon session (daemon.managed.ManagedSession)."""

    id: str
    meta: SessionMeta
    layout: SessionLayout
    session: Session | None
    queue: TurnQueue

    def save(self) -> None: ...
    def emit(self, event: ev.Event) -> None: ...
    async def wake(self) -> Session: ...


class DaemonGoal:
    """The `GoalHost` of a daemon session: turns go through its queue, events into its journal."""

    def __init__(self, host: Owner):
        self.host = host
        self.task: asyncio.Task | None = None
        self.waiting = False
        """Resumed, and waiting for the daemon's cap on running goals to have room."""

    @property
    def state(self) -> GoalState | None:
        return self.host.meta.goal

    def running(self) -> bool:
        """Pursued, or waiting to be resumed: either way it counts against `daemon.max_goals`."""
        return self.task is not None and not self.task.done()

    def pursued(self) -> bool:
        return self.running() and not self.waiting

    def start(self, spec: GoalSpec) -> GoalState:
        if self.running():
            raise Refused("goal_running", "a goal is already running in this session: stop it first (DELETE .../goal)")
        state = GoalState.new(spec)
        self._save(state)
        self.task = asyncio.create_task(self._run(state))
        return state

    def resume(self, room: Callable[[], bool]) -> None:
        """At the daemon's start: a goal a crash (or a stop) cut goes on if its budget has room, and says
        so; it waits first while `room()` says the daemon's cap on running goals is reached (the
        daemon resumes its goals oldest first)."""
        state = self.state
        if state is None or state.state != "running":
            return
        self._count_cut_turns(state)
        if (why := state.exhausted()) is not None:
            finish(state, self, "exhausted", f"the daemon restarted, and the goal {why}", self._save)
            return
        self.waiting = True
        self.task = asyncio.create_task(self._resume(state, room))

    async def _resume(self, state: GoalState, room: Callable[[], bool]) -> None:
        if not room():
            self.emit(ev.Note(text=f"goal {state.id} waits to resume: the daemon runs as many goals as it may "
                                   "(daemon.max_goals)"))
            while not room() and not state.stop_requested:
                await asyncio.sleep(0.2)
        self.waiting = False
        if state.stop_requested:
            finish(state, self, "stopped", "stopped by request while it waited to resume", self._save)
            return
        if (why := state.exhausted()) is not None:
            finish(state, self, "exhausted", f"the goal {why} while it waited to resume", self._save)
            return
        state.reason = "resumed after the daemon restarted; budget left: " + (
            ", ".join(f"{v:g} {k}" for k, v in state.budget_left().items()) or "no limit set")
        self.emit(ev.Note(text=f"goal {state.id} {state.reason}"))
        self._save(state)
        await self._run(state)

    def _count_cut_turns(self, state: GoalState) -> None:
        """The goal's turns the crash cut (closed as interrupted by the recovery) count against its budget."""
        path = self.host.layout.trajectory
        records = read_records(path, []) if path.is_file() else []
        ours = {r.turn_id for r in records if isinstance(r, TurnStartedRecord) and r.goal_id == state.id}
        for r in records:
            if isinstance(r, TurnFinishedRecord) and r.turn_id in ours and r.turn_id not in state.turn_ids:
                state.turns += 1
                state.turn_ids.append(r.turn_id)
                state.usage += r.usage

    def stop(self) -> GoalState:
        """Stop after the current turn (an interrupt stops it now)."""
        state = self.state
        if state is None:
            raise Refused("no_goal", f"session {self.host.id} has no goal")
        if state.state == "running":
            state.stop_requested = True
            self._save(state)
        return state

    async def close(self) -> None:
        """Stop pursuing without ending the goal: it stays `running` on disk, for the next daemon to resume."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self, state: GoalState) -> None:
        try:
            await self.host.wake()  # its records go into the session's trajectory from the start
        except Refused as e:
            finish(state, self, "error", f"the session could not wake: {e.message}", self._save)
            return
        await pursue(state, self, self._save)

    def _save(self, state: GoalState) -> None:
        self.host.meta.goal = state
        try:
            self.host.save()
        except Refused as e:  # the disk is full: the next save writes it
            log.error("session %s: the goal's state could not be saved: %s", self.host.id, e.message)

    # --- GoalHost ------------------------------------------------------------------------------

    async def check(self, command: str, timeout: float) -> CheckResult:
        session = await self.host.wake()  # asleep between turns: the check runs in its sandbox all the same
        return await session.check(command, timeout)

    async def goal_turn(self, text: str, goal_id: str, continuation: int) -> TurnResult:
        return await self.host.queue.run(text, goal_id, continuation)

    async def interrupt(self) -> None:
        await self.host.queue.interrupt(False)

    def subagents_running(self) -> bool:
        session = self.host.session
        return session is not None and session.subagents_running()

    def emit(self, event: ev.Event) -> None:
        self.host.emit(event)

    def record(self, record: Record) -> None:
        if self.host.session is not None:  # else the journal's goal.* events are the record
            self.host.session.record(record)
