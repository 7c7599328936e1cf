"""The harness: the entries in force, one entry, a scope's log and diffs, rollback; for a session
(the harness it sees), a project, or the user's alone."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from daemon.errors import Refused
from daemon.manager import harness_scope
from daemon.routes.common import Manager
from daemon.schemas import HarnessEntry, Rollback, RolledBack
from harness_store.entries import HarnessError
from harness_store.store import Change

router = APIRouter()
Scope = Annotated[str, Query(pattern="^(user|project|session)$")]


@router.get("/v1/harness")
async def harness_view(manager: Manager, session: str | None = None, project: str | None = None) -> list[HarnessEntry]:
    """The entries in force, narrowest scope first."""
    with manager.harness(session, project) as harness:
        return [HarnessEntry.model_validate(e) for e in await asyncio.to_thread(harness.list)]


@router.get("/v1/harness/entries/{entry_id:path}", response_class=Response,
            responses={200: {"content": {"text/markdown": {}}}})
async def harness_entry(entry_id: str, manager: Manager, session: str | None = None,
                        project: str | None = None) -> Response:
    """One entry in force, in full (front matter and body)."""
    with manager.harness(session, project) as harness:
        try:
            text = await asyncio.to_thread(harness.show, entry_id)
        except (KeyError, HarnessError) as e:
            raise Refused("not_found", str(e)) from None
    return Response(text, media_type="text/markdown")


@router.get("/v1/harness/log")
async def harness_log(manager: Manager, scope: Scope = "user", n: Annotated[int, Query(ge=1, le=1000)] = 20,
                      session: str | None = None, project: str | None = None) -> list[Change]:
    with manager.harness(session, project) as harness:
        changes = await asyncio.to_thread(harness_scope(harness, scope).log, n)
    return changes


@router.get("/v1/harness/diff", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def harness_diff(manager: Manager, scope: Scope = "user", a: str | None = None, b: str | None = None,
                       session: str | None = None, project: str | None = None) -> Response:
    with manager.harness(session, project) as harness:
        try:
            text = await asyncio.to_thread(harness_scope(harness, scope).diff, a, b)
        except HarnessError as e:
            raise Refused("harness", str(e)) from None
    return Response(text, media_type="text/plain")


@router.post("/v1/harness/rollback")
async def harness_rollback(req: Rollback, manager: Manager) -> RolledBack:
    """Undo one change (or restore a whole earlier state); every live session on that scope
    picks it up next turn, and what they had planned before it is stale."""
    return await manager.rollback(req)

