"""The conversation: a session's events turned into messages, cells, subagents and refinement cards.

Events arrive in batches (a whole history on attach, one or a few at a time live); each batch
mounts its new widgets at once, so 2,000 events of history cost one layout, not 2,000.
"""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widget import Widget

from agent.types import Event
from tui.widgets.cell_view import CellView, SubagentRow
from tui.widgets.message import AssistantMessage, Notice, UserMessage
from tui.widgets.refinement_card import RefinementCard

QUIET = {"model.started", "harness.reloaded", "message.delivered"}
REFINEMENT_CARDS = {"refinement.applied": "applied", "refinement.pending": "pending",
                    "refinement.dry_run": "dry run", "refinement.rejected": "rejected"}


class Conversation(VerticalScroll):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.reset()

    def reset(self) -> None:
        self.prompts: dict[str, UserMessage] = {}
        self.cells: dict[str, CellView] = {}
        self.last_cell: dict[str | None, CellView] = {}
        self.turn_cells: dict[str | None, list[CellView]] = {}
        self.speaking: dict[str | None, AssistantMessage] = {}
        """The assistant message being streamed, per turn."""
        self.said: dict[str | None, str] = {}
        """The last thing the assistant said in each turn (a final answer equal to it is not repeated)."""
        self.children_rows: dict[str, SubagentRow] = {}
        self.cards: dict[str, RefinementCard] = {}

    async def clear(self) -> None:
        await self.remove_children()
        self.reset()

    async def apply(self, events: list[Event]) -> None:
        """Show a batch of events."""
        # At the bottom before this batch: stay there as it grows (a reader scrolled up stays put).
        following = self.is_vertical_scroll_end or self.max_scroll_y == 0
        new: list[Widget] = []
        for e in events:
            widget = await self._apply(e)
            if widget is not None:
                new.append(widget)
        if new:
            await self.mount_all(new)
        if following:
            self.scroll_end(animate=False)

    async def _apply(self, e: Event) -> Widget | None:  # noqa: C901 - one branch per event type
        d, turn = e.data, e.turn_id
        if e.type in QUIET:
            return None
        if e.type == "turn.queued":
            self.prompts[turn] = UserMessage(d["prompt"], queued=True)
            return self.prompts[turn]
        if e.type == "turn.started":
            if turn in self.prompts:
                self.prompts[turn].started()
                return None
            self.prompts[turn] = UserMessage(d["prompt"])
            return self.prompts[turn]
        if e.type == "model.delta":
            message = self.speaking.get(turn)
            fresh = message is None
            if fresh:
                message = self.speaking[turn] = AssistantMessage()
            await message.feed(d["text"])
            return message if fresh else None
        if e.type == "model.completed":
            message = self.speaking.pop(turn, None)
            text = d.get("text") or ""
            if text:
                self.said[turn] = text
            if message is not None:
                await message.finish(text)
                return None
            return AssistantMessage(text) if text.strip() else None
        if e.type == "cell.started":
            cell = self.cells[d["cell_id"]] = self.last_cell[turn] = CellView(d["cell_id"], d["code"])
            self.turn_cells.setdefault(turn, []).append(cell)
            return cell
        if e.type == "cell.output":
            if cell := self.cells.get(d["cell_id"]):
                cell.add_output(d["stream"], d["text"])
            return None
        if e.type == "cell.finished":
            if cell := self.cells.get(d["cell_id"]):
                cell.finish(d["result"])
            return None
        if e.type == "subagent.spawned":
            cell = self.last_cell.get(turn)
            row = SubagentRow(d["id"], d["name"])
            self.children_rows[d["id"]] = row
            if cell is not None:
                await cell.add_child(row)
                return None
            return row
        if e.type == "subagent.finished":
            if row := self.children_rows.get(d["id"]):
                row.finished(d["outcome"], d.get("answer"))
            return None
        if e.type == "turn.finished":
            self.speaking.pop(turn, None)
            for cell in self.turn_cells.pop(turn, []):
                if cell.result is None:  # the turn ended under it (a daemon that died, a closed session)
                    cell.finish({"kernel_message": f"the cell never finished: {d.get('error')}"})
            outcome, answer = d["outcome"], d.get("answer")
            if turn in self.prompts and self.prompts[turn].has_class("queued"):
                self.prompts[turn].started()  # dropped before it began: the notice below says so
            if outcome == "completed":
                if answer and answer.strip() != self.said.get(turn, "").strip():
                    return AssistantMessage(answer)
                return None
            return Notice(f"turn {outcome}: {d.get('error') or ''}", "error" if outcome == "error" else "warning")
        if e.type in REFINEMENT_CARDS:
            status = REFINEMENT_CARDS[e.type]
            if card := self.cards.get(d["id"]):
                card.set_status(status, d.get("reason") or "")
                return None
            card = self.cards[d["id"]] = RefinementCard(d["id"], status, d.get("summary", ""), d.get("diff") or "",
                                                        d.get("scopes") or [], d.get("reason") or "")
            return card
        if e.type == "refinement.rolled_back":  # ref: the change undone; id: the rollback's own
            if card := self.cards.get(d.get("ref") or ""):
                card.set_status("rolled back")
            return Notice(f"rolled back {d.get('ref')} ({d.get('scope')} scope)", "info")
        return Notice(_describe(e), "error" if e.type == "error" else "info")


def _describe(e: Event) -> str:
    d = e.data
    match e.type:
        case "session.started":
            return f"session {e.session_id} started in {d.get('cwd')} ({d.get('model')})"
        case "session.resumed":
            return f"session resumed ({d.get('reason')}): a new kernel; variables from before are gone"
        case "note":
            return f"note: {d.get('text')}"
        case "error":
            return f"error: {d.get('message')}"
        case "steer.delivered":
            return f"steer delivered: {d.get('text')}"
        case "model.retry":
            return f"model: {d.get('reason')}; retry {d.get('attempt')} in {d.get('delay', 0):.1f}s"
        case "compaction":
            return f"context compacted ({d.get('folded_messages')} messages summarised)"
        case "harness.edited":
            return f"harness edited by you ({d.get('scope')}): {', '.join(d.get('entries') or [])}" + (
                f"; problems: {'; '.join(d['problems'])}" if d.get("problems") else "")
        case "refinement.proposed":
            return f"refinement proposed: {d.get('summary')}"
        case "refinement.failed":
            return f"refinement failed: {d.get('reason')}"
        case "refinement.skipped":
            return f"refinement skipped: {d.get('rationale')}"
    return f"{e.type}: {d}"
