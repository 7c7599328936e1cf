"""Approvals: what needs the user's say first. A command the sandbox denied may run with more room
(`kind: command`), and an MCP server under policy `ask` is called (`kind: mcp`), once the user says so.

The kernel asks with `await request_permission(command, reason)`, or calls a tool of such a server;
the request is an event (`approval.requested`) and a record in the trajectory, and waits for a
decision: `approve` (this once), `always` (for the rest of the session: see agent/approval_rules.py;
every call of the same MCP tool, or with the server as the prefix, of any of its tools), `deny`. The
daemon decides through POST /v1/sessions/{id}/approvals/{request_id}, `prime-agent run` at the
terminal (`ask`); `sandbox.approval = "never"` denies at once, and so does a session nobody can
answer; an `ask` that cannot reach its person (`NoTerminal`) denies too, recorded as nobody's decision.

An approved command runs in a sandbox of its own (`sandbox.shell`): the session kernel's view, limits
and network, with the workspace writable whatever the mode and, for a line of git commands only, the
repository git uses there (`.git` of the workspace and of its project, when there at the session's
start); nothing outside the workspace is writable, the secret stores stay hidden. It gets the kernel's
environment (secret-looking variables dropped, `sandbox.env_deny`) unless the person asked for their
full one (`full_env`, that decision only); its output goes back to the cell that asked. Where the OS
cannot sandbox, it runs unconfined, as the kernel does, and the request says so.

What a request puts in front of a person (summary, reason, notes) has its control characters written
as escapes (`agent.types.visible`): every front end shows what will run. A `.git` at the workspace's
or the project's root that was absent when the session began (the agent made it: git run there runs
its config's commands and hooks) is named on every request, and no rule approves a command while one
is there. A denied MCP call reaches the model as McpError. A subagent's requests go to its parent's
approvals (up to the session a person decides in), named in their reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent import events as ev
from agent.approval_rules import commands_of, covers, path_outside, prefix_of, rule_of, words_of
from agent.config import marks, project_root
from agent.config_models import SandboxConfig
from agent.context import Sinks
from agent.kernel.sandbox import Launch, kernel_env, shell, unavailable
from agent.kernel.view import View
from agent.trajectory import ApprovalRecord
from agent.types import has_control, visible

Kind = ev.ApprovalKind
Decision = Literal["approve", "always", "deny"]
Ask = Callable[["Request"], Awaitable[Decision]]
"""A front end's own way of asking (the terminal's, for `prime-agent run`); raises NoTerminal when
there is nobody to put the question to."""
MAX_COMMAND = 10_000
OUTPUT_LIMIT = 64 * 1024


@dataclass
class Request:
    id: str
    kind: Kind
    summary: str
    """The command line, or the MCP call as `server.tool(arguments)`, as shown: control characters as
    escapes (`visible`)."""
    reason: str
    prefix: str | None
    """What `always` approves (None: `always` is not offered): the command's rule as
    agent/approval_rules.py `prefix_of` shows it, or `server.tool`."""
    decided: asyncio.Future[tuple[Decision, str]]
    command: str = ""
    """A command's line as it runs (the summary shows it, with control characters as escapes)."""
    runs_in: str = ""
    """Where an approved command runs: its sandbox, in words."""
    notes: list[str] = field(default_factory=list)
    """What the person should know before deciding: a `.git` the agent made, control characters in the
    command, no sandbox on this machine."""
    full_env: bool = False
    """The person asked to run it with their full environment, secrets included."""
    unasked: str = ""
    """Why nobody could be asked (`NoTerminal`'s message), when that was so."""


class NoTerminal(Exception):
    """An `ask` could not put the question to anyone (the terminal would not open): the request is
    denied, recorded as `by: "no-terminal"` (no person decided), and the model is told why."""


