"""`prime-agent acp`: the agent over the Agent Client Protocol on stdio, for editors (Zed, JetBrains,
Neovim), Harbor and verifiers, built on the official SDK (`agent-client-protocol`).

Every ACP session is an ordinary daemon session (the daemon starts if none runs), so a session an
editor opened is in `prime-agent sessions`, the app and the API too. Each prompt is sent to the
daemon and its events become `session/update`s:

| daemon event                     | ACP update                                                        |
| -------------------------------- | ----------------------------------------------------------------- |
| model.started / model.delta      | agent_message_chunk (reasoning: agent_thought_chunk), with a      |
|                                  | messageId for each model call                                     |
| cell.started / output / finished | tool_call (kind execute, rawInput the code), tool_call_updates    |
|                                  | with the output so far, then completed or failed, with a `diff`   |
|                                  | content block for each small text file the cell changed           |
| subagent.spawned / finished      | a tool_call of its own (kind think) with the child's answer      |
| approval.requested               | session/request_permission (allow once, allow always, reject);    |
|                                  | the client's answer decides, cancelled means denied               |
| plan.proposed                    | a plan update (an entry per step), then, once the turn ends,      |
|                                  | session/request_permission (kind switch_mode): approve or reject  |
| turn.finished                    | the prompt's response: end_turn, cancelled, max_turn_requests     |

Permission modes are ACP session modes (`read-only`, `workspace-write`, `full-access`), and so is
`plan` (where the sandbox can keep the workspace read-only): the agent investigates and proposes a
plan, which the client approves or rejects when asked; approved, the same prompt goes on carrying it
out in `workspace-write` (a `current_mode_update` says so), rejected, the session stays in plan mode
and the model hears why with the next prompt. Changing the mode restarts the session's kernel in the
new sandbox at its next prompt; a plan that waited is dropped when plan mode is left. On stdin's end the agent
puts its sessions to sleep (their kernels stop; they wake on their next prompt from any front) and
exits. Standard output carries only protocol messages: everything else is sent to standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import acp
from acp import schema as s

from agent import events as ev
from agent.config import ConfigError, load_config, merge
from agent.kernel.sandbox import unavailable
from agent.types import FilesChanged
from cli import version
from cli.overrides import add_set, read_overrides
from daemon.client import Client, DaemonError, connect
from daemon.schemas import ModelKey

log = logging.getLogger("prime-agent.acp")
MODES = {
    "read-only": "Read only: the agent's code reads the workspace, writes nowhere but its temp folder",
    "workspace-write": "The agent's code writes the workspace; .git, the harness and your secrets stay out of reach",
    "full-access": "No sandbox: the agent's code runs with your rights",
}
PLAN = ("plan", "Plan: the agent investigates with the workspace read-only and proposes a plan; once you approve "
        "it, it carries it out in workspace-write")
"""Plan mode, a session mode beside the permission modes where the sandbox can freeze the workspace."""
PLAN_OPTIONS = [s.PermissionOption(option_id="approve", name="Approve the plan and carry it out", kind="allow_once"),
                s.PermissionOption(option_id="reject", name="Reject: keep planning", kind="reject_once")]
STOP = {"completed": "end_turn", "interrupted": "cancelled", "budget_exhausted": "max_turn_requests",
        "timed_out": "end_turn", "error": "end_turn"}
"""A turn's outcome as the prompt's stopReason."""
PERMISSION_OPTIONS = [s.PermissionOption(option_id="approve", name="Allow once", kind="allow_once"),
                      s.PermissionOption(option_id="always", name="Allow always in this session", kind="allow_always"),
                      s.PermissionOption(option_id="deny", name="Reject", kind="reject_once")]
SHOWN = 64 * 1024
"""Characters of a cell's live output carried in its tool call (the rest is in the final update)."""


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--model", help="model name (PRIME_AGENT_MODEL)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    p.add_argument("--sandbox", choices=[*MODES, PLAN[0]],
                   help="the mode new sessions start in (default: the configuration's); plan: plan mode")
    add_set(p, " for new sessions", deprecated_c=True)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="prime-agent acp: %(message)s")
    try:
        overrides = read_overrides(args, "acp")
    except ConfigError as e:
        print(f"prime-agent acp: {e}", file=sys.stderr)
        return 2
    if args.model:
        overrides.setdefault("model", {})["name"] = args.model
    if args.base_url:
        overrides.setdefault("model", {})["base_url"] = args.base_url
    if args.sandbox == PLAN[0]:
        overrides.setdefault("sandbox", {})["plan"] = True
    elif args.sandbox:
        overrides.setdefault("sandbox", {})["mode"] = args.sandbox
    try:  # the key this process holds (OPENAI_API_KEY) goes to the daemon for its endpoint's sessions
        key = ModelKey.of(load_config(Path.cwd(), overrides).model)
    except ConfigError:
        key = None  # a session's own configuration error is answered when it is created
    # The protocol gets the real stdout; anything else printed (by us, a library, a child) goes to stderr.
    protocol = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return asyncio.run(_serve(protocol, overrides, key))


