"""The refiner wired into a session: triggers, background planning, apply at turn boundaries.

Planning, validation, skill checks and the optional gate run in a background task while the
session keeps working (at most one in flight). The commit happens only at a turn boundary, so a
turn never sees a half-applied harness; the new view is in force from the next model call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent import events as ev
from agent.kernel.bridge import BridgeServer
from agent.config_models import Config, KernelConfig, SandboxConfig
from agent.context import Context, Current, Sinks, transcript
from agent.harness import SessionHarness
from agent.kernel import Kernel
from agent.layout import SessionLayout
from agent.model import Model, ModelError, Repeating
from agent.kernel.runtime import ENV_PATH, ENV_TOKEN
from agent.trajectory import RefinementRecord
from agent.types import Cell, Completion, Message
from harness_store.entries import HarnessError, InvalidEntry
from harness_store.refiner import Outcome, Plan, Proposal, ProposedEdit, RefinementError, Refiner, Verdict, render_edits
from harness_store.store import ForeignRepository, new_refinement_id


def model_caller(model: Model | None, config: Config, on_usage=None):
    """The refiner's `complete(messages, schema) -> text`, on the session's model (None: none is configured,
    and planning says so; deciding a plan already made needs no model). The reply's schema is sent where
    `refine.structured` says (auto: where the server says it enforces one), else a JSON object is asked
    for (`refine.json_mode`). A reply stopped for falling into a loop is no plan: a RefinementError."""

    async def complete(messages: list[dict[str, str]], schema: dict[str, Any] | None = None) -> str:
        if model is None:
            raise RefinementError("no model configured to plan with (set PRIME_AGENT_MODEL and OPENAI_BASE_URL)")
        structured = config.refine.structured
        if schema is not None and structured == "auto":
            structured = (await model.describe()).structured_outputs is True
        json_mode = schema if schema is not None and structured is True else config.refine.json_mode
        try:
            c = await model.complete([Message(**m) for m in messages], tools=False, json_mode=json_mode)
        except Repeating as e:  # a reply, and no plan: not an outage
            raise RefinementError(str(e)) from None
        if on_usage:
            on_usage(c)
        return c.message.content

    return complete


async def check_skill(skill_id: str, body: str, files: dict[str, str], *, sandbox: SandboxConfig,
                      timeout: float = 60) -> str | None:
    """Compile and import a skill's package and run the first ```python example of its SKILL.md, in a
    scratch kernel confined as `sandbox` says (the session's: its mode, network, hidden paths, limits
    and environment); the reason it failed, or None."""
    with tempfile.TemporaryDirectory(prefix="pa-skill-") as tmp:
        root = Path(tmp) / skill_id
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        root.mkdir(exist_ok=True)
        packages = sorted({Path(rel).parts[0].removesuffix(".py") for rel in files if rel.endswith(".py")})
        example = re.search(r"```python\n(.*?)```", body, re.DOTALL)
        steps = [
            ("compile", f"import pathlib\nfor f in sorted(pathlib.Path({str(root)!r}).rglob('*.py')):\n"
                        "    compile(f.read_bytes(), str(f), 'exec')"),  # writes nothing: read-only sandboxes too
            ("import", f"import sys, importlib\nsys.path.insert(0, {str(root)!r})\n"
                       + "".join(f"importlib.import_module({p!r})\n" for p in packages)),
        ]
        if example:
            steps.append(("run its example", example.group(1)))
        bridge = BridgeServer(Path(tmp), {})

        async def ready(kernel_dir: Path) -> dict[str, str]:
            await bridge.start(kernel_dir)
            return {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}

        kernel = Kernel(root, KernelConfig(cell_timeout=timeout, interrupt_grace=1.0), sandbox=sandbox)  # in `root`
        try:
            await kernel.start(ready=ready)
            for what, code in steps:
                r = await kernel.execute(Cell(id=what, code=code))
                if r.error_name or r.kernel_events:
                    detail = f"{r.error_name}: {r.error_value}" if r.error_name else r.kernel_message
                    return f"the skill failed to {what}: {detail}"
        finally:
            await kernel.shutdown()
            await bridge.close()
    return None


Hold = Callable[[Plan], Awaitable[Outcome]]
"""A plan whose edits name their scopes, judged by the refiner's rules now, then kept until a person decides."""
Gate = Callable[[Plan], Awaitable[Verdict]]
GateFactory = Callable[[Config, Model, SessionHarness], "Gate | None"]
"""A session's regression gate, built for the model it is given (`evals.gate.gate_for`): a session
builds its gate at birth and again when its model changes, so the gate replays on the model in use."""
"""A regression gate: may this plan apply? (evals.gate builds one from a task set.)"""