class Approvals:
    """One session's requests for the user's decision, and the rules its user approved."""

    def __init__(self, config: SandboxConfig, cwd: Path, sinks: Sinks, timeout: Callable[[], float],
                 box: Callable[[], tuple[Launch, View]], cell_id: Callable[[], str | None] = lambda: None,
                 parent: tuple[Approvals, str] | None = None,
                 hook: Callable[[Request], Awaitable[Decision | None]] | None = None, ask: Ask | None = None,
                 can_ask: bool = False):
        """`timeout()`: seconds an approved command may run (the kernel's cell timeout); `box()`: how the
        session's kernel is launched and what it sees, which an approved command's sandbox starts from;
        `cell_id()`: the cell running now; `parent`: a subagent's (its parent's approvals, its name),
        where its requests go to be decided, recorded and run, as the parent's own are, named in their
        reason; `hook`: the person's PermissionRequest hooks, which may decide before anyone is asked;
        `ask`: a front end's own way of asking (the terminal's); `can_ask`: someone decides pending
        requests through `decide` (the daemon's API)."""
        self.config, self.cwd, self.sinks, self.timeout, self.box = config, cwd, sinks, timeout, box
        self.cell_id, self.parent, self.hook = cell_id, parent, hook
        self.pending: dict[str, Request] = {}
        self.rules: list[list[str]] = []
        """Commands approved with `always`, as rules (agent/approval_rules.py)."""
        self.tools: set[str] = set()
        """MCP tools (`server.tool`) and servers approved with `always`."""
        self.ask, self.can_ask = ask, can_ask
        """With neither, a request is denied at once, saying why."""
        self.repositories = tuple(dict.fromkeys([cwd / ".git", project_root(cwd) / ".git"]))
        """Where git run in the workspace finds its repository: the workspace's root and the project's."""
        self.git_at_start = {str(p) for p in self.repositories if os.path.lexists(p)}
        """Those of them there when the session began (a resumed session's come from its record)."""

    def handlers(self) -> dict[str, Any]:
        return {"permission.request": self.request}

    def decide(self, request_id: str, decision: Decision, prefix: str | None = None, full_env: bool = False) -> Request:
        """A person's decision (KeyError: no such request waits; ValueError: a prefix that does not
        fit, or `always` where it is not offered). `prefix`: an MCP request's `always` may widen to its
        server; a command's is the request's own; `full_env`: run this command with the person's whole
        environment, secrets included (this once; a rule's commands never are)."""
        req = self.pending.get(request_id)
        if req is None or req.decided.done():
            raise KeyError(f"no approval request {request_id!r} waits for a decision in this session")
        if prefix is not None:
            req.prefix = _fitted(req, prefix.strip())
        if decision == "always" and req.prefix is None:
            raise ValueError(f"`always` is not offered for `{req.summary}`: no rule could cover it without covering "
                             "more than it (see docs/sandbox.md#approvals); approve it once")
        req.full_env = full_env and req.kind == "command"
        req.decided.set_result((decision, "user"))
        return req

    async def request(self, command: str, reason: str = "") -> dict[str, Any]:
        """The bridge handler behind `request_permission`: the decision, and the command's outcome."""
        if self.parent is not None:  # checked and decided up there
            upstream, name = self.parent
            return await upstream.request(command, f"[subagent {name}] {reason}".strip())
        if not isinstance(command, str) or not command.strip():
            raise ValueError("request_permission needs the command to run, as one shell command line")
        if len(command) > MAX_COMMAND:
            raise ValueError(f"the command is {len(command):,} characters; at most {MAX_COMMAND:,}")
        req = self._new("command", command, str(reason)[:2000], prefix_of(command, self.cwd))
        req.command, req.runs_in, req.notes = command, self._runs_in(command), self._notes(command)
        decision, by = await self._wait(req, {})
        if decision == "always" and req.prefix is None:  # a front end's own `ask` answered so
            decision = "approve"
        if decision == "always" and by == "user" and (rule := rule_of(words_of(command) or [], self.cwd)):
            self.rules.append(rule)
        if decision == "deny":
            self._decided(req, decision, by)
            return {"approved": False, "reason": self._why(by, req)}
        result = await self._run(command, req.full_env)
        self._decided(req, decision, by, result["exit_code"], req.full_env)
        return {"approved": True, "by": by, **result}

    async def mcp(self, server: str, tool: str, arguments: dict[str, Any], shown: str,
                  reason: str = "") -> str | None:
        """A call of an MCP server under policy `ask`: None once approved, else why not. `shown`: the
        arguments as the request shows them (shortened); `reason`: which subagent asks, if one does."""
        if self.parent is not None:
            upstream, name = self.parent
            return await upstream.mcp(server, tool, arguments, shown, f"[subagent {name}] {reason}".strip())
        req = self._new("mcp", f"{server}.{tool}({shown})", reason, f"{server}.{tool}")
        decision, by = await self._wait(req, {"server": server, "tool": tool, "arguments": arguments})
        if decision == "always":
            self.tools.add(req.prefix)
        self._decided(req, decision, by)
        return self._why(by, req) if decision == "deny" else None

    async def cell(self, code: str, reason: str) -> str | None:
        """A cell a PreToolUse hook asked a person about (`permissionDecision: "ask"`): None once
        approved (this once: there is no `always` for a cell), else why not."""
        if self.parent is not None:
            upstream, name = self.parent
            return await upstream.cell(code, f"[subagent {name}] {reason}".strip())
        req = self._new("cell", code[:MAX_COMMAND], reason, None)
        decision, by = await self._wait(req, {})
        self._decided(req, decision, by)
        return self._why(by, req) if decision == "deny" else None

    def _made(self) -> list[Path]:
        """The repositories the agent made this session (absent when it began)."""
        return [p for p in self.repositories if (os.path.islink(p) or marks(p)) and str(p) not in self.git_at_start]

    def _notes(self, command: str) -> list[str]:
        """What a command's request warns the person of: each repository the agent made this session,
        control characters in the command, and no sandbox to run it in."""
        notes = [f"{p} was made in this session (it was not there when the session began): "
                 "git run here runs the commands its config names (core.fsmonitor, hooks, filters) as you"
                 for p in self._made()]
        if has_control(command):
            notes.append("the command holds control characters, shown here as escapes (\\x1b, \\x0d...): what "
                         "runs holds the characters themselves")
        if not self.box()[0].confined:
            notes.append(f"it runs with your rights, unconfined: {_unconfined(self.config)}")
        return [visible(n) for n in notes]

    def _writable(self, command: str) -> list[Path]:
        """The repositories an approved `command` may write: for a line of git commands only, those there
        when the session began, real directories (`_run` finds git outside the workspace for it)."""
        lines = commands_of(command)
        if not lines or any(words[0] != "git" for words in lines):
            return []
        return [Path(os.path.realpath(p.parent), p.name) for p in self.repositories
                if str(p) in self.git_at_start and p.is_dir() and not p.is_symlink()]

    def _runs_in(self, command: str) -> str:
        launch = self.box()[0]
        if not launch.confined:
            return f"with your rights, unconfined ({_unconfined(self.config)})"
        git = " and its repository (.git)" if self._writable(command) else ""
        return (f"in a sandbox of its own: the workspace writable{git}, nothing outside it; the secret stores "
                f"hidden{'' if launch.network else '; no network'}")

    def _new(self, kind: Kind, summary: str, reason: str, prefix: str | None) -> Request:
        return Request(f"a-{secrets.token_hex(4)}", kind, visible(summary), visible(reason),
                       visible(prefix) if prefix is not None else None, asyncio.get_running_loop().create_future())

    async def _wait(self, req: Request, mcp: dict[str, Any]) -> tuple[Decision, str]:
        """Record and announce `req`, and wait for its decision (an interrupted cell: denied, `cancelled`)."""
        self._record(req, "requested")
        self.sinks.emit(ev.ApprovalRequested(turn_id=self.sinks.turn_id(), request_id=req.id, kind=req.kind,
                                             summary=req.summary, reason=req.reason, prefix=req.prefix,
                                             runs_in=req.runs_in, notes=req.notes, cell_id=self.cell_id(), **mcp))
        self.pending[req.id] = req
        try:
            return await self._decision(req)
        except asyncio.CancelledError:  # the cell was interrupted: nothing runs
            self._decided(req, "deny", "cancelled")
            raise
        finally:
            self.pending.pop(req.id, None)

    async def _decision(self, req: Request) -> tuple[Decision, str]:
        if self.hook is not None and (decided := await self.hook(req)) is not None:  # the person's own hooks
            return decided, "hook"
        if self.config.approval == "never" or (self.ask is None and not self.can_ask):
            return "deny", "policy"
        if self._ruled(req):
            return "always", "rule"
        if self.ask is not None:
            try:
                return await self.ask(req), "user"
            except NoTerminal as e:
                req.unasked = str(e)
                return "deny", "no-terminal"
        try:
            return await asyncio.wait_for(asyncio.shield(req.decided), self.config.approval_timeout)
        except TimeoutError:
            return "deny", "timeout"

    def _why(self, by: str, req: Request) -> str:
        if by == "policy":
            if self.config.approval == "never":
                return 'approvals are off here (sandbox.approval = "never")'
            return "nobody can approve it in this session (run it in the daemon, or at a terminal)"
        if by == "timeout":
            return f"nobody decided within {self.config.approval_timeout:g}s"
        if by == "no-terminal":
            return f"nobody could be asked: {req.unasked}"
        return "the user denied it"

    def _ruled(self, req: Request) -> bool:
        if req.kind == "cell":  # a cell is decided each time
            return False
        if req.kind == "mcp":
            tool = req.prefix or ""
            return tool in self.tools or tool.split(".", 1)[0] in self.tools
        # what a note on a made repository says, a person reads first
        return not self._made() and any(covers(rule, req.command, self.cwd) for rule in self.rules)

    async def _run(self, command: str, full_env: bool) -> dict[str, Any]:
        """In its own sandbox (the module's docstring says which), with the kernel's environment (or,
        when the person asked, the whole of this process's): the command's exit code and output, each
        stream cut to OUTPUT_LIMIT. Past `timeout()` it and all it started are killed (TimeoutError)."""
        launch, view = self.box()
        env = dict(os.environ) if full_env else kernel_env(os.environ, self.config)
        writable = self._writable(command)
        if writable:  # a `git` the agent put in the workspace never runs with the repository writable
            env["PATH"] = path_outside(env.get("PATH", os.defpath), self.cwd)
        launch = dataclasses.replace(launch, env=tuple(sorted(env.items())))
        view = dataclasses.replace(
            view, mode="workspace-write", frozen=False, read_only=tuple(p for p in view.read_only if p not in writable),
            writable=(*view.writable, *(p for p in writable if view.workspace not in p.parents)))
        async with shell(command, self.cwd, launch, view, stderr=asyncio.subprocess.PIPE) as (proc, _):
            assert proc.stdout is not None and proc.stderr is not None
            out, err, code = await asyncio.wait_for(
                asyncio.gather(_read(proc.stdout), _read(proc.stderr), proc.wait()), self.timeout())
        return {"exit_code": code, "stdout": out, "stderr": err}

    def _record(self, req: Request, status: str, by: str | None = None, exit_code: int | None = None,
                full_env: bool = False) -> None:
        self.sinks.record(ApprovalRecord(turn_id=self.sinks.turn_id(), request_id=req.id, request_kind=req.kind,
                                         summary=req.summary, status=status, by=by, reason=req.reason,
                                         exit_code=exit_code, full_env=full_env))

    def _decided(self, req: Request, decision: Decision, by: str, exit_code: int | None = None,
                 full_env: bool = False) -> None:
        self._record(req, decision, by, exit_code, full_env)
        self.sinks.emit(ev.ApprovalDecided(turn_id=self.sinks.turn_id(), request_id=req.id, kind=req.kind,
                                           decision=decision, by=by, exit_code=exit_code,  # type: ignore[arg-type]
                                           full_env=full_env))