async def _serve(protocol_fd: int, overrides: dict[str, Any], key: ModelKey | None) -> int:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    writer = asyncio.StreamWriter(_FdTransport(protocol_fd), asyncio.streams.FlowControlMixin(), None, loop)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    lines = asyncio.ensure_future(_parse_errors_answered(stdin, reader, writer))
    try:
        client = await connect(key=key)
    except DaemonError as e:
        print(f"prime-agent acp: the daemon could not be reached: {e}", file=sys.stderr)
        return 1
    agent = PrimeAgent(client, overrides)
    try:
        await acp.run_agent(agent, writer, reader)
    finally:
        lines.cancel()
        await agent.close()
        await client.close()
    return 0


LINE_LIMIT = 50 * 1024 * 1024
"""The longest message a client may send (an embedded file), as the SDK's own stdio has it."""


async def _parse_errors_answered(stdin: asyncio.StreamReader, reader: asyncio.StreamReader,
                                 writer: asyncio.StreamWriter) -> None:
    """Lines from stdin to the SDK's reader; one that is not JSON is answered here with a JSON-RPC
    parse error (the SDK would only log it, and the client would wait for an answer forever)."""
    try:
        while line := await stdin.readline():
            try:
                json.loads(line)
            except ValueError as e:
                error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": f"Parse error: {e}"}}
                writer.write(json.dumps(error).encode() + b"\n")
                continue
            reader.feed_data(line)
    except (ValueError, asyncio.LimitOverrunError) as e:  # a line past LINE_LIMIT: nothing more can be read
        log.error("stopped reading: %s", e)
    finally:
        reader.feed_eof()


class _FdTransport(asyncio.WriteTransport):
    """Writes the protocol to file descriptor `fd` as it comes (a pipe, a file or a terminal alike)."""

    def __init__(self, fd: int):
        super().__init__()
        self.fd, self.closing = fd, False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        view = memoryview(data)
        while view and not self.closing:
            try:
                view = view[os.write(self.fd, view):]
            except BrokenPipeError:  # the client is gone: what it would have read no longer matters
                self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return False


