"""Python client of the daemon API, used by the CLI and the TUI.

    client = await connect()              # starts the daemon when it is not running
    s = await client.create_session(cwd="/src/app")
    turn = await client.send(s.id, "fix the failing test")
    async for event in client.events(s.id):
        ...

Replies are the API's own types (daemon/schemas.py), events are agent.events' typed union.

Async first; `SyncClient` is the same API for code without an event loop. An event stream
reconnects by itself (with `Last-Event-ID`) when the daemon restarts or drops a slow reader, so
a caller sees every event once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
from pydantic import BaseModel, TypeAdapter

from agent.config import ConfigError, load_config
from agent.events import Event, TurnFinished, parse_event
from agent.checkpoints import TurnRow
from agent.goals import GoalSpec, GoalState
from agent.mcp import ServerInfo
from agent.notebook import Notebook
from agent.subagents import ChildInfo
from agent.types import Attachment, Budget, FilesChanged
from harness_store.store import Change
from daemon.paths import lock_file, log_file, pid_file, socket_file
from daemon.schedules import NewSchedule, Schedule
from daemon.schemas import (
    ApprovalDecision,
    ChildTranscript,
    CloseSession,
    CreateSession,
    Decide,
    DecideApproval,
    DecidePlan,
    HarnessEntry,
    Interrupt,
    Interrupted,
    KernelInfo,
    MessageAccepted,
    ModelKey,
    Notice,
    OpenWeb,
    PlanDecision,
    PruneSessions,
    Pruned,
    RefinementDecision,
    RefineRequest,
    RewindRequest,
    RewindResult,
    Rollback,
    RolledBack,
    SendMessage,
    SessionInfo,
    Status,
    Transcript,
    UpdateSession,
    WebAccess,
)

if TYPE_CHECKING:
    import atif

_T = TypeVar("_T")


class DaemonError(RuntimeError):
    """The daemon refused a request: `status` and `code` as it sent them."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class DaemonUnavailable(DaemonError):
    def __init__(self, message: str):
        super().__init__(0, "unavailable", message)


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, socket: Path | None = None,
                 timeout: float = 60.0, autostart: bool = False, key: ModelKey | None = None):
        """Over the Unix socket (default), or `url` (TCP) with `token`. With `autostart`, a request or
        event stream that finds no daemon on the socket starts one and tries again. `key`: the model
        API key this client gives the sessions it creates and prompts (over the Unix socket only:
        never sent over TCP), so a daemon started without one, or with another, uses the caller's."""
        self.socket = socket or socket_file()
        self.key = key if url is None else None
        self.autostart = autostart and url is None
        transport = None if url else httpx2.AsyncHTTPTransport(uds=str(self.socket))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx2.AsyncClient(base_url=url or "http://daemon", transport=transport, headers=headers,
                                        timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start_daemon(self, tcp: str | None = None, timeout: float = 30.0, remote_unsandboxed: bool = False) -> None:
        """Start the daemon in the background and wait until it answers (`remote_unsandboxed`: see `spawn`)."""
        process = spawn(tcp, remote_unsandboxed)
        # Reap it when it exits, so a daemon stopped while this client lives leaves no zombie
        # (which would look alive to a pid check).
        threading.Thread(target=process.wait, daemon=True, name="reap-daemon").start()
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.sleep(0.05)
            try:
                await self._http.get("/v1/status")
                return
            except (httpx2.ConnectError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(f"the daemon did not start within {timeout:g}s; see {log_file()}") from None

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = await self._http.request(method, path, **kw)
        except (httpx2.ConnectError, FileNotFoundError) as e:
            if not self.autostart:
                raise DaemonUnavailable(f"the daemon is not running ({self.socket}): {e}") from None
            await self.start_daemon()
            r = await self._http.request(method, path, **kw)
        except httpx2.RemoteProtocolError as e:
            raise DaemonUnavailable(f"the daemon went away mid-request: {e}") from None
        if r.status_code >= 400:
            raise _error(r.status_code, r.content)
        return r.json() if r.content else None

    # --- the daemon and its sessions ---------------------------------------------------------

    async def _typed(self, reply: type[_T], method: str, path: str, **kw: Any) -> _T:
        """The route's reply read as `reply` (a model, or `list[Model]`: the wire's types, parsed once here)."""
        return TypeAdapter(reply).validate_python(await self._call(method, path, **kw))

    def _body(self, request: BaseModel) -> dict[str, Any]:
        """A request's body: the route's schema model as JSON, fields left at their defaults out (the
        daemon validates it, once); a body that carries a model key gets this client's, in the clear."""
        body = request.model_dump(mode="json", exclude_defaults=True, warnings=False)  # as given: the daemon judges
        if "key" in type(request).model_fields and self.key is not None:
            body["key"] = self.key.wire()
        return body

    async def status(self) -> Status:
        return await self._typed(Status, "GET", "/v1/status")

    async def create_session(self, cwd: str | Path, model: str | None = None, base_url: str | None = None,
                             title: str | None = None, budget: Budget | None = None,
                             config: dict[str, Any] | None = None, sandbox: str | None = None,
                             mode: str | None = None) -> SessionInfo:
        body = CreateSession.model_construct(cwd=str(Path(cwd).resolve()), model=model, base_url=base_url, title=title,
                                             budget=budget, config=config, sandbox=sandbox, mode=mode)
        return await self._typed(SessionInfo, "POST", "/v1/sessions", json=self._body(body))

    async def sessions(self, cwd: str | Path | None = None) -> list[SessionInfo]:
        """Every session, oldest first; `cwd`: those of that directory or one below it."""
        params = _params(cwd=str(Path(cwd).resolve()) if cwd is not None else None)
        return await self._typed(list[SessionInfo], "GET", "/v1/sessions", params=params)

    async def session(self, session_id: str) -> SessionInfo:
        return await self._typed(SessionInfo, "GET", f"/v1/sessions/{session_id}")

    async def update(self, session_id: str, title: str | None = None, model: str | None = None,
                     sandbox: str | None = None, plan: bool | None = None) -> SessionInfo:
        body = UpdateSession.model_construct(title=title, model=model, sandbox=sandbox, plan=plan)
        return await self._typed(SessionInfo, "PATCH", f"/v1/sessions/{session_id}", json=self._body(body))

    async def compact(self, session_id: str) -> Notice:
        return await self._typed(Notice, "POST", f"/v1/sessions/{session_id}/compact")

    async def rebuild_prompt(self, session_id: str) -> Notice:
        return await self._typed(Notice, "POST", f"/v1/sessions/{session_id}/system-prompt")

    async def decide_refinement(self, session_id: str, refinement_id: str, approve: bool) -> RefinementDecision:
        """Approve or reject a refinement that waits for review."""
        return await self._typed(RefinementDecision, "POST", f"/v1/sessions/{session_id}/refinements/{refinement_id}",
                                 json=self._body(Decide.model_construct(approve=approve)))

    async def mcp(self, session_id: str, start: bool = False) -> list[ServerInfo]:
        """The session's MCP servers, their state and tools (`start`: start those not started, to list them)."""
        return await self._typed(list[ServerInfo], "GET", f"/v1/sessions/{session_id}/mcp",
                                 params=_params(start=start or None))

    async def decide_plan(self, session_id: str, approve: bool, note: str | None = None,
                          plan: str | None = None) -> PlanDecision:
        """Approve the session's proposed plan (it goes on writable, the plan its next turn) or reject it."""
        body = self._body(DecidePlan.model_construct(approve=approve, note=note or None, plan=plan or None))
        return await self._typed(PlanDecision, "POST", f"/v1/sessions/{session_id}/plan", json=body)

    async def decide_approval(self, session_id: str, request_id: str, decision: str, prefix: str | None = None,
                              full_env: bool = False) -> ApprovalDecision:
        """Decide a waiting request (`approval.requested`: a command, or an MCP call): approve, always or
        deny; `full_env`: the command runs with the person's whole environment, secrets included."""
        body = self._body(DecideApproval.model_construct(decision=decision, prefix=prefix or None, full_env=full_env))
        return await self._typed(ApprovalDecision, "POST", f"/v1/sessions/{session_id}/approvals/{request_id}", json=body)

    async def child_transcript(self, session_id: str, child_id: str) -> ChildTranscript:
        return await self._typed(ChildTranscript, "GET", f"/v1/sessions/{session_id}/subagents/{child_id}/transcript")

    async def harness_entry(self, entry_id: str, session: str | None = None) -> str:
        r = await self._http.get(f"/v1/harness/entries/{entry_id}", params=_params(session=session))
        if r.status_code >= 400:
            raise _error(r.status_code, r.content)
        return r.text

    async def diff(self, session_id: str) -> FilesChanged | None:
        """What changed in the session's workspace since its first checkpoint (None: nothing)."""
        path = f"/v1/sessions/{session_id}/diff"
        return await self._typed(FilesChanged | None, "GET", path)  # type: ignore[arg-type]

    async def server_models(self, session_id: str) -> list[str]:
        """The models the session's server lists."""
        return await self._typed(list[str], "GET", f"/v1/sessions/{session_id}/models")

    async def sleep(self, session_id: str) -> SessionInfo:
        return await self._typed(SessionInfo, "POST", f"/v1/sessions/{session_id}/sleep")

    async def close_session(self, session_id: str, if_idle: bool = False) -> SessionInfo:
        """Close the session (it stays listed; a prompt opens it again); `if_idle`: only if nothing runs in it."""
        return await self._typed(SessionInfo, "POST", f"/v1/sessions/{session_id}/close",
                                 json=self._body(CloseSession.model_construct(if_idle=if_idle)))

    async def delete(self, session_id: str, files: bool = False) -> None:
        """Out of the registry; `files`: its files removed too."""
        await self._call("DELETE", f"/v1/sessions/{session_id}", params={"files": "true"} if files else None)

    async def prune(self, older_than_days: float | None = None, cwd: str | Path | None = None,
                    dry_run: bool = False) -> Pruned:
        body = PruneSessions.model_construct(older_than_days=older_than_days, dry_run=dry_run,
                                             cwd=str(Path(cwd).resolve()) if cwd is not None else None)
        return await self._typed(Pruned, "POST", "/v1/sessions/prune", json=self._body(body))

    async def send(self, session_id: str, text: str, mode: str = "prompt",
                   notebook: Notebook | None = None) -> MessageAccepted:
        """Queue a prompt (or steer); with `notebook`, a turn that runs its cells (`text`: its prompt)."""
        body = self._body(SendMessage.model_construct(text=text, mode=mode, notebook=notebook))
        return await self._typed(MessageAccepted, "POST", f"/v1/sessions/{session_id}/messages", json=body)

    async def interrupt(self, session_id: str, drop_queued: bool = False, turn_id: str | None = None) -> Interrupted:
        """Stop the running turn; with `turn_id`, only that turn (dropped if it is still queued)."""
        body = self._body(Interrupt.model_construct(drop_queued=drop_queued, turn_id=turn_id or None))
        return await self._typed(Interrupted, "POST", f"/v1/sessions/{session_id}/interrupt", json=body)

    async def start_goal(self, session_id: str, text: str, check: str | None = None,
                         budget: dict[str, Any] | None = None, check_timeout: float | None = None) -> GoalState:
        spec = GoalSpec.model_construct(text=text, check=check, budget=budget or {},
                                        **({"check_timeout": check_timeout} if check_timeout is not None else {}))
        return await self._typed(GoalState, "POST", f"/v1/sessions/{session_id}/goal", json=self._body(spec))

    async def goal(self, session_id: str) -> GoalState:
        return await self._typed(GoalState, "GET", f"/v1/sessions/{session_id}/goal")

    async def stop_goal(self, session_id: str) -> GoalState:
        return await self._typed(GoalState, "DELETE", f"/v1/sessions/{session_id}/goal")

    async def schedules(self) -> list[Schedule]:
        return await self._typed(list[Schedule], "GET", "/v1/schedules")

    async def add_schedule(self, *, prompt: str = "", every: float | None = None, cron: str | None = None,
                           session: str | None = None, cwd: str | None = None, model: str | None = None,
                           base_url: str | None = None, count: int | None = None, heartbeat: bool = False) -> Schedule:
        """A schedule (daemon.schedules.NewSchedule says what each field means)."""
        body = NewSchedule.model_construct(prompt=prompt, every=every, cron=cron, session=session, cwd=cwd, model=model,
                                           base_url=base_url, count=count, heartbeat=heartbeat)
        return await self._typed(Schedule, "POST", "/v1/schedules", json=self._body(body))

    async def pause_schedule(self, schedule_id: str | None, paused: bool = True) -> list[Schedule]:
        """Pause (or resume) one schedule, or every one (`schedule_id` None)."""
        verb = "pause" if paused else "resume"
        if schedule_id is None:
            return await self._typed(list[Schedule], "POST", f"/v1/schedules/{verb}-all")
        return [await self._typed(Schedule, "POST", f"/v1/schedules/{schedule_id}/{verb}")]

    async def remove_schedule(self, schedule_id: str) -> None:
        await self._call("DELETE", f"/v1/schedules/{schedule_id}")

    async def transcript(self, session_id: str) -> Transcript:
        return await self._typed(Transcript, "GET", f"/v1/sessions/{session_id}/transcript")

    async def trajectory(self, session_id: str, format: str = "atif") -> atif.Trajectory:
        """The session's trajectory as an ATIF v1.8 document."""
        import atif  # ~0.1 s, for this call only

        return await self._typed(atif.Trajectory, "GET", f"/v1/sessions/{session_id}/trajectory",
                                 params={"format": format})

    async def subagents(self, session_id: str) -> list[ChildInfo]:
        return await self._typed(list[ChildInfo], "GET", f"/v1/sessions/{session_id}/subagents")

    async def cell_outputs(self, session_id: str, turn_id: str, cell_id: str) -> list[Attachment]:
        """A cell's display outputs (`cell.finished` names their types), each with its data in base64."""
        path = f"/v1/sessions/{session_id}/turns/{turn_id}/cells/{cell_id}/outputs"
        return await self._typed(list[Attachment], "GET", path)

    async def kernel(self, session_id: str) -> KernelInfo:
        return await self._typed(KernelInfo, "GET", f"/v1/sessions/{session_id}/kernel")

    async def refine(self, session_id: str, instructions: str | None = None, mode: str | None = None) -> Notice:
        body = self._body(RefineRequest.model_construct(instructions=instructions, mode=mode))
        return await self._typed(Notice, "POST", f"/v1/sessions/{session_id}/refine", json=body)

    async def checkpoints(self, session_id: str) -> list[TurnRow]:
        """The session's turns to rewind to: number, id, prompt, time, outcome, files changed."""
        return await self._typed(list[TurnRow], "GET", f"/v1/sessions/{session_id}/checkpoints")

    async def rewind(self, session_id: str, turn: int, *, parts: list[str] | None = None, after: bool = False,
                     force: bool = False, dry_run: bool = False) -> RewindResult:
        """Go back to before `turn` (or, with `after`, its end) in `parts` (default: code, conversation,
        harness, kernel); with `dry_run`, only say what would change."""
        chosen = {p: p in parts for p in ("code", "conversation", "harness", "kernel")} if parts is not None else {}
        body = RewindRequest.model_construct(turn=turn, after=after, force=force, dry_run=dry_run, **chosen)
        return await self._typed(RewindResult, "POST", f"/v1/sessions/{session_id}/rewind", json=self._body(body))

    async def harness(self, session: str | None = None, project: str | None = None) -> list[HarnessEntry]:
        return await self._typed(list[HarnessEntry], "GET", "/v1/harness", params=_params(session=session, project=project))

    async def harness_log(self, scope: str = "user", n: int = 20, session: str | None = None) -> list[Change]:
        return await self._typed(list[Change], "GET", "/v1/harness/log",
                                 params=_params(scope=scope, n=n, session=session))

    async def rollback(self, ref: str, scope: str = "user", to: bool = False, session: str | None = None,
                       project: str | None = None) -> RolledBack:
        body = Rollback.model_construct(ref=ref, scope=scope, to=to, session=session, project=project)
        return await self._typed(RolledBack, "POST", "/v1/harness/rollback", json=self._body(body))

    async def web(self, address: str, cwd: str) -> AsyncGenerator[WebAccess, None]:
        """Serve the web page on `address` (POST /v1/web; `cwd`: the page's default folder for a new
        session): yields where it is and its login token once, and returns when the daemon stops. The
        login is valid until then, or until the caller stops iterating."""
        async with self._http.stream("POST", "/v1/web", json=self._body(OpenWeb.model_construct(address=address, cwd=cwd)),
                                     timeout=httpx2.Timeout(10.0, read=None)) as r:
            if r.status_code >= 400:
                raise _error(r.status_code, await r.aread())
            lines = r.aiter_lines()
            yield WebAccess.model_validate_json(await anext(lines))
            async for _ in lines:  # empty lines keep it open
                pass

    # --- events --------------------------------------------------------------------------------

    async def events(self, session_id: str, after: int | None = None, reconnect: float = 30.0,
                     on_connection: Callable[[bool], None] | None = None) -> AsyncGenerator[Event, None]:
        """Every event after `after` (from the first without it), then live ones, forever.

        A dropped stream is resumed from the last event seen; `reconnect` is how many seconds to
        keep trying before `DaemonUnavailable` (0: do not reconnect; math.inf: forever).
        `on_connection(up)` hears when the stream is lost and when it is back.
        """
        last = after
        down_since: float | None = None
        restarted = False
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            try:
                async with self._http.stream("GET", f"/v1/sessions/{session_id}/events", headers=headers,
                                             timeout=httpx2.Timeout(10.0, read=None)) as r:
                    if r.status_code == 503:  # stopped on purpose: wait for it, do not start another
                        restarted = True
                        raise httpx2.TransportError("the daemon is stopping")
                    if r.status_code >= 400:
                        raise _error(r.status_code, await r.aread())
                    if down_since is not None and on_connection:
                        on_connection(True)
                    down_since, restarted = None, False
                    async for kind, data in _sse_data(r):
                        if kind == "stopping":  # stopped on purpose: wait for it, do not start another
                            restarted = True
                            continue
                        event = parse_event(data)
                        if event.seq:  # 0: told live but not journaled (a full disk), so no place to resume from
                            last = event.seq
                        yield event
            except (httpx2.TransportError, FileNotFoundError) as e:
                if down_since is None:
                    down_since = time.monotonic()
                    if on_connection:
                        on_connection(False)
                if self.autostart and not restarted and isinstance(e, httpx2.ConnectError | FileNotFoundError):
                    restarted = True  # once an outage, and not after a deliberate stop (a 503 first)
                    with contextlib.suppress(DaemonUnavailable):
                        await self.start_daemon()
                if time.monotonic() - down_since >= reconnect:
                    raise DaemonUnavailable(f"lost the event stream of {session_id}: {e}") from None
            await asyncio.sleep(0.2 if down_since else 0)

    async def wait_turn(self, session_id: str, turn_id: str, after: int | None = None) -> TurnFinished:
        """Follow the events until `turn_id` finishes; its `turn.finished` event."""
        async for event in self.events(session_id, after):
            if isinstance(event, TurnFinished) and event.turn_id == turn_id:
                return event
        raise AssertionError("unreachable: the event stream does not end")


async def _sse_data(response: httpx2.Response) -> AsyncIterator[tuple[str, bytes]]:
    """(event type, data) of each Server-Sent Event. Lines end only at LF (or CRLF), so a U+2028
    inside an event's JSON does not split it (str.splitlines would)."""
    buffer, data, kind = b"", [], "message"
    async for chunk in response.aiter_bytes():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.removesuffix(b"\r")
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
            elif line.startswith(b"event:"):
                kind = line[6:].strip().decode()
            elif not line and data:
                yield kind, b"\n".join(data)
                data, kind = [], "message"


def _params(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _error(status: int, body: bytes) -> DaemonError:
    try:
        err = httpx2.Response(status, content=body).json()["error"]
        return DaemonError(status, err["code"], err["message"])
    except (ValueError, KeyError, TypeError):
        return DaemonError(status, "http_error", body.decode(errors="replace")[:500] or f"HTTP {status}")


# --- starting the daemon ---------------------------------------------------------------------


async def connect(autostart: bool = True, key: ModelKey | None = None) -> Client:
    """A client of this home's daemon; with `autostart`, start the daemon when it is not running
    (now, and whenever the client later finds it gone). `key`: see Client."""
    client = Client(autostart=autostart, key=key)
    try:
        await client.status()
    except DaemonUnavailable:
        await client.close()
        raise
    return client


def own_key(cwd: Path) -> ModelKey | None:
    """The model key this process's own settings hold for `cwd` (OPENAI_API_KEY, config.toml), if any."""
    try:
        return ModelKey.of(load_config(cwd).model)
    except ConfigError:
        return None


def spawn(tcp: str | None = None, remote_unsandboxed: bool = False) -> subprocess.Popen:
    """Start the daemon in the background, detached from this terminal; its log is `run/daemon.log`.
    It runs as `prime-agent daemon start --foreground`: the command line is what hands the daemon
    the parts of the layers above it (the regression gate). `remote_unsandboxed`: with `tcp`, its
    clients there may loosen a sandbox (--allow-remote-unsandboxed)."""
    argv = [sys.executable, "-m", "cli", "daemon", "start", "--foreground", *(["--tcp", tcp] if tcp else []),
            *(["--allow-remote-unsandboxed"] if tcp and remote_unsandboxed else [])]
    with open(log_file(), "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/")


def daemon_pid() -> int | None:
    """The running daemon's pid (None when it is not running). Its lock says whether it runs, so a
    pid file a killed daemon left behind never names some other process."""
    fd = os.open(lock_file(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # held: a daemon runs (or is starting)
        try:
            return int(pid_file().read_text())
        except (FileNotFoundError, ValueError):
            return None
    finally:
        os.close(fd)
    return None


# --- the sync face ---------------------------------------------------------------------------


class SyncClient:
    """`Client` for code without an event loop: the same methods, blocking."""

    def __init__(self, client: Client | None = None, autostart: bool = True):
        self._loop = asyncio.new_event_loop()
        self._client = client or self._loop.run_until_complete(connect(autostart))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **kw: self._loop.run_until_complete(attr(*a, **kw))
        return attr

    def events(self, session_id: str, after: int | None = None, reconnect: float = 30.0) -> Iterator[Event]:
        stream = self._client.events(session_id, after, reconnect)
        try:
            while True:
                yield self._loop.run_until_complete(anext(stream))
        except StopAsyncIteration:
            return
        finally:
            self._loop.run_until_complete(stream.aclose())

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()
