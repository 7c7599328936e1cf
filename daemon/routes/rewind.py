"""A session's checkpoints, and rewinding to one (agent/checkpoints/)."""

from __future__ import annotations

from fastapi import APIRouter

from agent.checkpoints import TurnRow
from daemon.routes.common import Manager
from daemon.schemas import RewindRequest, RewindResult

router = APIRouter()


@router.get("/v1/sessions/{session_id}/checkpoints")
async def checkpoints(session_id: str, manager: Manager) -> list[TurnRow]:
    """The session's turns, to choose where to rewind: number, id, prompt, time, outcome, files changed."""
    return await manager.get(session_id).checkpoints()


@router.post("/v1/sessions/{session_id}/rewind")
async def rewind(session_id: str, req: RewindRequest, manager: Manager) -> RewindResult:
    """Go back to a turn's checkpoint in the parts asked for; 409 while a turn runs or is queued,
    or (without `force`) when it would overwrite what a person changed since. Wakes a dormant session."""
    return await manager.get(session_id).rewind(req)