class PrimeAgent:
    """The ACP agent: each method is one of the protocol's requests, answered through the daemon."""

    def __init__(self, client: Client, overrides: dict[str, Any]):
        self.client, self.overrides = client, overrides
        self.conn: acp.Client | None = None
        self.running: dict[str, asyncio.Task] = {}
        """The prompt running in each session (one at a time)."""
        self.modes: dict[str, str] = {}
        self.opened: set[str] = set()
        self.turns: dict[str, str] = {}
        """The daemon's turn each running prompt is."""
        self.asking: set[asyncio.Task] = set()
        """Permission requests waiting for the client."""

    def on_connect(self, conn: acp.Client) -> None:
        self.conn = conn

    async def close(self) -> None:
        """stdin ended: no kernel is left running for a client that is gone."""
        for task in self.running.values():
            task.cancel()
        for session_id in self.opened:
            with contextlib.suppress(DaemonError):
                if session_id in self.running:
                    await self.client.interrupt(session_id, drop_queued=True)
                await self.client.sleep(session_id)

    # --- the protocol's requests ---------------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any) -> s.InitializeResponse:
        return s.InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=s.AgentCapabilities(
                load_session=True,
                prompt_capabilities=s.PromptCapabilities(image=False, audio=False, embedded_context=True),
                mcp_capabilities=s.McpCapabilities(http=True, sse=True),
                session_capabilities=s.SessionCapabilities(list=s.SessionListCapabilities())),
            agent_info=s.Implementation(name="prime-agent", title="Prime Agent", version=version()))

    async def new_session(self, cwd: str, mcp_servers: list | None = None, **kwargs: Any) -> s.NewSessionResponse:
        overrides = copy.deepcopy(self.overrides)
        if mcp_servers:
            merge(overrides, {"mcp": {"servers": _mcp_servers(mcp_servers)}})
        try:
            config = load_config(Path(cwd), overrides)
        except ConfigError as e:
            raise acp.RequestError.invalid_params({"message": str(e)}) from None
        try:
            info = await self.client.create_session(cwd, model=config.model.name, base_url=config.model.base_url,
                                                    config=overrides or None)
        except DaemonError as e:
            raise _request_error(e) from None
        self.opened.add(info.id)
        self.modes[info.id] = PLAN[0] if info.planning else config.sandbox.mode
        return s.NewSessionResponse(session_id=info.id, modes=self._modes(info.id))

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list | None = None,
                           **kwargs: Any) -> s.LoadSessionResponse:
        info = await self._info(session_id)
        self.opened.add(session_id)
        self.modes.setdefault(session_id, PLAN[0] if info.planning else
                              _mode_of(info.sandbox) or load_config(Path(info.cwd)).sandbox.mode)
        turn = Updates(self, session_id, info.cwd, replay=True)
        if info.last_seq:
            async for event in self.client.events(session_id, after=0):
                await turn.on(event)
                if event.seq >= info.last_seq:
                    break
        return s.LoadSessionResponse(modes=self._modes(session_id))

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **kwargs: Any) -> s.ListSessionsResponse:
        sessions = await self.client.sessions()
        want = str(Path(cwd).resolve()) if cwd else None
        return s.ListSessionsResponse(sessions=[
            s.SessionInfo(session_id=i.id, cwd=i.cwd, title=i.title,
                          updated_at=datetime.datetime.fromtimestamp(i.updated, datetime.UTC).isoformat())
            for i in sorted(sessions, key=lambda i: -i.updated) if want is None or i.cwd == want])

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> s.SetSessionModeResponse:
        """A permission mode (leaving plan mode, if the session was in it), or plan mode."""
        modes = [mode.id for mode in self._modes(session_id).available_modes]
        if mode_id not in modes:
            raise acp.RequestError.invalid_params({"message": f"no mode {mode_id!r}: one of {', '.join(modes)}"})
        if session_id in self.running:
            raise acp.RequestError.invalid_request({"message": "the mode changes between prompts: cancel or wait"})
        await self._info(session_id)
        try:
            if mode_id == PLAN[0]:
                await self.client.update(session_id, plan=True)
            else:
                await self.client.update(session_id, sandbox=mode_id, plan=False)
        except DaemonError as e:
            raise _request_error(e) from None
        self.modes[session_id] = mode_id
        await self._send(session_id, s.CurrentModeUpdate(session_update="current_mode_update", current_mode_id=mode_id))
        return s.SetSessionModeResponse()

    async def prompt(self, session_id: str, prompt: list, **kwargs: Any) -> s.PromptResponse:
        if session_id in self.running:
            raise acp.RequestError.invalid_request({"message": "a prompt is already running in this session: "
                                                    "cancel it or wait for its response"})
        info = await self._info(session_id)
        self.opened.add(session_id)
        text = _prompt_text(prompt)
        if not text.strip():
            raise acp.RequestError.invalid_params({"message": "the prompt has no text"})
        task = asyncio.ensure_future(self._prompt(session_id, text, info.last_seq, info.cwd))
        self.running[session_id] = task
        try:
            return await task
        finally:
            self.running.pop(session_id, None)
            self.turns.pop(session_id, None)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        if (turn_id := self.turns.get(session_id)) is not None:  # this client's turn, not another front's
            with contextlib.suppress(DaemonError):
                await self.client.interrupt(session_id, turn_id=turn_id)

    async def authenticate(self, method_id: str, **kwargs: Any) -> s.AuthenticateResponse:
        return s.AuthenticateResponse()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise acp.RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    # --- one prompt ----------------------------------------------------------------------------

    async def _prompt(self, session_id: str, text: str, after: int, cwd: str) -> s.PromptResponse:
        try:
            accepted = await self.client.send(session_id, text)
        except DaemonError as e:
            raise _request_error(e) from None
        turn_id = self.turns[session_id] = accepted.turn_id
        updates = Updates(self, session_id, cwd)
        async for event in self.client.events(session_id, after=after):
            if event.turn_id not in (None, turn_id):
                continue
            await updates.on(event)
            if isinstance(event, ev.TurnFinished):
                await updates.finish(event)
                plan, updates.proposed = updates.proposed, None
                if plan is not None and event.outcome == "completed":
                    decided, follow = await self._decide_plan(session_id, plan, event.turn_id or "")
                    if follow is not None:  # approved: the same prompt goes on with the turn that carries it out
                        turn_id = self.turns[session_id] = follow
                        continue
                    if decided == "cancelled":
                        return s.PromptResponse(stop_reason="cancelled")
                return s.PromptResponse(stop_reason=STOP[event.outcome])  # type: ignore[arg-type]
        raise acp.RequestError.internal_error({"message": "the session's event stream ended"})

    async def _decide_plan(self, session_id: str, plan: str, turn_id: str) -> tuple[str, str | None]:
        """Ask the client to approve the plan: (what was decided, the turn that carries the plan out).
        Approved, that turn (the session is in workspace-write from now on); rejected, plan mode goes
        on and the model hears of it with the next prompt. Cancelled (the prompt was), or a client that
        fails to answer, leaves the plan waiting, to be decided in the app, over the API, or by the
        next plan's question."""
        assert self.conn is not None
        call = s.ToolCallUpdate(tool_call_id=f"plan-{turn_id}", title="Approve the plan?", kind="switch_mode",
                                status="pending", content=[acp.tool_content(acp.text_block(plan))],
                                raw_input={"plan": plan})
        try:
            answer = await self.conn.request_permission(session_id, call, PLAN_OPTIONS)
        except Exception:
            log.exception("the client did not answer the plan's permission request")
            return "unanswered", None
        if not isinstance(answer.outcome, s.AllowedOutcome):
            return "cancelled", None
        approve = answer.outcome.option_id == "approve"
        try:
            decision = await self.client.decide_plan(session_id, approve)
        except DaemonError as e:
            await self._send(session_id, acp.update_agent_message_text(f"\n[plan: {e.message}]"))
            return "failed", None
        if not approve:
            return "rejected", None
        self.modes[session_id] = "workspace-write"
        await self._send(session_id, s.CurrentModeUpdate(session_update="current_mode_update",
                                                         current_mode_id="workspace-write"))
        return "approved", decision.turn_id

    async def _send(self, session_id: str, update: Any) -> None:
        assert self.conn is not None
        await self.conn.session_update(session_id, update)

    async def _info(self, session_id: str):
        try:
            return await self.client.session(session_id)
        except DaemonError as e:
            raise _request_error(e) from None

    def _modes(self, session_id: str) -> s.SessionModeState:
        modes = {**MODES, **({PLAN[0]: PLAN[1]} if unavailable() is None else {})}  # plan mode needs the sandbox
        return s.SessionModeState(current_mode_id=self.modes.get(session_id, "workspace-write"), available_modes=[
            s.SessionMode(id=mode, name=mode, description=text) for mode, text in modes.items()])


