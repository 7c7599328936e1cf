"""A session's goal (daemon/goals.py): start, read, stop."""

from __future__ import annotations

from fastapi import APIRouter

from agent.goals import GoalSpec, GoalState
from daemon.errors import Refused
from daemon.routes.common import Manager

router = APIRouter()


@router.post("/v1/sessions/{session_id}/goal", status_code=201)
async def start_goal(session_id: str, req: GoalSpec, manager: Manager) -> GoalState:
    """Pursue a goal: turns until `check` exits 0 in the workspace (no check: until the model calls
    final()), or the first budget limit is reached. Its turns queue like any prompt."""
    return manager.start_goal(session_id, req)


@router.get("/v1/sessions/{session_id}/goal")
async def get_goal(session_id: str, manager: Manager) -> GoalState:
    """The session's goal (running, or the last one to end): state, continuations, last check, budget used."""
    state = manager.get(session_id).goal.state
    if state is None:
        raise Refused("no_goal", f"session {session_id} has no goal")
    return state


@router.delete("/v1/sessions/{session_id}/goal", status_code=202)
async def stop_goal(session_id: str, manager: Manager) -> GoalState:
    """Stop the goal after the current turn (an interrupt stops it now)."""
    return manager.get(session_id).goal.stop()
