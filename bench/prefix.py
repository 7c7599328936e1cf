"""Prompt-cache stability benchmark: prints a table and writes bench/results/prefix.json.

    .venv/bin/python bench/prefix.py [--turns 50] [--refinements 5] [--before REV]

A scripted session (a model behind the `Model` protocol, a real kernel, a real harness store) runs
`--turns` turns of one cell and one answer each; between turns, `--refinements` refinements are
planned and applied (each adds a prompt note), and the context is small enough to compact once.
For every request of the turn loop it measures how much of the request (its messages as the wire
JSON, in characters, ~4 to a token) repeats the previous request's: the part a provider's prompt
cache can serve. Figures:

- share: repeated / total over all requests but the first;
- share outside compactions: the same without the request right after each compaction (the prefix
  starts over there by design);
- requests that broke the prefix (do not start with the previous request).

It runs this tree, then the tree of `--before` (default: the commit this branch left main at,
extracted with `git archive`) under the same script, each in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CELL_OUTPUT = 400
"""Characters each turn's cell prints."""


# --- the scripted session (runs in the tree under test: imports only what both trees have) ----------


def proposal(i: int) -> str:
    edit = {"action": "create", "kind": "prompt", "id": f"lesson-{i}", "title": f"Lesson {i}", "scope": "project",
            "content": f"Lesson {i}: check the output of every cell before the next step. " * 3, "reason": "bench"}
    return "```json\n" + json.dumps({"summary": f"lesson {i}", "rationale": "bench", "expected_outcome": "bench",
                                     "edits": [edit]}) + "\n```"


class BenchModel:
    """Turn calls: a cell, then an answer once its result is in. Plain calls: a summary (compaction)
    or a refinement plan (json_mode). Records each turn call's messages as the wire JSON."""

    name = "bench"
    action_format = "tools"

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.after_compaction: set[int] = set()
        self.plans = 0

    def variant(self, name: str) -> BenchModel:
        return self

    async def describe(self):
        from agent.model import ServerModel

        return ServerModel()

    def reconfigure(self, config) -> None:
        pass

    async def complete(self, messages, *, tools: bool = True, json_mode: bool = False, **_):
        from agent.wire import to_wire
        from agent.types import Completion, Message, ToolCall, Usage

        if not tools:
            if json_mode:
                self.plans += 1
                text = proposal(self.plans)
            else:
                text = "SUMMARY: the earlier turns each ran one cell that printed a line of x."
                self.after_compaction.add(len(self.requests))
            return Completion(message=Message(role="assistant", content=text), finish_reason="stop",
                              usage=Usage(prompt_tokens=sum(len(m.content) for m in messages) // 4, completion_tokens=20))
        body = json.dumps([to_wire(m) for m in messages])
        self.requests.append(body)
        if messages[-1].role == "tool":
            reply = Message(role="assistant", content="done")
        else:
            n = len(self.requests)
            code = json.dumps({"code": f"print('{n}: ' + 'x' * {CELL_OUTPUT})"})
            reply = Message(role="assistant", tool_calls=[ToolCall(id=f"call_{n}", name="ipython", arguments=code)])
        return Completion(message=reply, finish_reason="stop", usage=Usage(prompt_tokens=len(body) // 4, completion_tokens=10))


async def scenario(turns: int, refinements: int, context_window: int) -> dict:
    from agent.config_models import Config
    from agent.session import Session

    with tempfile.TemporaryDirectory(prefix="pa-prefix-") as tmp:
        work = Path(tmp)
        os.environ["PRIME_AGENT_HOME"] = str(work / "home")
        project = work / "project"
        (project / ".git").mkdir(parents=True)
        config = Config.model_validate({"model": {"context_window": context_window, "base_prompt": "full"},
                                        "refine": {"auto_every": 0}, "kernel": {"interrupt_grace": 1.0}})
        model = BenchModel()
        applied: list[str] = []
        at = {round(turns * (k + 1) / (refinements + 1)) for k in range(refinements)}
        async with Session(config, model, cwd=project, on_event=lambda e: applied.append(e.type)) as s:
            for t in range(1, turns + 1):
                await s.prompt(f"turn {t}: print a line")
                if t in at:
                    want = applied.count("refinement.applied") + 1
                    s.refine("learn from this")
                    for _ in range(1500):
                        if applied.count("refinement.applied") >= want or applied.count("refinement.failed"):
                            break
                        await asyncio.sleep(0.01)
    return {"requests": model.requests, "after_compaction": sorted(model.after_compaction),
            "refinements_applied": applied.count("refinement.applied"), "compactions": applied.count("compaction")}


# --- measuring ----------------------------------------------------------------------------------------


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # binary search on equal prefixes: fast on 100 kB strings
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def measure(run: dict) -> dict:
    requests, after = run["requests"], set(run["after_compaction"])
    shared = total = shared_out = total_out = broken = 0
    for i in range(1, len(requests)):
        prev, cur = requests[i - 1], requests[i]
        same = common_prefix(prev[:-1], cur)  # the previous request's messages, without its closing bracket
        shared, total = shared + same, total + len(cur)
        if i not in after:
            shared_out, total_out = shared_out + same, total_out + len(cur)
            broken += same < len(prev) - 1
    return {"requests": len(requests), "compactions": run["compactions"], "refinements": run["refinements_applied"],
            "share": shared / total, "share_outside_compactions": shared_out / total_out,
            "prefix_breaks_outside_compactions": broken, "prompt_chars": total, "repeated_chars": shared}


def run_tree(tree: Path, args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--scenario", "--turns", str(args.turns),
                          "--refinements", str(args.refinements), "--context-window", str(args.context_window)],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"the scenario failed in {tree}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--refinements", type=int, default=5)
    p.add_argument("--context-window", type=int, default=10_000, help="tokens: small enough to compact once")
    p.add_argument("--before", default=None, help="the revision to compare with (default: merge-base with main)")
    p.add_argument("--scenario", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.scenario:  # in the tree under test (PYTHONPATH): print the raw run as one JSON line
        sys.path.insert(0, os.environ["PYTHONPATH"])
        print(json.dumps(asyncio.run(scenario(args.turns, args.refinements, args.context_window))))
        return
    sys.path.insert(0, str(ROOT))
    from bench.report import load_average, save

    load = load_average()
    before = args.before or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True,
                                           text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="pa-prefix-before-") as old:
        archive = subprocess.run(["git", "archive", before], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
        rows = {"before": measure(run_tree(Path(old), args)), "after": measure(run_tree(ROOT, args))}
    print(f"{args.turns}-turn scripted session, {args.refinements} refinements; before = {before[:12]}, after = this tree")
    print(f"{'':8} {'requests':>8} {'compact':>7} {'refined':>7} {'share':>7} {'outside compactions':>20} {'breaks':>6}")
    for name, r in rows.items():
        print(f"{name:8} {r['requests']:>8} {r['compactions']:>7} {r['refinements']:>7} {r['share']:>7.1%} "
              f"{r['share_outside_compactions']:>20.1%} {r['prefix_breaks_outside_compactions']:>6}")
    save(RESULTS / "prefix.json", {"turns": args.turns, "refinements": args.refinements, "before_rev": before, **rows},
         load)


if __name__ == "__main__":
    main()
