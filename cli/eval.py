"""`prime-agent eval TASKSET ...` and `prime-agent eval compare RUN_A RUN_B`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import platform
import re
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from agent.config import ConfigError, home, load_config, project_root
from cli import version
from cli.overrides import add_set, read_overrides
from cli.run import no_model
from harness_store.entries import HarnessError

EXIT_CONFIG = 2


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("taskset", help="reverse_text, kernel_tasks, repo_fix, a .jsonl file, a .py module, "
                   "rg:DATASET[?k=v&...] (reasoning-gym), vf:TASKSET_ID[?k=v&...] (verifiers); or 'compare'")
    p.add_argument("runs", nargs="*", help="with compare: two run directories")
    p.add_argument("--model", help="model name (PRIME_AGENT_MODEL)")
    p.add_argument("--base-url", action="append", help="OpenAI-compatible endpoint (OPENAI_BASE_URL); with --ray, "
                   "give it again for more: each rollout goes to the one with the fewest in flight")
    p.add_argument("-n", type=int, help="how many tasks (default: the set's own size)")
    p.add_argument("-r", "--rollouts", type=int, default=1, help="rollouts per task")
    p.add_argument("-j", "--concurrency", type=int, default=4, help="rollouts at once")
    p.add_argument("-c", type=int, dest="deprecated_concurrency", metavar="N",
                   help="deprecated: -j N (-c goes in the next release: elsewhere it is --set, in the app --continue)")
    add_set(p, " for the rollouts' sessions (a resumed run keeps its own unless given)")
    p.add_argument("--seed", type=int, default=0, help="task selection seed")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per rollout")
    p.add_argument("--out", help="run directory (default: outputs/evals/<taskset>--<model>/<run id>)")
    p.add_argument("--resume", metavar="DIR", help="finish a run: keep its results, rerun errored and missing rollouts")
    add_ray(p)
    p.add_argument("--harness", metavar="REF", help="evaluate this harness version (a commit, a tag, a refinement id, "
                   "or SCOPE@REV ...) on private copies; the live harness is left as it is")


def add_ray(p) -> None:
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run each rollout as a task on a Ray "
                   "cluster: auto, HOST:PORT or ray://HOST:PORT (docs/cluster.md); -j is then the rollouts in flight")
    p.add_argument("--ray-cpus", type=float, default=1.0, metavar="N", help="with --ray: CPUs a rollout takes (1)")


def connect(args: argparse.Namespace, urls: list[str]):
    """The Ray cluster `--ray` names (None without it); ClusterError where it cannot be joined."""
    if not args.ray:
        if len(urls) > 1:
            from evals.cluster import ClusterError

            raise ClusterError("several --base-url are for --ray: one process talks to one endpoint")
        return None
    from evals.cluster import Cluster

    return Cluster.connect(args.ray, urls if len(urls) > 1 else None, args.ray_cpus)


def main(args: argparse.Namespace) -> int:
    from evals.cluster import ClusterError
    from evals.runner import EvalSpec, compare, read_results

    if args.taskset == "compare":
        if len(args.runs) != 2:
            return _fail("usage: prime-agent eval compare RUN_A RUN_B")
        missing = [r for r in args.runs if not (Path(r) / "results.jsonl").is_file()]
        if missing:
            return _fail(f"not an eval run (no results.jsonl): {', '.join(missing)}")
        a, b = (read_results(Path(r) / "results.jsonl") for r in args.runs)
        report = compare(a, b)
        for task, (pa, pb) in sorted(report["differences"].items()):
            print(f"{task:<32} {pa:.2f} -> {pb:.2f}")
        verdict = "beyond noise" if report["beyond_noise"] else "within noise"
        print(f"{report['tasks']} tasks in both: {report['gained']} gained, {report['lost']} lost; "
              f"exact McNemar p = {report['p_value']:.3f} ({verdict})")
        return 0
    if args.deprecated_concurrency is not None:
        print("prime-agent eval: -c N is deprecated and goes in the next release; use "
              f"-j {args.deprecated_concurrency}", file=sys.stderr)
        args.concurrency = args.deprecated_concurrency
    for flag, value in (("-n", args.n), ("--rollouts", args.rollouts), ("--concurrency", args.concurrency)):
        if value is not None and value < 1:
            return _fail(f"{flag} must be at least 1")
    if args.timeout <= 0:
        return _fail("--timeout must be positive")
    meta = {}
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "metadata.json").is_file():
            return _fail(f"{run_dir}: not an eval run to resume (no metadata.json)")
        meta = json.loads((run_dir / "metadata.json").read_text())
    urls: list[str] = args.base_url or meta.get("base_urls") or []
    try:  # a resumed run keeps its model and overrides unless told otherwise
        overrides: dict = read_overrides(args, "eval") if args.overrides else meta.get("overrides", {})
        for key, flag, saved in (("name", args.model, meta.get("model")),
                                 ("base_url", (args.base_url or [None])[0], meta.get("base_url"))):
            if flag or saved:
                overrides.setdefault("model", {})[key] = flag or saved
        config = load_config(Path("."), overrides)
    except ConfigError as e:
        return _fail(str(e))
    if not config.model.configured:
        print(no_model(config.model), file=sys.stderr)
        return EXIT_CONFIG
    if args.resume:
        spec = EvalSpec(**meta["spec"])
    else:
        try:
            version = harness_version(args.harness) if args.harness else None
        except HarnessError as e:
            return _fail(f"--harness {args.harness}: {e}")
        spec = EvalSpec(args.taskset, args.n, args.rollouts, args.concurrency, args.seed, args.timeout, version)
        named = Path(args.taskset).stem if args.taskset.endswith((".jsonl", ".py")) else args.taskset  # rg:a?b.c=1
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{named}--{config.model.name}")
        run_dir = Path(args.out) if args.out else Path("outputs/evals") / slug / time.strftime("%Y%m%d-%H%M%S")
        if run_dir.is_dir() and any(run_dir.iterdir()):
            return _fail(f"{run_dir} is not empty; pass --resume {run_dir} to finish that run, or another --out")
    try:  # before anything is written: a cluster that cannot be reached leaves no run behind
        cluster = connect(args, urls)
    except ClusterError as e:
        return _fail(str(e))
    try:
        return asyncio.run(_run(spec, config, run_dir, overrides, cluster, urls))
    except ValueError as e:
        return _fail(str(e))
    finally:
        if cluster is not None:
            cluster.close()


async def _run(spec, config, run_dir: Path, overrides: dict, cluster=None, urls: list[str] = []) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from agent.providers import open_model
    from evals.runner import evaluate, read_results, summarize
    from evals.tasksets import load_taskset

    tasks = load_taskset(spec.taskset).tasks(spec.n, seed=spec.seed)
    kept = copy.deepcopy(overrides)  # for --resume; never a key
    kept.get("model", {}).pop("api_key", None)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metadata.json").write_text(json.dumps({
        "spec": asdict(spec), "model": config.model.name, "base_url": config.model.base_url,
        "task_ids": [t.id for t in tasks], "python": platform.python_version(), "prime_agent": version(),
        "config": config.model_dump(mode="json", exclude={"model": {"api_key"}}),
        "overrides": kept, **({"base_urls": urls} if len(urls) > 1 else {}),
    }, indent=1))
    model = open_model(config.model)
    console = Console(stderr=True)
    if spec.harness:
        console.print("harness: " + " ".join(f"{scope}@{commit[:12]}" for scope, commit in spec.harness.items()))
    done_before = sum(r.outcome in ("passed", "failed", "timed_out") for r in read_results(run_dir / "results.jsonl"))
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task(spec.taskset, total=len(tasks) * spec.rollouts, completed=done_before)
        try:
            with harness_copies(spec.harness) as roots:
                results = await evaluate(spec, config, model, run_dir, on_result=lambda r: progress.advance(bar),
                                         harness_roots=roots, cluster=cluster)
        finally:
            await model.close()
    _print_summary(Console(), summarize(results), run_dir)  # the summary is the output: stdout
    return 0


def harness_stores() -> dict:
    """The live harness scopes an eval's sessions would use: the user's and this project's."""
    from agent.harness import scope_roots
    from harness_store.store import HarnessStore

    return {scope: HarnessStore(root, scope) for scope, root in scope_roots(home(), project_root(Path(".")), None).items()}


