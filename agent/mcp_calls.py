"""The kernel's MCP calls, as the session serves them over the host bridge (agent/mcp.py holds the
clients; agent/kernel/runtime/mcp.py is the kernel's side): each under its server's policy (allow,
ask, deny), and each recorded in the trajectory and shown as an event, once, whatever its outcome.

A failure of a server or a tool is a reply (`{"error"}`), raised in the kernel as McpError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent import events as ev
from agent.config import shorten
from agent.context import Sinks
from agent.mcp import McpError, McpServers, summary
from agent.trajectory import McpCallRecord
from agent.types import McpCall

Ask = Callable[[str, str, dict[str, Any], str], Awaitable[str | None]]
"""ask(server, tool, arguments, arguments as shown) -> None once a person approved, else why not
(agent.approvals.Approvals.mcp)."""


class McpCalls:
    """The bridge's `mcp.*` handlers for one session."""

    def __init__(self, mcp: McpServers, sinks: Sinks, cell_id: Callable[[], str | None], ask: Ask):
        self.mcp = mcp
        self.sinks = sinks
        self.cell_id = cell_id
        """The running cell (the call's), if any."""
        self.ask = ask

    def handlers(self) -> dict[str, Any]:
        return {"mcp.servers": self.servers, "mcp.list": self.tools, "mcp.call": self.call, "mcp.read": self.read}

    async def servers(self) -> list[str]:
        return list(self.mcp.servers)

    async def tools(self, server: str | None = None) -> dict:
        try:
            return {"result": [s.model_dump() for s in await self.mcp.list(server, by_person=False)]}
        except McpError as e:
            return {"error": str(e)}

    async def call(self, server: str, tool: str, arguments: dict | None = None) -> dict:
        arguments = arguments or {}
        return await self._use(server, tool, arguments, lambda: self.mcp.call(server, tool, arguments))

    async def read(self, server: str, uri: str) -> dict:
        return await self._use(server, f"read:{uri}", {}, lambda: self.mcp.read(server, uri))

    async def _use(self, server: str, tool: str, arguments: dict, run: Callable) -> dict:
        """Under the server's policy: run the call, and record it (and its result) in the trajectory."""
        started, cell_id, turn_id = time.monotonic(), self.cell_id(), self.sinks.turn_id()
        outcome, result, error = "error", None, None
        try:
            policy = self.mcp.server(server).config.policy
            if policy == "deny":
                outcome = "denied"
                raise McpError(f"calls to MCP server {server!r} are denied by its policy "
                               f'(mcp.servers.{server}.policy = "deny")')
            if policy == "ask":  # nothing starts before a person approved: a tool is checked as last listed
                if not tool.startswith("read:"):
                    self.mcp.known_tool(server, tool)
                denied = await self.ask(server, tool, arguments, _shown(arguments))
                if denied:
                    outcome = "denied"
                    raise McpError(f"the call {server}.{tool} was not approved: {denied}")
            elif not tool.startswith("read:"):
                await self.mcp.tool(server, tool)  # an unknown tool fails before anything runs
            result = await run()
            outcome = "ok"
            return {"result": result}
        except McpError as e:
            error = str(e)
            return {"error": error}
        except asyncio.CancelledError:
            outcome, error = "cancelled", "the cell was interrupted, or stopped waiting"
            raise
        finally:
            kept, duration = summary(result), time.monotonic() - started
            call = dict(McpCall(cell_id=cell_id, server=server, tool=tool, arguments=arguments, outcome=outcome,
                                result=kept, error=error, duration=duration))
            self.sinks.log(McpCallRecord(turn_id=turn_id, **call), ev.McpCalled(turn_id=turn_id, **call))


def _shown(arguments: dict) -> str:
    """A call's arguments as an approval request shows them."""
    return shorten(", ".join(f"{k}={v!r}" for k, v in arguments.items()), 300)
