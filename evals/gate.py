"""The refiner's regression gate: run a task set with and without a proposed change to the
harness, each on a private copy of it, and refuse a change that lowers the pass count.

The selection is `evals.tasksets.select`, the same as `prime-agent eval` and RL evaluation.
Every refinement path uses it: `prime-agent run` and `refine` build it here, and the daemon is
handed `gate_for` (an agent.refine.GateFactory: a session rebuilds its gate with it when its model
changes) by the command line that starts it (the daemon cannot import evals).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent.config_models import Config
from agent.harness import SessionHarness
from agent.model import Model
from agent.refine import Gate
from evals.runner import EvalSpec, rollout
from evals.tasksets import load_taskset
from harness_store.refiner import Plan, RefinementError, Refiner, Verdict
from harness_store.store import HarnessStore


def gate_for(config: Config, model: Model, harness: SessionHarness) -> Gate | None:
    """The gate `config.refine` asks for (`gate_taskset`), or None."""
    r = config.refine
    return make_gate(config, model, harness, r.gate_taskset, r.gate_n, r.gate_seed) if r.gate_taskset else None




def make_gate(config: Config, model: Model, harness: SessionHarness, taskset: str, n: int | None = None,
              seed: int = 0, timeout: float = 600.0) -> Callable[[Plan], Awaitable[Verdict]]:
    async def gate(plan: Plan) -> Verdict:
        before, unjudged_before = await passes(config, model, harness, taskset, n, seed, timeout, plan=None)
        after, unjudged_after = await passes(config, model, harness, taskset, n, seed, timeout, plan=plan)
        total = len(load_taskset(taskset).tasks(n, seed=seed))
        unjudged = unjudged_before + unjudged_after
        if unjudged:  # an error is not evidence either way: do not apply blind
            return Verdict(False, f"the gate could not judge the change: {len(unjudged)} rollouts errored or "
                                  f"timed out (first: {unjudged[0]})")
        if after < before:
            return Verdict(False, f"the change lowers the task set's pass count from {before} to {after} of {total}")
        return Verdict(True, f"{after} of {total} pass with the change ({before} without)")

    return gate


async def passes(config: Config, model: Model, harness: SessionHarness, taskset: str, n: int | None, seed: int,
                 timeout: float, plan: Plan | None) -> tuple[int, list[str]]:
    """(passed, unjudged) of the selected tasks in fresh sessions over a copy of `harness` (with
    `plan` applied); unjudged: why each rollout that errored or timed out did."""
    env = load_taskset(taskset, scoring_sandbox=config.sandbox)
    spec = EvalSpec(taskset, n, 1, 1, seed, timeout)
    config = config.model_copy(update={"refine": config.refine.model_copy(update={"auto_every": 0})})
    with tempfile.TemporaryDirectory(prefix="pa-gate-") as tmp:
        roots = {}
        for scope, store in harness.stores.items():
            roots[scope] = Path(tmp) / "harness" / scope
            if store.root.is_dir():
                shutil.copytree(store.root, roots[scope], ignore=shutil.ignore_patterns(".harness.lock"))
        if plan is not None:
            copy = Refiner({sc: HarnessStore(r, sc) for sc, r in roots.items()}, _no_planning)
            outcome = await copy.apply(plan, generation=plan.generation)
            if outcome.status != "applied":
                raise RefinementError(f"the change could not be applied to the gate's copy: {outcome.reason}")
        passed, unjudged = 0, []
        for task in env.tasks(n, seed=seed):
            result = await rollout(env, task, 0, "", spec, config, model, Path(tmp) / "runs", harness_roots=roots)
            passed += result.outcome == "passed"
            if result.outcome in ("error", "timed_out"):
                unjudged.append(f"{task.id} {result.outcome}: {result.error}")
        return passed, unjudged


async def _no_planning(messages):
    raise RefinementError("the gate's copy of the harness never plans")
