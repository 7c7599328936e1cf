"""The host bridge: a Unix-socket RPC from code in the kernel to the session, token-checked."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

from agent.kernel.bridge import BridgeServer, socket_path


async def test_rejects_bad_token_unknown_method_and_handler_errors(tmp_path: Path):
    async def boom(**params):
        raise ValueError("no such thing")

    async def echo(**params):
        return params

    server = BridgeServer(tmp_path, {"echo": echo, "boom": boom})
    await server.start()
    try:
        assert stat.S_IMODE(server.path.stat().st_mode) == 0o600

        async def call(msg: dict) -> dict:
            reader, writer = await asyncio.open_unix_connection(str(server.path))
            writer.write(json.dumps(msg).encode() + b"\n")
            reply = json.loads(await reader.readline())
            writer.close()
            return reply

        ok = await call({"id": 1, "token": server.token, "method": "echo", "params": {"a": 1}})
        assert ok == {"id": 1, "result": {"a": 1}}
        bad = await call({"id": 2, "token": "guess", "method": "echo"})
        assert "bad token" in bad["error"]
        unknown = await call({"id": 3, "token": server.token, "method": "nope"})
        assert "unknown method 'nope'" in unknown["error"]
        failed = await call({"id": 4, "token": server.token, "method": "boom"})
        assert failed["error"] == "ValueError: no such thing"
    finally:
        await server.close()
    assert not server.path.exists()


def test_long_directories_get_a_short_socket_path(tmp_path: Path):
    deep = tmp_path / ("d" * 120)
    path = socket_path(deep, "bridge.sock")
    assert len(str(path)) < 100
    assert path == socket_path(deep, "bridge.sock")  # stable for the same directory
    assert socket_path(tmp_path, "bridge.sock") == tmp_path / "bridge.sock"
