"""One agent session: its kernel, host bridge, model context, trajectory and events.

The session owns resources and keeps the record; what a turn does is in agent/loop.py.

    async with Session(config, model, cwd=Path(".")) as session:
        result = await session.prompt("fix the failing test")
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent import loop
from agent.bridge import BridgeServer
from agent.config import Config, home, project_root
from agent.harness import SessionHarness, scope_roots
from agent.kernel import Kernel, KernelPool, KernelState
from agent.model import Model
from agent.prompt import system_prompt
from agent.refine import SessionRefiner
from agent.runtime import ENV_PATH, ENV_SESSION_DIR, ENV_SKILLS, ENV_TOKEN
from agent.subagents import Subagents
from agent.trajectory import (
    MessageRecord,
    Record,
    ResumedRecord,
    SessionRecord,
    SystemPromptRecord,
    TrajectoryWriter,
    TurnFinished,
    TurnStarted,
    _Record,
    contexts,
    turn_starts,
)
from agent.types import Event, EventType, Message, Outcome, Usage
from harness_store.store import Change, HarnessStore
from harness_store.watch import HarnessWatcher

Listener = Callable[[Event], None]
log = logging.getLogger(__name__)


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


@dataclass
class Turn:
    id: str
    prompt: str
    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    cells: int = 0
    usage: Usage = field(default_factory=Usage)
    final: str | None = None
    """Set by `final(answer)` from the kernel."""
    interrupted: bool = False
    compacted: bool = False


@dataclass
class TurnResult:
    turn_id: str
    outcome: Outcome
    answer: str | None
    error: str | None
    usage: Usage
    duration: float
    steps: int
    cells: int


class Session:
    def __init__(
        self,
        config: Config,
        model: Model,
        *,
        cwd: Path,
        session_dir: Path | None = None,
        session_id: str | None = None,
        on_event: Listener | None = None,
        parent: Session | None = None,
        instructions: str = "",
        subagent_slots: dict[int, asyncio.Semaphore] | None = None,
        harness_roots: dict | None = None,
        kernel_pool: KernelPool | None = None,
        last_seq: int = 0,
    ):
        """`parent` makes this a subagent; `instructions` follow the base prompt; `subagent_slots`
        holds the per-process limits on running children, one pool per depth (share one dict across
        the sessions of a process);
        `harness_roots` replaces the usual user/project/session scopes (the refiner's gate);
        `kernel_pool` supplies kernels started ahead of time (the daemon's, shared with subagents);
        events are numbered after `last_seq` (a daemon's journal goes on across processes)."""
        self.id = session_id or new_session_id()
        self.dir = session_dir or home() / "sessions" / self.id
        self.cwd = cwd.resolve()
        self.config = config
        self.model = model
        self.listeners: list[Listener] = [on_event] if on_event else []
        self.messages: list[Message] = []
        """The model's context, as it will be sent."""
        self.turn_starts: list[int] = []
        """Index in `messages` where each turn's prompt stands."""
        self.usage = Usage()
        self.turns = 0
        """Turns begun so far (turn ids are t1, t2, ... and never repeat)."""
        self.turn: Turn | None = None
        self.last_result: TurnResult | None = None
        self.context_tokens = 0
        """Prompt plus completion tokens of the last model call (the server's count)."""
        self.context_mark = 0
        """len(messages) when `context_tokens` was measured."""
        self.steering: list[str] = []
        self.parent = parent
        self.depth = parent.depth + 1 if parent else 0
        self.subagent_name = self.id.rsplit(".", 1)[-1] if parent else None
        self.instructions = instructions
        self.inbox: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        """Messages from the parent or children: delivered at the next model call, or by `recv`."""
        slots = subagent_slots if subagent_slots is not None else (parent.subagents.process_slots if parent else {})
        self.subagents = Subagents(self, slots)
        self.harness = SessionHarness(harness_roots or scope_roots(home(), project_root(self.cwd), self.dir), self.id)
        self.refiner = SessionRefiner(self)
        self.harness_version: str | None = None
        """The harness in force in the system prompt: each scope's commit."""
        self.bridge = BridgeServer(
            self.dir,
            {"final": self._final, "note": self._note, "ping": self._ping, "refine.request": self._refine,
             **self.harness.handlers(), **self.subagents.handlers()},
        )
        self._watcher: HarnessWatcher | None = None
        self.kernel = Kernel(self.cwd, self.dir, config.kernel, env={})
        self.kernel_pool = kernel_pool if kernel_pool is not None else (parent.kernel_pool if parent else None)
        self.compact_requested = False
        """Compact at the next model call, whatever the context's size (a user's `/compact`)."""
        self.notices: list[str] = []
        """Told to the model at the start of the next turn (e.g. that its kernel is new)."""
        self._resumed: str | None = None
        """Why this session was resumed from its trajectory, when it was."""
        self._seq = last_seq
        self._trajectory: TrajectoryWriter | None = None
        self._task: asyncio.Task | None = None

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.close()  # a session that could not start leaves no kernel, socket or file behind
            raise

    async def _start(self) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._trajectory = TrajectoryWriter(self.dir / "trajectory.jsonl")
        await self.bridge.start()
        self.kernel.env = {
            ENV_PATH: str(self.bridge.path),
            ENV_TOKEN: self.bridge.token,
            ENV_SKILLS: os.pathsep.join(self.harness.skill_dirs()),
            ENV_SESSION_DIR: str(self.dir),
            "PRIME_AGENT_SESSION": self.id,
        }
        if self._resumed is not None:
            self.record(ResumedRecord(reason=self._resumed, harness_version=self.harness_version))
            self._close_open_tool_calls()
        else:
            self._record_start()
        self._watch_harness()
        await self.kernel.start(self.kernel_pool)
        if self._resumed is not None:
            self.emit("session.resumed", None, reason=self._resumed, turns=self.turns)
        else:
            self.emit("session.started", None, dir=str(self.dir), cwd=str(self.cwd), model=self.model.name)

    def _record_start(self) -> None:
        self.harness_version = self.harness.view.version()
        self.record(
            SessionRecord(
                session_id=self.id,
                cwd=str(self.cwd),
                model=self.model.name,
                action_format=self.model.action_format,
                harness_version=self.harness_version,
                parent=self.parent.id if self.parent else None,
                config=self.config.model_dump(mode="json", exclude={"model": {"api_key"}}),
            )
        )
        self.append(Message(role="system", content=self._system_prompt()), None)

    def resume(self, records: list[Record], reason: str) -> None:
        """Before `start`: take up a session from its trajectory in a new process.

        The model's context, turn count, usage and last outcome come back; the kernel cannot (its
        namespace died with the old process), so the model is told at its next turn. A turn the old
        process never finished must already be closed (`finish_cut_turn`).
        """
        conversations = list(contexts(records))
        self.messages = conversations[-1] if conversations else []
        self.turn_starts = turn_starts(records)
        self.harness_version = next(
            (r.harness_version for r in reversed(records) if isinstance(r, SystemPromptRecord | SessionRecord)), None
        )
        for r in records:
            if isinstance(r, TurnStarted):
                self.turns += 1
            elif isinstance(r, TurnFinished):
                self.usage += r.usage
                self.last_result = TurnResult(r.turn_id, r.outcome, r.answer, r.error, r.usage, r.duration, r.steps, r.cells)
        self.subagents.interrupt_orphans(reason)
        self._resumed = reason
        self.notices.append(f"[{reason}. This session goes on in a new kernel: every variable, import and "
                            "running subagent from before is gone; files on disk are as they were.]")

    def _close_open_tool_calls(self) -> None:
        """Answer tool calls the old process never answered: a model API refuses a context without."""
        answered = {m.tool_call_id for m in self.messages if m.role == "tool"}
        last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
        for call in last.tool_calls if last else []:
            if call.id not in answered:
                self.append(Message(role="tool", tool_call_id=call.id,
                                    content="[lost: the session's process stopped while this cell ran]"), None)

    async def close(self) -> None:
        if self.refiner.task is not None and not self.refiner.task.done():
            self.refiner.task.cancel()
            await asyncio.gather(self.refiner.task, return_exceptions=True)
        await self.subagents.close()
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self.harness.close()
        await self.kernel.shutdown()
        await self.bridge.close()
        if self._trajectory is not None:
            self._trajectory.close()

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- what a client does ----------------------------------------------------------------

    async def prompt(self, text: str, turn_id: str | None = None) -> TurnResult:
        """Run one turn to its end; never raises for model, kernel or budget failures.
        `turn_id` names the turn when a client numbered it in advance (the daemon's queue)."""
        if self.turn is not None:
            raise RuntimeError("a turn is already running in this session; steer it or wait")
        self._task = asyncio.current_task()
        try:
            return await loop.run_turn(self, text, turn_id)
        finally:
            self._task = None

    def steer(self, text: str) -> None:
        """Queue a message for the running turn; it reaches the model at its next call."""
        self.steering.append(text)

    async def interrupt(self) -> None:
        """Stop the running turn: interrupt the running cell (kernel state kept), or the model call."""
        turn = self.turn
        if turn is None:
            return
        turn.interrupted = True
        if self.kernel.state is KernelState.BUSY:
            await self.kernel.interrupt()
        elif self.kernel.state is KernelState.IDLE and self._task is not None:
            self._task.cancel()  # waiting on the model: stop now
        # starting or restarting: the loop stops at its next step, with the kernel whole

    # --- record keeping (used by the loop) ---------------------------------------------------

    def emit(self, type: EventType, turn_id: str | None, **data: object) -> None:
        self._seq += 1
        event = Event(seq=self._seq, type=type, session_id=self.id, turn_id=turn_id, data=data)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:  # a client that cannot take events must not break the session
                log.exception("event listener failed on %s", type)

    def record(self, record: _Record) -> None:
        assert self._trajectory is not None, "session not started"
        self._trajectory.append(record)

    def append(self, message: Message, turn: Turn | None) -> None:
        self.messages.append(message)
        self.record(MessageRecord(turn_id=turn.id if turn else None, message=message))

    def begin_turn(self, prompt: str, turn_id: str | None = None) -> Turn:
        self.turns += 1
        turn = Turn(id=turn_id or f"t{self.turns}", prompt=prompt)
        self.turn = turn
        self.record(TurnStarted(turn_id=turn.id, prompt=prompt))
        self.emit("turn.started", turn.id, prompt=prompt)
        try:
            self.refiner.at_boundary()
            self.reload_harness(turn)
        except Exception as e:  # a broken harness must not wedge the session: keep the prompt in force
            log.exception("harness reload failed")
            self.emit("error", turn.id, message=f"the harness could not be reloaded ({type(e).__name__}: {e}); "
                                               "the previous system prompt stays in force")
        notes = self.notices
        self.notices = []
        last = self.last_result
        if last is not None and last.outcome != "completed":
            notes.insert(0, f"[Your previous turn ended early ({last.outcome}): {last.error}]")
        text = "\n\n".join([*notes, prompt])
        self.turn_starts.append(len(self.messages))
        self.append(Message(role="user", content=text), turn)
        return turn

    def end_turn(self, turn: Turn, outcome: Outcome, answer: str | None, error: str | None) -> TurnResult:
        result = TurnResult(
            turn_id=turn.id,
            outcome=outcome,
            answer=answer,
            error=error,
            usage=turn.usage,
            duration=time.monotonic() - turn.started,
            steps=turn.steps,
            cells=turn.cells,
        )
        self.record(
            TurnFinished(
                turn_id=turn.id, outcome=outcome, answer=answer, error=error, usage=turn.usage,
                duration=result.duration, steps=turn.steps, cells=turn.cells,
            )
        )
        self.turn = None
        self.last_result = result
        self.emit(
            "turn.finished", turn.id, outcome=outcome, answer=answer, error=error,
            usage=turn.usage.model_dump(), duration=result.duration, steps=turn.steps, cells=turn.cells,
        )
        # The turn boundary: a refinement planned meanwhile lands now, in force from the next call.
        try:
            if outcome == "interrupted":
                self.refiner.invalidate("an interrupt")
            self.refiner.at_boundary()
            self.refiner.after_turn(turn, turn.compacted)
        except Exception as e:
            log.exception("refinement at the turn boundary failed")
            self.emit("error", turn.id, message=f"a refinement could not be applied: {type(e).__name__}: {e}")
        assert self._trajectory is not None
        self._trajectory.sync()
        return result

    def use_model(self, model: Model, config: Config) -> None:
        """Switch the model (between turns); the refiner plans with the new one too."""
        self.model, self.config = model, config
        self.refiner.use_model(model)

    # --- the harness -------------------------------------------------------------------------

    def _system_prompt(self) -> str:
        return system_prompt(self.config, self.cwd, self.harness.view.render(), self.instructions)

    def reload_harness(self, turn: Turn) -> None:
        """At a turn boundary: if the harness changed, rebuild the system prompt around it."""
        version = self.harness.view.version()
        if version == self.harness_version:
            return
        content = self._system_prompt()
        self.harness_version = version
        if content == self.messages[0].content:
            return
        self.messages[0] = Message(role="system", content=content)
        self.record(SystemPromptRecord(turn_id=turn.id, content=content, harness_version=version))
        self.emit("harness.reloaded", turn.id, harness_version=version)

    def _watch_harness(self) -> None:
        """Commit a person's own edits of existing scopes as they happen (see harness_store.watch)."""
        existing = [s for s in self.harness.stores.values() if (s.root / ".git").is_dir()]
        if not existing:
            return
        loop = asyncio.get_running_loop()

        def on_edit(store: HarnessStore, change: Change | None, problems: list[str]) -> None:
            data = {"scope": store.scope, "entries": change.entries if change else [], "problems": problems}
            loop.call_soon_threadsafe(lambda: self.emit("harness.edited", self.turn.id if self.turn else None, **data))

        self._watcher = HarnessWatcher(existing, on_edit)
        self._watcher.start()

    # --- host bridge handlers (called from code in the kernel) -------------------------------

    async def _final(self, answer: str) -> None:
        if self.turn is None:
            raise RuntimeError("final() ends a turn, and no turn is running")
        self.turn.final = answer

    def rollback(self, ref: str, scope: str, to: bool = False) -> str:
        """Roll the harness back (one change, or `to` a whole earlier state); in force next turn."""
        store = self.harness.store(scope)
        change = store.rollback_to(ref, session=self.id) if to else store.rollback(ref, session=self.id)
        self.refiner.invalidate("a rollback")
        self.emit("refinement.rolled_back", self.turn.id if self.turn else None, ref=ref, scope=scope,
                  id=change.refinement_id, entries=change.entries)
        return change.refinement_id

    async def _refine(self, instructions: str | None = None) -> str:
        return self.refiner.request(instructions, trigger="explicit")

    async def _ping(self) -> str:
        """A no-op round trip: a health check for the bridge, and what bench/kernel.py times."""
        return "pong"

    async def _note(self, text: str) -> None:
        self.emit("note", self.turn.id if self.turn else None, text=text)
