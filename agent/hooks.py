"""Hooks: a person's own commands at the points of a turn, in Claude Code's shape, so hook scripts
written for it work unchanged.

A hooks file is `{"hooks": {EVENT: [{"matcher": REGEX?, "hooks": [{"type": "command", "command":
"...", "timeout": S?}]}]}}` (other top-level keys, as in a Claude Code settings.json, are ignored):
`$PRIME_AGENT_HOME/hooks.json` (the user's: runs) and `<project>/.prime-agent/hooks.json` (runs only
once a person trusted its exact content, agent/trust.py). A hook runs on the host with the person's
rights and environment, outside the kernel's sandbox (that is its point), but nothing of it is
resolved from the workspace (agent/hostrun.py): it starts in a neutral folder, with the project out
of its search paths, and a project file its command names runs as the copy a person trusted;
`$CLAUDE_PROJECT_DIR` and the input's `cwd` name the project. It gets the event as JSON on stdin,
and answers with its exit code: 0 goes on (the stdout of UserPromptSubmit and
SessionStart joins the model's context), 2 blocks (stderr is the reason: the cell does not run, the
prompt is refused, the turn goes on), any other is an error shown to the person that blocks nothing.
JSON on stdout decides finer: `decision: "block"` + `reason`, `continue: false` + `stopReason`, and
`hookSpecificOutput` with `permissionDecision` (allow, deny, ask), `permissionDecisionReason`,
`updatedInput` and `additionalContext`. Matching hooks run concurrently; one past its timeout
(default 60 s) is killed with its process group and reported, so a hook never hangs a turn.

The agent's one tool is `ipython` (`tool_input: {"code": ...}`); MCP calls are `mcp__SERVER__TOOL`
and subagent spawns `rlm`, so matchers written for other agents read naturally.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.hostrun import Host, Untrusted

HookEvent = Literal["SessionStart", "UserPromptSubmit", "PreToolUse", "PermissionRequest", "PostToolUse",
                    "PostToolUseFailure", "SubagentStart", "SubagentStop", "PreCompact", "Stop", "SessionEnd",
                    "Notification"]
EVENTS: tuple[str, ...] = HookEvent.__args__  # type: ignore[attr-defined]
OUTPUT_LIMIT = 64 * 1024
"""Characters of a hook's stdout and stderr kept (the head)."""


class HookSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["command", "http"] = "command"
    command: str | None = None
    """A shell command line (run with `sh -c` in a neutral folder): `$CLAUDE_PROJECT_DIR` names the project."""
    url: str | None = None
    """For `type: "http"`: the event is POSTed here as JSON; the response body is read as stdout."""
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(60.0, gt=0)
    """Seconds before the hook is killed (with its process group) and reported."""


class HookGroup(BaseModel):
    model_config = ConfigDict(extra="ignore")

    matcher: str | None = None
    """A regular expression the whole target must match (a tool's name, SessionStart's source,
    a notification's type); empty, absent or `*`: every one."""
    hooks: list[HookSpec]


class HooksFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    hooks: dict[HookEvent, list[HookGroup]] = Field(default_factory=dict)


class HooksError(Exception):
    """A hooks file that is not valid: the message names it."""


def read(path: Path, text: str) -> HooksFile:
    try:
        return HooksFile.model_validate_json(text)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        raise HooksError(f"{path}: not a hooks file ({problems})") from None


class HookRun(BaseModel):
    """One hook's run: what it was, what it said, what it decided (a trajectory record and an
    event carry it, agent/trajectory.py's HookRecord and events.HookRan)."""

    event: str
    source: str
    """user or project."""
    command: str
    """The command line, or an http hook's URL."""
    exit_code: int | None = None
    duration: float = 0.0
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    error: str | None = None
    """Why it could not run, or its non-blocking failure."""
    output: dict[str, Any] = Field(default_factory=dict)
    """Its stdout, when that was a JSON object."""

    @property
    def blocks(self) -> bool:
        return self.exit_code == 2 or self.output.get("decision") == "block"

    def line(self) -> str:
        """The run in a line, as the app and `prime-agent run` show it."""
        shown = self.command if len(self.command) <= 60 else self.command[:57] + "..."
        said = self.error or (self.stderr.strip().splitlines() or [""])[0][:120]
        how = "timed out" if self.timed_out else f"exit {self.exit_code}" if self.exit_code is not None else "not run"
        return (f"hook {self.event} ({self.source}): {shown}: {how}{', blocked' if self.blocks else ''} in "
                f"{self.duration:.2f}s" + (f": {said}" if said else ""))


