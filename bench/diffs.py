"""What showing each cell's file changes costs: prints a table and writes bench/results/diffs.json.

    .venv/bin/python bench/diffs.py [--cells 30] [--runs 3]

1. The snapshot after a cell and its diff (`Checkpoints.after_cell`: the workspace scanned, what
   changed hashed into the shadow store, the trees compared, the changed files' diffs), on a small
   workspace (200 files, 2 MB) and a large one (2,000 files, 50 MB), for a cell that changed no file,
   one file, and five; and the turn's summary at its end (`turn_files`) after five such cells.
2. A whole session (real kernel, scripted model): CELLS cells that each write a file, with
   `checkpoints.diffs` on and off, RUNS runs each, interleaved: the turn's time per cell, and the difference.

A bare `git --version` is the floor: one git process on this machine, measured before and after.
A cell that changed nothing costs a stat of the workspace's entries (`WorkspaceStore.unchanged`), or
one git process (the scan) past 2,000 of them; one that changed files, six (the scan, the index
updated, the tree written, the trees compared, the blobs' sizes, the small blobs read).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.checkpoints import Checkpoints  # noqa: E402
from agent.config_models import CheckpointConfig, KernelConfig  # noqa: E402
from agent.context import Context, Sinks  # noqa: E402
from agent.harness import SessionHarness, scope_roots  # noqa: E402
from agent.kernel import Kernel  # noqa: E402
from agent.layout import SessionLayout  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.scripted import ScriptedModel, cells  # noqa: E402
from bench.rewind import make_workspace, source_text  # noqa: E402
from tests.conftest import make_config  # noqa: E402

WORKSPACES = {"small": (200, 2), "large": (2000, 50)}


def p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


async def store_costs(tmp: Path, files: int, mb: int, n: int) -> dict[str, float]:
    rng = random.Random(0)
    ws = tmp / f"ws-{files}"
    paths = make_workspace(ws, files, mb, rng)
    layout = SessionLayout(tmp / "home" / "sessions" / f"bench-{files}")
    layout.dir.mkdir(parents=True)
    records: list = []
    sinks = Sinks(emit=lambda e: None, record=records.append, charge=lambda u, p: None, turn_id=lambda: None)
    harness = SessionHarness(scope_roots(tmp / "home", ws, layout.dir), "bench")
    kernel = Kernel(ws, KernelConfig())  # never started: a cell's snapshot does not use it
    cp = Checkpoints(CheckpointConfig(), ws, layout, "bench", kernel, harness, Context(records.append), sinks)
    await cp.at_turn_start("t0")  # the first checkpoint hashes everything; not what a cell pays

    def edit(path: Path) -> None:
        text = path.read_text()
        at = rng.randrange(len(text))
        path.write_text(text[:at] + source_text(rng, 200) + text[at + 200:])

    out: dict[str, float] = {}
    for changed in (0, 1, 5):
        times = []
        for _ in range(n):
            for path in rng.sample(paths, changed):
                edit(path)
            t = time.perf_counter()
            files = await cp.after_cell()
            times.append(time.perf_counter() - t)
            assert (files is None) == (changed == 0) and (files is None or len(files.files) == changed)
        out[f"cell_{changed}_changed_ms"] = p50(times)
    summary = []
    for turn in range(n):
        await cp.at_turn_start(f"t{turn + 1}")
        for _ in range(5):
            edit(rng.choice(paths))
            await cp.after_cell()
        t = time.perf_counter()
        files = await cp.turn_files()
        summary.append(time.perf_counter() - t)
        assert files is not None and files.files
    out["turn_summary_ms"] = p50(summary)
    return out


async def session_turn(project: Path, n: int, diffs: bool) -> float:
    """Seconds per cell of one turn of `n` cells that each write a file."""
    script = [cells(f"write('out/f{i}.txt', 'line {i}\\n' * 20)") for i in range(n)] + ["done"]
    config = make_config(checkpoints={"diffs": diffs, "kernel": False})
    async with Session(config, ScriptedModel(script), cwd=project) as s:
        result = await s.prompt("write the files")
    assert result.outcome == "completed" and result.cells == n
    return result.duration / n


def git_floor() -> float:
    times = []
    for _ in range(20):
        t = time.perf_counter()
        subprocess.run(["git", "--version"], capture_output=True)
        times.append(time.perf_counter() - t)
    return p50(times)


async def run(args: argparse.Namespace) -> dict:
    floor = [git_floor()]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        stores = {name: await store_costs(Path(tmp), files, mb, args.cells) for name, (files, mb) in WORKSPACES.items()}
        per_cell: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.runs):
            for diffs in (True, False):
                project = Path(tmp) / f"project-{i}-{diffs}"
                project.mkdir()
                per_cell[diffs].append(await session_turn(project, args.cells, diffs))
    floor.append(git_floor())  # the machine's speed drifts: before and after
    on, off = (statistics.median(per_cell[d]) * 1e3 for d in (True, False))
    return {"git_process_floor_ms": floor, "workspaces": {k: {"files": f, "mb": m} for k, (f, m) in WORKSPACES.items()},
            "store": stores, "session_cell_ms": {"diffs_on": on, "diffs_off": off, "difference": on - off,
                                                 "runs_on": [x * 1e3 for x in per_cell[True]],
                                                 "runs_off": [x * 1e3 for x in per_cell[False]]},
            "cells": args.cells, "runs": args.runs, "load_average": os.getloadavg(), "nproc": os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "diffs.json"))
    args = ap.parse_args()
    r = asyncio.run(run(args))
    print("one git process (floor), before and after: " + " and ".join(f"{x:.1f} ms" for x in r["git_process_floor_ms"])
          + f"; {r['nproc']} CPUs")
    print(f"{'after a cell (p50, ms)':<28}" + "".join(f"{k:>24}" for k in WORKSPACES))
    for key, label in (("cell_0_changed_ms", "no file changed"), ("cell_1_changed_ms", "1 file changed"),
                       ("cell_5_changed_ms", "5 files changed"), ("turn_summary_ms", "turn summary (5 cells)")):
        print(f"{label:<28}" + "".join(f"{r['store'][k][key]:>24.1f}" for k in WORKSPACES))
    c = r["session_cell_ms"]
    print(f"a session, per cell writing a file ({r['cells']} cells, median of {r['runs']} runs): "
          f"diffs on {c['diffs_on']:.1f} ms, off {c['diffs_off']:.1f} ms, difference {c['difference']:.1f} ms")
    print("load average: " + " ".join(f"{x:.2f}" for x in r["load_average"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(r, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
