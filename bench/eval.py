"""Evaluation benchmark: prints a table and writes bench/results/eval.json.

    .venv/bin/python bench/eval.py [--rollouts 24]

Rollouts per minute of `kernel_tasks` at concurrency 1 and 8 against the fake OpenAI-compatible
server (each rollout: a real session, one cell, one answer), and the overhead per rollout beyond
the model's own time (the rollout's wall time minus its model calls, from its trajectory).
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
from agent.providers import open_model  # noqa: E402
from agent.testing.openai_server import OpenAIServer, Reply  # noqa: E402
from agent.trajectory import ModelCall, read_records  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from evals.runner import EvalSpec, evaluate, rollout_layout  # noqa: E402
from evals.tasksets import select  # noqa: E402


def answers(n: int):
    expected = {t.prompt: t.data["answer"] for t in select("kernel_tasks", n, 0)}

    def script(request: dict) -> Reply:
        prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if not any(m["role"] == "tool" for m in request["messages"]):
            return Reply(code=["print('working')"])
        return Reply(content=expected[prompt])

    return script


async def measure(n: int, concurrency: int, work: Path) -> dict[str, float]:
    with OpenAIServer(answers(n)) as server:
        config = Config.model_validate({"model": {"name": "bench", "base_url": server.base_url}, "refine": {"auto_every": 0}})
        model = open_model(config.model)
        run = work / f"c{concurrency}"
        t = time.perf_counter()
        results = await evaluate(EvalSpec("kernel_tasks", n, 1, concurrency, 0, 120), config, model, run)
        wall = time.perf_counter() - t
        await model.close()
    assert all(r.outcome == "passed" for r in results), [r.outcome for r in results]
    overhead = []
    for r in results:
        records = read_records(rollout_layout(run, r).trajectory)
        overhead.append(r.seconds - sum(x.duration for x in records if isinstance(x, ModelCall)))
    return {"rollouts_per_min": n / wall * 60, "overhead_per_rollout_s": statistics.median(overhead)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=24)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "eval.json"))
    args = ap.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        figures = {f"c{c}": asyncio.run(measure(args.rollouts, c, Path(tmp))) for c in (1, 8)}
    print(f"{'concurrency':<12} {'rollouts/min':>13} {'overhead/rollout (s)':>21}")
    for c, f in figures.items():
        print(f"{c:<12} {f['rollouts_per_min']:>13.1f} {f['overhead_per_rollout_s']:>21.3f}")
    save(args.out, {"figures": figures, "rollouts": args.rollouts}, load)


if __name__ == "__main__":
    main()
