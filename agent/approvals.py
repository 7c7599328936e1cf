"""Approvals: what needs the user's say first. A command the sandbox denied may run outside it
(`kind: command`), and an MCP server under policy `ask` is called (`kind: mcp`), once the user says so.

The kernel asks with `await request_permission(command, reason)`, or calls a tool of such a server;
the request is an event (`approval.requested`) and a record in the trajectory, and waits for a
decision: `approve` (this once), `always` (for the rest of the session: every command that starts
with the same words and chains no other command; every call of the same MCP tool, or with the
server as the prefix, of any of its tools), `deny`. The daemon decides through
POST /v1/sessions/{id}/approvals/{request_id}, `prime-agent run` at the terminal (`ask`);
`sandbox.approval = "never"` denies at once, and so does a session nobody can answer; an `ask` that
cannot reach its person (`NoTerminal`) denies too, recorded as nobody's decision. An approved
command runs in the workspace with the user's rights, outside the sandbox; its output goes back to
the cell that asked. A denied MCP call reaches the model as McpError. A subagent's requests go to
its parent's approvals (up to the session a person decides in), named in their reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent import events as ev
from agent.config import SandboxConfig
from agent.context import Sinks
from agent.trajectory import ApprovalRecord

Kind = ev.ApprovalKind
Decision = Literal["approve", "always", "deny"]
Ask = Callable[["Request"], Awaitable[Decision]]
"""A front end's own way of asking (the terminal's, for `prime-agent run`); raises NoTerminal when
there is nobody to put the question to."""
MAX_COMMAND = 10_000
OUTPUT_LIMIT = 64 * 1024
CHAINS = set(";&|`$()<>\n\\")
"""Characters with which one command line runs others: such a line is never approved by a rule."""


@dataclass
class Request:
    id: str
    kind: Kind
    summary: str
    """The command line, or the MCP call as `server.tool(arguments)`."""
    reason: str
    prefix: str
    """What `always` approves: the command's first words, or `server.tool`."""
    decided: asyncio.Future[tuple[Decision, str]]
    unasked: str = ""
    """Why nobody could be asked (`NoTerminal`'s message), when that was so."""


class NoTerminal(Exception):
    """An `ask` could not put the question to anyone (the terminal would not open): the request is
    denied, recorded as `by: "no-terminal"` (no person decided), and the model is told why."""


