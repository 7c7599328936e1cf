"""The turn loop: prompt -> model -> cells -> results -> ... -> final answer.

A turn ends when the model answers without a cell, when code calls `final(answer)`, when a
budget runs out, when the user interrupts, or when the model fails for good. Every message,
model call and cell is recorded as it happens; the trajectory is synced when the turn ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from agent.kernel import KernelError
from agent.model import ContextOverflow, ModelError, ModelTimeout, fenced_cells, parse_tool_arguments
from agent.trajectory import CellRecord, CompactionRecord, ModelCall
from agent.types import Cell, CellResult, Completion, Message, ToolCall

if TYPE_CHECKING:
    from agent.session import Session, Turn, TurnResult


class Submitted(Exception):
    """The turn has its final answer."""

    def __init__(self, answer: str):
        self.answer = answer


class BudgetExhausted(Exception):
    """A turn budget (steps, cells, tokens, seconds) ran out; the message says which."""


class Interrupted(Exception):
    """The user interrupted the turn."""


async def run_turn(s: Session, prompt: str, turn_id: str | None = None) -> TurnResult:
    turn = s.begin_turn(prompt, turn_id)
    outcome, answer, error = "error", None, None
    try:
        while True:
            await step(s, turn)
    except Submitted as e:
        outcome, answer = "completed", e.answer
    except BudgetExhausted as e:
        outcome, error = "budget_exhausted", str(e)
    except Interrupted:
        outcome, error = "interrupted", "interrupted by the user"
    except ModelTimeout as e:
        outcome, error = "timed_out", str(e)
    except (ModelError, KernelError) as e:
        outcome, error = "error", str(e)
    except asyncio.CancelledError:
        if not turn.interrupted:  # the session is being torn down, not interrupted: let cancellation through
            outcome, error = "interrupted", "the session was closed during this turn"
            raise
        asyncio.current_task().uncancel()
        outcome, error = "interrupted", "interrupted by the user"
    except Exception as e:  # a bug of ours must not lose the session: record it, end the turn
        outcome, error = "error", f"internal error: {type(e).__name__}: {e}"
        s.emit("error", turn.id, message=error)
    finally:
        result = s.end_turn(turn, outcome, answer, error)
    return result


async def step(s: Session, turn: Turn) -> None:
    """One model call and the cells it asks for."""
    if turn.interrupted:
        raise Interrupted()
    check_budget(s, turn)
    deliver_steering(s, turn)
    if needs_compaction(s) or s.compact_requested:
        s.compact_requested = False
        await compact(s, turn)
    completion = await call_model(s, turn)
    message = completion.message
    codes = [] if s.model.action_format == "tools" else fenced_cells(message.content)
    if message.tool_calls:
        await run_tool_calls(s, turn, message.tool_calls)
    elif codes:
        await run_text_cells(s, turn, codes)
    elif completion.finish_reason == "length":
        s.append(Message(role="user", content=CUT_OFF), turn)
    elif not s.steering and s.inbox.empty():  # messages that arrived meanwhile are answered first
        raise Submitted(message.content)


CUT_OFF = "[Your reply was cut off at the output length limit. Continue from where it stopped, in shorter pieces.]"


# --- budgets and steering -------------------------------------------------------------------


def check_budget(s: Session, turn: Turn) -> None:
    b = s.config.budget
    if b.max_steps is not None and turn.steps >= b.max_steps:
        raise BudgetExhausted(f"the turn used its {b.max_steps} model calls (budget.max_steps)")
    if b.max_tokens is not None and turn.usage.total_tokens >= b.max_tokens:
        raise BudgetExhausted(f"the turn used {turn.usage.total_tokens} of its {b.max_tokens} tokens (budget.max_tokens)")
    if remaining_seconds(s, turn) == 0:
        raise BudgetExhausted(f"the turn used its {b.max_seconds:g} seconds (budget.max_seconds)")


def remaining_seconds(s: Session, turn: Turn) -> float | None:
    limit = s.config.budget.max_seconds
    return None if limit is None else max(0.0, limit - (time.monotonic() - turn.started))


def deliver_steering(s: Session, turn: Turn) -> None:
    """Messages that arrived since the last model call: the user's steering, then other agents'."""
    while s.steering:
        text = s.steering.pop(0)
        s.append(Message(role="user", content=f"[Message from the user while you work]\n{text}"), turn)
        s.emit("steer.delivered", turn.id, text=text)
    while not s.inbox.empty():
        sender, text = s.inbox.get_nowait()
        s.append(Message(role="user", content=f"[Message from {sender}]\n{text}"), turn)
        s.emit("message.delivered", turn.id, sender=sender, text=text)


# --- the model --------------------------------------------------------------------------------


async def call_model(s: Session, turn: Turn) -> Completion:
    turn.steps += 1
    s.emit("model.started", turn.id, step=turn.steps)
    call = s.model.complete(
        s.messages,
        on_delta=lambda text: s.emit("model.delta", turn.id, text=text),
        on_retry=lambda attempt, delay, why: s.emit("model.retry", turn.id, attempt=attempt, delay=delay, reason=why),
    )
    try:
        completion = await within_budget(s, turn, call)
    except ContextOverflow:
        if not await compact(s, turn):
            raise
        completion = await within_budget(s, turn, s.model.complete(s.messages))  # once, on the folded context
    account(s, turn, completion)
    s.record(
        ModelCall(
            turn_id=turn.id, context_messages=len(s.messages), usage=completion.usage, duration=completion.duration,
            attempts=completion.attempts, finish_reason=completion.finish_reason, model=completion.model,
            prompt_token_ids=completion.prompt_token_ids if s.config.model.record_logprobs else None,
        )
    )
    s.append(completion.message, turn)
    s.context_tokens, s.context_mark = completion.usage.total_tokens, len(s.messages)
    s.emit(
        "model.completed", turn.id, text=completion.message.content,
        tool_calls=[c.model_dump() for c in completion.message.tool_calls], usage=completion.usage.model_dump(),
    )
    return completion


async def within_budget(s: Session, turn: Turn, call):
    remaining = remaining_seconds(s, turn)
    try:
        return await (call if remaining is None else asyncio.wait_for(call, remaining))
    except TimeoutError:
        raise BudgetExhausted(
            f"the turn used its {s.config.budget.max_seconds:g} seconds (budget.max_seconds) waiting for the model"
        ) from None


def account(s: Session, turn: Turn, completion: Completion) -> None:
    turn.usage += completion.usage
    s.usage += completion.usage


# --- cells ------------------------------------------------------------------------------------


async def run_tool_calls(s: Session, turn: Turn, calls: list[ToolCall]) -> None:
    answered: set[str] = set()

    def reply(call: ToolCall, text: str) -> None:
        s.append(Message(role="tool", tool_call_id=call.id, content=text), turn)
        answered.add(call.id)

    try:
        for call in calls:
            try:
                args = parse_tool_arguments(call)
            except ValueError as e:
                reply(call, f"Error: {e}")
                continue
            result = await run_cell(s, turn, Cell(id=call.id, code=args["code"], timeout=args.get("timeout")))
            reply(call, result.render())
            stop_if_done(turn)
    finally:  # every tool call gets an answer, or the next request is invalid
        for call in calls:
            if call.id not in answered:
                reply(call, "Not run: the turn ended before this call.")


async def run_text_cells(s: Session, turn: Turn, codes: list[str]) -> None:
    outputs: list[str] = []
    try:
        for i, code in enumerate(codes, 1):
            result = await run_cell(s, turn, Cell(id=f"{turn.id}-{turn.steps}-{i}", code=code))
            outputs.append(f"[cell {i} output]\n{result.render()}")
            stop_if_done(turn)
    finally:
        if outputs:
            s.append(Message(role="user", content="\n\n".join(outputs)), turn)


def stop_if_done(turn: Turn) -> None:
    if turn.final is not None:
        raise Submitted(turn.final)
    if turn.interrupted:
        raise Interrupted()


async def run_cell(s: Session, turn: Turn, cell: Cell) -> CellResult:
    b = s.config.budget
    if b.max_cells is not None and turn.cells >= b.max_cells:
        raise BudgetExhausted(f"the turn ran its {b.max_cells} cells (budget.max_cells)")
    remaining = remaining_seconds(s, turn)
    if remaining is not None:
        if remaining == 0:
            raise BudgetExhausted(f"the turn used its {b.max_seconds:g} seconds (budget.max_seconds)")
        cell.timeout = min(cell.timeout or s.config.kernel.cell_timeout, remaining)
    turn.cells += 1
    s.emit("cell.started", turn.id, cell_id=cell.id, code=cell.code)
    result = await s.kernel.execute(
        cell, on_output=lambda stream, text: s.emit("cell.output", turn.id, cell_id=cell.id, stream=stream, text=text)
    )
    s.record(CellRecord(turn_id=turn.id, cell=cell, result=result))
    s.emit("cell.finished", turn.id, cell_id=cell.id, result=result.model_dump(exclude={"attachments"}),
           attachments=[a.mime for a in result.attachments])
    return result


# --- compaction -------------------------------------------------------------------------------

SUMMARY_PROMPT = (
    "You compact an agent's conversation. Summarise the transcript below for the agent itself: the user's "
    "goals and instructions, what was done (files read and changed, commands run, results), decisions made, "
    "open problems and next steps. Keep file paths, names and numbers exact. Be concise; no preamble."
)


def _chars(messages: list[Message]) -> int:
    return sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)


def context_estimate(s: Session) -> int:
    """Tokens in the context: the server's last count plus ~4 characters a token for what came after."""
    since = s.messages[s.context_mark :] if s.context_tokens else s.messages
    return s.context_tokens + _chars(since) // 4


