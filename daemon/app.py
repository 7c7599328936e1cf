"""The daemon's HTTP API (FastAPI): a thin face on `SessionManager`.

Errors are `{"error": {"code", "message"}}` with a 4xx for what the client got wrong and a 5xx
only for what the daemon did. Events stream as Server-Sent Events whose `id` is the event's `seq`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from agent.atif import to_atif
from agent.checkpoints import PARTS, Plan, RewindError, WorkspaceStore, turn_list
from agent.config import ENV_VARS, ConfigError, home, project_root, shorten
from agent.events import EVENTS
from agent.goals import GoalSpec, GoalState
from agent.harness import SessionHarness, scope_roots
from agent.layout import SessionLayout
from agent.mcp import McpServers, ServerInfo
from agent.model import ModelError
from agent.subagents import read_registry
from agent.trajectory import TrajectoryError, read_records
from daemon.errors import Refused
from daemon.manager import SessionManager
from daemon.schedules import NewSchedule, Schedule
from daemon.schemas import (
    ApprovalDecision,
    CloseSession,
    CreateSession,
    Decide,
    DecideApproval,
    DecidePlan,
    ErrorBody,
    Interrupt,
    Interrupted,
    KernelInfo,
    MessageAccepted,
    PlanDecision,
    ModelKey,
    RefineRequest,
    RefineStarted,
    RewindRequest,
    RewindResult,
    Rollback,
    RolledBack,
    SendMessage,
    SessionInfo,
    Status,
    UpdateSession,
)
from harness_store.entries import HarnessError
from harness_store.refiner import RefinementFailed

log = logging.getLogger(__name__)
VERSION = "0.1.0"
KEEPALIVE = 15.0
"""Seconds between comments on a quiet event stream (proxies and dead peers notice)."""
REPLAY_CHUNK = 1000
"""Events per write when replaying the journal."""

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 403, 404, 409, 413, 422, 429, 503)
}
STATUS = {
    "bad_config": 400, "bad_cwd": 400, "no_model": 400, "bad_scope": 400, "harness": 400, "bad_project": 400,
    "bad_last_event_id": 400, "bad_request": 400, "not_found": 404, "busy": 409, "config_broken": 409,
    "cwd_missing": 409, "not_running": 409, "refinement_failed": 409, "turn_running": 409, "no_plan": 409, "bad_turn": 400,
    "no_checkpoint": 409,
    "rewind_conflict": 409, "bad_rewind": 400, "rewind_failed": 409, "too_many_sessions": 429, "stopping": 503,
    "write_failed": 503, "disk_full": 507,
    "goal_running": 409, "in_use": 409, "no_goal": 404, "too_many_goals": 429, "remote_loosening": 403,
}
"""The HTTP status of each reason the daemon refuses a request (daemon.errors.Refused)."""


def create_app(manager: SessionManager, *, socket: str = "", tcp: str | None = None,
               remote_unsandboxed: bool = False) -> FastAPI:
    """The API over `manager`. Requests over TCP (marked by `TokenAuth`) may not loosen a sandbox,
    nor approve a command or call outside it, unless `remote_unsandboxed` (the daemon's
    --allow-remote-unsandboxed): whoever holds the token may be a kernel that read it."""
    app = FastAPI(title="Prime Agent daemon", version=VERSION, responses=ERRORS,
                  description="Sessions that outlive their terminal: create, prompt, steer, interrupt, stream events.")
    started, started_at = time.monotonic(), time.time()
    model_env = {var: "set" if var == "OPENAI_API_KEY" else os.environ[var] for var in ENV_VARS if os.environ.get(var)}

    @app.exception_handler(Refused)
    async def refused(request: Request, e: Refused) -> JSONResponse:
        return _error(STATUS[e.code], e.code, e.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        return _error(422, "invalid_request", problems or "invalid request")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = {404: f"no endpoint {request.url.path} (the API is described at /openapi.json)",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return _error(e.status_code, _CODES.get(e.status_code, "http_error"), message)

    @app.exception_handler(Exception)
    async def crashed(request: Request, e: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "internal", f"{type(e).__name__}: {e}")

    # --- the daemon ----------------------------------------------------------------------------

    @app.get("/v1/status")
    async def status() -> Status:
        return Status(
            pid=os.getpid(), version=VERSION, socket=socket, tcp=tcp, remote_unsandboxed=bool(tcp) and remote_unsandboxed,
            uptime=time.monotonic() - started, started=started_at, model_env=model_env,
            client_keys=sum(1 for s in manager.sessions.values() if s.key),
            sessions=len(manager.sessions), live_sessions=manager.live(),
            running_turns=manager.running_turns(),
            pool_ready=manager.pool.ready, disk_free_mb=shutil.disk_usage(manager.root).free / 2**20,
            write_error=manager.write_error,
        )

    # --- sessions ------------------------------------------------------------------------------

    def confined(request: Request) -> bool:
        """Whether this client is held to the sandbox the configuration says."""
        return bool(request.scope.get(REMOTE)) and not remote_unsandboxed

    @app.post("/v1/sessions", status_code=201)
    async def create_session(req: CreateSession, request: Request) -> SessionInfo:
        """A new session; over TCP, no less confined than the configuration says (else 403), unless the
        daemon was started with --allow-remote-unsandboxed."""
        _unix_only(req.key, request)
        return (await manager.create(req, may_loosen=not confined(request))).info()

    @app.get("/v1/sessions")
    async def list_sessions() -> list[SessionInfo]:
        """Every session of the registry, whichever front made it (`prime-agent run` too), oldest first."""
        return manager.listing()

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str) -> SessionInfo:
        return manager.info(session_id)

    @app.patch("/v1/sessions/{session_id}")
    async def update_session(session_id: str, req: UpdateSession) -> SessionInfo:
        managed = manager.get(session_id)
        await managed.update(req.title, req.model, req.sandbox, req.plan)
        return managed.info()

    @app.post("/v1/sessions/{session_id}/close")
    async def close_session(session_id: str, req: CloseSession | None = None) -> SessionInfo:
        """Close the session: its goal and turns stop (queued prompts are dropped, said why), then its
        kernel. It stays listed (`closed`); a prompt opens it again. `if_idle`: only if nothing runs
        or waits in it (else 409 `busy`)."""
        managed = manager.get(session_id)
        if req is not None and req.if_idle and managed.busy():
            raise Refused("busy", f"session {session_id} is busy (a turn, queued prompts, a goal, or background work)")
        await managed.end()
        return managed.info()

    @app.delete("/v1/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str) -> Response:
        await manager.delete(session_id)
        return Response(status_code=204)

    @app.post("/v1/sessions/{session_id}/sleep")
    async def sleep_session(session_id: str) -> SessionInfo:
        """Stop an idle session's kernel now; it stays listed (dormant) and wakes on its next prompt."""
        managed = manager.get(session_id)
        if managed.busy():
            raise Refused("busy", "the session is busy (a turn, queued prompts, or background work): "
                          "interrupt it or wait")
        await managed.sleep()
        return managed.info()

    @app.post("/v1/sessions/{session_id}/messages", status_code=202)
    async def send_message(session_id: str, req: SendMessage, request: Request) -> MessageAccepted:
        _unix_only(req.key, request)
        if manager.stopping:
            raise Refused("stopping", "the daemon is stopping")
        return manager.get(session_id).send(req.text, req.mode, req.key)

    @app.post("/v1/sessions/{session_id}/plan")
    async def decide_plan(session_id: str, req: DecidePlan) -> PlanDecision:
        """Approve the plan the model proposed in plan mode (the same kernel goes on with the workspace
        writable, the plan as its next turn) or reject it (`note` tells the model why)."""
        return await manager.get(session_id).decide_plan(req.approve, req.note, req.plan)

    @app.post("/v1/sessions/{session_id}/interrupt")
    async def interrupt(session_id: str, req: Annotated[Interrupt | None, Body()] = None) -> Interrupted:
        req = req or Interrupt()
        return await manager.get(session_id).interrupt(req.drop_queued, req.turn_id)

    @app.get("/v1/sessions/{session_id}/events", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/Event"}}},
                              "description": "Server-Sent Events: `id` is the event's seq, `data` one Event "
                                             "(one schema per `type`)."}})
    async def events(
        session_id: str,
        after: Annotated[int | None, Query(ge=0, lt=10**18, description="Replay events after this seq, then stream.")] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> StreamingResponse:
        if after is None and last_event_id is not None:
            if not re.fullmatch(r"\s*[0-9]{1,18}\s*", last_event_id):
                raise Refused("bad_last_event_id", f"Last-Event-ID must be an event seq, not {last_event_id[:40]!r}")
            after = int(last_event_id)
        managed = manager.get(session_id)
        replay, sub = managed.subscribe(after or 0)

        async def stream() -> AsyncIterator[str]:
            try:
                for i in range(0, len(replay), REPLAY_CHUNK):
                    yield "".join(_frame(seq, line) for seq, line in replay[i : i + REPLAY_CHUNK])
                while True:
                    try:
                        batch = [await asyncio.wait_for(sub.queue.get(), KEEPALIVE)]
                    except TimeoutError:
                        yield ": keepalive\n\n"
                        continue
                    while batch[-1] is not None and not sub.queue.empty():
                        batch.append(sub.queue.get_nowait())
                    frames = "".join(_frame(*item) for item in batch if item is not None)
                    if frames:
                        yield frames
                    if batch[-1] is None:  # the session was deleted, the daemon stops, or this client fell behind
                        if manager.stopping:  # said, so a client waits for it rather than starting another
                            yield "event: stopping\ndata: {}\n\n"
                        return
            finally:
                managed.unsubscribe(sub)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/sessions/{session_id}/goal", status_code=201)
    async def start_goal(session_id: str, req: GoalSpec) -> GoalState:
        """Pursue a goal: turns until `check` exits 0 in the workspace (no check: until the model calls
        final()), or the first budget limit is reached. Its turns queue like any prompt."""
        managed = manager.get(session_id)
        if manager.stopping:
            raise Refused("stopping", "the daemon is stopping")
        if not managed.goal.running() and manager.running_goals() >= manager.config.daemon.max_goals:
            raise Refused("too_many_goals", f"{manager.running_goals()} goals are running (daemon.max_goals); "
                          "stop one, or raise the limit")
        return managed.goal.start(req)

    @app.get("/v1/sessions/{session_id}/goal")
    async def get_goal(session_id: str) -> GoalState:
        """The session's goal (running, or the last one to end): state, continuations, last check, budget used."""
        state = manager.get(session_id).goal.state
        if state is None:
            raise Refused("no_goal", f"session {session_id} has no goal")
        return state

    @app.delete("/v1/sessions/{session_id}/goal", status_code=202)
    async def stop_goal(session_id: str) -> GoalState:
        """Stop the goal after the current turn (an interrupt stops it now)."""
        return manager.get(session_id).goal.stop()

    # --- schedules (daemon/schedules.py) --------------------------------------------------------

    @app.get("/v1/schedules")
    async def list_schedules() -> list[Schedule]:
        return sorted(manager.scheduler.schedules.values(), key=lambda s: s.created)

    @app.post("/v1/schedules", status_code=201)
    async def add_schedule(req: NewSchedule) -> Schedule:
        """Fire a prompt into a session every so often (`every` seconds) or on a cron line, `count` times
        or without end; `cwd` instead of `session` creates the session at the first fire."""
        return manager.scheduler.add(req)

    @app.post("/v1/schedules/pause-all")
    async def pause_all_schedules() -> list[Schedule]:
        return manager.scheduler.pause(None, True, "paused by request (pause --all)")

    @app.post("/v1/schedules/resume-all")
    async def resume_all_schedules() -> list[Schedule]:
        return manager.scheduler.pause(None, False)

    @app.get("/v1/schedules/{schedule_id}")
    async def get_schedule(schedule_id: str) -> Schedule:
        return manager.scheduler.get(schedule_id)

    @app.post("/v1/schedules/{schedule_id}/pause")
    async def pause_schedule(schedule_id: str) -> Schedule:
        return manager.scheduler.pause(schedule_id, True, "paused by request")[0]

    @app.post("/v1/schedules/{schedule_id}/resume")
    async def resume_schedule(schedule_id: str) -> Schedule:
        return manager.scheduler.pause(schedule_id, False)[0]

    @app.delete("/v1/schedules/{schedule_id}", status_code=204)
    async def remove_schedule(schedule_id: str) -> Response:
        manager.scheduler.remove(schedule_id)
        return Response(status_code=204)

    @app.get("/v1/sessions/{session_id}/transcript")
    async def transcript(session_id: str) -> dict[str, Any]:
        """The session's whole trajectory: every record, in order (see agent/trajectory.py)."""
        managed = manager.get(session_id)
        return {"session": managed.info().model_dump(), "records": await _records(managed.layout)}

    @app.get("/v1/sessions/{session_id}/trajectory")
    async def trajectory(session_id: str,
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

    @app.get("/v1/sessions/{session_id}/subagents")
    async def subagents(session_id: str) -> list[dict[str, Any]]:
        managed = manager.get(session_id)
        children = managed.session.children() if managed.session else read_registry(managed.layout).values()
        return [asdict(c) for c in children]

    @app.get("/v1/sessions/{session_id}/kernel")
    async def kernel(session_id: str) -> KernelInfo:
        """The live kernel's connection file (`jupyter console --existing FILE`); wakes a dormant session."""
        session = await manager.get(session_id).wake()
        return KernelInfo(connection_file=str(session.kernel.connection_file), state=session.kernel.state.value)

    @app.post("/v1/sessions/{session_id}/refine", status_code=202)
    async def refine(session_id: str, req: Annotated[RefineRequest | None, Body()] = None) -> RefineStarted:
        req = req or RefineRequest()
        session = await manager.get(session_id).wake()
        return RefineStarted(message=session.refine(req.instructions, trigger="api", mode=req.mode))

    @app.post("/v1/sessions/{session_id}/compact", status_code=202)
    async def compact(session_id: str) -> dict[str, str]:
        """Summarise the older context at the next model call (the running turn's, else the next turn's)."""
        session = await manager.get(session_id).wake()
        session.request_compaction()
        return {"message": "the context is compacted at the next model call"}

    @app.post("/v1/sessions/{session_id}/system-prompt", status_code=202)
    async def rebuild_prompt(session_id: str) -> dict[str, str]:
        """Build the system prompt afresh at the next turn boundary, with the harness as it is then (harness
        changes otherwise reach the model as notices, so the prompt prefix and the provider's cache hold)."""
        session = await manager.get(session_id).wake()
        session.rebuild_prompt()
        return {"message": "the system prompt is rebuilt at the next turn boundary (the prompt cache starts over there)"}

    @app.post("/v1/sessions/{session_id}/refinements/{refinement_id}")
    async def decide(session_id: str, refinement_id: str, req: Decide) -> dict[str, str]:
        """Approve or reject a refinement that waits for review (refine.mode = "review")."""
        session = await manager.get(session_id).wake()
        try:
            outcome = await session.decide(refinement_id, req.approve)
        except KeyError as e:
            raise Refused("not_found", str(e.args[0])) from None
        except (RefinementFailed, ModelError) as e:  # the plan still waits for review
            raise Refused("refinement_failed", str(e)) from None
        return {"refinement_id": refinement_id, "status": outcome.status}

    @app.get("/v1/sessions/{session_id}/checkpoints")
    async def checkpoints(session_id: str) -> list[dict[str, Any]]:
        """The session's turns, to choose where to rewind: number, id, prompt, time, outcome, files changed."""
        managed = manager.get(session_id)
        live = managed.session
        if live is not None:
            await live.checkpoints.settle()  # the last turn's end checkpoint, if still being taken
            store = live.checkpoints.store
        else:
            try:
                config = managed.config()
            except ConfigError as e:
                raise Refused("config_broken", str(e)) from None
            store = WorkspaceStore(Path(managed.meta.cwd), session_id, config.checkpoints)
        return await asyncio.to_thread(turn_list, managed.layout, store)

    @app.post("/v1/sessions/{session_id}/rewind")
    async def rewind(session_id: str, req: RewindRequest) -> RewindResult:
        """Go back to a turn's checkpoint in the parts asked for; 409 while a turn runs or is queued,
        or (without `force`) when it would overwrite what a person changed since. Wakes a dormant session."""
        managed = manager.get(session_id)
        parts = [p for p in PARTS if getattr(req, p)]
        if not parts:
            raise Refused("bad_rewind", "nothing to rewind: ask for code, conversation, harness or kernel")
        if managed.queue.busy() or (managed.session is not None and managed.session.turn is not None):
            raise Refused("turn_running", "a turn is running or queued; interrupt it or wait, then rewind")
        session = await managed.wake()
        if managed.queue.busy():
            raise Refused("turn_running", "a turn began meanwhile; interrupt it or wait, then rewind")
        try:
            done = await session.rewind(req.turn, parts, after=req.after, force=req.force, dry_run=req.dry_run)
        except RewindError as e:
            code = {"conflict": "rewind_conflict", "failed": "rewind_failed"}.get(e.code, e.code)
            raise Refused(code, e.message) from None
        if isinstance(done, Plan):
            return RewindResult(rewind_id=None, dry_run=True, **done.summary())
        return RewindResult(rewind_id=done.rewind_id, dry_run=False, turn=done.turn, after=done.after,
                            parts=done.parts, files=[f.model_dump() for f in done.files],
                            not_restored=[s.model_dump() for s in done.not_restored], conflicts=done.forced,
                            harness=dict(done.harness), kernel=done.kernel, notice=done.notice)

    @app.get("/v1/sessions/{session_id}/mcp")
    async def mcp(session_id: str, start: bool = False) -> list[ServerInfo]:
        """The session's MCP servers: transport, policy, state and tools (as last listed); starts none,
        unless `start=true`: then those not started are (a dormant session wakes) and list their tools."""
        managed = manager.get(session_id)
        if start:
            return await (await managed.wake()).mcp.list()
        if managed.session is not None:
            return managed.session.mcp.infos()
        try:
            config = managed.config()
        except ConfigError as e:
            raise Refused("config_broken", str(e)) from None
        return McpServers(config.mcp, Path(managed.meta.cwd), managed.layout.dir).infos()

    @app.post("/v1/sessions/{session_id}/approvals/{request_id}", responses=ERRORS)
    async def decide_approval(session_id: str, request_id: str, req: DecideApproval,
                              request: Request) -> ApprovalDecision:
        """Decide a request that waits (an `approval.requested` event: a command to run outside the
        sandbox, or an MCP call under policy "ask"): `approve` runs it once, `always` also approves
        later ones starting with `prefix` (default: the request's), `deny` refuses and the model is told.
        Over TCP only `deny` (403 otherwise), unless the daemon was started with --allow-remote-unsandboxed."""
        session = manager.get(session_id).session
        if session is None:
            raise Refused("not_found", f"no approval request {request_id!r} waits: session {session_id} is dormant")
        if req.decision != "deny" and confined(request):
            raise Refused("remote_loosening", "over TCP a request to act outside the sandbox can only be denied: "
                          "decide it over the daemon's Unix socket (the app, `prime-agent attach`), or start the "
                          "daemon with --allow-remote-unsandboxed")
        try:
            decided = session.approvals.decide(request_id, req.decision, req.prefix, req.full_env)
        except KeyError as e:
            raise Refused("not_found", str(e.args[0])) from None
        except ValueError as e:
            raise Refused("bad_request", str(e)) from None
        return ApprovalDecision(request_id=request_id, decision=req.decision, prefix=decided.prefix,
                                full_env=decided.full_env)

    @app.get("/v1/sessions/{session_id}/subagents/{child_id}/transcript")
    async def child_transcript(session_id: str, child_id: str) -> dict[str, Any]:
        """A child's whole trajectory."""
        child = read_registry(manager.get(session_id).layout).get(child_id)
        if child is None:
            raise Refused("not_found", f"no subagent {child_id!r} in session {session_id}")
        return {"child": asdict(child), "records": await _records(SessionLayout(Path(child.dir)))}

    # --- the harness ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def harness_for(session_id: str | None, project: str | None) -> Iterator[SessionHarness]:
        """The harness a session sees (its own, when live), or the user's and a project's. A project path the file system refuses (too long, a
        loop) is the request's problem (400), whether found checking it or reading under it."""
        if session_id is not None:
            managed = manager.get(session_id)
            if managed.session is not None:
                yield managed.session.harness
                return
            cwd, session_dir = Path(managed.meta.cwd), managed.layout.dir
        else:
            cwd, session_dir = Path(project or home()), None
        try:
            if project is not None and not Path(project).is_dir():
                raise Refused("bad_project", f"project {shorten(project)!r} is not a directory")
            harness = SessionHarness(scope_roots(home(), project_root(cwd), session_dir), session_id)
        except OSError as e:
            raise Refused("bad_project", f"project {shorten(str(project or cwd))!r}: {e.strerror or e}") from None
        try:
            yield harness
        except OSError as e:
            if e.errno not in _BAD_PATH:
                raise
            raise Refused("bad_project", f"{shorten(str(e.filename or project or cwd))!r}: {e.strerror}") from None

    @app.get("/v1/harness")
    async def harness_view(session: str | None = None, project: str | None = None) -> list[dict[str, Any]]:
        """The entries in force, narrowest scope first."""
        with harness_for(session, project) as harness:
            return await asyncio.to_thread(harness.list)

    @app.get("/v1/harness/entries/{entry_id:path}", response_class=Response,
             responses={200: {"content": {"text/markdown": {}}}})
    async def harness_entry(entry_id: str, session: str | None = None, project: str | None = None) -> Response:
        """One entry in force, in full (front matter and body)."""
        with harness_for(session, project) as harness:
            try:
                text = await asyncio.to_thread(harness.show, entry_id)
            except (KeyError, HarnessError) as e:
                raise Refused("not_found", str(e)) from None
        return Response(text, media_type="text/markdown")

    @app.get("/v1/harness/log")
    async def harness_log(scope: Annotated[str, Query(pattern="^(user|project|session)$")] = "user",
                          n: Annotated[int, Query(ge=1, le=1000)] = 20,
                          session: str | None = None, project: str | None = None) -> list[dict[str, Any]]:
        with harness_for(session, project) as harness:
            return [_change(c) for c in await asyncio.to_thread(_scope(harness, scope).log, n)]

    @app.get("/v1/harness/diff", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def harness_diff(scope: Annotated[str, Query(pattern="^(user|project|session)$")] = "user",
                           a: str | None = None, b: str | None = None,
                           session: str | None = None, project: str | None = None) -> Response:
        with harness_for(session, project) as harness:
            try:
                text = await asyncio.to_thread(_scope(harness, scope).diff, a, b)
            except HarnessError as e:
                raise Refused("harness", str(e)) from None
        return Response(text, media_type="text/plain")

    @app.post("/v1/harness/rollback")
    async def harness_rollback(req: Rollback) -> RolledBack:
        """Undo one change (or restore a whole earlier state); every live session on that scope
        picks it up next turn, and what they had planned before it is stale."""
        live = manager.get(req.session).session if req.session else None
        try:
            if live is not None:
                root = _scope(live.harness, req.scope).root
                change = live.rollback(req.ref, req.scope, req.to)
            else:
                with harness_for(req.session, req.project) as harness:
                    store = _scope(harness, req.scope)
                    root = store.root
                    rollback = store.rollback_to if req.to else store.rollback
                    change = await asyncio.to_thread(rollback, req.ref, session=req.session)
        except HarnessError as e:
            raise Refused("harness", str(e)) from None
        for other in manager.live_sessions():
            if other is not live and any(s.root == root for s in other.harness.stores.values()):
                other.harness_changed("a rollback")
        return RolledBack(scope=req.scope, **asdict(change))

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


async def _records(layout: SessionLayout) -> list[dict[str, Any]]:
    """A session's whole trajectory: every record, in order (see agent/trajectory.py); a damaged line
    (a write a full disk cut short) is skipped."""
    path = layout.trajectory
    records = await asyncio.to_thread(read_records, path, []) if path.is_file() else []
    return [r.model_dump(mode="json") for r in records]


def _scope(harness: SessionHarness, scope: str):
    try:
        return harness.store(scope)
    except ValueError as e:
        raise Refused("bad_scope", str(e)) from None


_BAD_PATH = {errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR}
"""Errors of a path's shape, not of the disk: a request naming such a path gets a 400."""


def _change(c) -> dict[str, Any]:
    return {"commit": c.commit, "refinement_id": c.refinement_id, "trigger": c.trigger, "summary": c.summary,
            "date": c.date.isoformat(), "entries": c.entries}


def _unix_only(key: ModelKey | None, request: Request) -> None:
    """A model key travels over the Unix socket only (a file only its user can open)."""
    if key is not None and request.scope.get(REMOTE):
        raise Refused("bad_request", "a model key is accepted over the daemon's Unix socket only, not over TCP: "
                      "set the key in the daemon's environment (OPENAI_API_KEY) or config.toml instead")


def _frame(seq: int, line: str) -> str:
    return f"id: {seq}\ndata: {line}\n\n"


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large", 401: "unauthorized"}


REMOTE = "prime_agent.tcp"
"""Set in the ASGI scope of a request that came over TCP (by `TokenAuth`)."""


class TokenAuth:
    """ASGI middleware for the TCP listener: every request needs `Authorization: Bearer TOKEN`, and is
    marked as remote (`REMOTE`): such a client may not loosen a sandbox (create_app)."""

    def __init__(self, app, token: str):
        self.app, self.token = app, token.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                response = _error(401, "unauthorized", "this listener needs `Authorization: Bearer <token>`; "
                                  f"the token is in {home() / 'run' / 'token'}")
                response.headers["WWW-Authenticate"] = "Bearer"
                return await response(scope, receive, send)
        await self.app({**scope, REMOTE: True}, receive, send)


class BodyLimit:
    """ASGI middleware: a request body past `limit` bytes gets 413 before the app sees any of it."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await self._refuse(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                return await self._refuse(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        await _error(413, "too_large", f"request bodies are limited to {self.limit} bytes")(scope, receive, send)
