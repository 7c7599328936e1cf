"""The host bridge under a flood (finding E10 of issue #51): prints a table and writes bench/results/bridge.json.

    .venv/bin/python bench/bridge.py

A daemon (its own process, real kernels, the fake model server) runs one session whose turn runs
one cell: six 60 MB notes through the runtime (`await host.acall("note", text=...)`), then the same
six lines written straight to the bridge's socket (past the runtime's own check), then 100 notes
of 60,000 characters (6 MB, over `kernel.output_spill`). Measured: the daemon's RSS before the turn
and after it, its peak over the turn (VmHWM, reset before the turn), and the size of the session's
events.jsonl.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.testing.openai_server import OpenAIServer  # noqa: E402
from bench.daemon import Daemon, agent_script, in_a_home  # noqa: E402
from bench.report import load_average, save  # noqa: E402

FLOOD = """
import json, socket
out = []
for _ in range(6):
    try:
        await host.acall("note", text="x" * 60_000_000)
        out.append("kept")
    except HostError as e:
        out.append(str(e)[:40])
s = socket.socket(socket.AF_UNIX)
s.connect(host._path)
replies = s.makefile("rb")
head = json.dumps({"id": 1, "token": host._token, "method": "note", "params": {"text": ""}})[:-3].encode()
for _ in range(6):
    s.sendall(head)
    for _ in range(60):
        s.sendall(b"x" * (1 << 20))
    s.sendall(b'"}}\\n')
    reply = json.loads(replies.readline())
    out.append(str(reply.get("error", "kept"))[:40])
kept = 0
for i in range(100):
    try:
        note(str(i % 10) * 60_000)
        kept += 1
    except HostError:
        pass
print(sorted(set(out)), kept, "notes of 60,000 kept")
"""


def status(pid: int, field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) * 1024


async def run(home: Path) -> dict[str, Any]:
    project = home / "project"
    project.mkdir()
    with OpenAIServer(agent_script) as server:
        daemon = Daemon(home / "daemon-home", pool_size=0)
        async with daemon as client:
            session = await client.create_session(project, model="fake", base_url=server.base_url)
            await client.send(session.id, "warm up")
            while (await client.session(session.id)).state != "idle":
                await asyncio.sleep(0.1)
            events = Path(session.dir) / "events.jsonl"
            before, journal = status(daemon.pid, "VmRSS"), events.stat().st_size
            Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")
            t = time.perf_counter()
            await client.send(session.id, "run: " + FLOOD)
            while (info := await client.session(session.id)).state != "idle" or info.turns < 2:
                await asyncio.sleep(0.1)
            seconds = time.perf_counter() - t
            after, peak = status(daemon.pid, "VmRSS"), status(daemon.pid, "VmHWM")
            grown = events.stat().st_size - journal
            with events.open("rb") as f:  # the turn's answer is the cell's output (the fake model's "ran: ...")
                f.seek(max(0, events.stat().st_size - 65536))
                answer = re.findall(rb'"answer": ?"(ran: [^"]*)"', f.read())
    return {"daemon_rss_before_mb": before / 1e6, "daemon_rss_after_mb": after / 1e6, "daemon_peak_mb": peak / 1e6,
            "events_jsonl_growth_mb": grown / 1e6, "turn_seconds": seconds,
            "cell_output": answer[-1].decode() if answer else None}


def main() -> None:
    started = load_average()
    figures = in_a_home("bench-bridge-", run)
    for key, value in figures.items():
        print(f"{key:<24} {value:,.1f}" if isinstance(value, float) else f"{key:<24} {value}")
    save(ROOT / "bench" / "results" / "bridge.json", figures, started)


if __name__ == "__main__":
    main()