def needs_compaction(s: Session) -> bool:
    c = s.config.compaction
    return c.enabled and context_estimate(s) > c.threshold * s.config.model.context_window


async def compact(s: Session, turn: Turn) -> bool:
    """Fold older context into a summary; False when there is nothing old enough to fold.

    Older turns go first (all but `keep_recent_turns`); a turn that alone fills the window
    folds its own early steps, keeping its prompt and its most recent steps verbatim.
    """
    starts, messages = s.turn_starts, s.messages
    current = starts[-1]
    keep_from = starts[max(0, len(starts) - 1 - s.config.compaction.keep_recent_turns)]
    if keep_from > 1:
        folded, kept = messages[1:keep_from], messages[keep_from:]
    else:
        steps = [i for i in range(current + 1, len(messages)) if messages[i].role == "assistant"]
        if len(steps) < 2:
            return False
        # Keep as many recent steps as fit in half the compaction threshold (at least the last
        # one), so the folded context lands well below it instead of compacting again next step.
        room = s.config.compaction.threshold * s.config.model.context_window * 2  # characters
        cut = next((i for i in steps[1:] if _chars(messages[i:]) <= room), steps[-1])
        folded, kept = [*messages[1:current], *messages[current + 1 : cut]], [messages[current], *messages[cut:]]
    transcript = _transcript(folded, s.config.model.context_window * 2)  # ~half the window in tokens
    completion = await within_budget(s, turn, s.model.complete(
        [Message(role="system", content=SUMMARY_PROMPT), Message(role="user", content=transcript)], tools=False
    ))  # the summary counts against the turn's time like any model call
    account(s, turn, completion)
    summary = completion.message.content.strip()
    head = Message(
        role="user",
        content=f"[Earlier work was compacted into this summary; the kernel and its variables are unchanged.]\n\n{summary}",
    )
    s.messages = [messages[0], head, *kept]
    first_kept = len(messages) - len(kept)
    s.turn_starts = [2 + i - first_kept for i in starts if i >= first_kept] or [2]
    s.context_tokens, s.context_mark = 0, 0
    turn.compacted = True
    s.record(CompactionRecord(turn_id=turn.id, summary=summary, messages=s.messages, usage=completion.usage,
                              turn_starts=s.turn_starts))
    s.emit("compaction", turn.id, folded_messages=len(folded), summary=summary)
    return True


def _transcript(messages: list[Message], budget: int) -> str:
    per = max(500, budget // max(1, len(messages)))
    lines = []
    for m in messages:
        text = m.content + "".join(f"\n[code]\n{c.arguments}" for c in m.tool_calls)
        if len(text) > per:
            text = text[: per // 2] + f"\n[... {len(text) - per:,} characters cut ...]\n" + text[-per // 2 :]
        lines.append(f"[{m.role}] {text}")
    return "\n\n".join(lines)
