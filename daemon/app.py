"""The daemon's HTTP API (FastAPI): the routers of daemon/routes/, one per area, over `SessionManager`.

Errors are `{"error": {"code", "message"}}` with a 4xx for what the client got wrong and a 5xx
only for what the daemon did. Events stream as Server-Sent Events whose `id` is the event's `seq`
(daemon/routes/events.py).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agent.events import EVENTS
from daemon.errors import Refused, error_response
from daemon.listeners import TcpListener
from daemon.manager import SessionManager
from daemon.routes import approvals, events, goals, harness, refine, rewind, schedules, sessions, status, trajectory
from daemon.routes.common import ERRORS, VERSION, Served
from daemon.web import router as web

log = logging.getLogger(__name__)
ROUTERS = (status, sessions, events, goals, schedules, trajectory, refine, rewind, approvals, harness, web)
"""The API's areas, in the order the OpenAPI spec lists them."""
STATUS = {
    "bad_config": 400, "bad_cwd": 400, "no_model": 400, "bad_scope": 400, "harness": 400, "bad_project": 400,
    "bad_last_event_id": 400, "bad_request": 400, "not_found": 404, "busy": 409, "config_broken": 409,
    "cwd_missing": 409, "not_running": 409, "refinement_failed": 409, "turn_running": 409, "no_plan": 409, "bad_turn": 400,
    "no_checkpoint": 409, "server": 502,
    "rewind_conflict": 409, "bad_rewind": 400, "rewind_failed": 409, "too_many_sessions": 429, "stopping": 503,
    "write_failed": 503, "disk_full": 507,
    "goal_running": 409, "in_use": 409, "no_goal": 404, "too_many_goals": 429, "remote_loosening": 403,
    "address_in_use": 409, "unix_only": 403, "bad_token": 403,
}
"""The HTTP status of each reason the daemon refuses a request (daemon.errors.Refused)."""


def create_app(manager: SessionManager, tcp: TcpListener, *, socket: str = "") -> FastAPI:
    """The API over `manager`, and the web page (daemon/web/). Bearer clients over TCP may not loosen
    a sandbox, nor approve a command or call outside it, unless the daemon was started with
    --allow-remote-unsandboxed: whoever holds the token may be a kernel that read it. The page
    logged in by `prime-agent web` may: it is the person (daemon/listeners.py, docs/web.md)."""
    app = FastAPI(title="Prime Agent daemon", version=VERSION, responses=ERRORS,
                  description="Sessions that outlive their terminal: create, prompt, steer, interrupt, stream events.")
    app.state.manager = manager
    app.state.served = Served(socket=socket, tcp=tcp)

    @app.exception_handler(Refused)
    async def refused(request: Request, e: Refused) -> JSONResponse:
        return error_response(STATUS[e.code], e.code, e.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        return error_response(422, "invalid_request", problems or "invalid request")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = {404: f"no endpoint {request.url.path} (the API is described at /openapi.json)",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return error_response(e.status_code, _CODES.get(e.status_code, "http_error"), message)

    @app.exception_handler(Exception)
    async def crashed(request: Request, e: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal", f"{type(e).__name__}: {e}")

    for area in ROUTERS:
        app.include_router(area.router)
    _publish_events(app)
    return app


def _publish_events(app: FastAPI) -> None:
    """The OpenAPI spec describes the event stream's `data`: the Event union, one schema per type."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            union = EVENTS.json_schema(ref_template="#/components/schemas/{model}")
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(union.pop("$defs", {}))
            schemas["Event"] = union
        return app.openapi_schema

    app.openapi = openapi


_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 401: "unauthorized"}