def prefix_of(command: str) -> str:
    """The words `always` approves: the program, and its subcommand when it has one (`git push`)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    keep = words[:2] if len(words) > 1 and words[1][:1].isalpha() else words[:1]
    return " ".join(keep)


class Approvals:
    """One session's requests for the user's decision, and the rules its user approved."""

    def __init__(self, config: SandboxConfig, cwd: Path, sinks: Sinks, timeout: Callable[[], float],
                 cell_id: Callable[[], str | None] = lambda: None, parent: tuple[Approvals, str] | None = None):
        """`timeout()`: seconds an approved command may run (the kernel's cell timeout); `cell_id()`:
        the cell running now; `parent`: a subagent's (its parent's approvals, its name), where its
        requests go to be decided, recorded and run, as the parent's own are, named in their reason."""
        self.config, self.cwd, self.sinks, self.timeout, self.cell_id = config, cwd, sinks, timeout, cell_id
        self.parent = parent
        self.pending: dict[str, Request] = {}
        self.rules: list[list[str]] = []
        """Command prefixes approved with `always`, as words."""
        self.tools: set[str] = set()
        """MCP tools (`server.tool`) and servers approved with `always`."""
        self.ask: Ask | None = None
        self.can_ask = False
        """Someone decides pending requests through `decide` (the daemon sets it: its API does). With
        neither this nor `ask`, a request is denied at once, saying why."""

    def handlers(self) -> dict[str, Any]:
        return {"permission.request": self.request}

    def decide(self, request_id: str, decision: Decision, prefix: str | None = None) -> Request:
        """A person's decision (KeyError: no such request waits; ValueError: a prefix that does not
        fit). `prefix` narrows or widens what `always` approves (default: the request's)."""
        req = self.pending.get(request_id)
        if req is None or req.decided.done():
            raise KeyError(f"no approval request {request_id!r} waits for a decision in this session")
        if prefix is not None:
            prefix = prefix.strip()
            if not prefix:
                raise ValueError("prefix must name at least the program")
            server = req.prefix.split(".", 1)[0]
            if req.kind == "mcp" and prefix not in (req.prefix, server):
                raise ValueError(f"an MCP request's prefix is its tool ({req.prefix!r}) or its server ({server!r})")
            req.prefix = prefix
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
        req = self._new("command", command, str(reason)[:2000], prefix_of(command))
        decision, by = await self._wait(req, {})
        if decision == "always":
            self.rules.append(req.prefix.split())
        if decision == "deny":
            self._decided(req, decision, by)
            return {"approved": False, "reason": self._why(by, req)}
        result = await self._run(command)
        self._decided(req, decision, by, result["exit_code"])
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

    def _new(self, kind: Kind, summary: str, reason: str, prefix: str) -> Request:
        return Request(f"a-{secrets.token_hex(4)}", kind, summary, reason, prefix,
                       asyncio.get_running_loop().create_future())

    async def _wait(self, req: Request, mcp: dict[str, Any]) -> tuple[Decision, str]:
        """Record and announce `req`, and wait for its decision (an interrupted cell: denied, `cancelled`)."""
        self._record(req, "requested")
        self.sinks.emit(ev.ApprovalRequested(turn_id=self.sinks.turn_id(), request_id=req.id, kind=req.kind,
                                             summary=req.summary, reason=req.reason, prefix=req.prefix,
                                             cell_id=self.cell_id(), **mcp))
        self.pending[req.id] = req
        try:
            return await self._decision(req)
        except asyncio.CancelledError:  # the cell was interrupted: nothing runs
            self._decided(req, "deny", "cancelled")
            raise
        finally:
            self.pending.pop(req.id, None)

    async def _decision(self, req: Request) -> tuple[Decision, str]:
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
        if req.kind == "mcp":
            return req.prefix in self.tools or req.prefix.split(".", 1)[0] in self.tools
        if CHAINS & set(req.summary):
            return False
        try:
            words = shlex.split(req.summary)
        except ValueError:
            return False
        return any(words[: len(rule)] == rule for rule in self.rules)

    async def _run(self, command: str) -> dict[str, Any]:
        """Outside the sandbox, in the workspace, as the user: the command's exit code and output."""
        proc = await asyncio.create_subprocess_shell(
            command, cwd=self.cwd, env=dict(os.environ), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout())
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise
        return {"exit_code": proc.returncode, "stdout": _text(out), "stderr": _text(err)}

    def _record(self, req: Request, status: str, by: str | None = None, exit_code: int | None = None) -> None:
        self.sinks.record(ApprovalRecord(turn_id=self.sinks.turn_id(), request_id=req.id, request_kind=req.kind,
                                         summary=req.summary, status=status, by=by, reason=req.reason,
                                         exit_code=exit_code))

    def _decided(self, req: Request, decision: Decision, by: str, exit_code: int | None = None) -> None:
        self._record(req, decision, by, exit_code)
        self.sinks.emit(ev.ApprovalDecided(turn_id=self.sinks.turn_id(), request_id=req.id, kind=req.kind,
                                           decision=decision, by=by, exit_code=exit_code))  # type: ignore[arg-type]


def _text(data: bytes) -> str:
    text = data.decode(errors="replace")
    if len(text) <= OUTPUT_LIMIT:
        return text
    half = OUTPUT_LIMIT // 2
    return f"{text[:half]}\n[... {len(text) - OUTPUT_LIMIT:,} characters cut ...]\n{text[-half:]}"
