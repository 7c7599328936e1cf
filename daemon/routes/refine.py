"""What a person asks of a session's context and harness: refine, compact, rebuild the system
prompt, decide a refinement that waits for review."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from daemon.routes.common import Manager
from daemon.schemas import Decide, Notice, RefinementDecision, RefineRequest

router = APIRouter()


@router.post("/v1/sessions/{session_id}/refine", status_code=202)
async def refine(session_id: str, manager: Manager,
                 req: Annotated[RefineRequest | None, Body()] = None) -> Notice:
    req = req or RefineRequest()
    return Notice(message=await manager.get(session_id).refine(req.instructions, req.mode))


@router.post("/v1/sessions/{session_id}/compact", status_code=202)
async def compact(session_id: str, manager: Manager) -> Notice:
    """Summarise the older context at the next model call (the running turn's, else the next turn's)."""
    await manager.get(session_id).compact()
    return Notice(message="the context is compacted at the next model call")


@router.post("/v1/sessions/{session_id}/system-prompt", status_code=202)
async def rebuild_prompt(session_id: str, manager: Manager) -> Notice:
    """Build the system prompt afresh at the next turn boundary, with the harness as it is then (harness
    changes otherwise reach the model as notices, so the prompt prefix and the provider's cache hold)."""
    await manager.get(session_id).rebuild_prompt()
    return Notice(message="the system prompt is rebuilt at the next turn boundary (the prompt cache starts over there)")


@router.post("/v1/sessions/{session_id}/refinements/{refinement_id}")
async def decide_refinement(session_id: str, refinement_id: str, req: Decide, manager: Manager) -> RefinementDecision:
    """Approve or reject a refinement that waits for review (refine.mode = "review")."""
    status = await manager.get(session_id).decide_refinement(refinement_id, req.approve)
    return RefinementDecision(refinement_id=refinement_id, status=status)
