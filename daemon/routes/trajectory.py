"""What a session recorded: its transcript, its trajectory as ATIF, its subagents and theirs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from daemon.routes.common import VERSION, Manager

router = APIRouter()


@router.get("/v1/sessions/{session_id}/transcript")
async def transcript(session_id: str, manager: Manager) -> dict[str, Any]:
    """The session's whole trajectory: every record, in order (see agent/trajectory.py)."""
    managed = manager.get(session_id)
    return {"session": managed.info().model_dump(), "records": await managed.records()}


@router.get("/v1/sessions/{session_id}/trajectory")
async def trajectory(session_id: str, manager: Manager,
                     format: Annotated[str, Query(pattern="^atif$", description="atif: an ATIF v1.8 document")]
                     = "atif") -> dict[str, Any]:
    """The session's trajectory as an ATIF v1.8 document (agent/atif.py), its subagents embedded."""
    return await manager.get(session_id).atif(VERSION)


@router.get("/v1/sessions/{session_id}/subagents")
async def subagents(session_id: str, manager: Manager) -> list[dict[str, Any]]:
    return manager.get(session_id).subagents()


@router.get("/v1/sessions/{session_id}/subagents/{child_id}/transcript")
async def child_transcript(session_id: str, child_id: str, manager: Manager) -> dict[str, Any]:
    """A child's whole trajectory."""
    return await manager.get(session_id).child_transcript(child_id)
