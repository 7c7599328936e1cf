"""MCP servers for a session: the client side of the Model Context Protocol, in the session host.

Code in the kernel calls a server's tools through the host bridge (`await mcp.call(server, tool,
**arguments)`, see agent/kernel/runtime/mcp.py); the client (the official `mcp` SDK) lives here, so a
server's credentials (its `env`, its `headers`) never enter the kernel.

Each configured server starts lazily, at its first use, and stays up for the session: its
initialisation and tool listing are done once. A stdio server runs in a process tree of its own
(agent/kernel/reaper.py), killed when the session closes and reaped by the next daemon when the host
was killed outright. A server that crashes fails the call it was serving and is started again by
the next one; one that crashes again before any call succeeded is reported as failed, not restarted.

Every listing is also kept on disk (`$PRIME_AGENT_HOME/mcp/tools/`), so the system prompt can name
a server's tools without starting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from agent import hostrun
from agent.config import home, project_root
from agent.config_models import McpConfig, McpServerConfig
from agent.hostrun import Host
from agent.kernel.reaper import ENV_MARKER, ProcessTree, stat

log = logging.getLogger(__name__)

State = Literal["stopped", "starting", "ready", "crashed", "failed"]
STOP_WAIT = 8.0
"""Seconds a server gets to stop (the SDK closes stdin, then SIGTERM, then SIGKILL) before its tree is killed."""
LOG_TAIL = 5


class McpError(Exception):
    """A server, tool or call failed; the message names which and why."""


class ToolInfo(BaseModel):
    name: str
    description: str = ""
    input_schema: dict[str, Any] = {}


class ServerInfo(BaseModel):
    """A server as `mcp.list()`, `prime-agent mcp list` and the API show it."""

    name: str
    transport: str
    policy: str
    state: State
    tools: list[ToolInfo] | None = None
    """None until the server was started (or listed before, in the cache)."""
    error: str | None = None
    pid: int | None = None
    restarts: int = 0

    def lines(self) -> list[str]:
        """The server, then a line per tool, as `prime-agent mcp list` and the app's /mcp show them."""
        tools = "?" if self.tools is None else str(len(self.tools))
        out = [f"{self.name}  {self.transport}  policy {self.policy}  {self.state}  {tools} tools"
               + (f"  ({self.error})" if self.error else "")]
        for t in self.tools or []:
            first = (t.description.strip().splitlines() or [""])[0]
            out.append(f"    {t.name}" + (f": {first[:100]}" if first else ""))
        return out


def expand(text: str, environ: Mapping[str, str], where: str) -> str:
    """`${VAR}` and `${VAR:-default}` from `environ`; a variable that is unset without a default is an error."""
    try:
        return hostrun.expand(text, environ)
    except KeyError as e:
        raise McpError(f"{where}: ${{{e.args[0]}}} is not set in the environment (write ${{{e.args[0]}:-default}} "
                       "for a default)") from None


def cache_path(name: str, config: McpServerConfig) -> Path:
    """Where a server's last tool listing is kept, by name and (unexpanded) configuration."""
    digest = hashlib.sha256(config.model_dump_json(include={"type", "command", "args", "url", "cwd"}).encode())
    return home() / "mcp" / "tools" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest.hexdigest()[:12]}.json"


