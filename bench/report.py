"""The end every benchmark shares: the load average it ran at, printed and kept in its JSON.

    load = load_average()                    # as the run begins
    ...
    save(out, {"figures": figures}, load)    # prints the load at both ends; writes `out` with it

The machines this project measures on are shared: the same code reads two to five times slower at
load 8 on 2 cores than idle. Read a figure against the load it ran at, and compare within one run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages now."""
    return [round(x, 2) for x in os.getloadavg()]


def save(out: str | Path, record: dict[str, Any], started: list[float]) -> None:
    """Print the load average at the run's start (`started`) and now, and write `record` to `out` as
    JSON with both and the CPU count (`load_average`)."""
    load = {"start": started, "end": load_average(), "cpus": os.cpu_count()}
    print(f"load average (1, 5, 15 min) on {load['cpus']} CPUs: {started} at the start, {load['end']} at the end")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**record, "load_average": load}, indent=2, default=str) + "\n")
    print(f"wrote {path}")
