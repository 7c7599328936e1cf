"""Goals: a prompt, a check and a budget; turns continue until the check passes or the budget ends.

After each turn the check runs (`run_check`: a shell command in the workspace, in the session's
sandbox, with a timeout); when it fails, a continuation turn starts carrying its output (capped) and
the budget left. With no check (autonomous mode) the goal is achieved when the model calls
`final()`. The goal ends `achieved`, `exhausted` (the first budget limit reached), `stopped` (asked
to, or interrupted) or `error` (a turn failed for good, or the check could not run).

    state = GoalState.new(GoalSpec(text="make the tests pass", check="pytest -q"))
    await pursue(state, host)      # host: the session (or the daemon's queue in front of it)

`GoalState` is the whole record of a goal (the daemon keeps it in session.json, so a restart
resumes a goal its budget still has room for); `pursue` only ever moves it forward.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agent import events as ev
from agent.kernel import sandbox
from agent.prompt import render
from agent.kernel.sandbox import Launch
from agent.kernel.view import View
from agent.trajectory import GoalRecord, Record
from agent.types import Text, TurnResult, Usage

GoalStatus = Literal["running", "achieved", "exhausted", "stopped", "error"]
OUTPUT_CAP = 8000
"""Characters of a check's output a continuation prompt carries (head and tail kept)."""


class GoalBudget(BaseModel):
    """Limits on a whole goal; None means unlimited. The first one reached ends the goal."""

    model_config = ConfigDict(extra="forbid")

    max_continuations: int | None = Field(10, ge=0)
    """Turns after the first."""
    max_turns: int | None = Field(None, ge=1)
    """Turns in all (the first included)."""
    max_tokens: int | None = Field(None, ge=1)
    """Prompt plus completion tokens over every turn of the goal."""
    max_cost: float | None = Field(None, ge=0)
    """Dollars over every turn of the goal."""
    max_seconds: float | None = Field(None, gt=0)
    """Wall-clock seconds from the goal's start (a daemon's downtime counts): a turn still running then is
    interrupted."""


class GoalSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: Text = Field(min_length=1)
    check: Text | None = Field(None, min_length=1, pattern=r"^[^\x00]*$")
    """A shell command run in the workspace after each turn; exit 0 means achieved. None: autonomous mode
    (achieved when the model calls `final()`)."""
    check_timeout: float = Field(300.0, gt=0)
    """Seconds the check may run; past it the check is killed and counts as failed."""
    budget: GoalBudget = Field(default_factory=GoalBudget)


class CheckResult(BaseModel):
    passed: bool
    exit_code: int | None = None
    output: str = ""
    """Its stdout and stderr together, capped (`OUTPUT_CAP`)."""
    duration: float = 0.0
    timed_out: bool = False


class GoalState(BaseModel):
    """A goal and how far it got: what `GET /v1/sessions/{id}/goal` returns."""

    id: str
    spec: GoalSpec
    state: GoalStatus = "running"
    continuations: int = 0
    turns: int = 0
    turn_ids: list[str] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    started: float = Field(default_factory=time.time)
    finished: float | None = None
    last_check: CheckResult | None = None
    reason: str | None = None
    """Why it ended (or, while running, why it resumed)."""
    stop_requested: bool = False
    """Stop after the current turn (`DELETE .../goal`)."""
    last_final: bool = False
    """The last turn ended with a call to `final()` (what autonomous mode checks)."""

    @classmethod
    def new(cls, spec: GoalSpec) -> GoalState:
        return cls(id="g-" + secrets.token_hex(4), spec=spec)

    def seconds(self) -> float:
        return (self.finished or time.time()) - self.started

    def exhausted(self) -> str | None:
        """The budget limit reached, said for a person; None while there is room for another turn."""
        b = self.spec.budget
        if b.max_continuations is not None and self.continuations >= b.max_continuations:
            return f"used its {b.max_continuations} continuations (max_continuations)"
        if b.max_turns is not None and self.turns >= b.max_turns:
            return f"used its {b.max_turns} turns (max_turns)"
        if b.max_tokens is not None and self.usage.total_tokens >= b.max_tokens:
            return f"used {self.usage.total_tokens} of its {b.max_tokens} tokens (max_tokens)"
        if b.max_cost is not None and self.usage.cost >= b.max_cost:
            return f"spent ${self.usage.cost:.4f} of its ${b.max_cost:g} (max_cost)"
        if b.max_seconds is not None and self.seconds() >= b.max_seconds:
            return f"ran its {b.max_seconds:g} seconds (max_seconds)"
        return None

    def budget_left(self) -> dict[str, float | int]:
        """What remains of each limit that is set."""
        b, left = self.spec.budget, {}
        if b.max_continuations is not None:
            left["continuations"] = max(0, b.max_continuations - self.continuations)
        if b.max_turns is not None:
            left["turns"] = max(0, b.max_turns - self.turns)
        if b.max_tokens is not None:
            left["tokens"] = max(0, b.max_tokens - self.usage.total_tokens)
        if b.max_cost is not None:
            left["cost"] = max(0.0, b.max_cost - self.usage.cost)
        if b.max_seconds is not None:
            left["seconds"] = round(max(0.0, b.max_seconds - self.seconds()), 1)
        return left

    def summary(self) -> str:
        """The goal in a line, as `prime-agent sessions` shows it: `running · continuation 2 of 5 ·
        1,200 tokens · 40 s left`, or `achieved after 3 turns`."""
        if self.state != "running":
            return f"{self.state} after {self.turns} turn{'' if self.turns == 1 else 's'}"
        b = self.spec.budget
        parts = ["running", f"continuation {self.continuations}" + (
            f" of {b.max_continuations}" if b.max_continuations is not None else "")]
        parts.append(f"{self.usage.total_tokens:,} tokens")
        if b.max_seconds is not None:
            parts.append(f"{self.budget_left()['seconds']:g} s left")
        return " · ".join(parts)


