"""The closed loop, offline: the agent's own sessions train the model that serves them.

    prime-agent demo [--steps N] [--eval-tasks N] [--fresh-warm-start]
    prime-agent demo --model smollm2-135m-instruct       # a real model (pulled if need be), LoRA

1. Starts the daemon (if none runs) and serves the local policy (a small byte-level transformer, or
   with --model a Hugging Face model: examples/closed_loop/smollm2.toml) on an OpenAI-compatible server.
2. Warm start: supervised steps on noisy demonstrations of examples/closed_loop/config.toml's
   tasks (questions about files in the session's working directory). Half the demonstrations
   compute the answer in a code cell, half guess it without running anything. Cached under
   $PRIME_AGENT_HOME/demo/ and reused while the config is unchanged.
3. Evaluates the warm start: each evaluation task is a daemon session (a real kernel, the agent's
   turn loop in text mode) whose answer is checked.
4. RL: each step runs a group of daemon sessions per task, turns their trajectories into token-level
   samples (rl.data: the policy's own tokens trainable, everything the harness inserted masked),
   takes one IPO step, and swaps the new weights into the server.
5. Evaluates the trained policy on the same tasks, then prints a before/after table with the spread
   over tasks and writes a reward-curve PNG.

Everything lands in $PRIME_AGENT_HOME/demo/runs/<time>/ (results.json, metrics.jsonl, rollouts.jsonl: every
session and its reward; reward.png). Of its sessions two stay in the daemon's list, the first evaluation
task's before and after RL; the others are deleted with their files once judged (training ones once the
run is over: the trainer reads their trajectories). A daemon the demo started is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from agent.config import home  # noqa: E402
from agent.layout import SessionLayout  # noqa: E402
from cli import invocation  # noqa: E402
from daemon.client import Client, DaemonError, DaemonUnavailable, connect, daemon_pid  # noqa: E402
from daemon.schemas import Status  # noqa: E402
from evals.env import Environment, Task  # noqa: E402
from evals.runner import Result, judge, lay_out, prompt_of, ran_past  # noqa: E402
from evals.tasksets import task_key  # noqa: E402
from rl.config import RunConfig, load  # noqa: E402
from rl.envs import load as load_env  # noqa: E402
from rl.envs.harness import HarnessOrchestrator, agent_overrides  # noqa: E402
from rl.policy.checkpoint import latest_checkpoint  # noqa: E402
from rl.pull import KNOWN, ModelError, pull  # noqa: E402
from rl.serve import BackgroundServer, engine_from, hf_engine  # noqa: E402
from rl.train import sft, train  # noqa: E402

CONFIG = Path(__file__).with_name("config.toml")
HF_CONFIG = Path(__file__).with_name("smollm2.toml")
"""The run with --model: a Hugging Face model in place of the byte policy."""
EVAL_SEED = 424_242
"""Evaluation tasks' seed: apart from the warm start's (rl.train.WARM_START_SEED + step) and RL's
(rl.orchestrator.rollout_seed)."""


class DaemonOrchestrator(HarnessOrchestrator):
    """Rollouts as daemon sessions: created with the RL agent settings (no checkpoints: nobody rewinds
    them), prompted with the task, and followed to the end of the turn. Training sessions are deleted
    from the list once done (their files stay until the run is over: the trainer reads their
    trajectories); evaluation sessions are deleted with their files once judged, but for the first
    task's first rollout (`KEPT`), kept asleep to open in the app."""

    KEPT = 0
    """Which evaluation task's first rollout stays listed, before and after RL."""

    def __init__(self, base_url: str, env: Environment, cfg: RunConfig, run_dir: Path, concurrency: int,
                 label: str = "train", progress: Progress | None = None):
        super().__init__(base_url, env, cfg.train, cfg.env, run_dir)
        self.concurrency, self.label, self.progress = concurrency, label, progress
        self.overrides = {**agent_overrides(base_url, cfg.train, cfg.env), "checkpoints": {"enabled": False}}
        self.log = run_dir / "rollouts.jsonl"
        self.kept: str | None = None
        """The evaluation session left listed."""

    async def rollouts(self, tasks: list[Task], group: int, step: int) -> list[tuple[Result, Path]]:
        progress = self.progress
        bar = progress.add_task(f"{self.label} rollouts", total=len(tasks) * group) if progress else None
        slots = asyncio.Semaphore(self.concurrency)
        async with Client() as client:

            async def one(task: Task, r: int) -> tuple[Result, Path]:
                async with slots:
                    keep = task is tasks[self.KEPT] and r == 0
                    result, trajectory = await self._one(client, task, r, step, keep)
                if progress is not None and bar is not None:
                    progress.advance(bar)
                return result, trajectory

            try:
                return await asyncio.gather(*(one(task, r) for task in tasks for r in range(group)))
            finally:
                if progress is not None and bar is not None:
                    progress.remove_task(bar)

    async def _one(self, client: Client, task: Task, r: int, step: int, keep: bool) -> tuple[Result, Path]:
        started = time.monotonic()
        result = Result(task.id, r, task_key(task, {"label": self.label, "step": step}), "error")
        work = self.run_dir / "work" / f"{self.label}-{step}-{task.id}-{r}"
        work.mkdir(parents=True, exist_ok=True)
        lay_out(task.files, work)
        trajectory = work / "missing"
        try:
            session = await client.create_session(work, title=f"demo {self.label} {task.id} #{r}",
                                                  config=self.overrides)
            result.session_id, trajectory = session.id, SessionLayout(Path(session.dir)).trajectory
            turn = await client.send(session.id, prompt_of(task))
            finished = await asyncio.wait_for(client.wait_turn(session.id, turn.turn_id), self.env_config.timeout)
            result.turns, result.cells, result.tokens = finished.steps, finished.cells, finished.usage.completion_tokens
            await judge(result, self.env, task, finished.outcome, finished.answer, finished.error, work)
            if self.label == "train":
                await client.delete(session.id)  # its files go once the run is over (`prune`)
            elif keep:
                await client.sleep(session.id)
                self.kept = session.id
            else:
                await client.delete(session.id, files=True)
        except TimeoutError:
            ran_past(result, self.env_config.timeout)
            with contextlib.suppress(DaemonError, DaemonUnavailable):  # its turn must not run on unseen
                await client.interrupt(result.session_id, drop_queued=True)
        except (DaemonError, DaemonUnavailable) as e:
            result.error = str(e)
        result.seconds = time.monotonic() - started
        with open(self.log, "a") as f:
            f.write(json.dumps({"label": self.label, "step": step, "task": task.id, "rollout": r,
                                "session": result.session_id, "outcome": result.outcome, "reward": result.reward,
                                "cells": result.cells, "completion_tokens": result.tokens,
                                "error": result.error}) + "\n")
        return result, trajectory


