"""Refiner benchmark: prints a table and writes bench/results/refiner.json.

    .venv/bin/python bench/refiner.py [--repeats 20]

Measures the time a ready refinement adds to a turn boundary (commit of one memory plus the
system-prompt rebuild the next turn does), and the turn loop's overhead while a plan is in
flight (a turn of 5 trivial cells, with and without a planning task running beside it).
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
sys.path.insert(0, str(ROOT))

from agent.config_models import Config  # noqa: E402
from agent.session import Session, Turn  # noqa: E402
from agent.testing.scripted import ScriptedModel, cells  # noqa: E402
from bench.report import load_average, save  # noqa: E402

PLANNER = "You refine the harness"


def plan_json(i: int) -> str:
    return json.dumps({"summary": f"fact {i}", "edits": [{"action": "create", "kind": "memory", "id": f"fact-{i}",
                       "title": f"Fact {i}", "content": f"Fact number {i}.", "scope": "project", "reason": "bench"}]})


async def boundary_cost(repeats: int, work: Path) -> tuple[list[float], list[float]]:
    counter = iter(range(10**6))

    def respond(messages):
        return plan_json(next(counter)) if messages[0].content.startswith(PLANNER) else "ok"

    with_plan, without = [], []
    async with Session(Config(), ScriptedModel([respond] * 10**5), cwd=work) as s:
        for i in range(repeats):
            plan = await s.refiner.refiner.plan("evidence", s.harness.view.render(), trigger="bench")
            s.refiner.ready = await s.refiner.refiner.prepare(plan)
            turn = Turn(id=f"b{i}", prompt="")
            t = time.perf_counter()
            s.refiner.at_boundary()
            s.system_prompt.at_boundary(turn.id)
            with_plan.append(time.perf_counter() - t)
            t = time.perf_counter()
            s.refiner.at_boundary()
            s.system_prompt.at_boundary(turn.id)
            without.append(time.perf_counter() - t)
    return with_plan, without


async def in_flight_overhead(repeats: int, work: Path) -> tuple[list[float], list[float]]:
    async def slow_plan(messages):
        await asyncio.sleep(3600)

    def respond(messages):
        start = max(i for i, m in enumerate(messages) if m.role == "user" and m.content == "five cells")
        steps = sum(m.role == "assistant" for m in messages[start:])
        return cells("1 + 1") if steps < 5 else "done"

    idle, busy = [], []
    async with Session(Config(), ScriptedModel([respond] * 10**5), cwd=work) as s:
        for _ in range(repeats):
            t = time.perf_counter()
            await s.prompt("five cells")
            idle.append(time.perf_counter() - t)
        s.refiner.refiner.complete = slow_plan
        s.refiner.request()
        for _ in range(repeats):
            t = time.perf_counter()
            await s.prompt("five cells")
            busy.append(time.perf_counter() - t)
    return idle, busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "refiner.json"))
    args = ap.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        work = Path(tmp) / "project"
        (work / ".git").mkdir(parents=True)
        with_plan, without = asyncio.run(boundary_cost(args.repeats, work))
        idle, busy = asyncio.run(in_flight_overhead(args.repeats, work))
    ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
    figures = {"boundary_with_ready_refinement_ms": ms(with_plan), "boundary_without_ms": ms(without),
               "turn_5_cells_idle_ms": ms(idle), "turn_5_cells_plan_in_flight_ms": ms(busy)}
    for key, value in figures.items():
        print(f"{key:<40} {value:>8.2f}")
    save(args.out, {"figures": figures, "repeats": args.repeats}, load)


if __name__ == "__main__":
    main()
