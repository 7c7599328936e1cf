"""Hooks benchmark: prints a table and writes bench/results/hooks.json.

    .venv/bin/python bench/hooks.py [--cells 20] [--rounds 5]

A turn of `--cells` cells (`pass`, one model call asking for all of them, a scripted model) in three
sessions with 0, 1 and 5 no-op command hooks (`true`) on PreToolUse, so each cell waits for that many
hooks, run concurrently; the sessions take turns, round after round (the machine's speed drifts).
Reported: a cell's time (p50 over the rounds' per-cell means), what the hooks add to it, and that
divided by the number of hooks.
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
from agent.hooks import HooksFile  # noqa: E402
from agent.kernel.sandbox import unavailable  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.scripted import ScriptedModel, cells  # noqa: E402
from bench.report import load_average, save  # noqa: E402

COUNTS = (0, 1, 5)


def session(cwd: Path, hooks: int, model: ScriptedModel) -> Session:
    config = Config()
    spec = {"hooks": {"PreToolUse": [{"matcher": "ipython", "hooks": [{"type": "command", "command": "true"}] * hooks}]}}
    if hooks:
        config._hooks.append(("user", HooksFile.model_validate(spec)))
    return Session(config, model, cwd=cwd)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    load = load_average()
    per_cell: dict[int, list[float]] = {k: [] for k in COUNTS}
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        work = Path(tmp) / "work"
        work.mkdir()
        models = {k: ScriptedModel([]) for k in COUNTS}
        sessions = {k: session(work, k, models[k]) for k in COUNTS}
        for s in sessions.values():
            await s.start()
        try:
            for r in range(a.rounds + 1):  # the first round warms up (imports, the first hook's fork)
                for k in COUNTS:
                    models[k].outputs += [cells(*["pass"] * a.cells), "done"]
                    began = time.perf_counter()
                    result = await sessions[k].prompt("go")
                    took = time.perf_counter() - began
                    assert result.outcome == "completed" and result.cells == a.cells, result
                    if r:
                        per_cell[k].append(took / a.cells)
        finally:
            for s in sessions.values():
                await s.close()
    base = statistics.median(per_cell[0])
    figures = {f"cell_{k}_hooks_ms": statistics.median(per_cell[k]) * 1000 for k in COUNTS}
    for k in COUNTS[1:]:
        figures[f"added_{k}_hooks_ms"] = figures[f"cell_{k}_hooks_ms"] - base * 1000
        figures[f"added_per_hook_{k}_ms"] = figures[f"added_{k}_hooks_ms"] / k
    print(f"sandbox: {unavailable() or 'bubblewrap'}; {a.cells} cells a turn, {a.rounds} rounds, interleaved")
    print(f"{'hooks per cell':<16} {'cell p50 ms':>12} {'added ms':>10} {'per hook ms':>12}")
    for k in COUNTS:
        added = figures.get(f"added_{k}_hooks_ms", 0.0)
        each = figures.get(f"added_per_hook_{k}_ms", 0.0)
        print(f"{k:<16} {figures[f'cell_{k}_hooks_ms']:>12.2f} {added:>10.2f} {each:>12.2f}")
    save(ROOT / "bench" / "results" / "hooks.json", {**vars(a), "sandbox": unavailable() or "bubblewrap", **figures}, load)


if __name__ == "__main__":
    asyncio.run(main())