class Updates:
    """One turn's daemon events as ACP updates (or, with `replay`, a past conversation's)."""

    def __init__(self, agent: PrimeAgent, session_id: str, cwd: str, replay: bool = False):
        self.agent, self.session_id, self.cwd, self.replay = agent, session_id, Path(cwd), replay
        self.output: dict[str, str] = {}
        self.said = ""
        self.message: str | None = None
        """The message the model's text is part of: one a model call (its `messageId`), so a client
        that keeps only the last message (verifiers' ACP runner) gets the answer, not the chatter."""
        self.proposed: str | None = None
        """The plan this turn proposed, for the client to decide once the turn ends."""

    async def on(self, e: ev.Event) -> None:
        send = self.send
        if isinstance(e, ev.TurnStarted) and self.replay:
            await send(acp.update_user_message_text(e.prompt))
        elif isinstance(e, ev.ModelStarted):
            self.message = f"{e.turn_id}-{e.step}"
        elif isinstance(e, ev.ModelDelta):
            if e.reasoning:
                await send(s.AgentThoughtChunk(session_update="agent_thought_chunk", content=acp.text_block(e.text),
                                               message_id=self.message))
            else:
                self.said += e.text
                await send(_said(e.text, self.message))
        elif isinstance(e, ev.CellStarted):
            self.output[e.cell_id] = ""
            title = next((line.strip() for line in e.code.splitlines() if line.strip()), "cell")[:120]
            await send(acp.start_tool_call(e.cell_id, title, kind="execute", status="in_progress",
                                           raw_input={"code": e.code}))
        elif isinstance(e, ev.CellOutput) and e.cell_id in self.output:
            shown = (self.output[e.cell_id] + e.text)[:SHOWN]
            self.output[e.cell_id] = shown
            await send(acp.update_tool_call(e.cell_id, content=[acp.tool_content(acp.text_block(shown))]))
        elif isinstance(e, ev.CellFinished):
            self.output.pop(e.cell_id, None)
            r = e.result
            failed = bool(r.error_name) or "died" in r.kernel_events or "timed_out" in r.kernel_events
            tables = "".join(f"{a.data}\n" for a in r.attachments if a.is_text)  # Markdown: editors render it
            text = "".join(part for part in (r.stdout, r.stderr, f"{r.result}\n" if r.result else "", tables,
                                             f"{r.error_name}: {r.error_value}\n" if r.error_name else "",
                                             f"[{r.kernel_message}]\n" if r.kernel_message else "") if part)
            content = [acp.tool_content(acp.text_block(text))] if text else []
            content += _diffs(self.cwd, e.files) if e.files is not None else []
            await send(acp.update_tool_call(e.cell_id, status="failed" if failed else "completed",
                                            content=content or None, raw_output=r.model_dump(exclude={"attachments"})))
        elif isinstance(e, ev.SubagentSpawned):
            await send(acp.start_tool_call(f"subagent-{e.id}", f"subagent {e.name}", kind="think",
                                           status="in_progress", raw_input={"name": e.name}))
        elif isinstance(e, ev.SubagentFinished):
            answer = e.answer or e.error or e.outcome
            await send(acp.update_tool_call(f"subagent-{e.id}", status="completed" if e.outcome == "completed"
                                            else "failed", content=[acp.tool_content(acp.text_block(answer))]))
        elif isinstance(e, ev.ApprovalRequested) and not self.replay:
            task = asyncio.ensure_future(self.ask(e))
            self.agent.asking.add(task)
            task.add_done_callback(self.agent.asking.discard)
        elif isinstance(e, ev.PlanProposed):
            self.proposed = e.plan
            await send(acp.update_plan(acp.plan_entry(step) for step in _plan_steps(e.plan)))
        elif isinstance(e, ev.TurnFinished) and self.replay:
            await self.finish(e)

    async def finish(self, e: ev.TurnFinished) -> None:
        """The answer, where the model's streamed text did not already say it (an answer given with
        `final()` from a cell), and the error of a turn that failed."""
        if e.answer and e.answer.strip() not in self.said:
            self.message = f"{e.turn_id}-answer"
            await self.send(_said(e.answer, self.message))
        if e.outcome != "completed" and e.error:  # a turn that never ran says why (its session could not start)
            await self.send(_said(f"\n[{e.outcome}: {e.error}]", self.message))
        self.said = ""

    async def ask(self, e: ev.ApprovalRequested) -> None:
        """The client decides: allow once, always (for `e.prefix`), or reject; cancelled is a rejection."""
        conn = self.agent.conn
        assert conn is not None
        call = s.ToolCallUpdate(tool_call_id=e.cell_id or e.request_id, title=e.summary,
                                kind="execute" if e.kind == "command" else "other",
                                raw_input={"summary": e.summary, "reason": e.reason, "always_covers": e.prefix,
                                           "runs_in": e.runs_in, "notes": e.notes})
        decision = "deny"
        options = [o for o in PERMISSION_OPTIONS if o.option_id != "always" or e.prefix]  # `always` where offered
        try:
            answer = await conn.request_permission(self.session_id, call, options)
            if isinstance(answer.outcome, s.AllowedOutcome):
                decision = answer.outcome.option_id
        except Exception:  # the client failed to answer: denied, as an unanswered request is
            log.exception("the client did not answer a permission request")
        with contextlib.suppress(DaemonError):
            await self.agent.client.decide_approval(self.session_id, e.request_id, decision)

    async def send(self, update: Any) -> None:
        await self.agent._send(self.session_id, update)


