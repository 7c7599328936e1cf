"""Kernel side of the host bridge: JSON-lines RPC over a Unix socket to the session host.

Each request is one line `{"id", "token", "method", "params"}`; each reply one line
`{"id", "result"}` or `{"id", "error"}`. A cell can call the host from sync code
(`host.call`) or from async code (`await host.acall`), while the cell is still running:
that is what the kernel's own comm channel cannot do.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
from typing import Any


REQUEST_BYTES = 4 * 1024 * 1024
"""The largest request the host reads (a line of JSON); it refuses a longer one unread. Large data
goes through a file (`rlm(context=...)` does it for a child)."""


class HostError(RuntimeError):
    """The host refused or failed a call; the message says why."""


class Host:
    def __init__(self, path: str, token: str):
        self._path = path
        self._token = token
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader = None

    def call(self, method: str, **params: Any) -> Any:
        """Call the host and block until it answers."""
        rid = next(self._ids)
        request = self._request(rid, method, params)
        with self._lock:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._sock.connect(self._path)
                self._reader = self._sock.makefile("rb")
            try:
                self._sock.sendall(request)
                line = self._reader.readline()
            except BaseException:  # an interrupt mid-call leaves a reply in flight: drop the connection
                self._close()
                raise
            if not line:
                self._close()
                raise HostError("the session host closed the bridge")
            return _result(line, rid)

    async def acall(self, method: str, **params: Any) -> Any:
        """Call the host from async code without blocking the kernel's event loop."""
        rid = next(self._ids)
        request = self._request(rid, method, params)
        reader, writer = await asyncio.open_unix_connection(self._path, limit=2**26)
        try:
            writer.write(request)
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
        if not line:
            raise HostError("the session host closed the bridge")
        return _result(line, rid)

    def _request(self, rid: int, method: str, params: dict[str, Any]) -> bytes:
        msg = {"id": rid, "token": self._token, "method": method, "params": params}
        data = json.dumps(msg).encode() + b"\n"
        if len(data) > REQUEST_BYTES:  # the host would refuse it: say so without sending it
            raise HostError(f"refused: a call to the host is at most {REQUEST_BYTES:,} bytes (this one: {len(data):,}); "
                            "write large data to a file and pass its path")
        return data

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None


def _result(line: bytes, rid: int) -> Any:
    reply = json.loads(line)
    if "error" in reply and reply.get("id") in (rid, None):  # None: refused before it was read (too large, busy)
        raise HostError(reply["error"])
    if reply.get("id") != rid:
        raise HostError(f"the bridge answered request {reply.get('id')} to request {rid}")
    return reply.get("result")
