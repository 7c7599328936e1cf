"""Approvals: what needs the user's say first. A command the sandbox denied may run outside it
(`kind: command`), and an MCP server under policy `ask` is called (`kind: mcp`), once the user says so.

The kernel asks with `await request_permission(command, reason)`, or calls a tool of such a server;
the request is an event (`approval.requested`) and a record in the trajectory, and waits for a
decision: `approve` (this once), `always` (for the rest of the session: see `rule_of`; every call
of the same MCP tool, or with the server as the prefix, of any of its tools), `deny`. The daemon
decides through POST /v1/sessions/{id}/approvals/{request_id}, `prime-agent run` at the terminal
(`ask`); `sandbox.approval = "never"` denies at once, and so does a session nobody can answer; an
`ask` that cannot reach its person (`NoTerminal`) denies too, recorded as nobody's decision. An
approved command runs in the workspace with the user's rights, outside the sandbox, but with the
kernel's environment (secret-looking variables dropped, `sandbox.env_deny`) unless the person asked
for their full one (`full_env`, that decision only); its output goes back to the cell that asked.
A `.git` at the workspace's or the project's root that was absent when the session began (the
agent made it: git run there runs its config's commands and hooks) is named on every request, and
no rule approves a command while one is there. A denied MCP call reaches the model as McpError. A
subagent's requests go to its parent's approvals (up to the session a person decides in), named in
their reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import re
import secrets
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agent import events as ev
from agent.config import marks, project_root
from agent.config_models import SandboxConfig
from agent.context import Sinks
from agent.kernel.sandbox import kernel_env
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


INTERPRETERS = ("python*", "pypy*", "ipython*", "sh", "bash", "zsh", "fish", "dash", "ksh", "mksh", "csh", "tcsh",
                "node", "nodejs", "bun", "ruby", "irb", "perl", "php", "lua*", "tclsh", "rscript", "osascript",
                "pwsh", "powershell", "awk", "gawk", "mawk", "nawk", "sed", "julia", "java", "groovy", "elixir")
"""Programs whose next word is the program they run (a script, `-m module`; `-c code` and any other
option: no rule). Shell globs, matched on the command's base name."""
LAUNCHERS = ("env", "xargs", "sudo", "doas", "su", "runuser", "pkexec", "exec", "nohup", "timeout", "nice", "ionice",
             "chrt", "taskset", "stdbuf", "unbuffer", "time", "command", "builtin", "eval", "source", ".", "setsid",
             "setpriv", "flock", "chroot", "unshare", "nsenter", "firejail", "bwrap", "strace", "ltrace", "gdb",
             "valgrind", "perf", "watch", "script", "parallel", "find", "ssh", "busybox", "tmux", "screen",
             "systemd-run", "dbus-run-session", "caffeinate")
"""Programs that run another command named somewhere in their arguments: no rule covers them."""
RUNNERS = ("npx", "uvx", "bunx", "pnpx")
"""Programs whose next word is a program they fetch or find and run: the rule names that program too."""
RUN_WORDS = {"run", "run-script", "exec", "x", "dlx", "eval"}
"""Subcommands that run a program or script named next (`npm run build`, `uv run pytest`): the rule names it."""
SUBCOMMANDS = {"git", "docker", "podman", "kubectl", "helm", "npm", "pnpm", "yarn", "bun", "deno", "cargo", "go",
               "rustup", "pip", "pip3", "uv", "poetry", "pdm", "hatch", "rye", "conda", "mamba", "gh", "glab",
               "systemctl", "apt", "apt-get", "dnf", "yum", "brew", "nix", "terraform", "aws", "gcloud", "az",
               "dotnet", "pipx"}
"""Programs whose first word is a subcommand: an option before it (`git -c core.fsmonitor=... status`)
leaves no rule, as the rule would stop before the subcommand."""
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _is(word: str, names: tuple[str, ...]) -> bool:
    base = os.path.basename(word).lower()
    return any(fnmatch.fnmatchcase(base, n) for n in names)


