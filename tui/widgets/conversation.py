"""The conversation: a session's events turned into messages, cells, subagents and refinement cards.

Events arrive in batches (a whole history on attach, one or a few at a time live); each batch
mounts its new widgets at once, so 2,000 events of history cost one layout, not 2,000.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from textual.containers import VerticalScroll
from textual.widget import Widget

from agent import events as ev
from agent.actions import FENCE
from agent.event_text import describe, spent
from agent.events import Event
from agent.types import Attachment
from tui.images import Figure
from tui.widgets.approval_card import ApprovalCard
from tui.widgets.cell_view import CellView, McpRow, SubagentRow
from tui.widgets.figure_row import FigureRow
from tui.widgets.files_row import FilesRow
from tui.widgets.message import AssistantMessage, Notice, UserMessage
from tui.widgets.plan_card import PlanCard
from tui.widgets.refinement_card import RefinementCard

REFINEMENT_CARDS = {"refinement.applied": "applied", "refinement.pending": "pending",
                    "refinement.dry_run": "dry run", "refinement.rejected": "rejected"}


class Conversation(VerticalScroll):
    """Anchored to its end (Textual's `anchor`) once it is taller than the view: it follows what is
    added and what grows in place (a streamed answer), until the reader scrolls up; scrolling back to
    the end follows again. (Deciding that per batch, from whether the view was at its end, lost a slow
    stream partway: the answer grew after the batch's scroll, and every later batch found the view
    short of its end.) Not before: an anchored view shorter than the screen sits at its bottom."""

    def __init__(self, outputs: Callable[[str, str], Awaitable[list[Attachment]]] | None = None,
                 graphics: type | None = None, **kw):
        """`outputs(turn_id, cell_id)`: a cell's display outputs (the daemon's), for the figures shown
        under it; `graphics`: the widget that draws them in this terminal (tui/images.py), None for rows."""
        super().__init__(**kw)
        self.outputs, self.graphics = outputs, graphics
        self.reset()

    def reset(self) -> None:
        self.prompts: dict[str, UserMessage] = {}
        self.steering: dict[str | None, list[UserMessage]] = {}
        """Each turn's steering waiting for its next model call, oldest first."""
        self.cells: dict[str, CellView] = {}
        self.last_cell: dict[str | None, CellView] = {}
        self.turn_cells: dict[str | None, list[CellView]] = {}
        self.speaking: dict[str | None, AssistantMessage] = {}
        """The assistant message being streamed, per turn."""
        self.answered: dict[str | None, AssistantMessage] = {}
        """The message of each turn's last model call: a text-mode cell it wrote is shown as the cell only."""
        self.said: dict[str | None, str] = {}
        """The last thing the assistant said in each turn (a final answer equal to it is not repeated)."""
        self.children_rows: dict[str, SubagentRow] = {}
        self.cards: dict[str, RefinementCard] = {}
        self.approvals: dict[str, ApprovalCard] = {}
        self.plan: PlanCard | None = None
        """The last plan proposed (plan mode)."""

    async def clear(self) -> None:
        await self.remove_children()
        self.reset()
        self.anchor(False)

    async def apply(self, events: list[Event]) -> None:
        """Show a batch of events."""
        new: list[Widget] = []
        for e in events:
            widget = await self._apply(e)
            if isinstance(widget, list):
                new.extend(widget)
            elif widget is not None:
                new.append(widget)
        if new:
            await self.mount_all(new)
        if not self.is_anchored:
            self.call_after_refresh(self._anchor_once_tall)  # once laid out with what came

    def _anchor_once_tall(self) -> None:
        if not self.is_anchored and self.max_scroll_y > 0:
            self.anchor()

    async def _apply(self, e: Event) -> Widget | list[Widget] | None:
        turn = e.turn_id
        match e:
            case ev.ModelStarted() | ev.HarnessReloaded() | ev.MessageDelivered():
                return None
            case ev.TurnQueued():
                self.prompts[turn] = UserMessage(e.prompt, queued=True)
                return self.prompts[turn]
            case ev.TurnStarted():
                if turn in self.prompts:
                    self.prompts[turn].started()
                    return None
                self.prompts[turn] = UserMessage(e.prompt)
                return self.prompts[turn]
            case ev.SteerQueued():
                message = UserMessage(e.text, label="you (steering)", queued=True)
                self.steering.setdefault(turn, []).append(message)
                return message
            case ev.SteerDelivered() if self.steering.get(turn):
                self.steering[turn].pop(0).started()
                return None
            case ev.SteerReturned():
                for message in self.steering.pop(turn, []):
                    message.returned()
                return Notice("not sent (you interrupted the turn): your steering is back in the prompt", "warning")
            case ev.ModelDelta():
                message = self.speaking.get(turn)
                fresh = message is None
                if message is None:
                    message = self.speaking[turn] = AssistantMessage()
                await message.feed(e.text, reasoning=e.reasoning)
                return message if fresh else None
            case ev.ModelCompleted():
                message = self.speaking.pop(turn, None)
                if e.text:
                    self.said[turn] = e.text
                if message is not None:
                    await message.finish(e.text, e.reasoning)
                    self.answered[turn] = message
                    return None
                if not (e.text.strip() or e.reasoning):
                    return None
                message = self.answered[turn] = AssistantMessage(e.text, e.reasoning or "")
                return message
            case ev.CellStarted():
                if (message := self.answered.get(turn)) is not None:
                    await _cell_shown_once(message, e.code)
                cell = self.cells[e.cell_id] = self.last_cell[turn] = CellView(e.cell_id, e.code)
                self.turn_cells.setdefault(turn, []).append(cell)
                return cell
            case ev.CellOutput():
                if cell := self.cells.get(e.cell_id):
                    cell.add_output(e.stream, e.text)
                return None
            case ev.CellFinished():
                cell = self.cells.get(e.cell_id)
                if cell is not None:
                    cell.finish(e.result)
                    if self.outputs is not None and any(m.startswith("image/") for m in e.attachments):
                        self.run_worker(self._figures(cell, e.turn_id or "", e.cell_id), group="figures")
                if e.files is None:
                    return None
                row = FilesRow(e.files)
                if cell is not None:
                    await cell.add_row(row)
                    return None
                return row
            case ev.SubagentSpawned():
                cell = self.last_cell.get(turn)
                row = self.children_rows[e.id] = SubagentRow(e.id, e.name)
                if cell is not None:
                    await cell.add_row(row)
                    return None
                return row
            case ev.McpCalled():
                row = McpRow(e)
                if cell := self.cells.get(e.cell_id or ""):
                    await cell.add_row(row)
                    return None
                return row
            case ev.HookRan():
                notice = Notice(e.run.line(), "error" if e.run.error or e.run.blocks else "info")
                if cell := self.cells.get(e.cell_id or ""):
                    await cell.add_row(notice)
                    return None
                return notice
            case ev.SubagentFinished():
                if row := self.children_rows.get(e.id):
                    row.finished(e.outcome, e.answer)
                return None
            case ev.TurnFinished():
                return self._turn_finished(e)
            case ev.RefinementApplied() | ev.RefinementPending() | ev.RefinementDryRun() | ev.RefinementRejected():
                status = REFINEMENT_CARDS[e.type]
                if card := self.cards.get(e.id):
                    card.set_status(status, e.reason)
                    return None
                card = self.cards[e.id] = RefinementCard(e.id, status, e.summary, e.diff, e.scopes, e.reason)
                return card
            case ev.ApprovalRequested():
                card = self.approvals[e.request_id] = ApprovalCard(e.request_id, e.kind, e.summary, e.reason, e.prefix,
                                                                     e.notes, e.runs_in)
                return card
            case ev.PlanProposed():
                self.plan = PlanCard(e.plan)
                return self.plan
            case ev.PlanDecided():
                if self.plan is not None and self.plan.status == "waiting":
                    self.plan.set_status("approved" if e.approved else "rejected")
                    return None
                return Notice(f"plan {'approved' if e.approved else 'rejected'}" + (f": {e.note}" if e.note else ""))
            case ev.ApprovalDecided():
                if card := self.approvals.get(e.request_id):
                    card.set_status(e.decision if e.by != "rule" else f"{e.decision} (by an earlier always)")
                    return None
                what = {"command": "command", "mcp": "MCP call"}.get(e.kind, "cell")
                return Notice(f"{what}: {e.decision} ({e.by})", "info")
            case ev.RefinementRolledBack():  # ref: the change undone; id: the rollback's own
                if card := self.cards.get(e.ref):
                    card.set_status("rolled back")
                return Notice(f"rolled back {e.ref} ({e.scope} scope)", "info")
        return Notice(describe(e), "error" if isinstance(e, ev.Error) else "info")

    async def _figures(self, cell: CellView, turn_id: str, cell_id: str) -> None:
        """The figures the cell displayed, fetched and shown under it (a cell cleared meanwhile gets none)."""
        assert self.outputs is not None
        try:
            attachments = await self.outputs(turn_id, cell_id)
        except Exception as e:  # noqa: BLE001 - a figure that cannot be fetched is said, the view goes on
            await cell.add_row(Notice(f"└─ its figures could not be fetched: {getattr(e, 'message', e)}", "error"))
            return
        for n, attachment in enumerate(attachments, 1):
            figure = Figure.of(attachment)
            if figure is not None and cell.is_attached:
                await cell.add_row(FigureRow(figure, f"{cell_id}-{n}", self.graphics))

    def _turn_finished(self, e: ev.TurnFinished) -> list[Widget]:
        turn = e.turn_id
        self.speaking.pop(turn, None)
        for cell in self.turn_cells.pop(turn, []):
            if cell.result is None:  # the turn ended under it (a daemon that died, a closed session)
                cell.abandon(e.error or "")
        if turn in self.prompts and self.prompts[turn].has_class("queued"):
            self.prompts[turn].started()  # dropped before it began: the notice below says so
        shown: list[Widget] = []
        if e.outcome != "completed":
            shown.append(Notice(f"turn {e.outcome}: {e.error or ''}", "error" if e.outcome == "error" else "warning"))
        elif e.answer and e.answer.strip() != self.said.get(turn, "").strip():
            shown.append(AssistantMessage(e.answer))
        if e.files is not None:
            names = ", ".join(f.path for f in e.files.files[:6]) + (", ..." if len(e.files.files) + e.files.more > 6
                                                                     else "")
            shown.append(Notice(f"{e.files.summary()}: {names}", "files"))
        if e.usage.total_tokens or e.usage.cost:
            shown.append(Notice(spent(e)))
        return shown


async def _cell_shown_once(message: AssistantMessage, code: str) -> None:
    """A text-mode model writes its cell as a ```python block in its message: the block goes from the
    message, since the cell below shows the same code (a message left empty is hidden)."""
    for m in FENCE.finditer(message.text):
        if m.group(1) == code:
            await message.finish(message.text[:m.start()] + message.text[m.end():], message.reasoning or None)
            message.display = bool(message.text.strip() or message.reasoning.strip())
            return