def cached_tools(name: str, config: McpServerConfig) -> list[ToolInfo] | None:
    try:
        return [ToolInfo.model_validate(t) for t in json.loads(cache_path(name, config).read_text())["tools"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _root_cause(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _describe(e: BaseException) -> str:
    e = _root_cause(e)
    text = str(e) or type(e).__name__
    return text if type(e).__name__ in ("MCPError", "McpError") else f"{type(e).__name__}: {text}"


class Server:
    """One configured server, started at its first use."""

    def __init__(self, name: str, config: McpServerConfig, host: Host, log_dir: Path):
        self.name = name
        self.config = config
        self.host = host
        self.log_path = log_dir / f"mcp-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.log"
        self.state: State = "stopped"
        self.error: str | None = None
        self.tools: list[ToolInfo] | None = None
        self.pid: int | None = None
        self.restarts = 0
        self._crashes = 0
        """Crashes since the last call that succeeded."""
        self._client: Any = None
        self._owner: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._tree: ProcessTree | None = None
        self._starting = asyncio.Lock()

    def info(self) -> ServerInfo:
        tools = self.tools if self.tools is not None else cached_tools(self.name, self.config)
        return ServerInfo(name=self.name, transport=self.config.type or "stdio", policy=self.config.policy,
                          state=self.state, tools=tools, error=self.error, pid=self.pid, restarts=self.restarts)

    # --- lifecycle ---------------------------------------------------------------------------

    async def client(self) -> Any:
        """The connected client, starting the server if it is not running."""
        async with self._starting:
            if self.state == "ready" and not self._alive():  # it died between two calls
                await self.stop()
                self._crashes += 1
                if self._crashes > 1:
                    self._failed("crashed again after it was restarted, so it is not restarted again"
                                 f"{self._log_tail()}")
                self.state = "crashed"
            if self.state == "ready":
                return self._client
            if self.state == "failed":
                raise McpError(f"MCP server {self.name!r} failed and is not restarted in this session: {self.error}")
            if self.state == "crashed":
                self.restarts += 1
            await self._start()
            return self._client

    def _alive(self) -> bool:
        """Whether the connection's process lives (a stdio server's; an HTTP one is asked, not watched)."""
        s = stat(self.pid) if self.pid is not None else None
        return self.pid is None or (s is not None and s.state not in "ZX")

    async def _start(self) -> None:
        self.state, self.error = "starting", None
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.ensure_future(self._own(ready))
        try:
            async with asyncio.timeout(self.config.startup_timeout):
                self._client, self.tools = await asyncio.shield(ready)
        except TimeoutError:
            await self.stop()
            self._failed(f"did not start and list its tools within {self.config.startup_timeout:g} s "
                         f"(mcp.servers.{self.name}.startup_timeout){self._log_tail()}")
        except asyncio.CancelledError:  # the caller went away: a start half done is not left running
            await self.stop()
            self.state = "stopped"
            raise
        except Exception as e:
            await self.stop()
            self._failed(f"could not start: {_describe(e)}{self._log_tail()}")
        self.state = "ready"
        self._save_listing()

    def _failed(self, why: str) -> None:
        self.state, self.error = "failed", why
        raise McpError(f"MCP server {self.name!r} {why}")

    async def _own(self, ready: asyncio.Future) -> None:
        """The task that holds the connection (the SDK's transports are entered and left in one task)."""
        from mcp import Client

        assert self._stop is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await self._transport(stack)
                client = await stack.enter_async_context(Client(transport, client_info=_client_info()))
                if self._tree is not None:
                    self.pid = self._tree.adopt_child()
                tools = await _list_tools(client)
                ready.set_result((client, tools))
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else McpError("the start was cancelled"))
            elif not isinstance(e, asyncio.CancelledError):
                log.warning("MCP server %s: its connection ended with %s", self.name, _describe(e))
            if not isinstance(e, Exception):
                raise
        finally:
            self._client = None
            if self._tree is not None:
                await self._tree.kill()
                self._tree = None
            self.pid = None

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        c, env = self.config, os.environ
        where = f"mcp.servers.{self.name}"
        if c.type == "stdio":
            from mcp import StdioServerParameters

            assert c.command is not None
            # A neutral folder, unless the person's config names one (relative paths are read there).
            host = self.host.within(expand(c.cwd, env, f"{where}.cwd") if c.cwd else None)
            words = [expand(c.command, env, f"{where}.command"), *(expand(a, env, f"{where}.args") for a in c.args)]
            try:  # the project files it runs, as the copies of what a person trusted
                argv = await asyncio.to_thread(host.argv, words, f"run by MCP server {self.name!r}")
            except hostrun.Untrusted as e:
                raise McpError(str(e)) from None
            self._tree = ProcessTree()
            outer = {ENV_MARKER: env[ENV_MARKER]} if ENV_MARKER in env else {}
            search = host.env({"PATH": env["PATH"]} if "PATH" in env else {})
            server_env = self._tree.env({**outer, **search,
                                         **{k: expand(v, env, f"{where}.env.{k}") for k, v in c.env.items()}})
            self._tree.prepare()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            errlog = stack.enter_context(open(self.log_path, "a", encoding="utf-8", errors="replace"))
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(command=argv[0], args=argv[1:], env=server_env,
                                           cwd=str(host.base if c.cwd else host.cwd))
            return stdio_client(params, errlog=errlog)
        import httpx2 as httpx

        assert c.url is not None
        url = expand(c.url, env, f"{where}.url")
        headers = {k: expand(v, env, f"{where}.headers.{k}") for k, v in c.headers.items()}
        if c.type == "sse":
            from mcp.client.sse import sse_client

            return sse_client(url, headers=headers)
        from mcp.client.streamable_http import streamable_http_client

        http = await stack.enter_async_context(httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300)))
        return streamable_http_client(url, http_client=http)

    async def stop(self) -> None:
        """Close the connection and stop the server; whatever it started is killed."""
        owner, self._owner = self._owner, None
        if owner is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), STOP_WAIT)
        except (TimeoutError, asyncio.CancelledError):
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
        except Exception:
            pass  # reported by the owner
        if self.state in ("ready", "starting"):
            self.state = "stopped"

    def _save_listing(self) -> None:
        path = cache_path(self.name, self.config)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"server": self.name, "listed": time.time(),
                                       "tools": [t.model_dump() for t in self.tools or []]}))
            tmp.replace(path)
        except OSError as e:
            log.warning("MCP tool listing of %s not cached (%s)", self.name, e)

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL:]
        except OSError:
            return ""
        return ("; its last output:\n" + "\n".join(lines)) if lines else ""

    # --- requests ----------------------------------------------------------------------------

    async def request(self, what: str, send: Callable[[Any], Awaitable[Any]]) -> Any:
        """`send(client)` with the server's timeout; a crash, a timeout and a protocol error are McpErrors."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        client = await self.client()
        try:
            async with asyncio.timeout(self.config.timeout):
                result = await send(client)
        except TimeoutError:
            raise McpError(f"{what}: no answer within {self.config.timeout:g} s (mcp.servers.{self.name}.timeout); "
                           "the request was cancelled") from None
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:
                await self._crashed()
            raise McpError(f"{what}: {e.message}") from None
        except (ConnectionError, OSError) as e:
            await self._crashed()
            raise McpError(f"{what}: {_describe(e)}") from None
        self._crashes = 0
        return result

    async def _crashed(self) -> None:
        tail = self._log_tail()
        await self.stop()
        self._crashes += 1
        if self._crashes > 1:
            self._failed(f"crashed again after it was restarted, so it is not restarted again{tail}")
        self.state, self.error = "crashed", f"the server crashed{tail}"
        raise McpError(f"MCP server {self.name!r} crashed during the call{tail}\n(it is started again at the next call)")


async def _list_tools(client: Any) -> list[ToolInfo]:
    tools: list[ToolInfo] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += [ToolInfo(name=t.name, description=t.description or "", input_schema=t.input_schema or {})
                  for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            return tools


def _find(server: str, tool: str, tools: list[ToolInfo]) -> ToolInfo:
    found = next((t for t in tools if t.name == tool), None)
    if found is None:
        names = ", ".join(sorted(t.name for t in tools)) or "none"
        raise McpError(f"MCP server {server!r} has no tool {tool!r}; its tools: {names}")
    return found


def _client_info() -> Any:
    from mcp.types import Implementation

    return Implementation(name="prime-agent", version="0.1.0")


# --- results as the kernel gets them -------------------------------------------------------------


def content_item(c: Any) -> dict[str, Any]:
    """One content block of a result, as JSON: text, binary data (base64) or a link."""
    kind = c.type
    if kind == "text":
        return {"type": "text", "text": c.text}
    if kind in ("image", "audio"):
        return {"type": kind, "mime": c.mime_type, "data": c.data}
    if kind == "resource":
        return resource_item(c.resource)
    if kind == "resource_link":
        return {"type": "link", "uri": str(c.uri), "name": c.name, "description": c.description,
                "mime": c.mime_type}
    return {"type": kind, "data": c.model_dump(mode="json", by_alias=True)}


def resource_item(r: Any) -> dict[str, Any]:
    item = {"type": "resource", "uri": str(r.uri), "mime": r.mime_type}
    return {**item, "text": r.text} if hasattr(r, "text") else {**item, "blob": r.blob}


def summary(value: Any, limit: int = 2000) -> Any:
    """What a trajectory keeps of a result: binary data as its size, long text cut."""
    if isinstance(value, dict):
        key = "blob" if "blob" in value else "data" if value.get("type") in ("image", "audio") else None
        if key is not None and isinstance(value[key], str):
            return {**value, key: f"<{len(value[key]) * 3 // 4:,} bytes>"}
        return {k: summary(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [summary(v, limit) for v in value]
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"... [{len(value) - limit:,} characters more]"
    return value


# --- the session's servers -----------------------------------------------------------------------


class McpServers:
    """A session's configured servers, for the bridge handlers (agent/session.py wires policy and records)."""

    def __init__(self, config: McpConfig, cwd: Path, log_dir: Path):
        self.config = config
        host = Host(home(), project_root(cwd), cwd.resolve())
        self.servers = {name: Server(name, c, host, log_dir) for name, c in sorted(config.servers.items())}

    def __bool__(self) -> bool:
        return bool(self.servers)

    def server(self, name: str) -> Server:
        try:
            return self.servers[name]
        except KeyError:
            known = ", ".join(self.servers) or "none (add one: `prime-agent mcp add NAME -- COMMAND ARGS...`)"
            raise McpError(f"no MCP server {name!r}; configured: {known}") from None

    async def tool(self, server: str, tool: str) -> ToolInfo:
        """The tool's listing, starting its server; an unknown one is an error naming what exists."""
        s = self.server(server)
        await s.client()
        return _find(server, tool, s.tools or [])

    def known_tool(self, server: str, tool: str) -> None:
        """Refuse a tool the server's listing lacks, starting nothing: the live listing, else the last
        one cached; a server never listed refuses nothing (its start will tell)."""
        tools = self.server(server).info().tools
        if tools is not None:
            _find(server, tool, tools)

    async def call(self, server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool; its result as JSON (`structured`, `content`), or McpError with the server's message."""
        await self.tool(server, tool)
        result = await self.server(server).request(
            f"{server}.{tool}", lambda client: client.call_tool(tool, arguments, read_timeout_seconds=None))
        content = [content_item(c) for c in result.content]
        if result.is_error:
            text = "\n".join(c["text"] for c in content if c["type"] == "text") or "the tool reported an error"
            raise McpError(f"{server}.{tool}: {text}")
        return {"structured": result.structured_content, "content": content}

    async def read(self, server: str, uri: str) -> list[dict[str, Any]]:
        result = await self.server(server).request(f"{server}: reading {uri}", lambda c: c.read_resource(uri))
        return [resource_item(r) for r in result.contents]

    async def list(self, server: str | None = None, *, by_person: bool = True) -> list[ServerInfo]:
        """Every server (or one) with its tools, starting those not started; a failure is in its `error`.
        A person's listing (the command line, the app) starts every server; the kernel's
        (`by_person=False`) only those under policy `allow`: one under `ask` starts at its first call
        a person approved, one under `deny` never."""
        chosen = [self.server(server)] if server is not None else list(self.servers.values())

        async def started(s: Server) -> None:
            if not by_person and s.config.policy != "allow":
                return
            with contextlib.suppress(McpError):
                await s.client()

        await asyncio.gather(*(started(s) for s in chosen))
        return [s.info() for s in chosen]

    def infos(self) -> list[ServerInfo]:
        """Every server as it is now, starting none (tools from the cache when not started)."""
        return [s.info() for s in self.servers.values()]

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers.values()))