def _what_runs(words: list[str]) -> list[str] | None:
    """The words naming what `words` (a program and its arguments) runs, or None where no rule can say."""
    if not words:
        return None
    program, args = words[0], words[1:]
    name = os.path.basename(program)
    if _is(program, LAUNCHERS):
        return None
    if _is(program, INTERPRETERS):
        if args[:1] == ["-m"] and name.lower().startswith(("python", "pypy")):
            module = _what_runs(args[1:])
            return [program, "-m", *module] if module else None
        return [program, args[0]] if args and not args[0].startswith("-") else None
    if _is(program, RUNNERS):  # npx prettier
        head, rest = [program], args
    elif args and args[0] in RUN_WORDS:  # npm run build, uv run pytest
        head, rest = [program, args[0]], args[1:]
    elif args and args[0][:1].isalpha():  # git push
        return [program, args[0]]
    else:  # ls -la; but never git without its subcommand
        return None if name in SUBCOMMANDS else [program]
    if not rest or rest[0].startswith("-"):
        return None
    runs = _what_runs(rest)
    return head + runs if runs else None


def rule_of(words: list[str]) -> list[str] | None:
    """What `always` approves for a command (as words): the program and what it runs, its subcommand
    when it has one (`git push`), the script or module an interpreter runs (`python3 -m pytest`, never
    `python3`), the script a package manager runs (`npm run build`). A later command is approved by
    the rule when it starts with these words and its own rule is no longer (`git push --force` is a
    `git push`; `python3 evil.py` is not a `python3 -m pytest`). None: `always` is not offered (a
    launcher such as `sudo`, `env` or `xargs`; an interpreter given code or options; an option
    before a subcommand). Leading `NAME=value` assignments belong to the rule."""
    i = 0
    while i < len(words) and ASSIGNMENT.match(words[i]):
        i += 1
    runs = _what_runs(words[i:])
    if runs is None or _is(runs[-1], INTERPRETERS + LAUNCHERS + RUNNERS):
        return None  # a rule never ends in a program that runs whatever follows it
    return words[:i] + runs


def _words(command: str) -> list[str] | None:
    try:
        return shlex.split(command)
    except ValueError:
        return None


def prefix_of(command: str) -> str | None:
    """The words `always` approves for `command`, as the request shows them (None: not offered)."""
    if CHAINS & set(command):
        return None
    words = _words(command)
    rule = rule_of(words) if words else None
    return shlex.join(rule) if rule else None


def covers(rule: list[str], command: str) -> bool:
    """Whether an `always` rule approves `command`: one command (no chain), starting with the rule's
    words, whose own rule the rule reaches."""
    if CHAINS & set(command):
        return False
    words = _words(command)
    own = rule_of(words) if words else None
    return own is not None and words[: len(rule)] == rule and len(own) <= len(rule)


