"""The turn loop: prompt -> model -> cells -> results -> ... -> final answer.

A turn ends when the model answers without a cell, when code calls `final(answer)`, when a
budget runs out, when the user interrupts, or when the model fails for good. Every message,
model call and cell is recorded as it happens. The loop is handed what it works with (model,
kernel, context, inbox, and sinks for events, records and usage); the session composes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agent import compaction, vision
from agent import events as ev
from agent.actions import fenced_cells, parse_tool_arguments
from agent.config_models import Config
from agent.context import Context, Current, Inbox, Sinks
from agent.hooks import NO_HOOKS, Runner
from agent.kernel import Kernel, KernelError
from agent.model import ContextOverflow, Model, ModelError, ModelTimeout, Repeating, ToolsRefused
from agent.notebook import Notebook, told
from agent.prompt import render
from agent.trajectory import CellRecord, CompactionRecord, ModelCall, WriteFailed
from agent.types import Cell, CellResult, Completion, FilesChanged, Image, Message, Outcome, ToolCall, Turn

T = TypeVar("T")


class Submitted(Exception):
    """The turn has its final answer."""

    def __init__(self, answer: str):
        self.answer = answer


class BudgetExhausted(Exception):
    """A turn budget (steps, cells, tokens, seconds, repeats) ran out; the message says which."""


class Interrupted(Exception):
    """The user interrupted the turn."""


MAX_STOP_BLOCKS = 3
"""Times in a row a Stop hook may make a turn go on (a hook that always blocks must not spin it)."""


class HookStopped(Exception):
    """A hook answered `continue: false`: the turn ends, with its `stopReason`."""


def out_of_seconds(seconds: float, waiting: str = "") -> str:
    """What a turn that ran out of `budget.max_seconds` says (the eval runner says the same)."""
    return f"the turn used its {seconds:g} seconds (budget.max_seconds)" + (f" {waiting}" if waiting else "")


class TurnLoop:
    def __init__(self, current: Current, kernel: Kernel, context: Context, inbox: Inbox, sinks: Sinks,
                 system_prompt: Callable[[], str], hooks: Runner = NO_HOOKS,
                 ask_cell: Callable[[str, str], Awaitable[str | None]] | None = None,
                 text_mode: Callable[[str], bool] = lambda reason: False,
                 before_call: Callable[[str], Awaitable[None]] | None = None,
                 after_cell: Callable[[], Awaitable[FilesChanged | None]] | None = None):
        """`current`: the model and configuration in force (read at each step: a switch takes effect at
        the next model call). `system_prompt()` builds the system prompt afresh: a compaction starts the context over with it.
        `hooks`: the person's (PreToolUse, PostToolUse, Stop, PreCompact); `ask_cell(code, reason)`: a
        person's say on a cell a hook asked about (None: approved, else why not); `text_mode(reason)`
        switches the session to text mode when the server refuses tools (False: it did not);
        `before_call(turn_id)`: fits the session to its model's server while it has not answered yet
        (agent/fit.py); `after_cell()`: the files the cell that just ran changed (the checkpoints')."""
        self.current, self.kernel, self.context, self.inbox = current, kernel, context, inbox
        self.emit, self.record, self.log, self.charge = sinks.emit, sinks.record, sinks.log, sinks.charge
        self.system_prompt = system_prompt
        self.hooks, self.ask_cell, self.text_mode, self.after_cell = hooks, ask_cell, text_mode, after_cell
        self.before_call = before_call
        self.said_no_logprobs = False

    @property
    def config(self) -> Config:
        return self.current.config

    @property
    def model(self) -> Model:
        return self.current.model

    async def run(self, turn: Turn, notebook: Notebook | None = None) -> tuple[Outcome, str | None, str | None]:
        """Step until the turn ends: (outcome, answer, error); with `notebook`, run its cells instead
        (`run_notebook`). Never raises for model, kernel or budget failures; a cancellation that is not
        an interrupt (the session closing) goes through."""
        stop_hook_active, goes_on = False, 0
        try:
            if notebook is not None:
                return await self.run_notebook(turn, notebook)
            while True:
                try:
                    await self.step(turn)
                except Submitted as e:
                    if goes_on >= MAX_STOP_BLOCKS or not self.hooks:
                        raise
                    verdict = await self.hooks("Stop", {"stop_hook_active": stop_hook_active,
                                                        "last_assistant_message": e.answer})
                    if not verdict.blocked:
                        raise
                    if turn.stop is e:  # an answer given with final(): taken back, so the model goes on
                        turn.stop, turn.final = None, False
                    stop_hook_active, goes_on = True, goes_on + 1  # the hook sees it, and can let the turn end
                    self.context.append(Message(role="user", content=f"[A Stop hook asks you to go on]\n"
                                                f"{verdict.reason}"), turn.id)
        except Submitted as e:
            return "completed", e.answer, None
        except HookStopped as e:
            return "interrupted", None, f"a hook stopped the turn: {e}"
        except (BudgetExhausted, Repeating) as e:  # a loop is a budget too: the model will not get out of it
            return "budget_exhausted", None, str(e)
        except Interrupted:
            return "interrupted", None, "interrupted by the user"
        except ModelTimeout as e:
            return "timed_out", None, str(e)
        except (ModelError, KernelError) as e:
            return "error", None, str(e)
        except WriteFailed as e:  # the disk is full, or the session's directory is gone: said, not a bug
            error = f"the session's records could not be written, so the turn stops: {e}"
            self.emit(ev.Error(turn_id=turn.id, message=error))
            return "error", None, error
        except asyncio.CancelledError:
            if not isinstance(turn.stop, Interrupted):  # the session is being torn down: let it through
                raise
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            return "interrupted", None, "interrupted by the user"
        except Exception as e:  # a bug of ours must not lose the session: record it, end the turn
            error = f"internal error: {type(e).__name__}: {e}"
            self.emit(ev.Error(turn_id=turn.id, message=error))
            return "error", None, error

    async def step(self, turn: Turn) -> None:
        """One model call and the cells it asks for."""
        self.stop_if_done(turn)
        self.check_budget(turn)
        self.deliver_inbox(turn)
        if self.before_call is not None:  # the window and prompt in force are what the server says
            await self.within_budget(turn, self.before_call(turn.id))
        if compaction.needed(self.context, self.config) or self.context.compact_requested:
            asked, self.context.compact_requested = self.context.compact_requested, False
            await self.compact(turn, "manual" if asked else "auto")
        completion = await self.call_model(turn)
        message = completion.message
        codes = [] if self.model.action_format == "tools" else fenced_cells(message.content)
        if message.tool_calls:
            cut = message.tool_calls[-1] if completion.finish_reason == "length" else None
            await self.run_tool_calls(turn, message.tool_calls, cut=cut)
        elif codes:
            await self.run_text_cells(turn, codes)
        elif completion.finish_reason == "length":
            self.context.append(Message(role="user", content=render("cut_off")), turn.id)
        elif self.inbox.empty():  # messages that arrived meanwhile are answered first
            raise Submitted(message.content)

    # --- budgets and the inbox --------------------------------------------------------------------

    def check_budget(self, turn: Turn) -> None:
        b = self.config.budget
        if b.max_steps is not None and turn.steps >= b.max_steps:
            raise BudgetExhausted(f"the turn used its {b.max_steps} model calls (budget.max_steps)")
        if b.max_tokens is not None and turn.usage.total_tokens >= b.max_tokens:
            raise BudgetExhausted(f"the turn used {turn.usage.total_tokens} of its {b.max_tokens} tokens "
                                  "(budget.max_tokens)")
        if self.remaining_seconds(turn) == 0:
            raise BudgetExhausted(out_of_seconds(b.max_seconds))

    def remaining_seconds(self, turn: Turn) -> float | None:
        limit = self.config.budget.max_seconds
        return None if limit is None else max(0.0, limit - (time.monotonic() - turn.started))

    async def within_budget(self, turn: Turn, call: Awaitable[T]) -> T:
        remaining = self.remaining_seconds(turn)
        try:
            return await (call if remaining is None else asyncio.wait_for(call, remaining))
        except TimeoutError:
            raise BudgetExhausted(out_of_seconds(self.config.budget.max_seconds, "waiting for the model")) from None

    def deliver_inbox(self, turn: Turn) -> None:
        """Messages that arrived since the last model call: the user's steering, then other agents'."""
        for text in self.inbox.take_steering():
            message = Message(role="user", content=f"[Message from the user while you work]\n{text}")
            self.context.append(message, turn.id)
            self.emit(ev.SteerDelivered(turn_id=turn.id, text=text))
        for sender, text in self.inbox.take_agents():
            self.context.append(Message(role="user", content=f"[Message from {sender}]\n{text}"), turn.id)
            self.emit(ev.MessageDelivered(turn_id=turn.id, sender=sender, text=text))

    @staticmethod
    def stop_if_done(turn: Turn) -> None:
        if turn.stop is not None:
            raise turn.stop

    # --- the model --------------------------------------------------------------------------------

    async def call_model(self, turn: Turn) -> Completion:
        turn.steps += 1
        self.emit(ev.ModelStarted(turn_id=turn.id, step=turn.steps))
        def call() -> Awaitable[Completion]:
            return self.model.complete(
                self.context.messages,
                on_delta=lambda text: self.emit(ev.ModelDelta(turn_id=turn.id, text=text)),
                on_reasoning=lambda text: self.emit(ev.ModelDelta(turn_id=turn.id, text=text, reasoning=True)),
                on_retry=lambda attempt, delay, why: self.emit(
                    ev.ModelRetry(turn_id=turn.id, attempt=attempt, delay=delay, reason=why)),
                on_fallback=lambda old, new, why: self.emit(
                    ev.ModelFallback(turn_id=turn.id, from_model=old, to_model=new, reason=why)),
            )

        try:
            completion = await self.within_budget(turn, call())
        except ToolsRefused as e:
            if not self.text_mode(str(e)):
                raise
            completion = await self.within_budget(turn, call())  # once more, in text mode
        except ContextOverflow:
            if not await self.compact(turn):
                raise
            completion = await self.within_budget(turn, self.model.complete(self.context.messages))  # once, folded
        self.charge(completion.usage, "turn", turn.id)
        self.record(ModelCall(
            turn_id=turn.id, context_messages=len(self.context.messages), usage=completion.usage,
            duration=completion.duration, attempts=completion.attempts, finish_reason=completion.finish_reason,
            model=completion.model,
            prompt_token_ids=completion.prompt_token_ids if self.config.model.record_logprobs else None,
        ))
        message = completion.message
        self.context.append(message, turn.id)
        self.context.measured(completion.usage.total_tokens)
        self.emit(ev.ModelCompleted(turn_id=turn.id, text=message.content, tool_calls=message.tool_calls,
                                    usage=completion.usage, reasoning=message.reasoning))
        if self.config.model.record_logprobs and message.logprobs is None and not self.said_no_logprobs:
            self.said_no_logprobs = True  # e.g. `transformers serve` and Ollama ignore `logprobs`
            self.emit(ev.Note(turn_id=turn.id, text=f"the server ({completion.model or self.model.name}) returned no "
                              "logprobs although model.record_logprobs is on: this session's trajectory has none "
                              "to train on"))
        return completion

    async def compact(self, turn: Turn, trigger: str = "auto") -> bool:
        """Fold older context into a summary (agent/compaction.py); False when nothing is old enough.
        `trigger`: manual (a person's `/compact`) or auto, as PreCompact hooks see it."""
        parts = compaction.split(self.context, self.config)
        if parts is None:
            return False
        folded, kept = parts
        await self.hooks("PreCompact", {"trigger": trigger, "custom_instructions": ""}, target=trigger)
        request = compaction.request(folded, self.config)
        # the summary counts against the turn's time like any model call
        completion = await self.within_budget(turn, self.model.complete(request, tools=False))
        self.charge(completion.usage, "compaction", turn.id)
        summary = completion.message.content.strip()
        compaction.fold(self.context, kept, summary, self.system_prompt())
        self.log(CompactionRecord(turn_id=turn.id, summary=summary, messages=self.context.messages,
                                  usage=completion.usage, turn_starts=self.context.turn_starts),
                 ev.Compaction(turn_id=turn.id, folded_messages=len(folded), summary=summary))
        return True

    # --- cells ------------------------------------------------------------------------------------

    async def run_tool_calls(self, turn: Turn, calls: list[ToolCall], cut: ToolCall | None = None) -> None:
        """Run each call in order; `cut` is one the token limit cut short (finish_reason "length"): its
        code is not run even when what arrived parses (a server may close the JSON it was cut in)."""
        answered: set[str] = set()
        images: list[Image] = []
        notes: list[str] = []

        def reply(call: ToolCall, text: str) -> None:
            self.context.append(Message(role="tool", tool_call_id=call.id, content=text), turn.id)
            answered.add(call.id)

        try:
            for call in calls:
                if call is cut:
                    reply(call, render("cut_off_call"))
                    continue
                try:
                    args = parse_tool_arguments(call)
                except ValueError as e:
                    reply(call, f"Error: {e}")
                    continue
                result = await self.run_cell(turn, Cell(id=call.id, code=args["code"], timeout=args.get("timeout")))
                reply(call, result.render())
                await self.images_of(call.id, result, images, notes)
                self.stop_if_done(turn)
        finally:  # every tool call gets an answer, or the next request is invalid
            for call in calls:
                if call.id not in answered:
                    reply(call, "Not run: the turn ended before this call.")
            if images or notes:  # after the results: a tool message holds no image in chat completions
                self.context.append(Message(role="user", content=vision.caption(images, notes), images=images), turn.id)

    async def run_text_cells(self, turn: Turn, codes: list[str]) -> None:
        outputs: list[str] = []
        images: list[Image] = []
        notes: list[str] = []
        try:
            for i, code in enumerate(codes, 1):
                cell = Cell(id=f"{turn.id}-{turn.steps}-{i}", code=code)
                result = await self.run_cell(turn, cell)
                outputs.append(f"[cell {i} output]\n{result.render()}")
                await self.images_of(cell.id, result, images, notes)
                self.stop_if_done(turn)
        finally:
            if outputs:
                shown = [vision.caption(images, notes)] if images or notes else []
                self.context.append(Message(role="user", content="\n\n".join(outputs + shown), images=images), turn.id)

    async def images_of(self, cell_id: str, result: CellResult, images: list[Image], notes: list[str]) -> None:
        """Add the images the cell displayed, as a vision model is shown them (agent/vision.py), to
        `images`, and a line to `notes` for each it is not; nothing for a model that sees none."""
        model = self.config.model
        if model.vision is True and any(a.mime.startswith("image/") for a in result.attachments):
            shown, said = await asyncio.to_thread(vision.prepare, result.attachments, cell_id, model.image_max_edge)
            images += shown
            notes += said

    async def run_notebook(self, turn: Turn, notebook: Notebook) -> tuple[Outcome, str | None, str | None]:
        """A notebook's cells, in order, each as the model's run (hooks, approvals, sandbox, budgets),
        with no model call; the first that fails stops the rest, as Jupyter's Run All does. The model
        is told what ran in one message, whatever ended it."""
        results: list[CellResult] = []
        try:
            for n, code in enumerate(notebook.cells, 1):
                result = await self.run_cell(turn, Cell(id=f"{turn.id}-notebook-{n}", code=code))
                results.append(result)
                self.stop_if_done(turn)
                if not result.ok:
                    what = f"{result.error_name}: {result.error_value}" if result.error_name else result.kernel_message
                    left = len(notebook.cells) - n
                    return "error", None, (f"cell {n} of {notebook.name} failed ({what})"
                                           + (f"; the {left} after it did not run" if left else ""))
            return "completed", None, None
        finally:
            if results:
                self.context.append(Message(role="user", content=told(notebook, results)), turn.id)

    async def run_cell(self, turn: Turn, cell: Cell) -> CellResult:
        b = self.config.budget
        if b.max_cells is not None and turn.cells >= b.max_cells:
            raise BudgetExhausted(f"the turn ran its {b.max_cells} cells (budget.max_cells)")
        remaining = self.remaining_seconds(turn)
        if remaining is not None:
            if remaining == 0:
                raise BudgetExhausted(out_of_seconds(b.max_seconds))
            if remaining < (cell.timeout or self.config.kernel.cell_timeout):  # else the cell's own stands
                cell.timeout = remaining
        turn.cells += 1
        tool_input = {"code": cell.code, **({"timeout": cell.timeout} if cell.timeout is not None else {})}
        pre = await self.hooks("PreToolUse", {"tool_name": "ipython", "tool_input": tool_input, "tool_use_id": cell.id},
                               "ipython", cell.id)
        if isinstance((pre.updated_input or {}).get("code"), str):
            cell.code = pre.updated_input["code"]  # type: ignore[index]
        refused = pre.reason if pre.blocked else None
        if refused is None and pre.permission == "ask" and self.ask_cell is not None:
            refused = await self.ask_cell(cell.code, pre.reason)
        self.emit(ev.CellStarted(turn_id=turn.id, cell_id=cell.id, code=cell.code))
        files = None
        if refused is not None:
            result = CellResult(error_name="BlockedByHook", error_value=f"a PreToolUse hook kept this cell from "
                                f"running: {refused}")
        else:
            result = await self.kernel.execute(cell, on_output=lambda stream, text: self.emit(
                ev.CellOutput(turn_id=turn.id, cell_id=cell.id, stream=stream, text=text)))
            files = await self.files_of_cell(turn)
            failed = bool(result.error_name) or bool({"died", "timed_out"} & set(result.kernel_events))
            post = await self.hooks(
                "PostToolUseFailure" if failed else "PostToolUse",
                {"tool_name": "ipython", "tool_input": {"code": cell.code}, "tool_use_id": cell.id, "tool_response": {
                    "stdout": result.stdout, "stderr": result.stderr, "result": result.result,
                    "error": f"{result.error_name}: {result.error_value}" if result.error_name else None}},
                "ipython", cell.id)
            result.hook_notes += [text for text in (post.reason if post.blocked else "", post.context) if text]
            if post.stop:
                turn.stop = HookStopped(post.stop)
        if pre.context:
            result.hook_notes.insert(0, pre.context)
        if pre.stop:
            turn.stop = HookStopped(pre.stop)
        told = result.model_copy(update={"attachments": [a for a in result.attachments if a.is_text]})  # no images
        self.log(CellRecord(turn_id=turn.id, cell=cell, result=result),
                 ev.CellFinished(turn_id=turn.id, cell_id=cell.id, attachments=[a.mime for a in result.attachments],
                                 result=told, files=files))
        self.count_repeats(turn, cell, result)
        return result

    def count_repeats(self, turn: Turn, cell: Cell, result: CellResult) -> None:
        """The same code with the same result `budget.max_repeats` times in a row: the model is going
        round in circles, and the turn stops once this cell's result is told (not its traceback, whose
        cell numbers differ each run)."""
        limit = self.config.budget.max_repeats
        seen = (cell.code.strip(), result.stdout, result.stderr, str(result.result), result.error_name or "",
                result.error_value or "")
        count, last = turn.same_cells
        turn.same_cells = (count + 1 if seen == last else 1, seen)
        if limit is not None and turn.same_cells[0] >= limit:
            turn.stop_with(BudgetExhausted(f"the model ran the same cell with the same result {limit} times in a "
                                           "row, going round in circles, so the turn stops (budget.max_repeats)"))

    async def files_of_cell(self, turn: Turn) -> FilesChanged | None:
        """The files the cell changed. An interrupt meanwhile (which cancels the turn's task while the
        kernel is idle) lets it finish: the cell ran, and its result and files are told; the turn
        stops at its next step."""
        if self.after_cell is None:
            return None
        job = asyncio.ensure_future(self.after_cell())
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not isinstance(turn.stop, Interrupted) or task is None:  # the session is being torn down
                job.cancel()
                raise
            task.uncancel()
            return await job
