"""`mcp` in the kernel: the tools of the session's MCP servers as awaitable Python functions.

    now = await mcp.time.get_current_time(timezone="Europe/Paris")     # a dict
    total = await mcp.call("everything", "get-sum", a=1, b=2)          # the same, by name
    help(mcp.time.get_current_time)                                   # description and schema
    mcp.list()                                                        # every server, tool and schema
    text = await mcp.read("everything", "demo://resource/static/document/architecture.md")

The servers run in the session host (agent/mcp.py); a call goes through the host bridge, so an
interrupt or a timeout of the cell (`asyncio.wait_for` too) cancels it there.
"""

from __future__ import annotations

import base64
import inspect
import json
import keyword
import re

from agent.kernel.runtime.bridge import Host

TYPES = {"string": str, "number": float, "integer": int, "boolean": bool, "array": list, "object": dict}


class McpError(RuntimeError):
    """An MCP server, tool or call failed; the message is the server's (or says what exists)."""


class Binary(bytes):
    """Binary content of a result (an image, audio, a blob resource), with its MIME type."""

    mime: str

    def __new__(cls, data: bytes, mime: str) -> Binary:
        self = super().__new__(cls, data)
        self.mime = mime
        return self

    def __repr__(self) -> str:
        return f"<{self.mime or 'binary'}, {len(self):,} bytes>"


class Listing(list):
    """`mcp.list()`: a list of servers (dicts: name, transport, policy, state, tools, error) that
    displays as text, each tool with its arguments."""

    def __repr__(self) -> str:
        out = []
        for s in self:
            head = f"{s['name']} ({s['transport']}, {s['state']}, policy {s['policy']})"
            out.append(head + (f": {s['error']}" if s.get("error") else ""))
            for t in s.get("tools") or []:
                out.append(f"  {t['name']}({_arguments(t['input_schema'])})" +
                           (f": {t['description'].strip()}" if t["description"].strip() else ""))
        return "\n".join(out) or "(no MCP servers are configured)"


class Mcp:
    """The session's MCP servers: `await mcp.call(server, tool, **arguments)`, `await mcp.SERVER.TOOL(...)`,
    `mcp.list(server=None)`, `await mcp.read(server, uri)`."""

    def __init__(self, host: Host):
        self._host = host
        self._servers: dict[str, ServerTools] = {}

    async def call(self, server: str, tool: str, /, **arguments):
        """Call `tool` of `server`; its result as a Python value (see agent/kernel/runtime/mcp.py)."""
        return _value(_checked(await self._host.acall("mcp.call", server=server, tool=tool, arguments=arguments)))

    async def read(self, server: str, uri: str):
        """Read a resource of `server`: text as `str` (JSON parsed), binary as bytes; a list when it has several parts."""
        parts = [_content(p) for p in _checked(await self._host.acall("mcp.read", server=server, uri=uri))]
        return parts[0] if len(parts) == 1 else parts

    def list(self, server: str | None = None) -> Listing:
        """Every server (or one) with its tools and their input schemas; starts those not started
        (but one under policy `ask`, which starts at its first approved call)."""
        return Listing(_checked(self._host.call("mcp.list", server=server)))

    def __getattr__(self, name: str) -> ServerTools:
        if name.startswith("_"):
            raise AttributeError(name)
        names = self._names()
        server = names.get(name)
        if server is None:
            raise AttributeError(f"no MCP server {name!r}; configured: {', '.join(names.values()) or 'none'}")
        if server not in self._servers:
            self._servers[server] = ServerTools(self, server)
        return self._servers[server]

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._names()]

    def _names(self) -> dict[str, str]:
        return {_identifier(n): n for n in self._host.call("mcp.servers")}

    def __repr__(self) -> str:
        names = ", ".join(self._host.call("mcp.servers")) or "none configured"
        return f"mcp: call(server, tool, **arguments), SERVER.TOOL(**arguments), list(server=None), read(server, uri); servers: {names}"


