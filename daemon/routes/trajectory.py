"""What a session recorded: its transcript, its trajectory as ATIF, a cell's display outputs, its
subagents and theirs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query

from agent.atif import to_atif
from agent.layout import SessionLayout
from agent.subagents import ChildInfo, read_registry
from agent.trajectory import Record, TrajectoryError, find_cell, read_records
from agent.types import Attachment
from daemon.errors import Refused
from daemon.routes.common import VERSION, Manager
from daemon.schemas import ChildTranscript, Transcript

router = APIRouter()


@router.get("/v1/sessions/{session_id}/transcript")
async def transcript(session_id: str, manager: Manager) -> Transcript:
    """The session's whole trajectory: every record, in order (see agent/trajectory.py)."""
    managed = manager.get(session_id)
    return Transcript(session=managed.info(), records=await _records(managed.layout))


@router.get("/v1/sessions/{session_id}/trajectory")
async def trajectory(session_id: str, manager: Manager,
                     format: Annotated[str, Query(pattern="^atif$", description="atif: an ATIF v1.8 document")]
                     = "atif") -> dict[str, Any]:
    """The session's trajectory as an ATIF v1.8 document (agent/atif.py), its subagents embedded."""
    path = manager.get(session_id).layout.trajectory
    if not path.is_file():
        raise Refused("not_found", f"session {session_id} has no trajectory yet")
    try:
        doc = await asyncio.to_thread(to_atif, path, VERSION)
    except TrajectoryError as e:
        raise Refused("bad_request", str(e)) from None
    return doc.to_json_dict()


@router.get("/v1/sessions/{session_id}/turns/{turn_id}/cells/{cell_id}/outputs")
async def cell_outputs(session_id: str, turn_id: str, cell_id: str, manager: Manager) -> list[Attachment]:
    """A cell's display outputs (its images: `cell.finished` names their MIME types in `attachments`),
    each `{"mime", "data"}` with the data in base64, in the order the cell showed them."""
    path = manager.get(session_id).layout.trajectory
    record = await asyncio.to_thread(find_cell, path, turn_id, cell_id) if path.is_file() else None
    if record is None:
        raise Refused("not_found", f"no cell {cell_id!r} in turn {turn_id!r} of session {session_id} (yet)")
    return record.result.attachments


@router.get("/v1/sessions/{session_id}/subagents")
async def subagents(session_id: str, manager: Manager) -> list[ChildInfo]:
    return manager.get(session_id).subagents()


@router.get("/v1/sessions/{session_id}/subagents/{child_id}/transcript")
async def child_transcript(session_id: str, child_id: str, manager: Manager) -> ChildTranscript:
    """A child's registry entry and whole trajectory."""
    child = read_registry(manager.get(session_id).layout).get(child_id)
    if child is None:
        raise Refused("not_found", f"no subagent {child_id!r} in session {session_id}")
    return ChildTranscript(child=child, records=await _records(SessionLayout(Path(child.dir))))


async def _records(layout: SessionLayout) -> list[Record]:
    """A session's whole trajectory: every record, in order (see agent/trajectory.py); a damaged line
    (a write a full disk cut short) is skipped."""
    path = layout.trajectory
    return await asyncio.to_thread(read_records, path, []) if path.is_file() else []
