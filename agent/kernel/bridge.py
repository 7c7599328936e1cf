"""Host side of the bridge: serves JSON-lines RPC from the session's kernel over a Unix socket.

The socket file is 0600 in a 0700 directory, and every request must carry the per-session
token. Handlers are async functions of keyword arguments; what they return is the reply, what
they raise becomes an error the kernel sees as `HostError`.

What a kernel sends is bounded before it is held: a request of more than REQUEST_BYTES is read
through and dropped (never buffered whole) and answered with an error; the requests being read or
served at once hold at most HELD_BYTES, on at most CONNECTIONS connections; and what the host keeps
of them (notes, messages, answers, MCP arguments: journaled and recorded) counts against a budget
per cell (`Allowance`: kernel.output_spill, as for what a cell prints).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.kernel.runtime.bridge import REQUEST_BYTES

Handler = Callable[..., Awaitable[Any]]
SOCKET_PATH_LIMIT = 96  # sun_path is 108 bytes on Linux; ipc adds '-<port>'
HELD_BYTES = 16 * REQUEST_BYTES
"""Bytes of requests a bridge holds at once (being read, or served): past it, a request is refused."""
CONNECTIONS = 256
"""Connections a kernel may hold open to its bridge at once (a gather over every child is 64)."""
CHUNK = 1 << 16


@dataclass
class Allowance:
    """The bytes of requests the host keeps (journals, records, delivers) that one cell may send:
    `limit` (kernel.output_spill; 0: no limit), counted afresh whenever `cell()` changes (the cells
    executed so far; calls after a cell count as its); the `transient` methods keep nothing of their
    requests (an `llm` prompt goes to the model) and are not counted."""

    limit: int
    cell: Callable[[], object]
    transient: frozenset[str] = frozenset()
    _at: object = None
    _used: int = 0

    def take(self, method: str, size: int) -> str | None:
        """Count a `method` request of `size` bytes: why it is refused, or None."""
        if self.limit <= 0 or method in self.transient:
            return None
        if (cell := self.cell()) != self._at:
            self._at, self._used = cell, 0
        if self._used + size > self.limit:
            return (f"refused: this cell has sent the host {self._used:,} bytes it keeps (notes, messages, answers, "
                    f"MCP arguments, harness edits) and this request is {size:,} more; kernel.output_spill allows "
                    f"{self.limit:,} a cell, as for what it prints. Write large text to a file and pass its path")
        self._used += size
        return None


class BridgeServer:
    def __init__(self, directory: Path, handlers: dict[str, Handler], allowance: Allowance | None = None):
        self.handlers = handlers
        self.allowance = allowance
        self.token = secrets.token_hex(16)
        self.path = socket_path(directory, "bridge.sock")
        self._server: asyncio.AbstractServer | None = None
        self._held = 0
        """Bytes of requests being read or served now."""
        self._open = 0
        """Connections open now."""

    async def start(self, directory: Path | None = None) -> None:
        """Listen in `directory` (a kernel's own, which its sandbox shows), else the one given at construction."""
        if directory is not None:
            self.path = socket_path(directory, "bridge.sock")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        # Not by the umask, which is the whole process's: a kernel launched meanwhile would inherit it.
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path), limit=CHUNK)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= CONNECTIONS:
            refused = f"refused: this kernel holds {CONNECTIONS} connections to the host already; await some calls first"
            writer.write(json.dumps({"id": None, "error": refused}).encode() + b"\n")
            writer.close()
            return
        self._open += 1
        try:
            while True:
                line, refused = await self._receive(reader)
                if line is None and refused is None:
                    return
                if line is None:
                    reply = {"id": None, "error": refused}
                else:
                    try:
                        # A client sends nothing while it waits for its reply, so anything readable now
                        # means it went away (an interrupted cell): cancel the call, so a waiting `recv`
                        # takes nothing.
                        call = asyncio.ensure_future(self._handle(line))
                        gone = asyncio.ensure_future(reader.read(1))
                        await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
                        if not call.done():
                            call.cancel()
                            await asyncio.gather(call, return_exceptions=True)
                            return
                        gone.cancel()
                        await asyncio.gather(gone, return_exceptions=True)  # the reader is free again
                        reply = call.result()
                    finally:
                        self._held -= len(line)
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:  # the loop is ending: end as done, since Python 3.11's stream
            pass  # server asks a finished handler for its exception, which a cancelled one raises (a traceback)
        finally:
            self._open -= 1
            writer.close()

    async def _receive(self, reader: asyncio.StreamReader) -> tuple[bytearray | None, str | None]:
        """The next request line, its bytes counted in `_held` (the caller takes them off once it is
        served); or why it is refused, read through to its end and dropped, never held whole. (None,
        None) at the end of the connection, or where a client sent more than a line before its reply."""
        line, size, refused = bytearray(), 0, None
        try:
            while chunk := await reader.read(CHUNK):
                end = chunk.find(b"\n")
                part = chunk if end < 0 else chunk[:end + 1]
                size += len(part)
                if refused is None and size > REQUEST_BYTES:
                    refused = f"refused: a call to the host is at most {REQUEST_BYTES:,} bytes; write large data to a file"
                elif refused is None and self._held + len(part) > HELD_BYTES:
                    refused = (f"refused: the host holds at most {HELD_BYTES:,} bytes of this kernel's calls at once; "
                               "await some of them first")
                if refused is None:
                    line += part
                    self._held += len(part)
                elif line:  # what was held of it is let go at once
                    self._held -= len(line)
                    line = bytearray()
                if end < 0:
                    continue
                if end + 1 < len(chunk):
                    break
                if refused is not None:
                    return None, f"{refused} (this one: {size:,} bytes)"
                done, line = line, bytearray()
                return done, None
            return None, None
        finally:
            self._held -= len(line)  # what is not handed on

    async def _handle(self, line: bytearray) -> dict[str, Any]:
        try:
            req = json.loads(line)
            rid = req.get("id")
        except (ValueError, AttributeError):
            return {"id": None, "error": "bad request: not a JSON object"}
        if not hmac.compare_digest(str(req.get("token", "")), self.token):
            return {"id": rid, "error": "bad token: this kernel is not authorised for this session"}
        handler = self.handlers.get(req.get("method"))
        if handler is None:
            return {"id": rid, "error": f"unknown method {req.get('method')!r}; known: {sorted(self.handlers)}"}
        if self.allowance is not None and (refused := self.allowance.take(req["method"], len(line))):
            return {"id": rid, "error": refused}
        try:
            return {"id": rid, "result": await handler(**(req.get("params") or {}))}
        except Exception as e:  # the kernel's caller gets the failure, the host goes on
            return {"id": rid, "error": f"{type(e).__name__}: {e}"}


def socket_path(directory: Path, name: str) -> Path:
    """`directory/name`, or a short private path named after it when that is too long for a socket."""
    path = directory / name
    if len(str(path)) <= SOCKET_PATH_LIMIT:
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"prime-agent-{os.getuid()}"
    short.mkdir(mode=0o700, exist_ok=True)
    st = short.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not short.is_dir() or short.is_symlink():
        raise PermissionError(f"{short} is not a private directory of this user; remove it, or set a shorter "
                              "PRIME_AGENT_HOME")
    return short / digest
