"""The person's hooks (agent/hooks.py) as one session runs them: each run recorded in the trajectory
and shown (`HookRan`); PermissionRequest hooks deciding a request before a person is asked; and the
hooks that only hear of an event (Notification, SubagentStart, SubagentStop), run in the background
until the session closes. The hooks that decide a step of a turn are the loop's (agent/loop.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from agent import events as ev
from agent.approvals import Decision, Request
from agent.context import Sinks
from agent.hooks import HookCall, HookRun, Hooks, Runner
from agent.trajectory import HookRecord


class SessionHooks(Runner):
    """A session's `Runner`: `common()` is what every hook gets besides its event's fields."""

    def __init__(self, hooks: Hooks, sinks: Sinks, common: Callable[[], dict[str, Any]]):
        super().__init__(hooks, common, self._ran)
        self._sinks = sinks
        self._notifying: set[asyncio.Task] = set()
        """Hooks told of something that have not finished yet."""
        self.closing = False
        """The session is closing: no hook hears of what closing does (children stopped...)."""

    def _ran(self, run: HookRun, cell_id: str | None) -> None:
        turn_id, call = self._sinks.turn_id(), dict(HookCall(cell_id=cell_id, run=run))
        self._sinks.log(HookRecord(turn_id=turn_id, **call), ev.HookRan(turn_id=turn_id, **call))

    async def permission(self, req: Request) -> Decision | None:
        """PermissionRequest hooks decide a request before a person is asked: allow, deny, or not.
        The tool is `ipython` (a cell a PreToolUse hook asked about), `Bash` (a command the sandbox
        denied, to run in a box of its own with the workspace writable: agent/approvals.py) or
        `mcp__SERVER__TOOL`."""
        tool = {"cell": "ipython", "command": "Bash"}.get(req.kind) or "mcp__" + (req.prefix or "").replace(".", "__", 1)
        verdict = await self("PermissionRequest", {
            "tool_name": tool, "tool_input": {"command": req.summary, "description": req.reason}}, target=tool)
        if verdict.blocked:
            return "deny"
        if verdict.permission == "allow" and not req.notes:  # what a note says (a .git the agent made), a person reads
            return "approve"
        return None

    def tell(self, event: ev.Event) -> None:
        """Hooks that hear of something without deciding anything: Notification (an approval waits,
        a goal ended), SubagentStart and SubagentStop. They run in the background."""
        if not self or self.closing:
            return
        if isinstance(event, ev.ApprovalRequested):
            call = self("Notification", {"message": f"The agent asks for your approval: {event.summary}",
                                         "notification_type": "permission_prompt"}, target="permission_prompt")
        elif isinstance(event, ev.GoalFinished):
            call = self("Notification", {"message": f"The goal ended: {event.state}",
                                         "notification_type": "goal_finished"}, target="goal_finished")
        elif isinstance(event, ev.SubagentSpawned):
            call = self("SubagentStart", {"agent_id": event.id, "agent_type": event.name}, target=event.name)
        elif isinstance(event, ev.SubagentFinished):
            call = self("SubagentStop", {"agent_id": event.id, "agent_type": event.name,
                                         "last_assistant_message": event.answer or event.error or ""},
                        target=event.name)
        else:
            return
        task = asyncio.ensure_future(call)
        self._notifying.add(task)
        task.add_done_callback(self._notifying.discard)

    async def end(self, started: bool) -> None:
        """The session closes: SessionEnd where it `started` (once), then the background hooks finish."""
        if started and not self.closing:
            with contextlib.suppress(Exception):  # the person's hook must not keep the kernel alive
                await self("SessionEnd", {"reason": "other"})
        self.closing = True
        await asyncio.gather(*self._notifying, return_exceptions=True)
