"""The host bridge: a Unix-socket RPC from code in the kernel to the session, token-checked."""

from __future__ import annotations

import asyncio
import json
import re
import stat
from pathlib import Path

from agent import events as ev
from agent.events import Event
from agent.kernel.bridge import CONNECTIONS, HELD_BYTES, Allowance, BridgeServer, socket_path
from agent.kernel.runtime.bridge import REQUEST_BYTES
from agent.session import Session
from agent.testing.scripted import ScriptedModel
from agent.types import Cell
from tests.conftest import make_config


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


def peak_rss_reset() -> None:
    """Start this process's peak resident size (VmHWM) afresh from what it holds now."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_growth(before: int) -> int:
    """Bytes this process's peak resident size grew over `before` (its VmRSS then)."""
    return _status("VmHWM") - before


def _status(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


async def test_a_request_past_the_cap_is_refused_unread_and_the_bridge_goes_on(tmp_path: Path):
    """E10: a 60 MB line from a kernel was buffered whole by the host (its reader's limit was 64 MiB),
    parsed, then kept. Now the host reads it through in small chunks, drops it, and says why; the
    same connection serves the next call. Sent six times, the host's peak memory never grows by one
    such request (the allocator's own slack, up to ~30 MB on a loaded machine, is not a held request)."""
    kept: list[int] = []

    async def note(text: str) -> None:
        kept.append(len(text))

    server = BridgeServer(tmp_path, {"note": note})
    await server.start()
    try:
        reader, writer = await asyncio.open_unix_connection(str(server.path))
        head = json.dumps({"id": 1, "token": server.token, "method": "note", "params": {"text": ""}})[:-3].encode()
        chunk = b"x" * (1 << 20)
        peak_rss_reset()
        before = _status("VmRSS")
        for _ in range(6):
            writer.write(head)
            for _ in range(60):
                writer.write(chunk)
                await writer.drain()
            writer.write(b'"}}\n')
            reply = json.loads(await reader.readline())
            assert reply["error"].startswith(f"refused: a call to the host is at most {REQUEST_BYTES:,} bytes"), reply
            assert f"(this one: {len(head) + 60 * len(chunk) + 4:,} bytes)" in reply["error"]
        growth = peak_rss_growth(before)
        writer.write(json.dumps({"id": 2, "token": server.token, "method": "note", "params": {"text": "hi"}}).encode()
                     + b"\n")
        assert json.loads(await reader.readline()) == {"id": 2, "result": None}
        writer.close()
    finally:
        await server.close()
    assert kept == [2]
    assert growth < 60 * len(chunk), f"the host's peak memory grew {growth:,} bytes"  # 60 MB each, sent 6 times


async def test_connections_and_bytes_held_at_once_are_bounded(tmp_path: Path):
    """Many connections at once (each may hold up to a request's cap) cannot add up: the bytes held
    across them stay under HELD_BYTES, and past CONNECTIONS a connection is refused, each with a reason."""
    release, arrived = asyncio.Event(), asyncio.Event()
    calls: list[int] = []
    expected = 0

    async def wait(pad: str = "") -> str:
        calls.append(len(pad))
        if len(calls) == expected:
            arrived.set()
        await release.wait()
        return "done"

    async def connect(request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_unix_connection(str(server.path))
        writer.write(request)
        return reader, writer

    async def round(request: bytes, n: int) -> tuple[list, dict]:
        """`n` calls waiting at once, then one more: its reply, and theirs once they may go on."""
        nonlocal expected
        calls.clear()
        release.clear()
        arrived.clear()
        expected = n
        waiting = [await connect(request) for _ in range(n)]
        await arrived.wait()
        reader, writer = await connect(request)
        refused = json.loads(await reader.readline())
        writer.close()
        release.set()
        replies = [json.loads(await r.readline()) for r, _ in waiting]
        for _, w in waiting:
            w.close()
        return replies, refused

    server = BridgeServer(tmp_path, {"wait": wait})
    await server.start()
    try:
        big = json.dumps({"id": 1, "token": server.token, "method": "wait",
                          "params": {"pad": "y" * (REQUEST_BYTES - 200)}}).encode() + b"\n"
        replies, refused = await round(big, HELD_BYTES // REQUEST_BYTES)  # each holds nearly a request's cap
        assert [r.get("result") for r in replies] == ["done"] * (HELD_BYTES // REQUEST_BYTES)
        assert refused["error"].startswith(f"refused: the host holds at most {HELD_BYTES:,} bytes"), refused
        small = json.dumps({"id": 2, "token": server.token, "method": "wait"}).encode() + b"\n"
        replies, refused = await round(small, CONNECTIONS)
        assert [r.get("result") for r in replies] == ["done"] * CONNECTIONS
        assert refused["error"] == (f"refused: this kernel holds {CONNECTIONS} connections to the host already; "
                                    "await some calls first")
    finally:
        await server.close()


def test_what_the_host_keeps_is_counted_per_cell_against_the_spill_cap():
    cell = ["c1"]
    allowance = Allowance(100, lambda: cell[0], transient=frozenset({"llm"}))
    assert allowance.take("note", 60) is None and allowance.take("llm", 10_000) is None
    assert "kernel.output_spill allows 100 a cell" in allowance.take("note", 60)
    cell[0] = "c2"
    assert allowance.take("note", 60) is None  # a new cell starts afresh
    assert Allowance(0, lambda: "c").take("note", 10**9) is None  # 0: no limit, as for output


RAW_FLOOD = """
import json, socket
def flood():
    s = socket.socket(socket.AF_UNIX)
    s.connect(host._path)
    replies, head = s.makefile("rb"), json.dumps({"id": 1, "token": host._token, "method": "note",
                                                  "params": {"text": ""}})[:-3].encode()
    out = []
    for _ in range(6):
        s.sendall(head)
        for _ in range(60):
            s.sendall(b"x" * (1 << 20))
        s.sendall(b'"}}\\n')
        out.append(json.loads(replies.readline())["error"][:50])
    return out
print(flood())
"""


async def test_a_cell_cannot_flood_the_hosts_memory_or_journal_through_the_bridge(project: Path):
    """E10, from a real kernel: `await host.acall("note", text=60 MB)` six times (and the same bytes
    written straight to the socket, past the runtime's own check) kept nothing and grew the host by
    nothing like 360 MB; a note is at most kernel.output_limit characters, and what the host keeps of
    one cell's calls at most kernel.output_spill, counted afresh for the next cell."""
    events: list[Event] = []
    config = make_config(kernel={"output_spill": 300_000})
    async with Session(config, ScriptedModel([]), cwd=project, on_event=events.append) as s:
        async def run(code: str):
            return await s.kernel.execute(Cell(id=f"c{len(events)}", code=code, timeout=120))

        peak_rss_reset()
        before = _status("VmRSS")
        flood = await run("for _ in range(6):\n    try:\n        await host.acall('note', text='x' * 60_000_000)\n"
                          "    except HostError as e:\n        print(e)")
        raw = await run(RAW_FLOOD)
        growth = peak_rss_growth(before)
        long = await run("note('y' * 70_000)")
        many = await run("for i in range(6):\n    try:\n        note(str(i) * 60_000)\n"
                         "    except HostError as e:\n        print(i, e)")
        after = await run("note('z' * 60_000)")
    assert flood.stdout.count(f"refused: a call to the host is at most {REQUEST_BYTES:,} bytes") == 6, flood
    assert raw.stdout.count("refused: a call to the host is at most") == 6, raw
    assert growth < 3 * REQUEST_BYTES, f"the host's peak memory grew {growth:,} bytes"
    assert long.error_name == "HostError" and "a note is at most 65,536 characters" in long.error_value, long
    refused = [line.split(" ", 1)[0] for line in many.stdout.splitlines() if "kernel.output_spill allows 300,000" in line]
    assert refused == ["4", "5"], many
    assert after.error_name is None, after
    notes = [e.text for e in events if isinstance(e, ev.Note)]
    assert [n[0] for n in notes] == ["0", "1", "2", "3", "z"] and max(map(len, notes)) == 60_000