class HookCall(BaseModel):
    """A hook's run and the cell it concerned, if one did: what `HookRecord` and `HookRan` carry."""

    cell_id: str | None = None
    run: HookRun


@dataclass
class Verdict:
    """What the hooks of one event decided, together."""

    runs: list[HookRun] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return any(r.blocks for r in self.runs) or self.permission == "deny"

    @property
    def reason(self) -> str:
        """Why it was blocked, denied or put to a person: the hooks' stderr and reasons, in order."""
        parts, winning = [], self.permission
        for r in self.runs:
            specific = _specific(r)
            for text in (r.stderr.strip() if r.exit_code == 2 else "", r.output.get("reason"),
                         specific.get("permissionDecisionReason")
                         if winning in ("deny", "ask") and specific.get("permissionDecision") == winning else None):
                if isinstance(text, str) and text.strip():
                    parts.append(text.strip())
        return "\n".join(parts) or "a hook blocked it"

    @property
    def permission(self) -> Literal["allow", "deny", "ask"] | None:
        """deny over ask over allow, as Claude Code orders them."""
        said = {_specific(r).get("permissionDecision") for r in self.runs}
        return next((d for d in ("deny", "ask", "allow") if d in said), None)  # type: ignore[return-value]

    @property
    def updated_input(self) -> dict[str, Any] | None:
        for r in self.runs:
            updated = _specific(r).get("updatedInput")
            if isinstance(updated, dict):
                return updated
        return None

    @property
    def context(self) -> str:
        """What the hooks add to the model's context: `additionalContext`, and plain stdout where
        the event takes it (UserPromptSubmit, SessionStart)."""
        parts = []
        for r in self.runs:
            added = _specific(r).get("additionalContext")
            if isinstance(added, str) and added.strip():
                parts.append(added.strip())
            elif not r.output and r.exit_code == 0 and r.event in ("UserPromptSubmit", "SessionStart") \
                    and r.stdout.strip():
                parts.append(r.stdout.strip())
        return "\n".join(parts)

    @property
    def stop(self) -> str | None:
        """`continue: false` from any hook: the turn ends, with this reason."""
        for r in self.runs:
            if r.output.get("continue") is False:
                return str(r.output.get("stopReason") or "a hook stopped the turn")
        return None


