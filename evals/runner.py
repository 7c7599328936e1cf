"""Run a task set through real agent sessions, and summarise the outcomes.

Each rollout is a session in a fresh temporary workspace. Outcomes: `passed | failed` (the
model's answer, judged), `timed_out` (the rollout ran past its time) and `error` (the model or
the runtime failed). Timed-out and errored rollouts are counted apart, never scored as failures
and never used as training data. Results append to `results.jsonl` as they finish; a resumed
run keeps finished rollouts and reruns the errored and missing ones.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.config_models import Config
from agent.kernel.reaper import host_tag, remove_gone_hosts_dirs
from agent.layout import SessionLayout
from agent.model import Model
from agent.session import Session
from evals.env import Environment, Task
from evals.scoring import TooLarge
from evals.stats import mean_ci, wilson
from evals.tasksets import load_taskset, task_key

KEPT = ("passed", "failed", "timed_out")
"""Outcomes a resumed run keeps; errored and missing rollouts run again."""


@dataclass
class EvalSpec:
    taskset: str
    n: int | None = None
    rollouts: int = 1
    concurrency: int = 4
    seed: int = 0
    timeout: float = 600.0
    harness: dict[str, str] | None = None
    """The harness version evaluated, each scope's commit (`eval --harness`, the refine loop); None: the
    harness in force."""

    def identity(self, model: str, base_url: str | None) -> dict[str, Any]:
        """What must match for a resumed rollout to count as the same."""
        return {"taskset": self.taskset, "seed": self.seed, "timeout": self.timeout, "model": model, "base_url": base_url,
                **({"harness": self.harness} if self.harness else {})}


@dataclass
class Result:
    task_id: str
    rollout: int
    key: str
    outcome: str
    reward: float | None = None
    check: str = ""
    turns: int = 0
    cells: int = 0
    tokens: int = 0
    cost: float = 0.0
    """Dollars the rollout's model calls cost (`Usage.cost`)."""
    seconds: float = 0.0
    session_id: str = ""
    harness_version: str | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """The environment's measures beside the reward (a verifiers task's metrics)."""
    node: str | None = None
    """The Ray node it ran on (evals/cluster.py); None: in this process."""


class Remote(Protocol):
    """Somewhere else rollouts run (evals.cluster.Cluster: a Ray cluster's nodes)."""

    async def rollout(self, taskset: str, task: Task, r: int, key: str, spec: EvalSpec, config: Config,
                      run_dir: Path, harness_roots: dict | None = None) -> Result: ...


@dataclass
class Summary:
    counts: dict[str, int]
    pass_rate: float | None
    pass_rate_ci: tuple[float, float] | None
    mean_reward: float | None
    mean_reward_ci: tuple[float, float] | None
    pass_at_k: dict[int, float]
    mean_tokens: float
    mean_seconds: float
    tasks: int
    rollouts: int
    per_task: dict[str, float] = field(default_factory=dict)
    """Each task's pass fraction over its scored rollouts."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Each of the environment's metrics, averaged over the scored rollouts that report it."""


async def evaluate(spec: EvalSpec, config: Config, model: Model, run_dir: Path,
                   on_result: Callable[[Result], None] | None = None, harness_roots: dict | None = None,
                   tasks: list[Task] | None = None, cluster: Remote | None = None) -> list[Result]:
    """Run what `run_dir/results.jsonl` does not hold yet; return every result, in task order.

    The Python API for the other users: the refiner's gate, the refine loop and RL evaluation pass
    their own harness (`harness_roots`: a session scope of its own is added to each rollout where it
    names none), model (a policy server serving a checkpoint) or `tasks` (a split of the set's
    selection), and `summarize()`. With `cluster` each rollout is a Ray task on one of its nodes, at most
    `spec.concurrency` in flight."""
    env = load_taskset(spec.taskset, scoring_sandbox=config.sandbox)
    tasks = env.tasks(spec.n, seed=spec.seed) if tasks is None else tasks
    identity = spec.identity(model.name, config.model.base_url)
    run_dir.mkdir(parents=True, exist_ok=True)
    results_path = run_dir / "results.jsonl"
    wanted = {(t.id, r): task_key(t, identity) for t in tasks for r in range(spec.rollouts)}
    kept = {(r.task_id, r.rollout): r for r in read_results(results_path)
            if r.outcome in KEPT and wanted.get((r.task_id, r.rollout)) == r.key}
    _write(results_path, list(kept.values()))  # drop errored, stale and torn rows before appending
    owed = [(t, r) for t in tasks for r in range(spec.rollouts) if (t.id, r) not in kept]
    slots = asyncio.Semaphore(spec.concurrency)
    lock = asyncio.Lock()

    async def one(task: Task, r: int) -> None:
        async with slots:
            if cluster is None:
                result = await rollout(env, task, r, wanted[(task.id, r)], spec, config, model, run_dir, harness_roots)
            else:
                result = await cluster.rollout(spec.taskset, task, r, wanted[(task.id, r)], spec, config, run_dir,
                                               harness_roots)
        async with lock:
            kept[(task.id, r)] = result
            with open(results_path, "a") as f:
                f.write(json.dumps(asdict(result)) + "\n")
        if on_result:
            on_result(result)

    await asyncio.gather(*(one(t, r) for t, r in owed))
    ordered = [kept[(t.id, r)] for t in tasks for r in range(spec.rollouts)]
    _write(results_path, ordered)  # the final file: complete, in order, replaced atomically
    return ordered


