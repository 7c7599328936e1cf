"""Schedules (daemon/schedules.py): prompts fired into sessions every so often or on a cron line."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from daemon.routes.common import Manager
from daemon.schedules import NewSchedule, Schedule

router = APIRouter()


@router.get("/v1/schedules")
async def list_schedules(manager: Manager) -> list[Schedule]:
    return sorted(manager.scheduler.schedules.values(), key=lambda s: s.created)


@router.post("/v1/schedules", status_code=201)
async def add_schedule(req: NewSchedule, manager: Manager) -> Schedule:
    """Fire a prompt into a session every so often (`every` seconds) or on a cron line, `count` times
    or without end; `cwd` instead of `session` creates the session at the first fire."""
    return manager.scheduler.add(req)


@router.post("/v1/schedules/pause-all")
async def pause_all_schedules(manager: Manager) -> list[Schedule]:
    return manager.scheduler.pause(None, True, "paused by request (pause --all)")


@router.post("/v1/schedules/resume-all")
async def resume_all_schedules(manager: Manager) -> list[Schedule]:
    return manager.scheduler.pause(None, False)


@router.get("/v1/schedules/{schedule_id}")
async def get_schedule(schedule_id: str, manager: Manager) -> Schedule:
    return manager.scheduler.get(schedule_id)


@router.post("/v1/schedules/{schedule_id}/pause")
async def pause_schedule(schedule_id: str, manager: Manager) -> Schedule:
    return manager.scheduler.pause(schedule_id, True, "paused by request")[0]


@router.post("/v1/schedules/{schedule_id}/resume")
async def resume_schedule(schedule_id: str, manager: Manager) -> Schedule:
    return manager.scheduler.pause(schedule_id, False)[0]


@router.delete("/v1/schedules/{schedule_id}", status_code=204)
async def remove_schedule(schedule_id: str, manager: Manager) -> Response:
    manager.scheduler.remove(schedule_id)
    return Response(status_code=204)