class ServerTools:
    """One server's tools as attributes (`-` and other characters no name may hold become `_`)."""

    def __init__(self, mcp: Mcp, server: str):
        self._mcp = mcp
        self._server = server
        self._tools: dict[str, object] | None = None

    def _functions(self) -> dict[str, object] | None:
        """The server's tools; None while they are not listed (a server under policy `ask` starts
        at its first approved call, not to be listed)."""
        if self._tools is None:
            listing = _checked(self._mcp._host.call("mcp.list", server=self._server))[0]
            if listing.get("error") and listing.get("tools") is None:
                raise McpError(listing["error"])
            if listing.get("tools") is None:
                return None
            self._tools = {_identifier(t["name"]): _function(self._mcp, self._server, t) for t in listing["tools"]}
        return self._tools

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        tools = self._functions()
        if tools is None:  # not listed: the call itself is checked, once approved and the server started
            return _function(self._mcp, self._server, {"name": name, "description": "(not listed yet)"})
        if name not in tools:
            raise AttributeError(f"MCP server {self._server!r} has no tool {name!r}; its tools: "
                                 f"{', '.join(sorted(tools)) or 'none'}")
        return tools[name]

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *(self._functions() or {})]

    def __repr__(self) -> str:
        tools = self._functions()
        return f"<MCP server {self._server}: {'tools not listed yet' if tools is None else ', '.join(tools) or 'no tools'}>"


def _function(mcp: Mcp, server: str, tool: dict):
    name = tool["name"]

    async def call(**arguments):
        return await mcp.call(server, name, **arguments)

    call.__name__ = call.__qualname__ = _identifier(name)
    schema = tool.get("input_schema") or {}
    call.__doc__ = (f"MCP tool {name!r} of server {server!r}.\n\n{tool.get('description', '').strip()}\n\n"
                    f"Arguments (JSON schema):\n{json.dumps(schema, indent=2)}")
    try:
        call.__signature__ = _signature(schema)
    except (TypeError, ValueError):  # argument names that are not Python names: keyword dict only
        pass
    return call


def _signature(schema: dict) -> inspect.Signature:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    params = [inspect.Parameter(
        k, inspect.Parameter.KEYWORD_ONLY, annotation=TYPES.get(str(p.get("type")), inspect.Parameter.empty),
        default=inspect.Parameter.empty if k in required else p.get("default"),
    ) for k, p in sorted(props.items(), key=lambda kv: kv[0] not in required)]
    return inspect.Signature(params)


def _arguments(schema: dict) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    return ", ".join(f"{k}{'' if k in required else '?'}: {p.get('type', 'any')}" for k, p in props.items())


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    return ident + "_" if keyword.iskeyword(ident) or not ident or ident[0].isdigit() else ident


def _checked(reply: dict):
    if "error" in reply:
        raise McpError(reply["error"])
    return reply["result"]


def _value(result: dict):
    """A tool's result: its structured content when it has one, else its content (one block as
    itself, several as a list): text as `str` (JSON text parsed), binary data as `Binary`. Images
    are shown (display attachments) as well."""
    for c in result["content"]:
        if c["type"] == "image":
            from IPython.display import display

            display({c["mime"]: c["data"]}, raw=True)
    if result.get("structured") is not None:
        return result["structured"]
    values = [_content(c) for c in result["content"]]
    return None if not values else values[0] if len(values) == 1 else values


def _content(c: dict):
    if c["type"] == "text" or "text" in c:
        return _text(c["text"], c.get("mime"))
    if c["type"] in ("image", "audio") or "blob" in c:
        return Binary(base64.b64decode(c.get("data") or c.get("blob") or ""), c.get("mime") or "")
    if c["type"] == "link":
        return {k: v for k, v in c.items() if v is not None}
    return c.get("data", c)


def _text(text: str, mime: str | None):
    stripped = text.strip()
    if mime == "application/json" or stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return text
