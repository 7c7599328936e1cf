"""`prime-agent refine loop TASKSET --rounds K --train N --val M --test T ...`: measure refinement.

Rounds of train rollouts, a refinement planned from them alone, and a candidate kept only if it
raises the validation mean without breaking a validation task that passed; then the held-out test
split with the first harness and the last (evals/refine_loop.py). Prints a table per round and the
held-out difference; writes DIR/report.json and DIR/refine.png.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path

from agent.config import ConfigError, home, load_config, merge, parse_override, project_root
from agent.model import ModelError
from evals.cluster import ClusterError
from cli.eval import add_ray
from cli.overrides import add_set
from cli.run import no_model

EXIT_CONFIG = 2
FLAGS = {"rounds": "--rounds", "train": "--train", "val": "--val", "test": "--test", "n": "-n", "concurrency": "-j",
         "timeout": "--timeout", "out": "--out", "resume": "--resume", "model": "--model", "base_url": "--base-url",
         "overrides": "--set", "ray": "--ray"}
"""The loop's own options, by their destination (`refine SESSION` takes none of them)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("refine loop TASKSET", "measure refinement on held-out tasks (docs/harness.md, "
                             "\"Measuring refinement\"); TASKSET is anything `eval` takes")
    g.add_argument("--rounds", type=int, help="refinement rounds (default 3)")
    g.add_argument("--train", type=int, help="tasks the refiner learns from")
    g.add_argument("--val", type=int, help="tasks that decide whether a candidate is kept")
    g.add_argument("--test", type=int, help="held-out tasks, run with the first harness and the last")
    g.add_argument("--seed", type=int, default=0, help="task selection seed (as eval's)")
    g.add_argument("-n", type=int, help="tasks to select (default: train + val + test); the splits are its first")
    g.add_argument("-j", "--concurrency", type=int, help="rollouts at once (default 4)")
    g.add_argument("--timeout", type=float, help="seconds per rollout (default 600)")
    g.add_argument("--out", metavar="DIR", help="run directory (default: outputs/refine/<taskset>--<model>/<run id>)")
    g.add_argument("--resume", metavar="DIR", help="finish an interrupted loop")
    g.add_argument("--model", help="model name (PRIME_AGENT_MODEL): the agent's and the refiner's")
    g.add_argument("--base-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    add_set(g, " (refine.default_scope=user: the loop edits the user scope)")
    add_ray(g)


def given(args: argparse.Namespace) -> list[str]:
    """The loop's options given on the command line."""
    return [flag for name, flag in FLAGS.items() if getattr(args, name, None) not in (None, [])]


def main(args: argparse.Namespace) -> int:
    from evals.refine_loop import LoopSpec, LoopState

    for name in ("rounds", "train", "val", "test", "n", "concurrency"):
        least = 0 if name in ("train", "val", "test") else 1
        if (value := getattr(args, name)) is not None and value < least:
            return _fail(f"{FLAGS[name]} must be at least {least}")
    if args.timeout is not None and args.timeout <= 0:
        return _fail("--timeout must be positive")
    state = None
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "loop.json").is_file():
            return _fail(f"{run_dir}: not a refine loop to resume (no loop.json)")
        state = LoopState.model_validate_json((run_dir / "loop.json").read_text())
        spec = LoopSpec(**state.spec)
    else:
        missing = [f"--{f}" for f in ("train", "val", "test") if getattr(args, f) is None]
        if not args.id or missing:
            return _fail("usage: prime-agent refine loop TASKSET --train N --val M --test T [--rounds K] ..."
                         + (f" (missing {', '.join(missing)})" if missing else ""))
        if args.val < 1 or args.test < 1:
            return _fail("--val and --test must be at least 1: they are what the loop measures on")
        spec = LoopSpec(args.id, args.rounds or 3, args.train, args.val, args.test, args.seed, args.n,
                        args.concurrency or 4, args.timeout or 600.0)
    try:
        sets: dict = {}
        for text in (state.settings.get("set", []) if state else []) + args.overrides:
            merge(sets, parse_override(text))
        for key, flag, saved in (("name", args.model, state and state.model),
                                 ("base_url", args.base_url, state and state.base_url)):
            if flag or saved:
                sets.setdefault("model", {})[key] = flag or saved
        config = load_config(Path("."), sets)
    except ConfigError as e:
        return _fail(str(e))
    if not config.model.configured:
        print(no_model(config.model), file=sys.stderr)
        return EXIT_CONFIG
    if state is None:
        named = Path(spec.taskset).stem if spec.taskset.endswith((".jsonl", ".py")) else spec.taskset
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{named}--{config.model.name}")
        run_dir = Path(args.out) if args.out else Path("outputs/refine") / slug / time.strftime("%Y%m%d-%H%M%S")
        if run_dir.is_dir() and any(run_dir.iterdir()):
            return _fail(f"{run_dir} is not empty; pass --resume {run_dir} to finish that run, or another --out")
    settings = {"set": (state.settings.get("set", []) if state else []) + args.overrides}
    cluster = None
    try:
        if args.ray:  # before anything is written: a cluster that cannot be reached leaves no run behind
            from evals.cluster import Cluster

            cluster = Cluster.connect(args.ray, num_cpus=args.ray_cpus)
        return asyncio.run(_run(spec, config, run_dir, settings, cluster))
    except (ValueError, ModelError, ClusterError) as e:  # LoopError too: an outage, a scope changed behind the loop
        begun = (run_dir / "loop.json").is_file()
        return _fail(f"{e}" + (f"\nfinish the run with: prime-agent refine loop --resume {run_dir}" if begun else ""))
    finally:
        if cluster is not None:
            cluster.close()