class GoalHost(Protocol):
    """What a goal needs of whoever runs its turns: the session, or the daemon's queue in front of it."""

    async def check(self, command: str, timeout: float) -> CheckResult:
        """Run the check (`run_check`) in the workspace, under the session's sandbox."""

    async def goal_turn(self, text: str, goal_id: str, continuation: int) -> TurnResult: ...
    async def interrupt(self) -> None: ...
    def subagents_running(self) -> bool: ...
    def emit(self, event: ev.Event) -> None: ...
    def record(self, record: Record) -> None: ...


async def run_check(command: str, cwd: Path, timeout: float, launch: Launch, view: View) -> CheckResult:
    """Run a goal's check: `command` through the shell in `cwd`, in a sandbox of its own that is the
    session kernel's (`launch`, `view`: what a cell cannot write, a check the model's code runs in
    cannot either), stdout and stderr together, killed with all it started past `timeout`."""
    started = time.monotonic()
    head, tail, cut = bytearray(), bytearray(), 0
    timed_out, code, hits = False, None, []
    async with sandbox.shell(command, cwd, launch, view) as (proc, box):

        async def read() -> int:  # what it printed is kept even when it is killed; memory stays bounded
            nonlocal tail, cut
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                room = OUTPUT_CAP * 4 - len(head)
                head.extend(chunk[:room])
                tail.extend(chunk[room:])
                if len(tail) > OUTPUT_CAP * 4:
                    cut += len(tail) - OUTPUT_CAP * 4
                    tail = tail[-OUTPUT_CAP * 4:]
            return await proc.wait()

        try:
            code = await asyncio.wait_for(read(), timeout)
        except TimeoutError:
            timed_out = True
        hits = box.hits()
    out = bytes(head) + (f"\n[... {cut:,} bytes cut ...]\n".encode() if cut else b"") + bytes(tail)
    text = cap(out.decode("utf-8", errors="replace"))
    if timed_out:
        text += f"\n[the check was killed after {timeout:g} seconds]"
    text += "".join(f"\n[the check hit {launch.limits.describe(limit)}]" for limit in hits)
    return CheckResult(passed=code == 0, exit_code=code, output=text, duration=time.monotonic() - started,
                       timed_out=timed_out)


def cap(text: str, limit: int = OUTPUT_CAP) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit:,} characters cut ...]\n{text[-half:]}"


