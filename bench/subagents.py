"""Subagent benchmark: prints a table and writes bench/results/subagents.json.

    .venv/bin/python bench/subagents.py [--repeats 5] [--children 16]

Measures, with the real runtime and a scripted model: the time from `await rlm(...)` in a cell
to the child's first model call (p50; there is no warm kernel pool yet, so every child starts
its own kernel), and the wall time for N children doing one trivial cell each, in parallel.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config_models import Config  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.scripted import ScriptedModel, cells  # noqa: E402
from bench.report import load_average, save  # noqa: E402


def model(parent_code: str, first_calls: list[float]) -> ScriptedModel:
    def respond(messages):
        if "# You are a subagent" in messages[0].content:
            steps = sum(m.role == "assistant" for m in messages)
            if steps == 0:
                first_calls.append(time.time())
                return cells("1 + 1")
            return "done"
        return cells(parent_code) if sum(m.role == "assistant" for m in messages) == 0 else "ok"

    return ScriptedModel([respond] * 10_000)


async def spawn_latency(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        firsts: list[float] = []
        code = "import time\n_t = time.time()\nh = await rlm('trivial', name='c')\nawait h\nprint(_t)"
        with tempfile.TemporaryDirectory() as tmp:
            async with Session(Config(), model(code, firsts), cwd=Path(tmp), session_dir=Path(tmp) / "s") as s:
                await s.prompt("spawn one")
                spawned_at = float(s.model.calls[-1][-1].content)
        out.append(firsts[0] - spawned_at)
    return out


async def fan_out(n: int) -> float:
    code = f"import asyncio\nprint(len(await asyncio.gather(*[await rlm('trivial', name=f'c{{i}}') for i in range({n})])))"
    with tempfile.TemporaryDirectory() as tmp:
        config = Config.model_validate({"subagents": {"max_concurrent": n, "max_concurrent_process": n}})
        async with Session(config, model(code, []), cwd=Path(tmp), session_dir=Path(tmp) / "s") as s:
            t = time.perf_counter()
            await s.prompt("fan out")
            return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--children", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "subagents.json"))
    args = ap.parse_args()
    load = load_average()
    os.environ["PRIME_AGENT_HOME"] = tempfile.mkdtemp()
    latency = asyncio.run(spawn_latency(args.repeats))
    wall = asyncio.run(fan_out(args.children))
    figures = {"spawn_to_first_call_p50_s": statistics.median(latency), "spawn_to_first_call_max_s": max(latency),
               f"children_{args.children}_wall_s": wall}
    print(f"{'measure':<44} {'value':>8}")
    print(f"{'rlm() to child first model call, p50 (s)':<44} {figures['spawn_to_first_call_p50_s']:>8.3f}")
    print(f"{'rlm() to child first model call, max (s)':<44} {figures['spawn_to_first_call_max_s']:>8.3f}")
    print(f"{f'{args.children} children, one trivial cell each, wall (s)':<44} {wall:>8.3f}")
    save(args.out, {"figures": figures, "kernel_pool": False}, load)


if __name__ == "__main__":
    main()
