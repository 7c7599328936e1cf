"""Sessions: create, list, get, update, close, delete, sleep; prompts, plans and interrupts; the
session's kernel and MCP servers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import Response

from agent.mcp import ServerInfo
from agent.types import FilesChanged
from daemon.errors import Refused
from daemon.routes.common import Manager, confined, unix_only
from daemon.schemas import (
    CloseSession,
    CreateSession,
    DecidePlan,
    Directory,
    Interrupt,
    Interrupted,
    KernelInfo,
    MessageAccepted,
    PlanDecision,
    Pruned,
    PruneSessions,
    SendMessage,
    SessionInfo,
    UpdateSession,
)

router = APIRouter()


@router.post("/v1/sessions", status_code=201)
async def create_session(req: CreateSession, request: Request, manager: Manager) -> SessionInfo:
    """A new session; over TCP, no less confined than the configuration says (else 403), unless the
    daemon was started with --allow-remote-unsandboxed."""
    unix_only(req.key, request)
    return (await manager.create(req, may_loosen=not confined(request))).info()


@router.get("/v1/sessions")
async def list_sessions(manager: Manager, cwd: Annotated[Directory | None, Query()] = None) -> list[SessionInfo]:
    """Every session of the registry, whichever front made it (`prime-agent run` too), oldest first;
    `cwd`: only those of that directory or one below it."""
    return manager.listing(cwd)


@router.post("/v1/sessions/prune")
async def prune_sessions(req: PruneSessions, manager: Manager) -> Pruned:
    """Remove sessions with their files: those deleted whose files stayed, those never prompted, and
    with `older_than_days` those not used for that long (live, busy and elsewhere-hosted ones stay)."""
    return await manager.prune(req)


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, manager: Manager) -> SessionInfo:
    return manager.info(session_id)


@router.patch("/v1/sessions/{session_id}")
async def update_session(session_id: str, req: UpdateSession, request: Request, manager: Manager) -> SessionInfo:
    """Rename, switch model, sandbox or plan mode; over TCP the sandbox can only be tightened (else
    403), unless the daemon was started with --allow-remote-unsandboxed."""
    managed = manager.get(session_id)
    await managed.update(req.title, req.model, req.sandbox, req.plan, may_loosen=not confined(request))
    return managed.info()


@router.post("/v1/sessions/{session_id}/close")
async def close_session(session_id: str, manager: Manager, req: CloseSession | None = None) -> SessionInfo:
    """Close the session: its goal and turns stop (queued prompts are dropped, said why), then its
    kernel. It stays listed (`closed`); a prompt opens it again. `if_idle`: only if nothing runs
    or waits in it (else 409 `busy`)."""
    managed = manager.get(session_id)
    if req is not None and req.if_idle and managed.busy():
        raise Refused("busy", f"session {session_id} is busy (a turn, queued prompts, a goal, or background work)")
    await managed.end()
    return managed.info()


@router.delete("/v1/sessions/{session_id}", status_code=204)
async def delete_session(session_id: str, manager: Manager, files: bool = False) -> Response:
    """Out of the registry: its goal, turns and kernel stop; `files=true`: its files are removed too
    (else they stay on disk, and `POST /v1/sessions/prune` removes them later)."""
    await manager.delete(session_id, files)
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/sleep")
async def sleep_session(session_id: str, manager: Manager) -> SessionInfo:
    """Stop an idle session's kernel now; it stays listed (dormant) and wakes on its next prompt."""
    managed = manager.get(session_id)
    if managed.busy():
        raise Refused("busy", "the session is busy (a turn, queued prompts, or background work): "
                      "interrupt it or wait")
    await managed.sleep()
    return managed.info()


@router.post("/v1/sessions/{session_id}/messages", status_code=202)
async def send_message(session_id: str, req: SendMessage, request: Request, manager: Manager) -> MessageAccepted:
    unix_only(req.key, request)
    return manager.send(session_id, req.text, req.mode, req.key, req.notebook)


@router.post("/v1/sessions/{session_id}/plan")
async def decide_plan(session_id: str, req: DecidePlan, request: Request, manager: Manager) -> PlanDecision:
    """Approve the plan the model proposed in plan mode (the same kernel goes on with the workspace
    writable, the plan as its next turn) or reject it (`note` tells the model why). Over TCP a plan
    can only be rejected (else 403), unless the daemon was started with --allow-remote-unsandboxed."""
    return await manager.get(session_id).decide_plan(req.approve, req.note, req.plan, may_loosen=not confined(request))


@router.post("/v1/sessions/{session_id}/interrupt")
async def interrupt(session_id: str, manager: Manager,
                    req: Annotated[Interrupt | None, Body()] = None) -> Interrupted:
    req = req or Interrupt()
    return await manager.get(session_id).interrupt(req.drop_queued, req.turn_id)


@router.get("/v1/sessions/{session_id}/kernel")
async def kernel(session_id: str, manager: Manager) -> KernelInfo:
    """The live kernel's connection file (`jupyter console --existing FILE`); wakes a dormant session."""
    return await manager.get(session_id).kernel()


@router.get("/v1/sessions/{session_id}/diff")
async def diff(session_id: str, manager: Manager) -> FilesChanged | None:
    """What changed in the workspace since the session's first checkpoint (a snapshot taken now;
    null: nothing); each file with its bounded diff. Wakes a dormant session."""
    return await manager.get(session_id).diff()


@router.get("/v1/sessions/{session_id}/models")
async def server_models(session_id: str, manager: Manager) -> list[str]:
    """The models the session's server lists (`GET {base_url}/models`, with the session's key)."""
    return await manager.get(session_id).server_models()


@router.get("/v1/sessions/{session_id}/mcp")
async def mcp(session_id: str, manager: Manager, start: bool = False) -> list[ServerInfo]:
    """The session's MCP servers: transport, policy, state and tools (as last listed); starts none,
    unless `start=true`: then those not started are (a dormant session wakes) and list their tools."""
    return await manager.get(session_id).mcp_servers(start)