def prompt_section(servers: list[ServerInfo], budget: int) -> str:
    """The system prompt's list of servers and tool names with one-line descriptions: sorted, and
    the same for the same servers and listings, so a provider's prompt cache keeps hitting. Every
    server is named; the tools share what `budget` (characters) leaves, equally, a server's unused
    share going to the next; the tools left out are counted."""
    if not servers:
        return ""
    lines = ["# MCP servers",
             "Call their tools from code: `await mcp.SERVER.TOOL(**arguments)` (or `await mcp.call(server, tool, "
             "**arguments)`); `help(mcp.SERVER.TOOL)` shows a tool's arguments, `mcp.list()` every schema, "
             "`await mcp.read(server, uri)` reads a resource. A result is a Python value; a failure raises `McpError`."]
    blocks = []
    for s in sorted(servers, key=lambda s: s.name):
        head = f"- {s.name} ({s.transport}{', each call needs approval' if s.policy == 'ask' else ''})"
        if s.policy == "deny":
            head += ": calls are denied by policy"
        elif s.tools is None and s.policy == "ask":
            head += ": tools not listed yet (its first approved call starts it)"
        elif s.tools is None:
            head += f': tools not listed yet (`mcp.list("{s.name}")` starts it)'
        tools = [] if s.policy == "deny" else sorted(s.tools or [], key=lambda t: t.name)
        blocks.append((s.name, head, [_tool_line(t) for t in tools]))
    room = budget - sum(len(line) + 1 for line in lines) - sum(len(head) + 1 for _, head, _ in blocks)
    with_tools = [b for b in blocks if b[2]]
    for name, head, tools in blocks:
        lines.append(head)
        if not tools:
            continue
        share = room // len(with_tools)
        with_tools.pop(0)
        used, taken = 0, 0
        more = f'  - ... {len(tools)} more: `mcp.list("{name}")`'
        for i, line in enumerate(tools):
            rest = len(more) + 1 if i < len(tools) - 1 else 0  # room to say what is left out
            if used + len(line) + 1 + rest > share:
                break
            lines.append(line)
            used, taken = used + len(line) + 1, i + 1
        if taken < len(tools):
            lines.append(f'  - ... {len(tools) - taken} more: `mcp.list("{name}")`')
            used += len(lines[-1]) + 1
        room -= used
    return "\n".join(lines)


def _tool_line(t: ToolInfo) -> str:
    first = (t.description.strip().splitlines() or [""])[0]
    return f"  - {t.name}" + (f": {first[:117] + '...' if len(first) > 120 else first}" if first else "")