async def rollout(env: Environment, task: Task, r: int, key: str, spec: EvalSpec, config: Config, model: Model,
                  run_dir: Path, harness_roots: dict | None = None) -> Result:
    started = time.monotonic()
    result = Result(task.id, r, key, "error")
    limit = spec.timeout
    with workspace() as tmp:
        work = Path(tmp)
        session = rollout_session(config, model, work, rollout_layout(run_dir, result).dir, harness_roots)
        result.session_id = session.id

        async def run_session():
            async with session:
                result.harness_version = session.system_prompt.harness_version
                return await session.prompt(prompt_of(task))

        try:
            lay_out(task.files, work)
            if (prepare := getattr(env, "prepare", None)) is not None:  # e.g. a verifiers task's setup
                try:
                    await asyncio.to_thread(prepare, task, work)
                except TimeoutError as e:  # the environment's own setup deadline, not the rollout's
                    raise StageTimedOut(str(e) or "the task's setup ran past its time") from None
            limit = min(spec.timeout, task.timeout or spec.timeout)
            turn = await asyncio.wait_for(run_session(), limit)  # the start counts against the timeout too
            result.turns, result.cells, result.tokens = turn.steps, turn.cells, turn.usage.total_tokens
            result.cost = turn.usage.cost
            await judge(result, env, task, turn.outcome, turn.answer, turn.error, work)
        except StageTimedOut as e:
            result.outcome, result.error = "timed_out", str(e)
        except TimeoutError:
            ran_past(result, limit)
        except Exception as e:  # a rollout that cannot run is an error of the run, not of the model
            result.error = f"{type(e).__name__}: {e}"
    result.seconds = time.monotonic() - started
    return result


WORKSPACE_PREFIX = "pa-eval-"
"""A rollout works in a throwaway workspace: a temporary directory named with this prefix."""


def workspace() -> tempfile.TemporaryDirectory:
    """A rollout's throwaway workspace: `pa-eval-<pid>-<start>-...` in the system's temporary directory,
    named for this process (`host_tag`). A finished rollout removes its own; the first of a process
    removes those whose process is gone (killed mid-rollout), which nothing else would."""
    _collect_workspaces()
    return tempfile.TemporaryDirectory(prefix=f"{WORKSPACE_PREFIX}{host_tag()}-")


@functools.cache
def _collect_workspaces() -> None:
    remove_gone_hosts_dirs(Path(tempfile.gettempdir()).glob(f"{WORKSPACE_PREFIX}*"))


def rollout_session(config: Config, model: Model, work: Path, session_dir: Path,
                    harness_roots: dict | None = None) -> Session:
    """A rollout's session, in its throwaway workspace `work`: nothing to rewind, so no checkpoints."""
    off = config.checkpoints.model_copy(update={"enabled": False})
    if harness_roots is not None and "session" not in harness_roots:  # shared roots: each rollout its own scope
        harness_roots = {**harness_roots, "session": SessionLayout(session_dir).harness}
    return Session(config.model_copy(update={"checkpoints": off}), model, cwd=work, session_dir=session_dir,
                   harness_roots=harness_roots)


class StageTimedOut(Exception):
    """An environment's own stage (a task's setup) ran past its deadline: the rollout is timed out."""


def rollout_layout(run_dir: Path, result: Result) -> SessionLayout:
    """Where a rollout's session lives in its run: `<run>/sessions/<task>-<rollout>`."""
    return SessionLayout.of(f"{result.task_id}-{result.rollout}", run_dir)


def prompt_of(task: Task) -> str:
    """What a rollout's session is asked: the task's system text, if any, above its prompt."""
    return f"{task.system}\n\n{task.prompt}" if task.system else task.prompt


