"""What a session recorded: its transcript, its trajectory as ATIF, its subagents and theirs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from agent.subagents import ChildInfo
from daemon.routes.common import VERSION, Manager
from daemon.schemas import ChildTranscript, Transcript

router = APIRouter()


@router.get("/v1/sessions/{session_id}/transcript")
async def transcript(session_id: str, manager: Manager) -> Transcript:
    """The session's whole trajectory: every record, in order (see agent/trajectory.py)."""
    return await manager.get(session_id).transcript()


@router.get("/v1/sessions/{session_id}/trajectory")
async def trajectory(session_id: str, manager: Manager,
                     format: Annotated[str, Query(pattern="^atif$", description="atif: an ATIF v1.8 document")]
                     = "atif") -> dict[str, Any]:
    """The session's trajectory as an ATIF v1.8 document (agent/atif.py), its subagents embedded."""
    return await manager.get(session_id).atif(VERSION)


@router.get("/v1/sessions/{session_id}/subagents")
async def subagents(session_id: str, manager: Manager) -> list[ChildInfo]:
    return manager.get(session_id).subagents()


@router.get("/v1/sessions/{session_id}/subagents/{child_id}/transcript")
async def child_transcript(session_id: str, child_id: str, manager: Manager) -> ChildTranscript:
    """A child's whole trajectory."""
    return await manager.get(session_id).child_transcript(child_id)
