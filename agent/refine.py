"""The refiner wired into a session: triggers, background planning, apply at turn boundaries.

Planning, validation, skill checks and the optional gate run in a background task while the
session keeps working (at most one in flight). The commit happens only at a turn boundary, so a
turn never sees a half-applied harness; the new view is in force from the next model call.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from agent.bridge import BridgeServer
from agent.config import Config, KernelConfig
from agent.kernel import Kernel
from agent.model import Model, ModelError
from agent.runtime import ENV_PATH, ENV_TOKEN
from agent.trajectory import RefinementRecord
from agent.types import Cell, Message
from harness_store.refiner import Outcome, Plan, RefinementFailed, Refiner

if TYPE_CHECKING:
    from agent.session import Session, Turn


def model_caller(model: Model, config: Config, on_usage=None):
    """The refiner's `complete(messages) -> text`, on the session's model."""

    async def complete(messages: list[dict[str, str]]) -> str:
        c = await model.complete([Message(**m) for m in messages], tools=False, json_mode=config.refine.json_mode)
        if on_usage:
            on_usage(c)
        return c.message.content

    return complete


async def check_skill(skill_id: str, body: str, files: dict[str, str], timeout: float = 60) -> str | None:
    """Compile and import a skill's package and run the first ```python example of its SKILL.md, in a
    scratch kernel; the reason it failed, or None."""
    with tempfile.TemporaryDirectory(prefix="pa-skill-") as tmp:
        root = Path(tmp) / skill_id
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        root.mkdir(exist_ok=True)
        packages = sorted({Path(rel).parts[0].removesuffix(".py") for rel in files if rel.endswith(".py")})
        example = re.search(r"```python\n(.*?)```", body, re.DOTALL)
        steps = [
            ("compile", f"import py_compile, pathlib\nfor f in sorted(pathlib.Path({str(root)!r}).rglob('*.py')):\n"
                        "    py_compile.compile(str(f), doraise=True)"),
            ("import", f"import sys, importlib\nsys.path.insert(0, {str(root)!r})\n"
                       + "".join(f"importlib.import_module({p!r})\n" for p in packages)),
        ]
        if example:
            steps.append(("run its example", example.group(1)))
        bridge = BridgeServer(Path(tmp), {})
        await bridge.start()
        env = {ENV_PATH: str(bridge.path), ENV_TOKEN: bridge.token}
        kernel = Kernel(root, Path(tmp), KernelConfig(cell_timeout=timeout, interrupt_grace=1.0), env)
        try:
            await kernel.start()
            for what, code in steps:
                r = await kernel.execute(Cell(id=what, code=code))
                if r.error_name or r.kernel_events:
                    detail = f"{r.error_name}: {r.error_value}" if r.error_name else r.kernel_message
                    return f"the skill failed to {what}: {detail}"
        finally:
            await kernel.shutdown()
            await bridge.close()
    return None


class SessionRefiner:
    def __init__(self, session: Session):
        self.s = session
        cfg = session.config.refine
        self.config = cfg
        self.refiner = Refiner(
            session.harness.stores, model_caller(session.model, session.config, self._account),
            mode=cfg.mode, default_scope=cfg.default_scope, check_skill=check_skill,
            gate=None,
        )
        self.generation = 0
        """Bumped by interrupts, rollbacks and resets: plans from before are stale."""
        self.task: asyncio.Task | None = None
        self.ready: Outcome | None = None
        self.turns_since = 0
        self.last_auto_turn = -10**9
        self.dir = session.dir / "refinements"

    def use_model(self, model: Model) -> None:
        self.refiner.complete = model_caller(model, self.s.config, self._account)

    def use_gate(self, gate) -> None:
        """A regression gate (`evals.gate.make_gate`) every refinement must pass before it applies."""
        self.refiner.gate = gate

    # --- triggers -------------------------------------------------------------------------------

    def request(self, instructions: str | None = None, trigger: str = "explicit", mode: str | None = None) -> str:
        """Start planning in the background (unless a plan is already in flight or waiting to apply);
        `mode` overrides `refine.mode` for this one."""
        if (self.task is not None and not self.task.done()) or self.ready is not None:
            return "a refinement is already being planned or waits for the turn boundary; it applies then"
        self.task = asyncio.create_task(self._plan(instructions, trigger, review=False, mode=mode))
        return "refinement planning started; it applies at the next turn boundary"

    def after_turn(self, turn: Turn, compacted: bool) -> None:
        """Auto-refine: every `auto_every` completed turns and after compaction, behind a review call."""
        if self.config.auto_every <= 0:
            return
        self.turns_since += 1
        due = self.turns_since >= self.config.auto_every or (compacted and self.config.after_compaction)
        cooled = self.s.turns - self.last_auto_turn >= self.config.cooldown_turns
        if due and cooled and (self.task is None or self.task.done()):
            self.turns_since, self.last_auto_turn = 0, self.s.turns
            self.task = asyncio.create_task(self._plan(None, "auto", review=True))

    def invalidate(self, why: str) -> None:
        """Interrupts, rollbacks and resets make what was planned before them stale (pending reviews too)."""
        self.generation += 1
        stale = [self.ready.plan] if self.ready is not None else []
        self.ready = None
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            stale.append(Plan.from_json(path.read_text()))
            path.unlink()
        for plan in stale:
            self._finish(Outcome(plan, "rejected", reason=f"stale: {why} since planning"), None)

    # --- background -----------------------------------------------------------------------------

    async def _plan(self, instructions: str | None, trigger: str, review: bool, mode: str | None = None) -> None:
        s, generation = self.s, self.generation
        evidence = transcript(s.messages, self.config.window_chars)
        try:
            if review:
                decision = await self.refiner.review(evidence)
                if not decision.should_refine:
                    s.emit("refinement.skipped", None, trigger=trigger, rationale=decision.rationale)
                    return
                instructions = decision.instructions
            plan = await self.refiner.plan(evidence, s.harness.view.render(), trigger=trigger,
                                           instructions=instructions, generation=generation)
            s.emit("refinement.proposed", None, id=plan.id, trigger=trigger, summary=plan.proposal.summary,
                   rationale=plan.proposal.rationale, edits=[e.model_dump() for e in plan.proposal.edits])
            outcome = await self.refiner.prepare(plan, mode=mode)
        except (RefinementFailed, ModelError) as e:
            self._failed(trigger, str(e))
            return
        except Exception as e:  # a crash of the planning task is a failed refinement, never a dead session
            self._failed(trigger, f"internal error: {type(e).__name__}: {e}")
            return
        self._ready_or_finish(outcome)

    def _ready_or_finish(self, outcome: Outcome) -> None:
        if outcome.status != "ready":
            self._finish(outcome, None)
            return
        self.ready = outcome
        if self.s.turn is None:  # idle: this is a turn boundary
            try:
                self.at_boundary()
            except Exception as e:
                self._failed(outcome.plan.trigger, f"could not apply: {type(e).__name__}: {e}")

    def at_boundary(self) -> None:
        """Commit a ready refinement (called between turns)."""
        outcome, self.ready = self.ready, None
        if outcome is None:
            return
        outcome = self.refiner.commit(outcome, session=self.s.id, generation=self.generation)
        self._finish(outcome, self.s.turn)

    # --- review mode ----------------------------------------------------------------------------

    async def decide(self, refinement_id: str, approve: bool) -> Outcome:
        """Approve (it applies at the next turn boundary, now if idle) or reject a pending refinement."""
        path = self.dir / f"{refinement_id}.json"
        if not path.is_file():
            raise KeyError(f"no pending refinement {refinement_id!r} in session {self.s.id}")
        plan = Plan.from_json(path.read_text())
        if not approve:
            path.unlink()
            outcome = Outcome(plan, "rejected", reason="rejected by the user")
            self._finish(outcome, self.s.turn)
            return outcome
        outcome = await self.refiner.prepare(plan, approved=True)  # if this fails, the plan still waits
        path.unlink()
        self._ready_or_finish(outcome)
        return outcome

    # --- records --------------------------------------------------------------------------------

    def _finish(self, outcome: Outcome, turn: Turn | None) -> None:
        plan, s = outcome.plan, self.s
        if outcome.status == "pending":
            self.dir.mkdir(exist_ok=True)
            (self.dir / f"{plan.id}.json").write_text(plan.to_json())
        s.record(RefinementRecord(
            turn_id=turn.id if turn else None, refinement_id=plan.id, trigger=plan.trigger, status=outcome.status,
            summary=plan.proposal.summary, rationale=plan.proposal.rationale,
            edits=[e.model_dump() for e in outcome.applied], refused=[{"id": e.id, "reason": r} for e, r in outcome.refused],
            commit=outcome.change.commit if outcome.change else None, reason=outcome.reason or None,
        ))
        kind = {"applied": "refinement.applied", "pending": "refinement.pending", "dry-run": "refinement.dry_run"}
        s.emit(kind.get(outcome.status, "refinement.rejected"), turn.id if turn else None, id=plan.id,
               summary=plan.proposal.summary, diff=outcome.diff, reason=outcome.reason,
               scopes=sorted({scope for _, scope, _ in outcome.edits}),
               refused=[{"id": e.id, "reason": r} for e, r in outcome.refused])

    def _failed(self, trigger: str, reason: str) -> None:
        self.s.record(RefinementRecord(refinement_id="", trigger=trigger, status="failed", summary="", reason=reason))
        self.s.emit("refinement.failed", None, trigger=trigger, reason=reason)

    def _account(self, completion) -> None:
        self.s.usage += completion.usage


def transcript(messages: list[Message], limit: int) -> str:
    """The recent conversation as text for the planner: newest kept, each message bounded."""
    out, used = [], 0
    for m in reversed(messages[1:]):
        text = m.content + "".join(f"\n[code]\n{_code(c.arguments)}" for c in m.tool_calls)
        if len(text) > 2000:
            text = text[:1000] + f"\n[... {len(text) - 2000:,} characters cut ...]\n" + text[-1000:]
        block = f"[{m.role}] {text}"
        if used + len(block) > limit:
            break
        out.append(block)
        used += len(block)
    return "\n\n".join(reversed(out))


def _code(arguments: str) -> str:
    try:
        return json.loads(arguments).get("code", arguments)
    except (ValueError, AttributeError):
        return arguments