async def pursue(state: GoalState, host: GoalHost, on_change: Callable[[GoalState], None] = lambda s: None) -> GoalState:
    """Run the goal to its end (or, for one resumed with turns behind it, from its next check).
    `on_change` is called after every step (the daemon saves the state there). Never raises for a
    failed turn or check: the goal ends `error`, said why."""
    spec = state.spec
    if state.turns == 0:
        host.emit(ev.GoalStarted(goal_id=state.id, text=spec.text, check=spec.check,
                                 budget=spec.budget.model_dump(exclude_none=True)))
        host.record(GoalRecord(goal_id=state.id, step="started", spec=spec))
    timer = _deadline(state, host, on_change)
    try:
        if state.turns == 0:
            if await _turn(state, host, spec.text, on_change):
                return state
        while True:
            check = await _check(state, host, on_change)
            if check.passed:
                return finish(state, host, "achieved", "the check passed" if spec.check else "the model called final()",
                               on_change)
            if state.stop_requested:
                return finish(state, host, "stopped", "stopped by request after the turn", on_change)
            if (why := state.exhausted()) is not None:
                return finish(state, host, "exhausted", f"the goal {why}", on_change)
            while host.subagents_running():  # continuations do not pile on top of running children
                await asyncio.sleep(0.2)
            if state.state != "running":
                return state
            state.continuations += 1
            host.emit(ev.GoalContinued(goal_id=state.id, continuation=state.continuations,
                                       budget_left=state.budget_left()))
            host.record(GoalRecord(goal_id=state.id, step="continued", continuation=state.continuations))
            if await _turn(state, host, _continuation(state, check), on_change):
                return state
    except Exception as e:  # a bug of ours, or a check that could not start: the goal ends, said why
        return finish(state, host, "error", f"{type(e).__name__}: {e}", on_change)
    finally:
        if timer is not None:
            timer.cancel()


async def _turn(state: GoalState, host: GoalHost, text: str, on_change: Callable[[GoalState], None]) -> bool:
    """One turn of the goal; True when it ended the goal."""
    result = await host.goal_turn(text, state.id, state.continuations)
    state.turns += 1
    state.turn_ids.append(result.turn_id)
    state.usage += result.usage
    state.last_final = result.final
    on_change(state)
    if state.state != "running":  # ended meanwhile (the budget's deadline)
        return True
    if result.outcome == "interrupted":
        finish(state, host, "stopped", f"the turn was interrupted: {result.error}", on_change)
        return True
    if result.outcome in ("error", "timed_out"):
        finish(state, host, "error", f"turn {result.turn_id} failed ({result.outcome}): {result.error}", on_change)
        return True
    return False


async def _check(state: GoalState, host: GoalHost, on_change: Callable[[GoalState], None]) -> CheckResult:
    spec = state.spec
    if spec.check is None:
        final = state.last_final
        check = CheckResult(passed=final, output="" if final else "the turn ended without a call to final()")
    else:
        check = await host.check(spec.check, spec.check_timeout)
    state.last_check = check
    host.emit(ev.GoalCheck(goal_id=state.id, passed=check.passed, exit_code=check.exit_code, output=check.output,
                           duration=check.duration))
    host.record(GoalRecord(goal_id=state.id, step="check", check=check))
    on_change(state)
    return check


def _continuation(state: GoalState, check: CheckResult) -> str:
    left = ", ".join(f"{v:g} {k}" for k, v in state.budget_left().items()) or "no limit set"
    if state.spec.check is None:
        return render("goal_autonomous", goal=state.spec.text, continuation=str(state.continuations), left=left)
    status = "timed out" if check.timed_out else f"exit code {check.exit_code}"
    return render("goal_continue", goal=state.spec.text, check=state.spec.check, status=status,
                  output=check.output or "(no output)", continuation=str(state.continuations), left=left)


def finish(state: GoalState, host: GoalHost, status: GoalStatus, reason: str,
            on_change: Callable[[GoalState], None]) -> GoalState:
    if state.state != "running":
        return state
    state.state, state.reason, state.finished = status, reason, time.time()
    host.emit(ev.GoalFinished(goal_id=state.id, state=status, reason=reason, continuations=state.continuations,
                              turns=state.turns, usage=state.usage, seconds=state.seconds()))
    host.record(GoalRecord(goal_id=state.id, step="finished", state=status, reason=reason, usage=state.usage,
                           continuations=state.continuations, turns=state.turns))
    on_change(state)
    return state


def _deadline(state: GoalState, host: GoalHost, on_change: Callable[[GoalState], None]) -> asyncio.TimerHandle | None:
    """At `max_seconds`, the goal ends exhausted and the running turn is interrupted."""
    limit = state.spec.budget.max_seconds
    if limit is None:
        return None
    loop = asyncio.get_running_loop()

    def expire() -> None:
        finish(state, host, "exhausted", f"the goal ran its {limit:g} seconds (max_seconds)", on_change)
        loop.create_task(host.interrupt())

    return loop.call_later(max(0.0, limit - state.seconds()), expire)