def _said(text: str, message_id: str | None) -> s.AgentMessageChunk:
    return s.AgentMessageChunk(session_update="agent_message_chunk", content=acp.text_block(text), message_id=message_id)


def _prompt_text(blocks: list) -> str:
    """The prompt's text: text blocks, and embedded resources (a file the editor attached) with their URI."""
    parts = []
    for block in blocks:
        if isinstance(block, s.TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, s.EmbeddedResourceContentBlock) and isinstance(block.resource, s.TextResourceContents):
            parts.append(f"\n<file uri={block.resource.uri!r}>\n{block.resource.text}\n</file>\n")
        elif isinstance(block, s.ResourceContentBlock):
            parts.append(f"[{block.name}: {block.uri}]")
    return "".join(parts)


def _diffs(cwd: Path, files: FilesChanged) -> list:
    """The files a cell changed as tool call content: a `diff` block (path, oldText, newText) for each
    small text file, which the editor shows as it shows its own diffs; the rest as text, their diff's
    hunks or what they are (binary, large)."""
    out: list = []
    for f in files.files:
        if f.whole:
            out.append(acp.tool_diff_content(str(cwd / f.path), f.new_text,
                                             None if f.change == "created" else f.old_text))
        else:
            lines = "\n".join(line for _, line in f.lines())
            out.append(acp.tool_content(acp.text_block(f"{f.headline()}\n{lines}".rstrip("\n"))))
    if files.more:
        out.append(acp.tool_content(acp.text_block(f"... and {files.more} more files changed")))
    return out


