"""What confined scoring costs: prints a table and writes bench/results/scoring.json.

    .venv/bin/python bench/scoring.py [--rounds 2]

Each round checks every repo_fix task with its bug fixed, the three ways interleaved: the check as it
runs (`confined`: a copy of the workspace, the task's tests restored, pytest isolated in a sandbox of
its own: RepoFix.check), as it ran before (`old`: `python -m pytest -q` in the workspace, on the
host, which loads every pytest plugin installed), and that with plugins off as the check now runs it
(`old_no_plugins`: what confinement itself adds is the difference from this one). The median seconds of
each, over rounds x 12 checks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save  # noqa: E402
from evals.runner import lay_out  # noqa: E402
from evals.tasksets.repo_fix import RepoFix  # noqa: E402

FIXES = {"add": ("a - b", "a + b"), "mean": ("(len(xs) + 1)", "len(xs)"), "last": ("xs[len(xs)]", "xs[-1]"),
         "is_even": ("== 1", "== 0"), "reverse": ("s[::1]", "s[::-1]"), "clamp": ("max(hi, min(lo, x))", "max(lo, min(hi, x))"),
         "count_words": ("len(s.split(' ')) - 1", "len(s.split())"), "factorial": ("range(1, n)", "range(1, n + 1)"),
         "maximum": ("best = 0", "best = xs[0]"), "dedupe": ("list(set(xs))", "list(dict.fromkeys(xs))"),
         "title": ("s.capitalize()", "s.title()"), "fizz": ("n % 3 == 0:\n        return 'Fizz'\n    if n % 15 == 0:\n        return 'FizzBuzz'",
                                                              "n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'")}


def the_old_way(workspace: Path, plugins: bool) -> bool:
    env = {**os.environ, **({} if plugins else {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scoring.json"))
    args = ap.parse_args()
    load = load_average()
    ways = ("confined", "old", "old_no_plugins")
    env, times = RepoFix(), {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        for r in range(args.rounds):
            for task in env.tasks(None, seed=r):
                work = Path(tmp) / f"{r}-{task.id}"
                work.mkdir()
                old, new = FIXES[task.id]
                lay_out({**task.files, "lib.py": task.files["lib.py"].replace(old, new)}, work)
                for i in range(len(ways)):  # each way first in turn
                    way = ways[(i + r) % len(ways)]
                    t = time.perf_counter()
                    passed = env.check(task, "", work).passed if way == "confined" else \
                        the_old_way(work, plugins=way == "old")
                    times[way].append(time.perf_counter() - t)
                    assert passed, (way, task.id)
    figures = {way: {"median_s": statistics.median(ts), "checks": len(ts)} for way, ts in times.items()}
    figures["confinement_adds_s"] = figures["confined"]["median_s"] - figures["old_no_plugins"]["median_s"]
    print(f"{'check':<16} {'median (s)':>11} {'checks':>7}")
    for way in ways:
        print(f"{way:<16} {figures[way]['median_s']:>11.3f} {figures[way]['checks']:>7}")
    print(f"confinement adds {figures['confinement_adds_s']:.3f} s a rollout (confined - old_no_plugins)")
    save(args.out, {"figures": figures, "rounds": args.rounds}, load)


if __name__ == "__main__":
    main()