def harness_version(ref: str) -> dict[str, str]:
    """Every scope's commit in the version `ref` names (scopes it does not name: their HEAD now)."""
    from harness_store.versions import resolve_version

    stores = harness_stores()
    named = resolve_version(ref, stores)
    return {scope: named.get(scope) or head for scope, store in stores.items() if (head := store.head()) or scope in named}


@contextlib.contextmanager
def harness_copies(version: dict[str, str] | None):
    """Private copies of the harness at `version` (each scope it names at its commit, the others empty),
    removed after; None: the live harness, as a session finds it."""
    if version is None:
        yield None
        return
    from harness_store.versions import check_out

    with tempfile.TemporaryDirectory(prefix="pa-harness-") as tmp:
        stores = harness_stores()
        yield check_out(stores, {scope: version.get(scope) for scope in stores}, Path(tmp))


def _print_summary(console, s, run_dir: Path) -> None:
    from rich.table import Table

    t = Table(title=f"{s.tasks} tasks, {s.rollouts} rollouts")
    t.add_column("measure")
    t.add_column("value", justify="right")
    if s.pass_rate is not None:
        t.add_row("pass rate (95% CI)", f"{s.pass_rate:.3f} ({s.pass_rate_ci[0]:.3f}-{s.pass_rate_ci[1]:.3f})")
    if s.mean_reward is not None:
        t.add_row("mean reward (95% CI)", f"{s.mean_reward:.3f} ({s.mean_reward_ci[0]:.3f}-{s.mean_reward_ci[1]:.3f})")
    for k, v in s.pass_at_k.items():
        t.add_row(f"pass@{k}", f"{v:.3f}")
    for name, mean in sorted(s.metrics.items()):
        t.add_row(f"mean {name}", f"{mean:.3f}")
    t.add_row("mean tokens", f"{s.mean_tokens:,.0f}")
    t.add_row("mean seconds", f"{s.mean_seconds:.2f}")
    for outcome, n in s.counts.items():
        t.add_row(outcome, str(n))
    console.print(t)
    console.print(f"results: {run_dir / 'results.jsonl'}")


def _fail(message: str) -> int:
    print(f"prime-agent: {message}", file=sys.stderr)
    return EXIT_CONFIG