# --- evaluation ----------------------------------------------------------------------------------------


class RolloutsFailed(Exception):
    """Every rollout of an evaluation failed to run: nothing to learn from, nothing to compare."""


def evaluation(cfg: RunConfig, env: Environment, tasks: list[Task], args: argparse.Namespace, run_dir: Path,
               weights: Path, label: str, console: Console) -> dict:
    """`tasks` x args.eval_rollouts daemon sessions against a policy server on `weights`; their summary
    (with `kept`: the session left listed)."""
    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    engine = hf_engine(str(latest_checkpoint(weights) or weights)) if cfg.model.hf else \
        engine_from(str(weights), truncate=True)
    with BackgroundServer(engine) as url, progress:
        orchestrator = DaemonOrchestrator(url, env, cfg, run_dir, args.concurrency, label, progress)
        results = [r for r, _ in asyncio.run(orchestrator.rollouts(tasks, args.eval_rollouts, 0))]
    if all(r.outcome == "error" for r in results):
        raise RolloutsFailed(f"every {label} rollout failed; the first: {results[0].error}")
    s = {**summary(results), "kept": orchestrator.kept}
    _log(console, f"{label}: reward {s['reward']['mean']:.3f} over {len(tasks)} tasks x {args.eval_rollouts}, "
                  f"{s['ran_code']:.0%} answered by running code, {s['errors']} errored")
    return s


def summary(results: list[Result]) -> dict:
    """Per task: the mean reward of its rollouts; then the mean and a 95% interval over tasks."""
    by_task: dict[str, list[Result]] = {}
    for r in results:
        by_task.setdefault(r.task_id, []).append(r)
    per_task = {t: statistics.fmean(r.reward or 0.0 for r in rs) for t, rs in by_task.items()}
    return {
        "reward": _mean_ci(list(per_task.values())),
        "success_rate": sum(r.outcome == "passed" for r in results) / len(results),
        "ran_code": sum(r.cells > 0 for r in results) / len(results),
        "completion_tokens": statistics.fmean(r.tokens for r in results),
        "errors": sum(r.outcome in ("error", "timed_out") for r in results),
        "per_task": per_task,
    }


def _mean_ci(xs: list[float]) -> dict:
    mean = statistics.fmean(xs)
    half = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(xs)}