def _unconfined(config: SandboxConfig) -> str:
    return "the sandbox is off (full-access)" if config.mode == "full-access" else str(unavailable())


def _fitted(req: Request, prefix: str) -> str:
    """The prefix a person gave for `always`, checked: an MCP request's is its tool or its server; a
    command's is the request's own (a rule covers what the person saw, never more: approval_rules.py)."""
    if req.kind == "mcp":
        tool = req.summary.split("(", 1)[0]
        server = tool.split(".", 1)[0]
        if prefix not in (tool, server):
            raise ValueError(f"an MCP request's prefix is its tool ({tool!r}) or its server ({server!r})")
        return prefix
    if req.prefix is None:
        raise ValueError(f"`always` is not offered for {req.summary!r}: approve it once")
    if prefix != req.prefix:
        raise ValueError(f"a command's `always` covers what its request shows ({req.prefix!r}), no other prefix")
    return prefix


async def _read(stream: asyncio.StreamReader) -> str:
    """All of `stream` as text; past OUTPUT_LIMIT bytes its head and tail, saying how much was cut
    between (the host's memory stays bounded whatever the command prints)."""
    half = OUTPUT_LIMIT // 2
    head, tail, total = bytearray(), bytearray(), 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        room = max(half - len(head), 0)
        head += chunk[:room]
        tail += chunk[room:]
        del tail[:-half]
    if total <= OUTPUT_LIMIT:
        return (head + tail).decode(errors="replace")
    return f"{head.decode(errors='replace')}\n[... {total - OUTPUT_LIMIT:,} bytes cut ...]\n{tail.decode(errors='replace')}"
