"""Plan mode (`sandbox.plan`, docs/architecture.md §16): the workspace read-only until a person approves
the plan the model proposed (`propose_plan(text)` in the kernel); approved, the same kernel's
workspace becomes writable and the session goes on in workspace-write. The trajectory's plan
records are the durable truth of it (`in_plan_mode`, `pending_plan`), not session.json.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agent import events as ev
from agent.context import Sinks
from agent.kernel import Kernel
from agent.prompt import render
from agent.trajectory import PlanRecord, Record, TurnStartedRecord, in_plan_mode, pending_plan


class PlanMode:
    """One session's plan mode, the one place it is kept: whether it is on, the plan that waits for
    a person, and the steps that change them. The session hands it what those steps touch: its
    `kernel` (frozen from the next start, thawed when a plan is approved), `final` (the running turn
    ends with an answer), `sync` (the trajectory made durable; OSError where it cannot be) and `tell`
    (a notice for the model's next turn). Subagents spawned while it is on are in plan mode too."""

    def __init__(self, on: bool, sinks: Sinks, kernel: Kernel, *, final: Callable[[str], Awaitable[None]],
                 sync: Callable[[], None], tell: Callable[[str], None]):
        self.on = on
        """The workspace is read-only until a person approves a plan."""
        self.plan: str | None = None
        """The plan the model proposed and nobody has decided yet."""
        self._sinks, self._kernel = sinks, kernel
        self._final, self._sync, self._tell = final, sync, tell

    def handlers(self) -> dict[str, Any]:
        return {"plan.propose": self.propose}

    def set(self, on: bool) -> None:
        """Plan mode on or off from the next kernel start (a running kernel is thawed by `decide`)."""
        self.on = on
        self._kernel.freeze(on)

    def notes(self) -> list[str]:
        """What the model is told at the start of each turn in plan mode."""
        return [render("plan")] if self.on else []

    async def propose(self, plan: str) -> None:
        """`propose_plan(text)` from a cell: the plan waits for a person, and the turn ends with it."""
        if not self.on:
            raise RuntimeError("propose_plan() is for plan mode, and this session is not in it: go ahead and do it")
        if not plan.strip():
            raise ValueError("the plan is empty")
        self.plan = plan
        turn_id = self._sinks.turn_id()
        self._sinks.log(PlanRecord(turn_id=turn_id, step="proposed", plan=plan), ev.PlanProposed(turn_id=turn_id, plan=plan))
        await self._final(plan)

    async def decide(self, approve: bool, note: str | None = None, plan: str | None = None) -> str | None:
        """A person's decision on the proposed plan (`plan`: as they edited it). Approved, the same
        kernel's workspace becomes writable and the prompt that carries the plan out is returned (the
        caller sends it); rejected, the note reaches the model with the next prompt and plan mode goes on."""
        if self.plan is None:
            raise ValueError("no plan waits for a decision in this session")
        if self._sinks.turn_id() is not None:
            raise RuntimeError("a turn is running: decide the plan once it ends")
        proposed, self.plan = self.plan, None  # taken before any await: a second decision finds none
        plan = plan if plan and plan.strip() else proposed
        if approve:
            try:
                await self._kernel.thaw()
            except BaseException:
                self.plan = proposed
                raise
            self.set(False)  # subagents spawned from now on write too
        # The approval's one durable fact (`in_plan_mode` reads it on resume): synced before anyone hears of it.
        self._sinks.record(PlanRecord(step="approved" if approve else "rejected", plan=plan, note=note))
        if approve:
            try:
                self._sync()
            except OSError as e:
                self._sinks.emit(ev.Error(message=f"the plan's approval could not be made durable (a restart may "
                                          f"find the session in plan mode again): {e}"))
        self._sinks.emit(ev.PlanDecided(approved=approve, note=note, plan=plan))
        if not approve:
            self._tell(f"[The user rejected your plan{': ' + note if note else ''}. The workspace stays "
                       "read-only: investigate further and propose another with propose_plan().]")
            return None
        return render("plan_approved", note=f" ({note})" if note else "", plan=plan)

    def resume(self, records: list[Record], created: bool) -> None:
        """Take plan mode up from a trajectory (`created`: whether the session was created in it):
        on or off, the plan that waits, and a notice of a change since the last turn the model has
        yet to hear of."""
        self.set(in_plan_mode(records, created))
        self.plan = pending_plan(records) if self.on else None
        since = next((r for r in reversed(records) if isinstance(r, TurnStartedRecord | PlanRecord)), None)
        if isinstance(since, PlanRecord) and since.step != "proposed":
            self._tell(_notice(since))


def _notice(r: PlanRecord) -> str:
    """What the model is told, resumed, of plan mode changing after its last turn (an approval whose
    follow-up turn never ran: the process ended between the two)."""
    why = f" ({r.note})" if r.note else ""
    if r.step == "approved":
        return f"[The user approved your plan{why}. The workspace is writable now: carry the plan out.]\n\n{r.plan}"
    if r.step == "entered":
        return f"[The user turned plan mode on{why}.] " + render("plan")
    if r.step == "left":
        return (f"[The user turned plan mode off{why}: no plan waits for approval any more, and the workspace is "
                "as the session's sandbox allows. Go on with the task.]")
    return (f"[The user rejected your plan{why}. The workspace stays read-only: investigate further and "
            "propose another with propose_plan().]")