def report(before: dict, after: dict, console: Console) -> dict:
    common = sorted(before["per_task"].keys() & after["per_task"].keys())
    change = _mean_ci([after["per_task"][t] - before["per_task"][t] for t in common])
    table = Table(title="before and after RL (same evaluation tasks)")
    table.add_column("")
    table.add_column("warm start", justify="right")
    table.add_column("after RL", justify="right")
    table.add_column("change", justify="right")
    def fmt(s: dict) -> str:
        return f"{s['mean']:.3f}  [{s['low']:.3f}, {s['high']:.3f}]"

    table.add_row("reward (95% CI over tasks)", fmt(before["reward"]), fmt(after["reward"]), f"{change['mean']:+.3f}  "
                  f"[{change['low']:+.3f}, {change['high']:+.3f}]")
    rows = [("success_rate", "success rate", ".1%"), ("ran_code", "answered by running code", ".1%"),
            ("completion_tokens", "completion tokens / rollout", ".1f"), ("errors", "errored rollouts", "d")]
    for key, name, spec in rows:
        table.add_row(name, format(before[key], spec), format(after[key], spec),
                      format(after[key] - before[key], "+" + spec))
    console.print(table)
    return change


def plot(history: list[dict], before: dict, after: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([h["step"] + 1 for h in history], [h["reward_mean"] for h in history], marker=".",
            label="training rollouts (mean reward per step)")
    for x, s, name in [(0, before, "warm start"), (len(history), after, "after RL")]:
        r = s["reward"]
        ax.errorbar([x], [r["mean"]], yerr=[[r["mean"] - r["low"]], [r["high"] - r["mean"]]], fmt="o", capsize=4,
                    label=f"evaluation: {name} (95% CI)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("the agent's own sessions train its policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the run -------------------------------------------------------------------------------------------


def warm_start(cfg: RunConfig, fresh: bool, log) -> Path:
    """The SFT checkpoint for this config, trained once and reused (keyed by the settings it depends on)."""
    key = hashlib.sha256(json.dumps([cfg.model.model_dump(), cfg.env.model_dump(), cfg.sft.model_dump(),
                                     cfg.train.max_tokens, cfg.train.seed], sort_keys=True).encode()).hexdigest()[:12]
    root = home() / "demo" / f"warm-start-{key}"
    if fresh and root.exists():
        import shutil

        shutil.rmtree(root)
    if (done := latest_checkpoint(root / "sft")) is not None:
        log(f"warm start: reusing {done}")
        return done
    log(f"warm start: {cfg.sft.steps} supervised steps on noisy demonstrations (cached for next time in {root})")
    return sft(cfg.model_copy(update={"train": cfg.train.model_copy(update={"out": str(root)})}), log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prime-agent demo", description=__doc__.split("\n\n")[0],
                                epilog="Other options are config overrides, as for rl train: --train.lr 1e-3 ...")
    p.add_argument("--steps", type=int, help="RL steps (default: the config's)")
    p.add_argument("--eval-tasks", type=int, default=32, help="evaluation tasks (default 32)")
    p.add_argument("--eval-rollouts", type=int, default=2, help="rollouts per evaluation task (default 2)")
    p.add_argument("--concurrency", type=int, default=8, help="sessions at once (default 8)")
    p.add_argument("--fresh-warm-start", action="store_true", help="train the warm start again")
    p.add_argument("--model", help="a Hugging Face model in place of the byte policy: a name `prime-agent models "
                                    "list` knows (pulled if need be) or a model directory; the run is "
                                    "examples/closed_loop/smollm2.toml with its [model] hf")
    p.add_argument("--config", help="the run config (default examples/closed_loop/config.toml, with --model "
                                    "examples/closed_loop/smollm2.toml)")
    args, extra = p.parse_known_args(argv)
    console = Console()
    run_dir = home() / "demo" / "runs" / time.strftime("%Y%m%d-%H%M%S")
    overrides = [*extra, "--train.out", json.dumps(str(run_dir))]
    if args.model:
        overrides += ["--model.hf", json.dumps(args.model)]
        if args.model in KNOWN:
            try:
                pull(args.model, lambda line: _log(console, line))
            except ModelError as e:
                console.print(f"prime-agent demo: {e}", style="red", markup=False)
                return 1
    args.config = args.config or str(HF_CONFIG if args.model else CONFIG)
    if args.steps is not None:
        overrides += ["--train.steps", str(args.steps)]
    try:
        cfg = load(args.config, overrides)
    except (ValueError, OSError) as e:
        console.print(f"prime-agent demo: {e}", style="red", markup=False)
        return 2
    started_daemon = daemon_pid() is None  # the first session starts it: stopped again at the end
    try:
        return run(cfg, args, run_dir, console, started_daemon)
    except DaemonUnavailable as e:
        console.print(f"prime-agent demo: the daemon is not running: {e}", style="red", markup=False)
        return 1
    except RolloutsFailed as e:
        console.print(f"prime-agent demo: {e}\n(a daemon started by older code? `prime-agent daemon stop`, then run "
                      "the demo again)", style="red", markup=False)
        return 1
    except KeyboardInterrupt:
        console.print(f"\ninterrupted: what ran is in {run_dir}", markup=False)
        return 130
    finally:
        tidy(run_dir, started_daemon, console)


def tidy(run_dir: Path, started_daemon: bool, console: Console) -> None:
    """The run's deleted sessions' files removed (the training sessions'), and the daemon stopped if
    the demo started it. Run folders stay: each is a record of its run."""
    if daemon_pid() is None:
        return

    async def prune() -> int:
        async with Client() as client:
            return (await client.prune(cwd=run_dir)).bytes

    try:
        freed = asyncio.run(prune())
        _log(console, f"removed the files of the run's deleted sessions: {freed / 1e6:.1f} MB")
    except (DaemonError, DaemonUnavailable) as e:
        _log(console, f"the run's deleted sessions could not be tidied: {e}")
    if started_daemon and (pid := daemon_pid()) is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while daemon_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        _log(console, f"stopped the daemon the demo started (pid {pid})")


def run(cfg: RunConfig, args: argparse.Namespace, run_dir: Path, console: Console, started_daemon: bool) -> int:
    started = time.monotonic()
    run_dir.mkdir(parents=True)
    env = load_env(cfg.env.name, **cfg.env.options)

    console.rule("[bold]1. the daemon and the policy")
    status = asyncio.run(_daemon_status())
    _log(console, f"daemon pid {status.pid}, {status.sessions} sessions; run folder {run_dir}")
    warm = warm_start(cfg, args.fresh_warm_start, lambda text: _log(console, text))
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"init_from": str(warm)})})
    tasks = env.tasks(args.eval_tasks, seed=EVAL_SEED)

    console.rule("[bold]2. evaluate the warm start")
    before = evaluation(cfg, env, tasks, args, run_dir, warm, "before", console)

    console.rule(f"[bold]3. RL: {cfg.train.steps} steps x {cfg.train.batch_size} tasks x {cfg.train.group_size} "
                 f"sessions, {cfg.loss.name.upper()} loss")
    history = train(cfg, log=lambda text: _log(console, text), progress=True,
                    orchestrator=lambda servers: DaemonOrchestrator(servers.url, env, cfg, run_dir,
                                                                     args.concurrency))

    console.rule("[bold]4. evaluate the trained policy")
    after = evaluation(cfg, env, tasks, args, run_dir, run_dir / "checkpoints", "after", console)

    console.rule("[bold]5. before and after")
    change = report(before, after, console)
    plot(history, before, after, run_dir / "reward.png")
    minutes = (time.monotonic() - started) / 60
    (run_dir / "results.json").write_text(json.dumps({
        "before": before, "after": after, "change": change, "history": history, "minutes": minutes,
        "config": cfg.model_dump(), "eval": {"tasks": args.eval_tasks, "rollouts": args.eval_rollouts,
                                             "seed": EVAL_SEED}}, indent=1))
    verdict = "beats" if change["low"] > 0 else "does not clearly beat"
    console.print(f"After RL the reward {verdict} the warm start's: {change['mean']:+.3f} "
                  f"(95% CI over tasks [{change['low']:+.3f}, {change['high']:+.3f}]). {minutes:.1f} minutes.")
    console.print(f"\nRun folder: {run_dir} (results.json, metrics.jsonl, rollouts.jsonl, [bold]reward.png[/])")
    console.print(NEXT.format(pa=invocation(), before=before["kept"], after=after["kept"],
                              stopped="\nThe daemon the demo started stops now; these commands start it again."
                              if started_daemon else ""),
                  markup=False, highlight=False, soft_wrap=True)
    return 0


