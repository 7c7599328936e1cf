"""One agent session: its kernel, host bridge, model context, trajectory and events.

One concern: the session composes its parts, owns their lifecycle and keeps the record (it numbers
the events and appends the trajectory). What a turn does is in agent/loop.py; each other concern is
a part beside it, handed only what it needs: plan mode (plan.py), the system prompt and harness
notices (system_prompt.py), the kernel's MCP calls (mcp_calls.py), the person's hooks
(session_hooks.py), subagents, approvals, checkpoints, the refiner.

    async with Session(config, model, cwd=Path(".")) as session:
        result = await session.prompt("fix the failing test")
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import events as ev
from agent.approvals import Approvals, Ask, Decision, Request
from agent.kernel.bridge import Allowance, BridgeServer
from agent.checkpoints import PARTS, Checkpoints, Part, Plan, RewindError, rewound
from agent.config import home, project_root
from agent.config_models import Config, ModelConfig
from agent.context import Context, Current, Inbox, Sinks, capped
from agent.fit import ModelFit
from agent.goals import CheckResult, GoalState, pursue, run_check
from agent.harness import HarnessApi, SessionHarness, edits_by, scope_roots
from agent.kernel import Kernel, KernelPool, KernelState
from agent.layout import SessionLayout
from agent.hooks import Hooks
from agent.hostrun import Host
from agent.loop import Interrupted, Submitted, TurnLoop
from agent.mcp import McpServers, prompt_section
from agent.mcp_calls import McpCalls
from agent.model import Model
from agent.notebook import Notebook
from agent.plan import PlanMode
from agent.prompt import system_prompt
from agent.refine import KERNEL, GateFactory, SessionRefiner
from agent.session_hooks import SessionHooks
from agent.kernel.runtime import ENV_PATH, ENV_SESSION_DIR, ENV_SKILLS, ENV_TOKEN
from agent.kernel.sandbox import SandboxError, describe, unavailable
from agent.kernel.view import View
from agent.subagents import ChildInfo, Subagents
from agent.system_prompt import SystemPrompt
from agent.trajectory import (
    Record,
    ResumedRecord,
    RewindRecord,
    SessionRecord,
    TrajectoryWriter,
    TurnFinishedRecord,
    TurnStartedRecord,
    WriteFailed,
    begun,
    recorded,
    contexts,
    turn_starts,
)
from agent.types import Budget, FilesChanged, Message, Outcome, Turn, TurnBegun, TurnOutcome, TurnResult, Usage
from harness_store.refiner import Outcome as RefinementOutcome
from harness_store.store import Change

Listener = Callable[[ev.Event], None]
log = logging.getLogger(__name__)


def new_session_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


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
        seq: ev.Sequence | None = None,
        ask: Ask | None = None,
        can_ask: bool = False,
        gate: GateFactory | None = None,
    ):
        """`parent` makes this a subagent; `instructions` follow the base prompt; `subagent_slots`
        holds the per-process limits on running children, one pool per depth (share one dict across
        the sessions of a process);
        `harness_roots` replaces the usual user/project/session scopes (the refiner's gate);
        `kernel_pool` supplies kernels started ahead of time (the daemon's, shared with subagents);
        events are numbered from `seq` (a daemon's journal's, which owns it and goes on across
        processes; without one the session owns its own); `ask` is a front end's own way of asking
        a person (the terminal's) and `can_ask` says someone decides requests through the API (the
        daemon); `gate` builds the regression gate every refinement must pass, for the model in use.

        The parts: the kernel, the person's hooks (session_hooks.py, every run recorded and shown),
        checkpoints (one at every turn boundary, for `rewind`, and the files each cell changed; a
        subagent's files are in its parent's), the system prompt in force and the harness notices,
        the model fit (fit.py), approvals (requests for a person's decision; a subagent's go up to the
        session the person decides in), the turn loop, the refiner, subagents, MCP servers (started at
        their first use), plan mode (plan.py) and the host bridge (the kernel's one way out)."""
        self.id = session_id or new_session_id()
        self.layout = SessionLayout(session_dir) if session_dir else SessionLayout.of(self.id)
        self.dir, self.cwd, self.instructions = self.layout.dir, cwd.resolve(), instructions
        self.current = current = Current(model, config)
        """The model and configuration in force, which the loop, subagents, refiner and fit read on each call."""
        self.listeners: list[Listener] = [on_event] if on_event else []
        self.usage, self.turns = Usage(), 0
        """Spend, and turns begun (turn ids are t1, t2, ... and never repeat)."""
        self.turn: Turn | None = None
        self.last_result: TurnResult | None = None
        self.between_turns = asyncio.Event()
        """Set while no turn runs."""
        self.between_turns.set()
        self.depth = parent.depth + 1 if parent else 0
        self._parent_id = parent.id if parent else None
        self.kernel_pool = kernel_pool if kernel_pool is not None else (parent.kernel_pool if parent else None)
        self.notices: list[str] = []
        """Told to the model at the start of the next turn (e.g. that its kernel is new)."""
        self._resumed: str | None = None
        """Why this session was resumed from its trajectory, when it was."""
        self.seq, self._own_seq = (seq, False) if seq is not None else (ev.Sequence(), True)
        """The event numbers: read here, taken here only where no host records the events (`_own_seq`)."""
        self._reporting = False
        """An event could not be recorded, and the error event saying so is being emitted."""
        self._trajectory: TrajectoryWriter | None = None
        self._task: asyncio.Task | None = None

        # The parts, each handed the narrow interface it needs (none holds the session).
        self.sinks = sinks = Sinks(emit=self.emit, record=self.record, charge=self.charge, turn_id=self._turn_id)
        self.context, self.inbox = Context(self.record), Inbox()
        project = project_root(self.cwd)
        self.harness = harness = SessionHarness(harness_roots or scope_roots(home(), project, self.dir), self.id,
                                                config.harness.limits(), edits_by=edits_by)
        view = View.of(config.sandbox, self.cwd, self.dir, [s.root for s in harness.stores.values()], project)
        self.kernel = kernel = Kernel(self.cwd, config.kernel, sandbox=config.sandbox, view=view)
        self.hooks = SessionHooks(Hooks.of(config.hooks, Host(home(), project, self.cwd)), sinks, self._hook_input)
        self.checkpoints = Checkpoints(config.checkpoints, self.cwd, self.layout, self.id, kernel, harness,
                                       self.context, sinks, enabled=parent is None)
        self.system_prompt = SystemPrompt(harness, self.context, sinks, self._prompt_text, tell=self.notices.append)
        self.fit = ModelFit(current, self._prompt_text, self.system_prompt.replace, sinks)
        self.approvals = Approvals(config.sandbox, self.cwd, sinks, timeout=lambda: current.config.kernel.cell_timeout,
                                   box=lambda: (kernel.launch, kernel.view), cell_id=lambda: kernel.cell_id,
                                   hook=self.hooks.permission, ask=ask, can_ask=can_ask,
                                   parent=(parent.approvals, self.id.rsplit(".", 1)[-1]) if parent else None)
        self.loop = TurnLoop(current, kernel, self.context, self.inbox, sinks, self.system_prompt.build,
                             hooks=self.hooks, ask_cell=self.approvals.cell, text_mode=self.fit.text_mode,
                             before_call=self.fit.before_call, after_cell=self.checkpoints.after_cell)
        self.refiner = SessionRefiner(current, harness, self.context, self.layout, self.id, sinks, gate=gate,
                                      hold=parent.refiner.hold if parent else None)
        slots = subagent_slots if subagent_slots is not None else (parent.subagents.process_slots if parent else {})
        self.subagents = Subagents(current, self.layout, self.id, self.depth, slots, sinks, self._child, self.inbox,
                                   left=self._budget_left, parent_inbox=parent.inbox if parent else None,
                                   name=self.id.rsplit(".", 1)[-1] if parent else None)
        self.mcp = McpServers(config.mcp, self.cwd, self.dir)
        self.plan_mode = PlanMode(config.sandbox.plan, sinks, kernel, final=self._final, sync=self._sync,
                                  tell=self.notices.append)
        mcp_calls = McpCalls(self.mcp, sinks, cell_id=lambda: kernel.cell_id, ask=self.approvals.mcp)
        self.bridge = BridgeServer(
            self.dir,
            {"final": self._final, "note": self._note, "ping": self._ping, "refine.request": self._refine,
             **self.plan_mode.handlers(), **mcp_calls.handlers(), **HarnessApi(harness, self.refiner.propose).handlers(),
             **self.subagents.handlers(), **self.approvals.handlers()},
            Allowance(config.kernel.output_spill, lambda: kernel.executions, transient=frozenset({"llm"})),
        )

    def preload(self, code: str) -> None:
        """Run `code` in the kernel after the runtime's bootstrap, before any cell (a child's `context`)."""
        self.kernel.setup.append(code)

    @property
    def messages(self) -> list[Message]:
        """The model's context, as it will be sent."""
        return self.context.messages

    def _child(self, config: Config, model: Model, name: str, layout: SessionLayout, instructions: str) -> Session:
        """A subagent: its own session in `layout`, on this session's user and project scopes."""
        roots = {scope: store.root for scope, store in self.harness.stores.items() if scope != "session"}
        config = config.model_copy(update={"sandbox": config.sandbox.model_copy(update={"plan": self.planning})})
        return Session(config, model, cwd=self.cwd, session_dir=layout.dir, session_id=f"{self.id}.{name}",
                       parent=self, instructions=instructions, harness_roots={**roots, "session": layout.harness})

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.close()  # a session that could not start leaves no kernel, socket or file behind
            raise
        finally:
            if self.kernel_pool is not None:  # after the start, which would wait behind a launch (KernelPool.take)
                self.kernel_pool.fill()

    @property
    def ignored(self) -> list[str]:
        """The project's files and settings not in force (untrusted, or loosening the sandbox), a line each."""
        return self.config.ignored

    @property
    def sandbox(self) -> str:
        """The sandbox in force, in words (the status bar's, `prime-agent run`'s)."""
        return describe(self.kernel.launch, self.config.sandbox.mode)

    async def _start(self) -> None:
        mode = self.config.sandbox.mode
        if self.config.sandbox.required and mode != "full-access" and unavailable():
            raise SandboxError(f"{unavailable()}; sandbox.required is set, so the session does not start")
        if self.planning and (mode != "workspace-write" or unavailable()):
            raise SandboxError("plan mode keeps the workspace read-only until you approve a plan, which needs the "
                               f"sandbox in workspace-write (here: {unavailable() or mode})")
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.checkpoints.enabled and self.config.checkpoints.kernel:  # before the sandbox binds it writable
            with contextlib.suppress(OSError):  # else snapshots fail, and the session says so once
                self.layout.kernel_snapshots.mkdir(parents=True, exist_ok=True)
        # The kernel starts while the model's server is asked about the model: both wait on other processes.
        kernel = asyncio.ensure_future(self.kernel.start(self.kernel_pool, ready=self._bridge_up))
        try:
            fit = await self.fit.fit()  # before the system prompt is built: it depends on the fit
            self._trajectory = TrajectoryWriter(self.layout.trajectory)
            if self._resumed is not None:
                self.record(ResumedRecord(reason=self._resumed, harness_version=self.system_prompt.harness_version))
                self.context.close_open_tool_calls()
            else:
                self._record_start()
            self.system_prompt.watch()
            self.checkpoints.warm()
        except BaseException:
            kernel.cancel()
            await asyncio.gather(kernel, return_exceptions=True)
            raise
        await kernel
        window = self.config.model.context_window
        if self._resumed is not None:
            self.emit(ev.SessionResumed(reason=self._resumed, turns=self.turns, sandbox=self.sandbox,
                                        ignored=self.ignored, context_window=window))
        else:
            self.emit(ev.SessionStarted(dir=str(self.dir), cwd=str(self.cwd), model=self.model.name,
                                        sandbox=self.sandbox, ignored=self.ignored, context_window=window))
        for text in fit:
            self.emit(ev.Note(text=text))
        source = "resume" if self._resumed is not None else "startup"
        started = await self.hooks("SessionStart", {"source": source}, target=source)
        if started.context:
            self.notices.append(f"[Context from the user's SessionStart hook]\n{started.context}")

    async def _bridge_up(self, kernel_dir: Path) -> dict[str, str]:
        """The host bridge, in the kernel's own directory: the one way out of its sandbox."""
        await self.bridge.start(kernel_dir)
        self.subagents.kernel_dir = kernel_dir
        return {
            ENV_PATH: str(self.bridge.path),
            ENV_TOKEN: self.bridge.token,
            ENV_SKILLS: os.pathsep.join(self.harness.skill_dirs()),
            ENV_SESSION_DIR: str(self.dir),
            "PRIME_AGENT_SESSION": self.id,
        }

    def _record_start(self) -> None:
        self.record(
            SessionRecord(
                session_id=self.id,
                cwd=str(self.cwd),
                model=self.model.name,
                action_format=self.model.action_format,
                harness_version=self.harness.view.version(),
                parent=self._parent_id,
                config=recorded(self.config),
                repositories=sorted(self.approvals.git_at_start),
            )
        )
        self.context.append(Message(role="system", content=self.system_prompt.build()), None)

    def resume(self, records: list[Record], reason: str) -> None:
        """Before `start`: take up a session from its trajectory in a new process.

        The model's context, turn count, usage and last outcome come back; the kernel cannot (its
        namespace died with the old process), so the model is told at its next turn. A turn the old
        process never finished must already be closed (`finish_cut_turn`).
        """
        conversations = list(contexts(records))
        self.context.messages = conversations[-1] if conversations else []
        self.context.turn_starts = turn_starts(records)
        self.system_prompt.resume(records)
        started = next((r for r in records if isinstance(r, SessionRecord)), None)
        if started is not None and started.repositories is not None:  # not what is there now: the agent's may be
            self.approvals.git_at_start = set(started.repositories)
        self.turns += len(begun(records))
        for r in records:
            if isinstance(r, TurnFinishedRecord):
                self.usage += r.usage
                self.last_result = TurnResult(turn_id=r.turn_id, **{f: getattr(r, f) for f in TurnOutcome.model_fields})
        self.subagents.interrupt_orphans(reason)
        self._resumed = reason
        last = next((r for r in reversed(records) if isinstance(r, TurnStartedRecord | RewindRecord)), None)
        if isinstance(last, RewindRecord):  # rewound since the last turn: the model has yet to hear of it
            self.notices.append(last.notice)
        self.plan_mode.resume(records, self.config.sandbox.plan)  # the trajectory decides, not session.json
        self.notices.append(f"[{reason}. This session goes on in a new kernel: every variable, import and "
                            "running subagent from before is gone; files on disk are as they were.]")

    async def close(self) -> None:
        await self.hooks.end(started=self._trajectory is not None)
        await self.refiner.close()
        await self.checkpoints.close()
        await self.subagents.close()
        self.system_prompt.close()
        await self.kernel.shutdown()
        await self.mcp.close()
        await self.bridge.close()
        if self._trajectory is not None:
            self._trajectory.close()

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- what a client does ----------------------------------------------------------------

    async def prompt(self, text: str, turn_id: str | None = None, goal: tuple[str, int] | None = None,
                     notebook: Notebook | None = None) -> TurnResult:
        """Run one turn to its end; never raises for model, kernel or budget failures.
        `turn_id` names the turn when a client numbered it in advance (the daemon's queue); `goal`
        (goal id, continuation) marks it as one of a goal's turns; `notebook`: its cells are the turn,
        run as the model's are, with no model call (agent/notebook.py)."""
        if self.turn is not None:
            raise RuntimeError("a turn is already running in this session; steer it or wait")
        self.turns += 1
        goal_id, continuation = goal or (None, None)
        turn = self.turn = Turn(id=turn_id or f"t{self.turns}", prompt=text, goal_id=goal_id,
                                continuation=continuation)
        self.between_turns.clear()
        outcome: Outcome = "interrupted"
        answer = files = None
        error = "the session was closed during this turn"
        try:
            # Before anything of the turn: the last turn's checkpoint (or a rewind) finishes, and this
            # one is taken. An interrupt meanwhile stops the turn at its first step (no task to cancel yet).
            await self.checkpoints.settle()
            await self.checkpoints.at_turn_start(turn.id)
            turn.started = time.monotonic()  # the budget is the turn's own time
            self._task = asyncio.current_task()
            submitted = await self.hooks("UserPromptSubmit", {"prompt": text})
            refused = submitted.stop or (submitted.reason if submitted.blocked else None)
            self._begin_turn(turn, None if refused else submitted.context)
            if refused:  # the prompt never reaches the model; the person is told why
                outcome, error = "error", f"a UserPromptSubmit hook refused the prompt: {refused}"
            else:
                outcome, answer, error = await self.loop.run(turn, notebook)
                self._task = None  # nothing of the turn is left to interrupt
                files = await self.checkpoints.turn_files()
        except WriteFailed as e:  # the turn's beginning could not be recorded: it ends here, said so
            outcome, error = "error", f"the session's records could not be written, so the turn stops: {e}"
            self.emit(ev.Error(turn_id=turn.id, message=error))
        finally:
            self._task = None
            result = self._end_turn(turn, outcome, answer, error, files)
            self.checkpoints.after_turn(turn.id)
        return result

    async def pursue(self, goal: GoalState, on_change: Callable[[GoalState], None] = lambda s: None) -> GoalState:
        """Run a goal (agent/goals.py) in this session: turns until its check passes or its budget ends."""
        return await pursue(goal, self, on_change)

    async def check(self, command: str, timeout: float) -> CheckResult:
        """Run a goal's check in the workspace, sandboxed as this session's kernel is."""
        return await run_check(command, self.cwd, timeout, self.kernel.launch, self.kernel.view)

    async def goal_turn(self, text: str, goal_id: str, continuation: int) -> TurnResult:
        return await self.prompt(text, goal=(goal_id, continuation))

    def subagents_running(self) -> bool:
        return self.subagents.running()

    async def rewind(self, turn: int, parts: list[Part] | None = None, *, after: bool = False, force: bool = False,
                     dry_run: bool = False) -> Plan | RewindRecord:
        """Go back to the checkpoint before turn `turn` (1-based; with `after`, to when it ended) in
        `parts` (default all: code, conversation, harness, kernel). With `dry_run`, only say what
        would change. RewindError when there is no such checkpoint, when a turn or a subagent runs,
        or (without `force`) when a person changed a file the rewind would overwrite."""
        if self.turn is not None or self.subagents.running():
            raise RewindError("turn_running", "a turn or a subagent is running: interrupt it or wait, then rewind")
        plan = await self.checkpoints.plan(turn, list(parts or PARTS), after)
        if dry_run:
            return plan
        if self.turn is not None:
            raise RewindError("turn_running", "a turn began meanwhile: interrupt it or wait, then rewind")
        record = await self.checkpoints.rewind(plan, force)
        if record.messages is not None:
            self.last_result = None
            self.system_prompt.harness_version = None  # the restored context's prompt is checked at the next turn
        if record.harness:
            self.harness_changed("a rewind")
        self.notices[:] = [n for n in self.notices if not n.startswith("[The user rewound")] + [record.notice]
        self.emit(rewound(record))
        return record

    @property
    def planning(self) -> bool:
        """Plan mode (sandbox.plan): the workspace read-only until a person approves a plan."""
        return self.plan_mode.on

    @property
    def plan(self) -> str | None:
        """The plan the model proposed and nobody has decided yet."""
        return self.plan_mode.plan

    async def decide_plan(self, approve: bool, note: str | None = None, plan: str | None = None) -> str | None:
        """A person's decision on the proposed plan (`PlanMode.decide`): approved, the prompt that
        carries the plan out (the caller sends it); rejected, None."""
        return await self.plan_mode.decide(approve, note, plan)

    def steer(self, text: str) -> None:
        """Queue a message for the running turn; it reaches the model at its next call."""
        self.inbox.steer(text)
        self.emit(ev.SteerQueued(turn_id=self.turn.id if self.turn else None, text=text))

    def take_steering(self) -> list[str]:
        """Steering that no model call took (it came as the turn ended), now no longer queued."""
        return self.inbox.take_steering()

    def rebuild_prompt(self) -> None:
        """Build the system prompt afresh at the next turn boundary (the prompt cache starts over there)."""
        self.system_prompt.rebuild = True

    def request_compaction(self) -> None:
        """Summarise the older context at the next model call (the running turn's, else the next turn's)."""
        self.context.compact_requested = True

    async def interrupt(self) -> None:
        """Stop the running turn: interrupt the running cell (kernel state kept), or the model call."""
        turn = self.turn
        if turn is None:
            return
        turn.stop_with(Interrupted())
        if self.kernel.state is KernelState.BUSY:
            await self.kernel.interrupt()
        elif self.kernel.state is KernelState.IDLE and self._task is not None:
            self._task.cancel()  # waiting on the model: stop now
        # starting or restarting: the loop stops at its next step, with the kernel whole

    def is_busy(self) -> bool:
        """A turn running, a refinement being planned, or children still running."""
        return self.turn is not None or self.refiner.planning() or self.subagents.running()

    def children(self) -> list[ChildInfo]:
        """This session's subagents, as its registry lists them."""
        return self.subagents.list_children()

    def refine(self, instructions: str | None = None, trigger: str = "explicit", mode: str | None = None) -> str:
        """Plan a harness refinement in the background; it applies at the next turn boundary (now if idle)."""
        return self.refiner.request(instructions, trigger=trigger, mode=mode)

    async def decide_refinement(self, refinement_id: str, approve: bool) -> RefinementOutcome:
        """Approve or reject a refinement waiting for review (KeyError when none has that id)."""
        return await self.refiner.decide(refinement_id, approve)

    def decide_approval(self, request_id: str, decision: Decision, prefix: str | None = None,
                        full_env: bool = False) -> Request:
        """A person's decision on a request that waits (`Approvals.decide`: KeyError when none has that
        id, ValueError when the decision does not fit it)."""
        return self.approvals.decide(request_id, decision, prefix, full_env)

    def use_model(self, model: Model, config: Config) -> None:
        """Switch the model (between turns): the loop, the refiner, its gate and new children use it
        from now on. It is fitted to its server before its first call."""
        self.current.model, self.current.config = model, config
        self.fit.pending = True

    @property
    def model(self) -> Model:
        return self.current.model

    @property
    def config(self) -> Config:
        return self.current.config

    def _budget_left(self) -> Budget:
        """What the running turn has left of its budget (a child gets no more)."""
        return self.config.budget.left(self.turn)

    # --- record keeping (the sinks handed to the parts) ---------------------------------------

    def emit(self, event: ev.Event) -> None:
        """Number the event and hand it to the listeners. One that cannot take it (the daemon's
        journal on a full disk) must not break the session, nor leave a gap: the number is not used
        up, and the failure is an error event of its own (if that fails too, the log has it)."""
        event.seq, event.session_id = self.seq.last + 1, self.id
        failed: Exception | None = None
        for listener in self.listeners:
            try:
                listener(event)
            except Exception as e:
                failed = e
                log.exception("event listener failed on %s", event.type)
        if failed is None:
            if self._own_seq:
                self.seq.take(event.seq)
            self.hooks.tell(event)
        elif not self._reporting:
            self._reporting = True
            try:
                self.emit(ev.Error(turn_id=event.turn_id, message=f"a {event.type} event could not be recorded: "
                                                                  f"{type(failed).__name__}: {failed}"))
            finally:
                self._reporting = False

    def _hook_input(self) -> dict[str, Any]:
        """What every hook gets besides its event's fields, as Claude Code sends it."""
        return {"session_id": self.id, "transcript_path": str(self.layout.trajectory),
                "permission_mode": self.config.sandbox.mode}

    def record(self, record: Record) -> None:
        assert self._trajectory is not None, "session not started"
        self._trajectory.append(record)

    def _sync(self) -> None:
        """Make the trajectory durable now (OSError where it cannot be)."""
        assert self._trajectory is not None, "session not started"
        self._trajectory.sync()

    def charge(self, usage: Usage, purpose: str, turn_id: str | None = None) -> None:
        """Model spend, the one sink for all of it: the session's, and the turn's that caused it
        (`turn_id`, else the running one). The running turn reports its own when it ends; spend caused
        by another (a refinement planned after its turn, a child that outlived it) is an event of its
        own naming that turn, so clients count every token once."""
        self.usage += usage
        turn = self.turn
        if turn is not None and turn_id in (None, turn.id):
            turn.usage += usage
            turn.spend[purpose] = turn.spend.get(purpose, Usage()) + usage
        elif usage.total_tokens or usage.cost:
            self.emit(ev.UsageCharged(turn_id=turn_id, usage=usage, purpose=purpose))

    def _turn_id(self) -> str | None:
        return self.turn.id if self.turn else None

    def _begin_turn(self, turn: Turn, hook_context: str | None = "") -> None:
        """Record the turn's start and put its prompt in the context, with what UserPromptSubmit
        hooks added (`hook_context`; None: a hook refused the prompt, which stays out of it)."""
        prompt = turn.prompt
        begun = dict(TurnBegun(prompt=prompt, goal_id=turn.goal_id, continuation=turn.continuation))
        self.sinks.log(TurnStartedRecord(turn_id=turn.id, **begun), ev.TurnStarted(turn_id=turn.id, **begun))
        try:
            self.refiner.at_boundary()
            self.system_prompt.at_boundary(turn.id)
        except Exception as e:  # a broken harness must not wedge the session: keep the prompt in force
            log.exception("harness reload failed")
            self.emit(ev.Error(turn_id=turn.id, message=f"the harness could not be reloaded ({type(e).__name__}: "
                                                        f"{e}); the previous system prompt stays in force"))
        notes = [*self.notices, *self.plan_mode.notes()]
        self.notices.clear()
        last = self.last_result
        if last is not None and last.outcome != "completed":
            notes.insert(0, f"[Your previous turn ended early ({last.outcome}): {last.error}]")
        if hook_context is None:
            self.notices[:] = notes  # told with the next prompt instead
            return
        extra = [f"[Context from the user's UserPromptSubmit hook]\n{hook_context}"] if hook_context else []
        self.context.begin_turn(Message(role="user", content="\n\n".join([*notes, prompt, *extra])), turn.id)

    def _end_turn(self, turn: Turn, outcome: Outcome, answer: str | None, error: str | None,
                  files: FilesChanged | None = None) -> TurnResult:
        """Close the turn, whatever else fails: the session is free for the next one."""
        done = TurnOutcome(outcome=outcome, answer=answer, error=error, usage=turn.usage,
                           duration=time.monotonic() - turn.started, steps=turn.steps, cells=turn.cells)
        result = TurnResult(turn_id=turn.id, **dict(done), final=turn.final and outcome == "completed")
        self.turn = None
        self.between_turns.set()
        self.last_result = result
        try:
            self.record(TurnFinishedRecord(turn_id=turn.id, **dict(done),
                                           harness_version=self.system_prompt.harness_version))
        except WriteFailed as e:  # a restart finds the turn open and closes it as cut short
            self.emit(ev.Error(turn_id=turn.id, message=f"the end of this turn could not be recorded: {e}"))
        self.emit(ev.TurnFinished(turn_id=turn.id, **dict(done), spend=turn.spend, files=files))
        # The turn boundary: a refinement planned meanwhile lands now, in force from the next call.
        try:
            if outcome == "interrupted":
                self.refiner.invalidate("an interrupt")
            self.refiner.at_boundary()
            self.refiner.after_turn(turn.id)
        except Exception as e:
            log.exception("refinement at the turn boundary failed")
            self.emit(ev.Error(turn_id=turn.id, message=f"a refinement could not be applied: {type(e).__name__}: {e}"))
        try:
            self._sync()
        except OSError as e:
            self.emit(ev.Error(turn_id=turn.id, message=f"the trajectory could not be made durable: {e}"))
        return result

    # --- the harness -------------------------------------------------------------------------

    def _prompt_text(self, model: ModelConfig | None = None) -> str:
        """The system prompt for these model settings (default: those in force), with the harness and
        MCP servers as they are now."""
        mcp = prompt_section(self.mcp.infos(), self.config.mcp.prompt_chars)
        config = self.config if model is None else self.config.model_copy(update={"model": model})
        return system_prompt(config, self.cwd, self.harness.view.render(), self.instructions, mcp)

    # --- host bridge handlers (called from code in the kernel) -------------------------------

    async def _final(self, answer: str) -> None:
        if self.turn is None:
            raise RuntimeError("final() ends a turn, and no turn is running")
        self.turn.final = True
        self.turn.stop_with(Submitted(answer))

    def rollback(self, ref: str, scope: str, to: bool = False) -> Change:
        """Roll the harness back (one change, or `to` a whole earlier state); in force next turn."""
        store = self.harness.store(scope)
        change = store.rollback_to(ref, session=self.id) if to else store.rollback(ref, session=self.id)
        self.harness_changed("a rollback")
        self.emit(ev.RefinementRolledBack(turn_id=self._turn_id(), ref=ref, scope=scope, id=change.refinement_id,
                                          entries=change.entries))
        return change

    def harness_changed(self, why: str) -> None:
        """Someone rolled back a scope this session uses: what was planned before is stale."""
        self.refiner.invalidate(why)

    async def _refine(self, instructions: str | None = None) -> str:
        return self.refine(instructions, trigger=KERNEL)

    async def _ping(self) -> str:
        """A no-op round trip: a health check for the bridge, and what bench/kernel.py times."""
        return "pong"

    async def _note(self, text: str) -> None:
        self.emit(ev.Note(turn_id=self._turn_id(), text=capped(text, self.config.kernel.output_limit, "a note")))