KERNEL = "kernel"
"""The trigger of a refinement a cell asked for (`await refine.request()`)."""


class SessionRefiner:
    """One session's refinements. Handed the session's harness, context and sinks, not the session."""

    def __init__(self, current: Current, harness: SessionHarness, context: Context, layout: SessionLayout,
                 session_id: str, sinks: Sinks, gate: GateFactory | None = None, hold: Hold | None = None):
        """Plans are made, and judged by the regression `gate` (built for the model in use, `GateFactory`),
        on the session's model as it is now (`current`); plans waiting for review are kept in the
        session's `layout`; `hold`: where a plan the kernel caused waits for a person (a child's goes to
        the top session's, `SessionRefiner.hold`, where a person reviews)."""
        self.hold: Hold = hold or self._hold
        self.current, self.gate = current, gate
        self.config = current.config.refine
        self.harness, self.context, self.session_id, self.sinks = harness, context, session_id, sinks
        self.refiner = Refiner(
            harness.stores, self._complete,
            mode=self.config.mode, default_scope=self.config.default_scope, gate=self._gate if gate else None,
            check_skill=functools.partial(check_skill, sandbox=current.config.sandbox),
        )
        self.generation = 0
        """Bumped by interrupts, rollbacks and resets: plans from before are stale."""
        self.task: asyncio.Task | None = None
        self.ready: Outcome | None = None
        self.turns_since = 0
        self.turns_ended = 0
        self.last_auto_turn = -10**9
        self.compactions_seen = 0
        self.layout = layout
        self.cause: str | None = None
        """The turn whose refinement is being planned (its spend is that turn's)."""

    async def _complete(self, messages: list[dict[str, str]], schema: dict[str, Any] | None = None) -> str:
        """The planner's model call, on the model in use now."""
        return await model_caller(self.current.model, self.current.config, self._charge)(messages, schema)

    async def _gate(self, plan: Plan) -> Verdict:
        """The regression gate, replayed on the model in use now."""
        assert self.gate is not None
        gate = self.gate(self.current.config, self.current.model, self.harness)
        return Verdict(True, "no gate is configured") if gate is None else await gate(plan)

    def planning(self) -> bool:
        return self.task is not None and not self.task.done()

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    # --- triggers -------------------------------------------------------------------------------

    def request(self, instructions: str | None = None, trigger: str = "explicit", mode: str | None = None) -> str:
        """Start planning in the background (unless a plan is already in flight or waiting to apply);
        `mode` overrides `refine.mode` for this one. Trigger `kernel` (`refine.request()` in a cell):
        its edits beyond the session scope wait for a person in any mode, as a cell's own edits do."""
        if self.planning() or self.ready is not None:
            return "a refinement is already being planned or waits for the turn boundary; it applies then"
        self.cause = self.sinks.turn_id()
        self.task = asyncio.create_task(self._plan(instructions, trigger, review=False, mode=mode))
        if trigger == KERNEL:
            return ("refinement planning started; its session-scope edits apply at the next turn boundary, "
                    "edits of the project or user scope only once a person accepts them")
        return "refinement planning started; it applies at the next turn boundary"

    def after_turn(self, turn_id: str) -> None:
        """Auto-refine after `turn_id`: every `auto_every` completed turns and after compaction, behind a review call."""
        compacted = self.context.compactions > self.compactions_seen
        self.compactions_seen = self.context.compactions
        if self.config.auto_every <= 0:
            return
        self.turns_since += 1
        self.turns_ended += 1
        due = self.turns_since >= self.config.auto_every or (compacted and self.config.after_compaction)
        cooled = self.turns_ended - self.last_auto_turn >= self.config.cooldown_turns
        if due and cooled and not self.planning():
            self.turns_since, self.last_auto_turn, self.cause = 0, self.turns_ended, turn_id
            self.task = asyncio.create_task(self._plan(None, "auto", review=True))

    def invalidate(self, why: str) -> None:
        """Interrupts, rollbacks and resets make what was planned before them stale (pending reviews too)."""
        self.generation += 1
        stale = [self.ready.plan] if self.ready is not None else []
        self.ready = None
        for path in sorted(self.layout.refinements.glob("*.json")):
            stale.append(Plan.from_json(path.read_text()))
            path.unlink()
        for plan in stale:
            self._finish(Outcome(plan, "rejected", reason=f"stale: {why} since planning"))

    # --- background -----------------------------------------------------------------------------

    async def _plan(self, instructions: str | None, trigger: str, review: bool, mode: str | None = None) -> None:
        generation = self.generation
        evidence = transcript(self.context.messages[1:], per_message=2000, total=self.config.window_chars)
        try:
            if review:
                decision = await self.refiner.review(evidence)
                if not decision.should_refine:
                    self.sinks.emit(ev.RefinementSkipped(trigger=trigger, rationale=decision.rationale))
                    return
                instructions = decision.instructions
            plan = await self.refiner.plan(evidence, self.harness.view.render(), trigger=trigger,
                                           instructions=instructions, generation=generation)
            self.sinks.emit(ev.RefinementProposed(
                id=plan.id, trigger=trigger, summary=plan.proposal.summary, rationale=plan.proposal.rationale,
                edits=[e.model_dump() for e in plan.proposal.edits]))
            outcome = await self.refiner.prepare(plan, mode=mode)
            if trigger == KERNEL:
                outcome = await self._held_beyond_session(outcome)
                if outcome is None:
                    return
        except (RefinementError, ModelError, HarnessError) as e:
            self._failed(trigger, str(e))
            return
        except Exception as e:  # a crash of the planning task is a failed refinement, never a dead session
            self._failed(trigger, f"internal error: {type(e).__name__}: {e}")
            return
        self._ready_or_finish(outcome)

    async def _held_beyond_session(self, outcome: Outcome) -> Outcome | None:
        """What the kernel asked for lands beyond the session scope only once a person accepts it: those
        edits (all of them in review mode) wait as a plan of their own (`hold`: in the top session's
        records); the session's own go on (None: nothing is left of the plan here)."""
        if outcome.status not in ("ready", "pending"):
            return outcome
        review = outcome.status == "pending"
        own = [edit for edit in outcome.edits if edit[1] == "session" and not review]
        held = [edit for edit in outcome.edits if edit[1] != "session" or review]
        if not held:
            return outcome
        plan = outcome.plan
        await self.hold(dataclasses.replace(plan, id=new_refinement_id("r") if own else plan.id, proposal=(
            plan.proposal.model_copy(update={"edits": [pe.model_copy(update={"scope": scope}) for pe, scope, _ in held]}))))
        if not own:
            return None
        return dataclasses.replace(outcome, applied=[pe for pe, _, _ in own], edits=own, diff=render_edits(own))

    def _ready_or_finish(self, outcome: Outcome) -> None:
        if outcome.status != "ready":
            self._finish(outcome)
            return
        self.ready = outcome
        if self.sinks.turn_id() is None:  # idle: this is a turn boundary
            try:
                self.at_boundary()
            except Exception as e:
                self._failed(outcome.plan.trigger, f"could not apply: {type(e).__name__}: {e}")

    def at_boundary(self) -> None:
        """Commit a ready refinement (called between turns)."""
        outcome, self.ready = self.ready, None
        if outcome is None:
            return
        self._finish(self.refiner.commit(outcome, session=self.session_id, generation=self.generation))

    # --- review mode ----------------------------------------------------------------------------

    async def propose(self, edit: ProposedEdit, summary: str) -> str:
        """A cell's edit of a scope wider than its session's: judged by the refiner's rules now (a
        refusal raises, with the rule's reason), then it waits, as a review-mode refinement does, for
        a person to accept it (the app's card, `prime-agent harness review`); once accepted its
        entry says `source: agent`."""
        assert edit.scope is not None and edit.id is not None
        plan = Plan(new_refinement_id("a"), "agent", Proposal(summary=summary, edits=[edit]),
                    {f"{edit.scope}:{edit.id}": self.refiner.stores[edit.scope].version_of(edit.id)},
                    self.generation, source="agent")
        await self.hold(plan)  # a child's waits in the top session, where a person reviews
        return (f"proposed {summary} ({edit.scope} scope) as {plan.id}: not in force until a person accepts it "
                f"(`prime-agent harness review`, or the app's card)")

    async def _hold(self, plan: Plan) -> Outcome:
        """`plan` (its edits name their scopes) judged by the refiner's rules now (a refusal of every
        edit raises, with the first rule's reason), then kept in this session's records until a person
        accepts or rejects it (`decide`)."""
        for scope in {pe.scope for pe in plan.proposal.edits}:
            if scope is not None and (why := self.refiner.stores[scope].problem()) is not None:
                raise ForeignRepository(why)
        plan.generation = self.generation
        ok, refused = await self.refiner.validate(plan)
        if not ok:
            raise InvalidEntry(f"refused by the refiner's rules: {refused[0][1] if refused else 'no edits'}")
        plan.proposal = plan.proposal.model_copy(update={"edits": [pe for pe, _, _ in ok]})
        outcome = Outcome(plan, "pending", [pe for pe, _, _ in ok], refused, diff=render_edits(ok), edits=ok)
        self._finish(outcome)
        return outcome

    async def decide(self, refinement_id: str, approve: bool) -> Outcome:
        """Approve (it applies at the next turn boundary, now if idle) or reject a pending refinement."""
        path = self.layout.pending(refinement_id)
        if not path.is_file():
            raise KeyError(f"no refinement {refinement_id!r} waits for review in session {self.session_id}")
        plan = Plan.from_json(path.read_text())
        plan.generation = self.generation  # still on disk, so nothing made it stale up to now
        if not approve:
            path.unlink()
            outcome = Outcome(plan, "rejected", reason="rejected by the user")
            self._finish(outcome)
            return outcome
        outcome = await self.refiner.prepare(plan, approved=True)  # if this fails, the plan still waits
        path.unlink()
        self._ready_or_finish(outcome)
        return outcome

    # --- records --------------------------------------------------------------------------------

    def _finish(self, outcome: Outcome) -> None:
        plan, turn_id = outcome.plan, self.sinks.turn_id()
        if outcome.status == "pending":
            self.layout.refinements.mkdir(exist_ok=True)
            self.layout.pending(plan.id).write_text(plan.to_json())
        refused = [ev.Refused(id=e.id, reason=r) for e, r in outcome.refused]
        kind = ev.DECIDED.get(outcome.status, ev.RefinementRejected)
        self.sinks.log(
            RefinementRecord(turn_id=turn_id, refinement_id=plan.id, trigger=plan.trigger, status=outcome.status,
                             summary=plan.proposal.summary, rationale=plan.proposal.rationale,
                             edits=[e.model_dump() for e in outcome.applied], refused=[r.model_dump() for r in refused],
                             commit=outcome.change.commit if outcome.change else None, reason=outcome.reason or None),
            kind(turn_id=turn_id, id=plan.id, summary=plan.proposal.summary, diff=outcome.diff, reason=outcome.reason,
                 scopes=sorted({scope for _, scope, _ in outcome.edits}), refused=refused))

    def _failed(self, trigger: str, reason: str) -> None:
        self.sinks.log(RefinementRecord(refinement_id="", trigger=trigger, status="failed", summary="", reason=reason),
                       ev.RefinementFailed(trigger=trigger, reason=reason))

    def _charge(self, completion: Completion) -> None:
        self.sinks.charge(completion.usage, "refine", self.cause)

