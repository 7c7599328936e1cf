"""Harness store benchmark: prints a table and writes bench/results/harness.json.

    .venv/bin/python bench/harness.py [--sizes 10,100,1000] [--repeats 30]

For stores of N entries: one change committed (update of one entry), a rollback of that
change, and prompt-view assembly, cold (first render of a new view: every file parsed) and
warm (the view as a session re-renders it at each turn boundary after a change).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save  # noqa: E402
from harness_store.store import Edit, HarnessStore  # noqa: E402
from harness_store.view import HarnessView  # noqa: E402

KINDS = ["memory", "prompt", "skill", "subagent"]


def populate(store: HarnessStore, n: int) -> None:
    edits = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        edits.append(Edit("create", f"{kind}-{i}", kind=kind, title=f"{kind.title()} {i}",
                          description=f"what {kind} {i} is for", body=f"Entry {i}: " + "lorem ipsum " * 20))
    store.apply(edits, summary=f"populate {n}", trigger="bench", source="agent")


def p50(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def measure(n: int, repeats: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = HarnessStore(Path(tmp) / "harness", "user")
        populate(store, n)
        commit, rollback, warm, cold = [], [], [], []
        view = HarnessView([store])
        view.render()
        for i in range(repeats):
            t = time.perf_counter()
            change = store.apply([Edit("update", "memory-0", body=f"version {i}")], summary=f"edit {i}",
                                 trigger="bench", source="agent")
            commit.append(time.perf_counter() - t)
            t = time.perf_counter()
            view.render()  # one entry changed since the last render
            warm.append(time.perf_counter() - t)
            t = time.perf_counter()
            store.rollback(change.refinement_id)
            rollback.append(time.perf_counter() - t)
            fresh = HarnessView([HarnessStore(store.root, "user")])
            t = time.perf_counter()
            fresh.render()
            cold.append(time.perf_counter() - t)
    return {"commit_ms": p50(commit), "rollback_ms": p50(rollback), "view_warm_ms": p50(warm), "view_cold_ms": p50(cold)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "harness.json"))
    args = ap.parse_args()
    load = load_average()
    results = {n: measure(n, args.repeats) for n in map(int, args.sizes.split(","))}
    print(f"{'entries':>8} {'commit p50':>11} {'rollback p50':>13} {'view p50':>9} {'view cold':>10}   (ms)")
    for n, r in results.items():
        print(f"{n:>8} {r['commit_ms']:>11.1f} {r['rollback_ms']:>13.1f} {r['view_warm_ms']:>9.1f} {r['view_cold_ms']:>10.1f}")
    print("targets at 1,000 entries: view <= 20 ms, commit <= 30 ms")
    save(args.out, {"results": results, "repeats": args.repeats}, load)


if __name__ == "__main__":
    main()
