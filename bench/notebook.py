"""Notebooks: what a notebook's turn costs a cell, and exporting a session as .ipynb; prints a table
and writes bench/results/notebook.json.

    .venv/bin/python bench/notebook.py [--cells 100]

A real kernel and the scripted model: a notebook of CELLS cells that each print a line, run as a
session's turn (each cell through the hooks, approvals and sandbox: the turn's time a cell), then one
that shows a matplotlib figure; then the session, CELLS + 1 cells, exported (`to_notebook`: read,
built, validated by nbformat) and written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from agent.notebook import Notebook, to_notebook  # noqa: E402
from agent.session import Session  # noqa: E402
from agent.testing.scripted import ScriptedModel  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from tests.conftest import make_config  # noqa: E402

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"


async def measure(cells: int, tmp: Path) -> dict[str, float]:
    project = tmp / "project"
    (project / ".git").mkdir(parents=True)
    printing = Notebook(name="bench.ipynb", cells=[f"print('line {i}')" for i in range(cells)])
    async with Session(make_config(), ScriptedModel([]), cwd=project) as s:
        began = time.monotonic()
        result = await s.prompt(printing.prompt(), notebook=printing)
        turn = time.monotonic() - began
        plotted = await s.prompt("plot", notebook=Notebook(name="plot.ipynb", cells=[PLOT]))
    assert result.outcome == "completed" and plotted.outcome == "completed", (result.error, plotted.error)
    began = time.monotonic()
    text = nbformat.writes(to_notebook(s.layout.trajectory))
    export = time.monotonic() - began
    return {"cells": cells + 1, "turn_s": turn, "per_cell_ms": turn / cells * 1e3, "export_ms": export * 1e3,
            "ipynb_bytes": len(text)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", type=int, default=100)
    args = p.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        figures = asyncio.run(measure(args.cells, Path(tmp)))
    print(f"{'cells':>6} {'turn s':>8} {'ms a cell':>10} {'export ms':>10} {'.ipynb bytes':>13}")
    print(f"{figures['cells']:>6} {figures['turn_s']:>8.2f} {figures['per_cell_ms']:>10.1f} "
          f"{figures['export_ms']:>10.0f} {figures['ipynb_bytes']:>13,}")
    save(ROOT / "bench" / "results" / "notebook.json", {"figures": figures}, load)


if __name__ == "__main__":
    main()