def _plan_steps(plan: str) -> list[str]:
    """A plan's steps as the plan update's entries: its list items (`1.`, `-`, `*`), each with the
    lines under it; a plan without a list is one entry."""
    steps: list[str] = []
    for line in plan.splitlines():
        item = re.match(r"\s{0,3}(?:\d+[.)]|[-*+])\s+(.*)", line)
        if item:
            steps.append(item.group(1).strip())
        elif steps and line.strip():
            steps[-1] += "\n" + line.strip()
    return steps or [plan.strip()]


def _mcp_servers(servers: list) -> dict[str, dict[str, Any]]:
    """The client's MCP servers as [mcp.servers.NAME] tables (the person's editor configured them)."""
    out: dict[str, dict[str, Any]] = {}
    for server in servers:
        if isinstance(server, s.McpServerStdio):
            out[server.name] = {"type": "stdio", "command": server.command, "args": list(server.args),
                                "env": {v.name: v.value for v in server.env or []}}
        else:
            out[server.name] = {"type": "sse" if isinstance(server, s.SseMcpServer) else "http", "url": server.url,
                                "headers": {h.name: h.value for h in server.headers or []}}
    return out


def _mode_of(sandbox: str | None) -> str | None:
    return next((m for m in MODES if sandbox and sandbox.startswith(m)), None)


def _request_error(e: DaemonError) -> acp.RequestError:
    if e.status == 404:
        return acp.RequestError(-32002, e.message, {"code": e.code})
    return acp.RequestError(-32602 if 400 <= e.status < 500 else -32603, e.message, {"code": e.code})