async def _run(spec, config, run_dir: Path, settings: dict, cluster=None) -> int:
    from rich.console import Console

    from agent.providers import open_model
    from evals.refine_loop import RefineLoop

    err = Console(stderr=True)
    roots = {"user": home() / "harness", "project": project_root(Path(".").resolve()) / ".prime-agent" / "harness"}
    model = open_model(config.model)
    try:
        loop = RefineLoop(spec, config, model, run_dir, roots, settings=settings,
                          say=lambda text: err.print(f"[dim]{text}[/dim]"), cluster=cluster)
        err.print(f"refine loop: {run_dir}")
        report = await loop.run()
    finally:
        await model.close()
    print_report(Console(width=None if sys.stdout.isatty() else 160), report, run_dir)  # a file or pipe: no wrapping
    return 0


def print_report(console, report, run_dir: Path) -> None:
    from rich.table import Table

    t = Table(title=f"{report.taskset}: {len(report.rounds)} rounds, the {report.scope} scope "
                    f"(train {len(report.splits['train'])}, val {len(report.splits['val'])}, "
                    f"test {len(report.splits['test'])})")
    for name, justify in (("round", "right"), ("candidate", "left"), ("validation", "right"), ("kept", "left"),
                          ("regressions", "right"), ("refused", "right"), ("tokens", "right"), ("cost", "right"),
                          ("reason", "left")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in report.rounds:
        t.add_row(str(r.round), r.summary[:40] or "-", f"{_num(r.val.before)} -> {_num(r.val.after)}",
                  "yes" if r.kept else "no", str(len(r.regressions)),
                  f"{len(r.refused)}" + (f" ({r.guard_refusals} guard)" if r.guard_refusals else ""),
                  f"{r.tokens:,}", f"${r.cost:.4f}", _short(r.reason))
    console.print(t)
    h = report.test  # plain lines: one each, whatever the terminal's width
    print(f"test split, n={h.n}: before {h.before.mean:.3f} [{h.before.ci95[0]:.3f}, {h.before.ci95[1]:.3f}], "
          f"after {h.after.mean:.3f} [{h.after.ci95[0]:.3f}, {h.after.ci95[1]:.3f}]; "
          f"difference {h.diff:+.3f}, 95% CI [{h.ci95[0]:+.3f}, {h.ci95[1]:+.3f}] (paired, the task as the unit)")
    print(f"harness {report.harness_before[:12]} -> {report.harness_after[:12]}; {report.tokens:,} tokens, "
          f"${report.cost:.4f}")
    print(f"report: {run_dir / 'report.json'}; figure: {run_dir / 'refine.png'}")


def _short(text: str, width: int = 100) -> str:
    """A reason in the table: a failed plan's quotes the model's reply (report.json holds all of it)."""
    return text if len(text) <= width else text[:width - 1] + "…"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fail(message: str) -> int:
    print(f"prime-agent: {message}", file=sys.stderr)
    return EXIT_CONFIG

