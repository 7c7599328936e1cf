"""Host side of the bridge: serves JSON-lines RPC from the session's kernel over a Unix socket.

The socket file is 0600 in a 0700 directory, and every request must carry the per-session
token. Handlers are async functions of keyword arguments; what they return is the reply, what
they raise becomes an error the kernel sees as `HostError`.
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
from pathlib import Path
from typing import Any

Handler = Callable[..., Awaitable[Any]]
SOCKET_PATH_LIMIT = 96  # sun_path is 108 bytes on Linux; ipc adds '-<port>'


class BridgeServer:
    def __init__(self, directory: Path, handlers: dict[str, Handler]):
        self.handlers = handlers
        self.token = secrets.token_hex(16)
        self.path = socket_path(directory, "bridge.sock")
        self._server: asyncio.AbstractServer | None = None

    async def start(self, directory: Path | None = None) -> None:
        """Listen in `directory` (a kernel's own, which its sandbox shows), else the one given at construction."""
        if directory is not None:
            self.path = socket_path(directory, "bridge.sock")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        # Not by the umask, which is the whole process's: a kernel launched meanwhile would inherit it.
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path), limit=2**26)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                # A client sends nothing while it waits for its reply, so anything readable now means
                # it went away (an interrupted cell): cancel the call, so a waiting `recv` takes nothing.
                call = asyncio.ensure_future(self._handle(line))
                gone = asyncio.ensure_future(reader.read(1))
                await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not call.done():
                    call.cancel()
                    await asyncio.gather(call, return_exceptions=True)
                    return
                gone.cancel()
                await asyncio.gather(gone, return_exceptions=True)  # the reader is free again
                writer.write(json.dumps(call.result()).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:  # the loop is ending: end as done, since Python 3.11's stream
            pass  # server asks a finished handler for its exception, which a cancelled one raises (a traceback)
        finally:
            writer.close()

    async def _handle(self, line: bytes) -> dict[str, Any]:
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
