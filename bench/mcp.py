"""MCP benchmark: a tool call's round trip from a cell, next to a bare `mcp` SDK client's to the
same kind of server; prints a table and writes bench/results/mcp.json.

    .venv/bin/python bench/mcp.py [--calls 300] [--repeats 3]

Both sides call `get_current_time` of `mcp-server-time` (stdio, a local Python server). From the cell, the calls are timed inside the
kernel (`await mcp.time.get_current_time(...)` in a loop: bridge, policy, record, event, SDK and
server); the bare client is the SDK's `Client` alone, in this process. Interleaved, repeated, the
figure is the median of each repeat's p50 (and its p99), and the difference is what we add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This file is bench/mcp.py: its folder must not stand first on the path, or `import mcp` finds it.
sys.path[:] = [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench")]

from agent.config_models import Config  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.scripted import ScriptedModel  # noqa: E402
from agent.types import Cell  # noqa: E402
from bench.report import load_average, save  # noqa: E402

TIME = str(Path(sys.prefix) / "mcp-servers" / "time" / "bin" / "mcp-server-time")  # its own venv: scripts/setup.sh
ARGS = {"timezone": "UTC"}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def bare(n: int) -> list[float]:
    from mcp import Client, StdioServerParameters

    async with Client(StdioServerParameters(command=TIME, args=["--local-timezone", "UTC"])) as c:
        for _ in range(20):
            await c.call_tool("get_current_time", ARGS)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await c.call_tool("get_current_time", ARGS)
            out.append(time.perf_counter() - t)
        return out


CELL = """
import time
for _ in range(20):
    await mcp.time.get_current_time(timezone="UTC")
_times = []
for _ in range({n}):
    _t = time.perf_counter()
    await mcp.time.get_current_time(timezone="UTC")
    _times.append(time.perf_counter() - _t)
print(_times)
"""


async def from_cell(session: Session, n: int) -> list[float]:
    result = await session.kernel.execute(Cell(id="bench", code=CELL.format(n=n)))
    assert not result.error_name, result
    return json.loads(result.stdout)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        config = Config.model_validate({"mcp": {"servers": {"time": {"command": TIME, "args": ["--local-timezone", "UTC"]}}}})
        async with Session(config, ScriptedModel([]), cwd=Path(tmp)) as session:
            runs = {"cell": [], "bare": []}
            for _ in range(a.repeats):  # interleaved: the machine's speed drifts
                runs["cell"].append(await from_cell(session, a.calls))
                runs["bare"].append(await bare(a.calls))
    figures = {}
    for side, repeats in runs.items():
        figures[f"{side}_p50_ms"] = statistics.median(pct(r, 0.5) for r in repeats) * 1e3
        figures[f"{side}_p99_ms"] = statistics.median(pct(r, 0.99) for r in repeats) * 1e3
    figures["overhead_p50_ms"] = figures["cell_p50_ms"] - figures["bare_p50_ms"]
    rows = [("tool call from a cell, p50", "cell_p50_ms", None), ("tool call from a cell, p99", "cell_p99_ms", None),
            ("bare mcp SDK client, p50", "bare_p50_ms", None), ("bare mcp SDK client, p99", "bare_p99_ms", None),
            ("overhead over the bare client, p50", "overhead_p50_ms", 1.0)]
    print(f"{'measure (mcp-server-time get_current_time, stdio)':<52} {'ms':>8} {'target':>8}")
    for label, key, target in rows:
        print(f"{label:<52} {figures[key]:>8.3f} {'' if target is None else f'<= {target:g}':>8}")
    save(ROOT / "bench" / "results" / "mcp.json", {"calls": a.calls, "repeats": a.repeats, **figures}, load)


if __name__ == "__main__":
    asyncio.run(main())
