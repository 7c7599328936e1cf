"""A daemon session: an agent `Session` plus what outlives it (its metadata, journal and queue).

A session is *live* when its agent session and kernel run in this process, *dormant* when only
its files do (after a daemon restart, or put to sleep when idle): a dormant session wakes, with
a new kernel, on its next prompt. The directory's files are named in agent/layout.py.

One concern: hosting one session across its live and dormant states. What it does for the API
(events, turns, approvals, rewinds, switches of model, sandbox or plan mode) each needs the
session, its metadata and its journal at once, whichever state it is in; the turn queue
(daemon/turns.py), goals (daemon/goals.py), the journal (daemon/journal.py) and the model clients
(daemon/models.py) are modules of their own. It is the daemon's one door to a session: routes, the
manager and schedules call its methods; only it and its parts reach the agent `Session` inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from pathlib import Path
from typing import Protocol

from agent import events as ev
from agent.checkpoints import PARTS, Plan, RewindError, TurnRow, WorkspaceStore, turn_list
from agent.checkpoints import recover as finish_rewind
from agent.checkpoints import rewound
from agent.config import SANDBOX_ORDER, ConfigError, home, load_config, project_root
from agent.config_models import Config
from agent.harness import SessionHarness, scope_roots
from agent.kernel import KernelPool
from agent.kernel.sandbox import unavailable
from agent.layout import SessionLayout
from agent.mcp import McpServers, ServerInfo
from agent.model import ModelError, OpenAIModel
from agent.notebook import Notebook
from agent.refine import GateFactory
from agent.server_models import ListingError, listed_models
from agent.session import Session
from agent.subagents import ChildInfo, read_registry
from agent.trajectory import (
    PlanRecord,
    SessionRecord,
    TrajectoryError,
    append_record,
    in_plan_mode,
    pending_plan,
    read_records,
)
from agent.types import FilesChanged
from daemon.errors import Refused
from daemon.fanout import Fanout, Subscriber
from daemon.goals import DaemonGoal
from daemon.journal import EventJournal
from daemon.meta import SessionMeta, title_of
from daemon.models import SessionModels, model_in_force
from daemon.schemas import Interrupted, KernelInfo, MessageAccepted, ModelKey, PlanDecision, SessionInfo
from daemon.schemas import ApprovalDecision, DecideApproval, RewindRequest, RewindResult
from daemon.turns import TurnQueue
from harness_store.refiner import RefinementError
from harness_store.store import Change

log = logging.getLogger(__name__)
RESTARTED = "The daemon restarted"
RUN_ENDED = "The `prime-agent run` that hosted this session ended"
PLAN_TURN_END = 30.0
"""Seconds a decision on a plan waits for the turn that proposed it to end."""
SLEPT = "The session was idle and its kernel was stopped to free memory"
SWITCHED = "The user switched the session's sandbox or plan mode, which restarted its kernel"


class Daemon(Protocol):
    """What a daemon session needs of the daemon that hosts it (daemon.manager.SessionManager)."""

    config: Config
    stopping: bool
    turn_slots: asyncio.Semaphore
    subagent_slots: dict[int, asyncio.Semaphore]
    pool: KernelPool
    gate_factory: GateFactory | None
    write_error: str | None

    def live(self) -> int: ...
    async def make_room(self) -> bool: ...
    def write_failed(self, error: OSError) -> None: ...


class ManagedSession:
    def __init__(self, manager: Daemon, meta: SessionMeta, layout: SessionLayout):
        self.manager, self.meta, self.layout = manager, meta, layout
        self.journal = EventJournal(layout.events)
        self.fanout = Fanout(meta.session_id, manager.config.daemon.client_buffer)
        self.queue = TurnQueue(self)
        self.goal = DaemonGoal(self)
        self.turn_slots = manager.turn_slots
        self.session: Session | None = None
        """The agent session while live: the daemon's other modules reach it only through this class."""
        self.models = SessionModels()
        self._waking = asyncio.Lock()
        self.last_active = time.monotonic()
        self._woken_because = RESTARTED if meta.host == "daemon" else RUN_ENDED
        """Why a dormant session is dormant, told to the model when it wakes."""
        self.closed = False
        self._plan_state: tuple[bool, str | None] | None = None
        """A dormant session's plan mode and pending plan, as its trajectory says (read once, kept since)."""

    @property
    def id(self) -> str:
        return self.meta.session_id

    def stopping(self) -> bool:
        return self.manager.stopping

    def awake(self) -> bool:
        """Live: its agent session and kernel run in this process."""
        return self.session is not None

    def turn_running(self) -> bool:
        return self.session is not None and self.session.turn is not None

    def save(self) -> None:
        """Write `session.json`; a disk that refuses it is a request the daemon cannot serve (507)."""
        try:
            self.meta.save(self.layout)
        except OSError as e:
            self.manager.write_failed(e)
            raise Refused("disk_full" if e.errno == errno.ENOSPC else "write_failed",
                          f"the daemon could not save {self.layout.meta}: {e.strerror or e}") from e

    def info(self) -> SessionInfo:
        m, config = self.meta, self._config_if_loads()
        if self.turn_running():
            state = "running"
        elif self.queue.busy():
            state = "queued"
        elif self.session is not None:
            state = "idle"
        else:
            state = "closed" if m.closed else "dormant"
        model, base_url = model_in_force(config, m.overrides)
        planning, plan = self.plan_state()
        return SessionInfo(
            id=m.session_id, cwd=m.cwd, model=model, base_url=base_url, title=m.title, created=m.created, state=state,
            turns=m.turns, queued=len(m.queued), last_seq=self.journal.last_seq, usage=m.usage,
            dir=str(self.layout.dir), updated=m.updated or m.created,
            harness_version=self.session.system_prompt.harness_version if self.session else None,
            sandbox=self.session.sandbox if self.session else config.sandbox.mode if config else None,
            ignored=self.session.ignored if self.session else [],
            planning=planning, plan=plan,
            goal=m.goal.summary() if m.goal else None,
        )

    def _config_if_loads(self) -> Config | None:
        """Its configuration (a dormant session's read now: 0.6 ms), None where it no longer loads."""
        try:
            return self.config()
        except ConfigError:
            return None

    def plan_state(self) -> tuple[bool, str | None]:
        """Plan mode and the plan waiting for a decision, as the trajectory's plan records say (`in_plan_mode`;
        the live session's, if live)."""
        if self.session is not None:
            return self.session.planning, self.session.plan
        if self._plan_state is None:
            try:
                created = self.config().sandbox.plan
            except ConfigError:
                created = bool(self.meta.overrides.get("sandbox", {}).get("plan"))
            try:  # parsed only where plan mode ever changed: a listing reads no other trajectory whole
                text = self.layout.trajectory.read_text(encoding="utf-8", errors="replace")
                records = read_records(self.layout.trajectory, []) if '"kind":"plan"' in text else []
            except (OSError, TrajectoryError):  # none yet, or unreadable: waking it says why
                records = []
            planning = in_plan_mode(records, created)
            self._plan_state = planning, pending_plan(records) if planning else None
        return self._plan_state

    # --- events ------------------------------------------------------------------------------

    def emit(self, event: ev.Event) -> None:
        """An event of the daemon's own (queueing, recovery), numbered in the session's sequence."""
        if self.session is not None:
            self.session.emit(event)
            return
        event.seq, event.session_id = self.journal.seq.last + 1, self.id  # taken by the journal
        try:
            self._on_event(event)
        except OSError:  # live readers were told; it is in the log
            log.exception("session %s: a %s event could not be journaled", self.id, event.type)

    def _on_event(self, event: ev.Event) -> None:
        """Journal the event, then hand it to every reader; what the session's metadata keeps of it
        is saved last. A journal that refuses it (a full disk) raises, so its number is not used
        up; live readers still get it, numbered 0 (not in the journal, so never replayed)."""
        line = event.model_dump_json()
        try:
            self.journal.append(event.seq, line)
        except OSError as e:
            self.manager.write_failed(e)
            self.fanout.publish(0, event.model_copy(update={"seq": 0}).model_dump_json())
            raise
        self.fanout.publish(event.seq, line)
        if self.meta.account(event):  # a turn's end
            try:
                self.save()
                self.journal.sync()
                self.manager.write_error = None  # a whole turn is on disk again
            except (Refused, OSError) as e:  # its own event, after this one (which every reader has)
                why = e.message if isinstance(e, Refused) else f"the event journal could not be synced: {e}"
                asyncio.get_running_loop().call_soon(self.emit, ev.Error(turn_id=event.turn_id, message=why))

    def subscribe(self, after: int) -> tuple[list[tuple[int, str]], Subscriber]:
        """The journal's events after `after`, and a subscriber for every later one: nothing is
        missed or repeated between the two (no await separates them)."""
        if self.manager.stopping:
            raise Refused("stopping", "the daemon is stopping; reconnect once it is back")
        if self.closed:
            raise Refused("not_found", f"session {self.id} was deleted")
        return self.journal.read_after(after), self.fanout.subscribe()

    def unsubscribe(self, sub: Subscriber) -> None:
        self.fanout.unsubscribe(sub)
        self.last_active = time.monotonic()

    # --- turns -------------------------------------------------------------------------------

    def send(self, text: str, mode: str, key: ModelKey | None = None,
             notebook: Notebook | None = None) -> MessageAccepted:
        """Queue a prompt (or steer the running turn); `key`: the sending client's model key. The
        first prompt names a session that has no title."""
        self.use_key(key)
        if self.meta.title is None and not self.closed:
            self.meta.title = title_of(text)  # saved by the queue
        return self.queue.send(text, mode, notebook=notebook)

    async def interrupt(self, drop_queued: bool, turn_id: str | None = None) -> Interrupted:
        """Stop the running turn; a goal it belongs to stops with it (its check does not run)."""
        if turn_id is None and self.goal.running():
            self.goal.stop()
        return await self.queue.interrupt(drop_queued, turn_id)

    # --- what the API asks of it ----------------------------------------------------------------

    async def mcp_servers(self, start: bool = False) -> list[ServerInfo]:
        """Its MCP servers: transport, policy, state and tools (as last listed); starts none, unless
        `start`: then those not started are (a dormant session wakes) and list their tools."""
        if start:
            return await (await self.wake()).mcp.list()
        if self.session is not None:
            return self.session.mcp.infos()
        return McpServers(self._config_or_refuse().mcp, Path(self.meta.cwd), self.layout.dir).infos()

    def decide_approval(self, request_id: str, req: DecideApproval, may_loosen: bool = True) -> ApprovalDecision:
        """A person's decision on a request that waits (a command to run in a sandbox with more room, an
        MCP call under policy "ask"). `may_loosen`: False for a client that may only deny (over TCP,
        unless the daemon was started to allow it)."""
        if self.session is None:
            raise Refused("not_found", f"no approval request {request_id!r} waits: session {self.id} is dormant")
        if req.decision != "deny" and not may_loosen:
            raise Refused("remote_loosening", "over TCP a request to act outside the sandbox can only be denied: "
                          "decide it over the daemon's Unix socket (the app, `prime-agent attach`), or start the "
                          "daemon with --allow-remote-unsandboxed")
        try:
            decided = self.session.decide_approval(request_id, req.decision, req.prefix, req.full_env)
        except KeyError as e:
            raise Refused("not_found", str(e.args[0])) from None
        except ValueError as e:
            raise Refused("bad_request", str(e)) from None
        return ApprovalDecision(request_id=request_id, decision=req.decision, prefix=decided.prefix,
                                full_env=decided.full_env)

    async def refine(self, instructions: str | None, mode: str | None) -> str:
        """A refinement a person asked for, planned in the background; what became of the request."""
        return (await self.wake()).refine(instructions, trigger="api", mode=mode)

    async def compact(self) -> None:
        (await self.wake()).request_compaction()

    async def rebuild_prompt(self) -> None:
        (await self.wake()).rebuild_prompt()

    async def kernel(self) -> KernelInfo:
        kernel = (await self.wake()).kernel
        return KernelInfo(connection_file=str(kernel.connection_file), state=kernel.state.value)

    async def diff(self) -> FilesChanged | None:
        """What changed in the workspace since its first checkpoint (a snapshot taken now)."""
        try:
            return await (await self.wake()).checkpoints.since_start()
        except ValueError as e:
            raise Refused("no_checkpoint", str(e)) from None

    async def server_models(self) -> list[str]:
        """The models its server lists (`GET {base_url}/models`, with the session's key)."""
        config = self._config_or_refuse()
        try:
            return await listed_models(config.model.base_url, self.models.api_key(config))
        except ListingError as e:
            raise Refused("server", f"the server did not list its models: {e}") from None

    def harness(self) -> SessionHarness:
        """The harness it sees: the live session's, else one over its scopes (the user's, its project's, its own)."""
        if self.session is not None:
            return self.session.harness
        return SessionHarness(scope_roots(home(), project_root(Path(self.meta.cwd)), self.layout.dir), self.id)

    def rollback(self, ref: str, scope: str, to: bool) -> Change | None:
        """Undo a harness change through the live session (which records it); None for a dormant one."""
        return self.session.rollback(ref, scope, to) if self.session is not None else None

    def harness_changed(self, root: Path, why: str) -> None:
        """Tell a live session that sees the harness scope at `root` that it changed (`why`)."""
        if self.session is not None and any(s.root == root for s in self.session.harness.stores.values()):
            self.session.harness_changed(why)

    def subagents(self) -> list[ChildInfo]:
        return list(self.session.children() if self.session else read_registry(self.layout).values())

    async def decide_refinement(self, refinement_id: str, approve: bool) -> str:
        """Approve or reject a refinement that waits for review; its outcome's status."""
        session = await self.wake()
        try:
            outcome = await session.decide_refinement(refinement_id, approve)
        except KeyError as e:
            raise Refused("not_found", str(e.args[0])) from None
        except (RefinementError, ModelError) as e:  # the plan still waits for review
            raise Refused("refinement_failed", str(e)) from None
        return outcome.status

    async def checkpoints(self) -> list[TurnRow]:
        """Its turns, to choose where to rewind: number, id, prompt, time, outcome, files changed."""
        live = self.session
        if live is not None:
            await live.checkpoints.settle()  # the last turn's end checkpoint, if still being taken
            store = live.checkpoints.store
        else:
            store = WorkspaceStore(Path(self.meta.cwd), self.id, self._config_or_refuse().checkpoints)
        return await asyncio.to_thread(turn_list, self.layout, store)

    async def rewind(self, req: RewindRequest) -> RewindResult:
        """Go back to a turn's checkpoint in the parts asked for; refused while a turn runs or is queued,
        or (without `force`) when it would overwrite what a person changed since. Wakes it if dormant."""
        parts = [p for p in PARTS if getattr(req, p)]
        if not parts:
            raise Refused("bad_rewind", "nothing to rewind: ask for code, conversation, harness or kernel")
        if self.queue.busy() or self.turn_running():
            raise Refused("turn_running", "a turn is running or queued; interrupt it or wait, then rewind")
        session = await self.wake()
        if self.queue.busy():
            raise Refused("turn_running", "a turn began meanwhile; interrupt it or wait, then rewind")
        try:
            done = await session.rewind(req.turn, parts, after=req.after, force=req.force, dry_run=req.dry_run)
        except RewindError as e:
            code = {"conflict": "rewind_conflict", "failed": "rewind_failed"}.get(e.code, e.code)
            raise Refused(code, e.message) from None
        if isinstance(done, Plan):
            return RewindResult(rewind_id=None, dry_run=True, **done.summary())
        return RewindResult(rewind_id=done.rewind_id, dry_run=False, turn=done.turn, after=done.after,
                            parts=done.parts, files=done.files, not_restored=done.not_restored, conflicts=done.forced,
                            harness=dict(done.harness), kernel=done.kernel, notice=done.notice)

    def _config_or_refuse(self) -> Config:
        """Its configuration; one that no longer loads (a file edited since) is `config_broken`."""
        try:
            return self.config()
        except ConfigError as e:
            raise Refused("config_broken", str(e)) from None

    # --- lifecycle ---------------------------------------------------------------------------

    def config(self, overrides: dict | None = None) -> Config:
        """The session's configuration (from `overrides`, default its own): the live session's, loaded
        once when it woke (or as the create request was validated); a dormant one's, read now."""
        if overrides is None and self.session is not None:
            return self.session.config
        return load_config(Path(self.meta.cwd), self.meta.overrides if overrides is None else overrides)

    def use_key(self, key: ModelKey | None, config: Config | None = None) -> None:
        """Take a client's key, if it is meant for this session's endpoint (its configuration's: `config`, if in
        hand); a live session uses it from its next turn."""
        if key is not None:
            self.models.use_key(key, model_in_force(config or self._config_if_loads(), self.meta.overrides)[1])

    def _use_model(self, config: Config) -> None:
        """Switch the live session to a model built from `config` (the old one is closed with the session:
        a refinement or a child may still be using it)."""
        assert self.session is not None
        self.session.use_model(self.models.open(config), config)

    async def wake(self, config: Config | None = None) -> Session:
        """The live agent session: resumed from its trajectory, on a new kernel, if it was dormant, with
        `config` (a create's, validated) or its configuration as it is now."""
        async with self._waking:
            if self.session is not None:
                if self.models.stale and self.session.turn is None:
                    try:
                        self._use_model(self.config(self.meta.overrides))  # read afresh, as a wake reads it
                    except ConfigError as e:
                        raise Refused("config_broken", str(e)) from None
                return self.session
            if self.closed:
                raise Refused("not_found", f"session {self.id} was deleted")
            if self.manager.stopping:
                raise Refused("stopping", "the daemon is stopping")
            while self.manager.live() >= self.manager.config.daemon.max_sessions:  # re-checked after each await
                if not await self.manager.make_room():
                    raise Refused("too_many_sessions", f"{self.manager.live()} sessions are live and busy "
                                  "(daemon.max_sessions); delete one, or raise the limit")
            cwd = Path(self.meta.cwd)
            if not cwd.is_dir():
                raise Refused("cwd_missing", f"the session's directory {cwd} no longer exists")
            try:
                config = config or self.config()
            except ConfigError as e:
                raise Refused("config_broken", str(e)) from None
            damaged: list[str] = []
            records = read_records(self.layout.trajectory, damaged) if self.layout.trajectory.is_file() else []
            model = self.models.open(config)
            session = Session(
                config, model, cwd=cwd, session_dir=self.layout.dir, session_id=self.id, on_event=self._on_event,
                subagent_slots=self.manager.subagent_slots, kernel_pool=self.manager.pool,
                seq=self.journal.seq, can_ask=True,  # approval requests are events; the API decides them
                gate=self.manager.gate_factory,
            )
            # Live from here: the session numbers every event (the daemon's own too), and counts
            # against max_sessions before the first await.
            self.session = session
            self.last_active = time.monotonic()
            try:
                if any(isinstance(r, SessionRecord) for r in records):
                    session.resume(records, self._woken_because)
                await session.start()
                for problem in damaged:  # a write a crash or a full disk cut short: skipped, said once
                    session.emit(ev.Error(message=f"a damaged line of the session's record was skipped: {problem}"))
            except BaseException:
                self.session = None
                await _close(session, self.models.release())
                raise
            if self.meta.closed or self.meta.host != "daemon":  # open again, here
                self.meta.closed, self.meta.host = False, "daemon"
                self.save()
            return session

    async def close(self, why: str = "the session was deleted", drain: float | None = None) -> None:
        """Stop its turns (waiting up to `drain` seconds for each to be recorded), kernel and children; the
        files stay (trajectories are training data). A drain that fails still closes it."""
        self.closed = True
        try:
            await self.goal.close()  # a running goal stays `running` on disk: the next daemon resumes it
            await self.queue.stop(why, self.manager.config.kernel.interrupt_grace + 5 if drain is None else drain)
        finally:
            async with self._waking:
                if self.session is not None:
                    await _close(self.session, self.models.release())
                self.session = None
            self.fanout.end_all()
            self.journal.close()

    async def delete(self) -> None:
        """Marked deleted in session.json (no longer listed), then closed."""
        self.meta.deleted = True
        self.save()
        await self.close()

    async def end(self, why: str = "the session was closed") -> None:
        """`sessions close`: stop its goal and its turns (queued ones dropped, said why), then its kernel
        and children. It stays listed, closed; a prompt, a rewind or an attach that needs it opens it again."""
        if self.goal.running():
            self.goal.stop()
        await self.goal.close()
        await self.queue.stop(why, self.manager.config.kernel.interrupt_grace + 5)
        if self.session is not None:
            await self.session.checkpoints.settle()  # the last turn's end checkpoint: a rewind can come back to it
        await self.sleep()
        self.meta.closed = True
        self.save()

    def busy(self) -> bool:
        """A turn running or queued, a goal being pursued, something waking it, or work of its own in
        the background (a refinement being planned, children still running)."""
        return (self.queue.busy() or self.goal.running() or self._waking.locked()
                or (self.session is not None and self.session.is_busy()))

    def idle(self) -> bool:
        """Live, not busy, and nobody following its events: the sweep may put it to sleep."""
        return self.session is not None and not self.busy() and not self.fanout

    def sleep_after(self, turn_id: str) -> asyncio.Task[None]:
        """Back to sleep once the queued turn `turn_id` is over and nothing else keeps the session busy or
        follows its events (a heartbeat woke it); call before any await after `send`."""
        ended = self.queue.watch(turn_id)  # now: the turn may end before the task runs

        async def back_to_sleep() -> None:
            await ended
            while self.busy():
                await asyncio.sleep(0.1)
            if not self.fanout and not self.closed:
                await self.sleep()
        return asyncio.create_task(back_to_sleep())

    async def sleep(self) -> None:
        """Stop the kernel of an idle session; it stays listed (dormant) and wakes on its next prompt."""
        async with self._waking:
            await self._sleep()

    async def _sleep(self) -> None:
        if self.session is None:
            return
        session, models = self.session, self.models.release()
        self._woken_because = SLEPT
        self._plan_state = session.planning, session.plan
        # Shielded: a cancelled caller (an interrupt of the turn that wanted the room) must not
        # leave a kernel running that nothing refers to any more.
        closing = asyncio.ensure_future(_close(session, models))
        try:
            await asyncio.shield(closing)
        finally:
            self.session = None
            if closing.done():
                self.journal.close()  # reopened by the next event

    def recover(self) -> None:
        """After a crash: finish a rewind it cut, close the turn it cut (as interrupted) and the turns it
        left queued. None of it is a use of the session: when it was last used stays as it was."""
        used = self.meta.updated
        if self.layout.rewind_intent.is_file():
            self._finish_rewind()
        self.queue.recover(RESTARTED if self.meta.host == "daemon" else RUN_ENDED, RESTARTED)
        self.meta.updated = used
        self.save()

    def _finish_rewind(self) -> None:
        """A rewind the crash cut midway is finished, so the session is in the new state, not a mix."""
        done = finish_rewind(self.layout, Path(self.meta.cwd), self.harness(), self.config().checkpoints, self.id)
        if done is not None:
            self.emit(rewound(done))

    async def decide_plan(self, approve: bool, note: str | None, plan: str | None,
                          may_loosen: bool = True) -> PlanDecision:
        """A person's decision on the session's plan: approved, the same kernel goes on writable with
        the plan as its next turn (and the session wakes out of plan mode from now on). `may_loosen`:
        False for a client that may only reject (over TCP, where the token's holder may be a kernel)."""
        if approve and not may_loosen:
            raise Refused("remote_loosening", "over TCP a plan can only be rejected: approving it makes the "
                          "workspace writable (approve it over the Unix socket: the app, `prime-agent`, ACP)")
        session = await self.wake()
        if session.turn is not None and session.turn.final and session.plan is not None:
            # the turn that proposed the plan is ending (a client shows the plan from plan.proposed on)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.between_turns.wait(), PLAN_TURN_END)
        if session.turn is not None:
            raise Refused("turn_running", "a turn is running: decide the plan once it ends")
        try:
            follow = await session.decide_plan(approve, note, plan)
        except ValueError as e:
            raise Refused("no_plan", str(e)) from None
        if not approve:
            return PlanDecision(approved=False, turn_id=None)
        # The approval is durable once its trajectory record is (session.json does not change): a daemon
        # that dies from here on wakes the session writable, and the model hears of the plan then.
        return PlanDecision(approved=True, turn_id=self.send(follow or "", "prompt").turn_id)

    async def update(self, title: str | None, model: str | None, sandbox: str | None = None,
                     plan: bool | None = None, may_loosen: bool = True) -> None:
        """Rename the session, switch its model (from the next turn on), its sandbox mode or plan mode
        (its kernel stops now and restarts in the new mode at the next turn). `may_loosen`: False for
        a client that may only tighten the sandbox (over TCP)."""
        if title is not None:
            self.meta.title = title
        if sandbox is not None or plan is not None:
            await self._switch(sandbox, plan, may_loosen)
        if model is not None and model != model_in_force(self._config_if_loads(), self.meta.overrides)[0]:
            if self.turn_running():
                raise Refused("turn_running", "the model can change between turns; interrupt or wait")
            overrides = {**self.meta.overrides, "model": {**self.meta.overrides.get("model", {}), "name": model}}
            try:
                config = self.config(overrides)
            except ConfigError as e:
                raise Refused("bad_config", str(e)) from None
            if self.session is not None:
                self._use_model(config)
            self.meta.overrides = overrides
        self.save()

    async def _switch(self, sandbox: str | None, plan: bool | None, may_loosen: bool = True) -> None:
        """A person's switch of sandbox mode, or of plan mode (on: the workspace read-only in
        workspace-write until they approve a plan; off: the pending plan is dropped). Another
        sandbox mode for a session in plan mode turns plan mode off: plan mode exists only in
        workspace-write, and whoever picks a mode wants the session to run in it.

        Plan mode is the trajectory's (`in_plan_mode`), the sandbox mode session.json's: written in
        the order that never leaves plan mode on in another sandbox mode (on: the mode first; off:
        the record first), so a crash between the two leaves a session that starts."""
        current, planning = self.config().sandbox.mode, self.plan_state()[0]
        if plan:
            if sandbox not in (None, "workspace-write"):
                raise Refused("bad_request", f"plan mode runs in the workspace-write sandbox, not {sandbox}: the "
                              "workspace is read-only until you approve a plan, then writable")
            if (why := unavailable()) is not None:
                raise Refused("bad_config", f"plan mode needs the sandbox to keep the workspace read-only: {why}")
            mode = "workspace-write"
        else:
            mode = sandbox or current
        want = (plan if plan is not None else planning) and mode == "workspace-write"
        if mode == current and want == planning:
            return
        # plan mode's frozen workspace is as tight as read-only: leaving it loosens unless into read-only
        if not may_loosen and (SANDBOX_ORDER[mode] > SANDBOX_ORDER[current] or (planning and not want and mode != "read-only")):
            raise Refused("remote_loosening", f"over TCP a session's sandbox can only be tightened: {current}"
                          f"{' in plan mode' if planning else ''} to {mode}{' in plan mode' if want else ''} loosens it "
                          "(switch it over the Unix socket: the app or `prime-agent`)")
        if self.busy():
            raise Refused("busy", "the sandbox or plan mode can change between turns; interrupt or wait")
        overrides = {**self.meta.overrides, "sandbox": {**self.meta.overrides.get("sandbox", {}), "mode": mode}}
        try:
            load_config(Path(self.meta.cwd), overrides)
        except ConfigError as e:
            raise Refused("bad_config", str(e)) from None
        async with self._waking:
            if self.session is not None:
                await self._sleep()  # the kernel restarts in the new mode at the next turn
                self._woken_because = SWITCHED
            pending = self.plan_state()[1]
            if want and mode != current:
                self.meta.overrides = overrides
                self.save()
            if want != planning:
                note = f"the sandbox was switched to {mode}" if sandbox is not None and not want else None
                try:
                    append_record(self.layout.trajectory, PlanRecord(step="entered" if want else "left", note=note))
                except OSError as e:
                    self.manager.write_failed(e)
                    raise Refused("write_failed", f"the daemon could not record plan mode in "
                                  f"{self.layout.trajectory}: {e}") from e
                self._plan_state = want, None
            else:
                self._plan_state = planning, pending
            self.meta.overrides = overrides  # saved by `update`
        if want != planning:
            self.emit(ev.Note(text=("plan mode on: the workspace is read-only until you approve a plan"
                                    if want else "plan mode off" + (" (the plan that waited is dropped)"
                                                                    if pending else ""))))


async def _close(session: Session, models: list[OpenAIModel]) -> None:
    await session.close()
    for model in models:
        await model.close()