class Hooks:
    """The hooks in force for a session: the user's, and the project's when trusted."""

    def __init__(self, groups: dict[str, list[tuple[str, HookGroup]]], host: Host, env: dict[str, str] | None = None):
        self.groups, self.host, self.cwd = groups, host, host.base
        self.env = host.env({**(os.environ if env is None else env), "CLAUDE_PROJECT_DIR": str(self.cwd),
                             "PRIME_AGENT_PROJECT_DIR": str(self.cwd)})

    @classmethod
    def of(cls, files: list[tuple[str, HooksFile]], host: Host) -> Hooks:
        """The hooks of `files` (each with its source), run for the project `host` names."""
        groups: dict[str, list[tuple[str, HookGroup]]] = {}
        for source, f in files:
            for event, entries in f.hooks.items():
                groups.setdefault(event, []).extend((source, g) for g in entries)
        return cls(groups, host)

    def __bool__(self) -> bool:
        return any(self.groups.values())

    def matching(self, event: str, target: str | None) -> list[tuple[str, HookSpec]]:
        out = []
        for source, group in self.groups.get(event, []):
            m = group.matcher
            if m in (None, "", "*") or (target is not None and _fullmatch(m, target)):
                out.extend((source, spec) for spec in group.hooks)
        return out

    async def run(self, event: HookEvent, payload: dict[str, Any], target: str | None = None,
                  on_run: Callable[[HookRun], None] = lambda r: None) -> Verdict:
        """Every hook matching `event` (and `target`), concurrently; `payload` is the event's input
        less `hook_event_name` and `cwd`, which are added here."""
        specs = self.matching(event, target)
        if not specs:
            return Verdict()
        data = json.dumps({**payload, "hook_event_name": event, "cwd": str(self.cwd)}).encode()
        runs = await asyncio.gather(*(self._one(event, source, spec, data) for source, spec in specs))
        for r in runs:
            on_run(r)
        return Verdict(list(runs))

    async def _one(self, event: str, source: str, spec: HookSpec, data: bytes) -> HookRun:
        """One hook's run; whatever goes wrong is its error, never an exception for the turn."""
        try:
            return await self._run_one(event, source, spec, data)
        except Exception as e:  # a URL httpx refuses, a header it cannot encode, ...
            return HookRun(event=event, source=source, command=spec.command or spec.url or "",
                           error=f"{type(e).__name__}: {e}")

    async def _run_one(self, event: str, source: str, spec: HookSpec, data: bytes) -> HookRun:
        began = time.monotonic()
        if spec.type == "http":
            return await self._post(event, source, spec, data, began)
        if not spec.command:
            return HookRun(event=event, source=source, command="", error="a command hook without a command")
        run = HookRun(event=event, source=source, command=spec.command)
        try:  # the project files it runs, as the copies of what a person trusted
            command = await asyncio.to_thread(self.host.shell, spec.command, hook_what(event, source))
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=self.host.cwd, env=self.env, start_new_session=True)
        except Untrusted as e:
            run.error, run.duration = f"not run: {e}", time.monotonic() - began
            return run
        except OSError as e:
            run.error, run.duration = f"could not start: {e}", time.monotonic() - began
            return run
        try:
            out, err = await asyncio.wait_for(proc.communicate(data), spec.timeout)
            run.exit_code = proc.returncode
        except TimeoutError:
            run.timed_out = True
            run.error = f"killed after its {spec.timeout:g} s timeout"
            out, err = b"", b""
        finally:
            with contextlib.suppress(ProcessLookupError):  # it, and whatever it started in the background
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.returncode is None:
                await proc.wait()
        run.duration = time.monotonic() - began
        run.stdout = out.decode(errors="replace")[:OUTPUT_LIMIT]
        run.stderr = err.decode(errors="replace")[:OUTPUT_LIMIT]
        run.output = _json_object(run.stdout) if run.exit_code == 0 else {}
        if run.exit_code not in (0, 2, None):
            run.error = f"exited {run.exit_code}" + (f": {run.stderr.strip()[:500]}" if run.stderr.strip() else "")
        return run

    async def _post(self, event: str, source: str, spec: HookSpec, data: bytes, began: float) -> HookRun:
        run = HookRun(event=event, source=source, command=spec.url or "")
        try:
            async with httpx2.AsyncClient(timeout=spec.timeout) as http:
                r = await http.post(spec.url or "", content=data,
                                    headers={"content-type": "application/json", **spec.headers})
            run.stdout = r.text[:OUTPUT_LIMIT]
            run.exit_code = 0 if r.is_success else 1
            run.output = _json_object(run.stdout) if r.is_success else {}
            if not r.is_success:
                run.error = f"HTTP {r.status_code}"
        except httpx2.TimeoutException:
            run.timed_out, run.error = True, f"no answer within its {spec.timeout:g} s timeout"
        except httpx2.HTTPError as e:
            run.error = f"{type(e).__name__}: {e}"
        run.duration = time.monotonic() - began
        return run


def hook_what(event: str, source: str) -> str:
    """A hook as a file it runs names it (agent/trust.py's `what`)."""
    return f"run by a {event} hook ({source})"


def _specific(run: HookRun) -> dict[str, Any]:
    """A run's `hookSpecificOutput`, when it is an object (anything else a hook printed decides nothing)."""
    specific = run.output.get("hookSpecificOutput")
    return specific if isinstance(specific, dict) else {}


def _fullmatch(pattern: str, target: str) -> bool:
    try:
        return re.fullmatch(pattern, target) is not None
    except re.error:
        return pattern == target


def _json_object(text: str) -> dict[str, Any]:
    text = text.strip()
    if not text.startswith("{"):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Runner:
    """A session's hooks: the input fields every event carries (`common()`: session_id,
    transcript_path, permission_mode) and where each run is reported (`report(run, cell_id)`)."""

    def __init__(self, hooks: Hooks, common: Callable[[], dict[str, Any]],
                 report: Callable[[HookRun, str | None], None]):
        self.hooks, self.common, self.report = hooks, common, report

    def __bool__(self) -> bool:
        return bool(self.hooks)

    async def __call__(self, event: HookEvent, payload: dict[str, Any], target: str | None = None,
                       cell_id: str | None = None) -> Verdict:
        if not self.hooks:
            return Verdict()
        return await self.hooks.run(event, {**self.common(), **payload}, target,
                                    on_run=lambda run: self.report(run, cell_id))


NO_HOOKS = Runner(Hooks({}, Host(Path("."), Path("."), Path("."))), dict, lambda run, cell_id: None)
"""For a loop built without a session's hooks (tests, evals)."""