@dataclass
class Request:
    id: str
    kind: Kind
    summary: str
    """The command line, or the MCP call as `server.tool(arguments)`."""
    reason: str
    prefix: str | None
    """What `always` approves: the command's first words (None: `always` is not offered), or `server.tool`."""
    decided: asyncio.Future[tuple[Decision, str]]
    notes: list[str] = field(default_factory=list)
    """What the person should know before deciding (a `.git` the agent made)."""
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
                 cell_id: Callable[[], str | None] = lambda: None, parent: tuple[Approvals, str] | None = None,
                 hook: Callable[[Request], Awaitable[Decision | None]] | None = None, ask: Ask | None = None,
                 can_ask: bool = False):
        """`timeout()`: seconds an approved command may run (the kernel's cell timeout); `cell_id()`:
        the cell running now; `parent`: a subagent's (its parent's approvals, its name), where its
        requests go to be decided, recorded and run, as the parent's own are, named in their reason;
        `hook`: the person's PermissionRequest hooks, which may decide before anyone is asked; `ask`: a
        front end's own way of asking (the terminal's); `can_ask`: someone decides pending requests
        through `decide` (the daemon's API)."""
        self.config, self.cwd, self.sinks, self.timeout, self.cell_id = config, cwd, sinks, timeout, cell_id
        self.parent, self.hook = parent, hook
        self.pending: dict[str, Request] = {}
        self.rules: list[list[str]] = []
        """Command prefixes approved with `always`, as words."""
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
        fit, or `always` where it is not offered). `prefix` narrows what `always` approves (default:
        the request's; an MCP request's may widen to its server); `full_env`: run this command with
        the person's whole environment, secrets included (this once; a rule's commands never are)."""
        req = self.pending.get(request_id)
        if req is None or req.decided.done():
            raise KeyError(f"no approval request {request_id!r} waits for a decision in this session")
        if prefix is not None:
            req.prefix = _fitted(req, prefix.strip())
        if decision == "always" and req.prefix is None:
            raise ValueError(f"`always` is not offered for `{req.summary}`: no rule could say what it covers (a "
                             "launcher, an interpreter given code or options, or a chain of commands); approve it once")
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
        req = self._new("command", command, str(reason)[:2000], prefix_of(command))
        req.notes = self._notes()
        decision, by = await self._wait(req, {})
        if decision == "always" and req.prefix is None:  # a front end's own `ask` answered so
            decision = "approve"
        if decision == "always" and by == "user":
            self.rules.append(shlex.split(req.prefix or ""))
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

    def _notes(self) -> list[str]:
        """What a command's request tells the person: each repository the agent made this session."""
        return [f"{p} was made in this session (it was not there when the session began): "
                "git run here runs the commands its config names (core.fsmonitor, hooks, filters) as you"
                for p in self.repositories if (os.path.islink(p) or marks(p)) and str(p) not in self.git_at_start]

    def _new(self, kind: Kind, summary: str, reason: str, prefix: str | None) -> Request:
        return Request(f"a-{secrets.token_hex(4)}", kind, summary, reason, prefix,
                       asyncio.get_running_loop().create_future())

    async def _wait(self, req: Request, mcp: dict[str, Any]) -> tuple[Decision, str]:
        """Record and announce `req`, and wait for its decision (an interrupted cell: denied, `cancelled`)."""
        self._record(req, "requested")
        self.sinks.emit(ev.ApprovalRequested(turn_id=self.sinks.turn_id(), request_id=req.id, kind=req.kind,
                                             summary=req.summary, reason=req.reason, prefix=req.prefix,
                                             notes=req.notes, cell_id=self.cell_id(), **mcp))
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
        if not req.notes and self._ruled(req):  # what a note says, a person reads first
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
        return any(covers(rule, req.summary) for rule in self.rules)

    async def _run(self, command: str, full_env: bool) -> dict[str, Any]:
        """Outside the sandbox, in the workspace, as the user, with the kernel's environment (or, when
        the person asked, the whole of this process's): the command's exit code and output."""
        env = dict(os.environ) if full_env else kernel_env(os.environ, self.config)
        proc = await asyncio.create_subprocess_shell(
            command, cwd=self.cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
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


def _fitted(req: Request, prefix: str) -> str:
    """The prefix a person gave for `always`, checked: an MCP request's is its tool or its server; a
    command's starts the command and reaches at least the request's own rule (it may only narrow)."""
    if req.kind == "mcp":
        tool = req.summary.split("(", 1)[0]
        server = tool.split(".", 1)[0]
        if prefix not in (tool, server):
            raise ValueError(f"an MCP request's prefix is its tool ({tool!r}) or its server ({server!r})")
        return prefix
    words, command = _words(prefix), _words(req.summary) or []
    if not words:
        raise ValueError("prefix must name at least the program")
    if command[: len(words)] != words:
        raise ValueError(f"the prefix must be how the command starts: {shlex.join(words)!r} does not start "
                         f"{req.summary!r}")
    if req.prefix is None or len(words) < len(_words(req.prefix) or []):
        raise ValueError(f"`always` covers at least {req.prefix!r}: a shorter prefix would approve other programs "
                         "than this one" if req.prefix else f"`always` is not offered for {req.summary!r}")
    return shlex.join(words)


def _text(data: bytes) -> str:
    text = data.decode(errors="replace")
    if len(text) <= OUTPUT_LIMIT:
        return text
    half = OUTPUT_LIMIT // 2
    return f"{text[:half]}\n[... {len(text) - OUTPUT_LIMIT:,} characters cut ...]\n{text[-half:]}"
