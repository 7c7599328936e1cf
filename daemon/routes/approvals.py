"""Deciding a request that waits for a person: a command to run in a sandbox with more room, or an MCP
call under policy "ask"."""

from __future__ import annotations

from fastapi import APIRouter, Request

from daemon.routes.common import ERRORS, Manager, confined
from daemon.schemas import ApprovalDecision, DecideApproval

router = APIRouter()


@router.post("/v1/sessions/{session_id}/approvals/{request_id}", responses=ERRORS)
async def decide_approval(session_id: str, request_id: str, req: DecideApproval,
                          request: Request, manager: Manager) -> ApprovalDecision:
    """Decide a request that waits (an `approval.requested` event: a command to run in a sandbox with
    more room, or an MCP call under policy "ask"): `approve` runs it once, `always` also approves
    later ones its rule covers (the request's `prefix`), `deny` refuses and the model is told.
    Over TCP only `deny` (403 otherwise), unless the daemon was started with --allow-remote-unsandboxed."""
    return manager.get(session_id).decide_approval(request_id, req, may_loosen=not confined(request))