def _log(console: Console, text: str) -> None:
    console.print(text, style="dim", markup=False, highlight=False)


async def _daemon_status() -> Status:
    client = await connect()
    try:
        return await client.status()
    finally:
        await client.close()


NEXT = """
Two sessions stay, the first evaluation task before and after RL; the others went with their files
(rollouts.jsonl keeps each one's outcome and reward).{stopped}
  {pa} --resume {before}      open the one before RL in the app (cells, outputs, the answer)
  {pa} --resume {after}      and the one after
  {pa} sessions delete {before} {after}     when you are done with them
  {pa}                                the app itself, on a new session in this directory

The same loop with a real model (any OpenAI-compatible server that returns logprobs, e.g. vLLM):
  vllm serve MODEL --port 8000               or Ollama, llama.cpp, OpenRouter, ...
  OPENAI_BASE_URL=http://localhost:8000/v1 PRIME_AGENT_MODEL=MODEL {pa}     (with [model] record_logprobs = true
                                             in $PRIME_AGENT_HOME/config.toml: every session records logprobs)
  {pa} rate last 1                    rate a session (or write a rubric)
  {pa} rl ingest --all -o samples.jsonl   token-level samples: sampled tokens trainable, the rest masked
"""


if __name__ == "__main__":
    sys.exit(main())
