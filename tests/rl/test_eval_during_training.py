"""Evaluation during training ([eval]): every N steps the weights the server holds answer the selection
`prime-agent eval` makes, logged as eval rows in metrics.jsonl, drawn on reward.png, the last in results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.stats import mean_ci, wilson
from evals.tasksets import select
from rl.config import RunConfig
from rl.train import intervals, train


def config(run: Path, **eval) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 48},
        "env": {"name": "reverse_text", "options": {"min_len": 3, "max_len": 4}},
        "train": {"steps": 5, "batch_size": 2, "group_size": 4, "max_tokens": 6, "threads": 1, "lr": 1e-2,
                  "out": str(run), "checkpoint_every": 100},
        "eval": eval,
    })


def test_eval_rows_every_n_steps_on_the_selection_eval_makes(tmp_path: Path, capsys):
    run = tmp_path / "run"
    said: list[str] = []
    history = train(config(run, every=2, tasks=3, seed=7, rollouts=2, taskset="reverse_text"),
                    log=said.append, progress=False)
    assert not [line for line in said if "held-out" in line]  # seed 7: no step of 5 deals with it
    assert [h["step"] for h in history] == [0, 1, 2, 3, 4]  # what train returns: the steps alone
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("kind") == "eval"]
    # before the first step, after every second, and after the last; each of the weights after that many steps
    assert [r["step"] for r in evals] == [0, 2, 4, 5]
    assert [r["policy_version"] for r in evals] == [0, 2, 4, 5]
    assert [r.get("kind") for r in rows] == ["eval", None, None, "eval", None, None, "eval", None, "eval"]
    assert all(r["tasks"] == 3 and r["rollouts"] == 6 and r["errored"] == 0 for r in evals)
    last = json.loads((run / "results.json").read_text())
    assert {k: last[k] for k in evals[-1]} == evals[-1]
    assert [r["task_id"] for r in last["results"]] == [t.id for t in select("reverse_text", 3, 7)]
    rewards = [x for r in last["results"] for x in r["rewards"]]
    assert len(rewards) == 6 and all(0 <= x <= 1 for x in rewards)
    assert last["reward_mean"] == pytest.approx(sum(rewards) / 6)
    # the interval's unit is the task: over the 3 tasks' means, not the 6 rollouts
    lo, hi = last["reward_ci"]
    assert (lo, hi) == pytest.approx(mean_ci([sum(r["rewards"]) / 2 for r in last["results"]]))
    assert lo <= last["reward_mean"] <= hi and len(last["solve_rate_ci"]) == 2
    printed = capsys.readouterr().out
    assert [line.split()[1] for line in printed.splitlines() if line.startswith("eval ")] == ["0", "2", "4", "5"]
    assert f"reward {last['reward_mean']:.3f} ({lo:.3f}-{hi:.3f})" in printed.splitlines()[-1]
    assert (run / "reward.png").stat().st_size > 1000


def test_intervals_are_over_tasks_and_leave_out_excluded_rollouts():
    # one scored rollout a task: Wilson's interval for the solve rate; an excluded rollout counts nowhere
    reward_ci, solve_ci = intervals([[1.0], [0.0], [0.5], ["errored"]])
    assert reward_ci == pytest.approx(mean_ci([1.0, 0.0, 0.5])) and solve_ci == pytest.approx(wilson(1, 3))
    assert solve_ci[0] > 0  # Wilson's, not the normal approximation's
    # several: the normal approximation over each task's mean, so two tasks are two values, not four
    reward_ci, solve_ci = intervals([[1.0, 0.0], [1.0, "timed_out", 1.0]])
    assert reward_ci == pytest.approx(mean_ci([0.5, 1.0])) and solve_ci == pytest.approx(mean_ci([0.5, 1.0]))
    assert intervals([["errored"], ["timed_out"]]) == (None, None)


def test_no_task_solved_in_several_rollouts_is_no_proof_that_none_ever_is():
    # the bare SmolLM2 on 200 reasoning-gym tasks x 4 rollouts solved none: the normal approximation over the
    # tasks' solved shares (all 0) collapses to (0, 0); the interval is Wilson's over the tasks instead
    _, solve_ci = intervals([[0.0, 0.2, 0.0, 0.4]] * 200)
    assert solve_ci == pytest.approx(wilson(0, 200)) and solve_ci[1] > 0.01
    _, solve_ci = intervals([[1.0, 1.0]] * 50)  # all solved, every time
    assert solve_ci == pytest.approx(wilson(50, 50)) and solve_ci[0] < 0.95


def test_the_default_selection_is_the_training_environments(tmp_path: Path):
    from evals.tasksets.reverse_text import ReverseText

    run = tmp_path / "run"
    cfg = config(run, every=10, tasks=2)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 1})})
    said: list[str] = []
    train(cfg, log=said.append, progress=False)
    # eval.seed 0 is the seed step 0 deals its tasks with (train.seed 0): said, since they are not held out
    assert [line for line in said if "held-out" in line] == [
        "WARNING eval.seed 0 selects the tasks training step 0 trains on: the evaluation is not on held-out tasks; "
        "choose a seed no step deals with (steps deal 0..0)"]
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [r["step"] for r in evals] == [0, 1] and evals[0]["taskset"] == "reverse_text"
    last = json.loads((run / "results.json").read_text())
    assert [r["task_id"] for r in last["results"]] == [t.id for t in ReverseText(min_len=3, max_len=4).tasks(2, seed=0)]


def test_eval_configs_that_cannot_run_are_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="harness"):
        RunConfig.model_validate({"env": {"harness": True}, "eval": {"every": 2}})
    tasks = tmp_path / "checked.jsonl"  # a task set judged by a check in the workspace: sessions only
    tasks.write_text(json.dumps({"id": "a", "prompt": "make a file", "check": {"shell": "test -f out"}}) + "\n")
    with pytest.raises(ValueError, match="agent sessions"):
        train(config(tmp_path / "run", every=1, taskset=str(tasks)), log=lambda *_: None, progress=False)


def test_a_resumed_run_keeps_its_evaluations_and_goes_on(tmp_path: Path):
    run = tmp_path / "run"
    cfg = config(run, every=1, tasks=2)
    first = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 2, "checkpoint_every": 1})})
    train(first, log=lambda *_: None, progress=False)
    then = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 3, "checkpoint_every": 1})})
    assert [h["step"] for h in train(then, log=lambda *_: None, progress=False)] == [0, 1, 2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r.get("kind"), r["step"]) for r in rows] == [
        ("eval", 0), (None, 0), ("eval", 1), (None, 1), ("eval", 2), (None, 2), ("eval", 3)]
    assert json.loads((run / "results.json").read_text())["step"] == 3