async def judge(result: Result, env: Environment, task: Task, outcome: str, answer: str | None, error: str | None,
                work: Path) -> None:
    """A finished turn's verdict into `result`: timed out (or out of its seconds, or its scoring out of
    the environment's), checked by the environment (passed or failed, with the reward, its metrics and
    any error of its scorer; failed where the workspace is too large to score), or an error."""
    if outcome == "timed_out" or (outcome == "budget_exhausted" and "max_seconds" in (error or "")):
        result.outcome, result.error = "timed_out", error
    elif outcome in ("completed", "budget_exhausted"):
        try:
            check = await asyncio.to_thread(env.check, task, answer or "", work)
        except TimeoutError as e:  # the environment's own scoring deadline (a verifiers task's)
            result.outcome, result.error = "timed_out", str(e) or "scoring ran past its time"
            return
        except TooLarge as e:  # the policy filled its workspace past what a scorer copies: its failure
            result.outcome, result.reward, result.check = "failed", 0.0, str(e)
            return
        result.outcome = "passed" if check.passed else "failed"
        result.reward, result.check = check.reward, check.detail
        result.metrics, result.error = check.metrics, check.error
    else:
        result.outcome, result.error = "error", error


def ran_past(result: Result, seconds: float) -> None:
    """`result` as a rollout stopped from outside for running past its `seconds` (judge covers a turn
    that ended itself on its budget's seconds)."""
    result.outcome, result.error = "timed_out", f"the rollout ran past {seconds:g}s"


def lay_out(files: dict[str, str], work: Path) -> None:
    """A task's files in its workspace; a path that would land outside it is refused."""
    for rel, text in files.items():
        target = (work / rel).resolve()
        if not target.is_relative_to(work.resolve()):
            raise ValueError(f"task file {rel!r} would be written outside the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def read_results(path: Path) -> list[Result]:
    """The results on disk; a torn last line (a killed run) is a rollout still owed."""
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(Result(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    return out


def _write(path: Path, results: list[Result]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))
    os.replace(tmp, path)


def summarize(results: list[Result]) -> Summary:
    counts = {o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "timed_out", "error")}
    scored = [r for r in results if r.outcome in ("passed", "failed")]
    passed = counts["passed"]
    by_task: dict[str, list[Result]] = {}
    for r in scored:
        by_task.setdefault(r.task_id, []).append(r)
    rewards = [r.reward for r in scored if r.reward is not None]
    k_max = max((len(v) for v in by_task.values()), default=0)
    pass_at_k = {k: sum(_pass_at_k(len(v), sum(x.outcome == "passed" for x in v), k) for v in by_task.values())
                 / len(by_task) for k in range(1, k_max + 1)} if by_task else {}
    return Summary(
        counts=counts,
        pass_rate=passed / len(scored) if scored else None,
        pass_rate_ci=wilson(passed, len(scored)) if scored else None,
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        mean_reward_ci=mean_ci(rewards) if rewards else None,
        pass_at_k=pass_at_k,
        mean_tokens=sum(r.tokens for r in results) / len(results) if results else 0.0,
        mean_seconds=sum(r.seconds for r in results) / len(results) if results else 0.0,
        tasks=len({r.task_id for r in results}),
        rollouts=len(results),
        per_task={t: sum(x.outcome == "passed" for x in v) / len(v) for t, v in by_task.items()},
        metrics={k: sum(vs) / len(vs) for k, vs in _metric_values(scored).items()},
    )


def _metric_values(results: list[Result]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in results:
        for k, v in r.metrics.items():
            out.setdefault(k, []).append(v)
    return out


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n < k:
        return float(c > 0)
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def compare(a: list[Result], b: list[Result]) -> dict[str, Any]:
    """Per-task differences between two runs, and an exact McNemar test on tasks both scored:
    is the change in pass rate beyond noise?"""
    sa, sb = summarize(a).per_task, summarize(b).per_task
    common = sorted(set(sa) & set(sb))
    diffs = {t: (sa[t], sb[t]) for t in common if sa[t] != sb[t]}
    gained = sum(1 for t in common if sa[t] < 0.5 <= sb[t])
    lost = sum(1 for t in common if sb[t] < 0.5 <= sa[t])
    m = gained + lost
    p = min(1.0, 2 * sum(math.comb(m, i) for i in range(min(gained, lost) + 1)) / 2**m) if m else 1.0
    return {"tasks": len(common), "differences": diffs, "gained": gained, "lost": lost, "p_value": p,
            "beyond_noise": p < 0.05}
