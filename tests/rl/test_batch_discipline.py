"""Batch discipline (INTELLECT-2): groups without signal dropped and replaced (train.skip_zero_advantage),
tasks kept by solve rate (train.difficulty). Real training of a tiny byte policy, sampled by the built-in
policy server, on task sets built so the answer is known."""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from pathlib import Path

from evals.env import Check, Task
from rl.config import RunConfig
from rl.policy.tokenizer import ByteTokenizer
from rl.train import train
from tests.rl.servers import Recording


class HalfFlat:
    """Half its tasks score every answer 0.5 (a group of them never has signal); the other half score an
    answer 0 or 1 by a hash of its text, so a group of different answers mostly has."""

    name = "half_flat"

    def __init__(self, flat_share: float = 0.5):
        self.flat_share = flat_share

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        rng = random.Random(seed)
        return [Task(id=f"{seed}-{i}", prompt=f"{kind} {seed % 1000}-{i}", system="Answer.", data={"kind": kind})
                for i in range(n or 8) for kind in ["flat" if rng.random() < self.flat_share else "graded"]]

    def reward(self, task: Task, answer: str) -> float:
        return 0.5 if task.data["kind"] == "flat" else float(zlib.crc32(answer.encode()) % 2)

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        return Check(False, self.reward(task, answer))


class KnownSolveRates:
    """Each task states its solve rate (0, 1/4, ..., 1): of every 4 answers it scores, in order, exactly
    rate * 4 solve it (reward 1), whatever they say. The filter's 4 estimating samples are a task's first 4."""

    name = "known_solve_rates"
    RATES = (0.0, 0.25, 0.5, 0.75, 1.0)

    def __init__(self):
        self.scored: Counter[str] = Counter()
        """Answers scored per task: 4 for a task only measured, 4 + group_size for one trained on."""

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        rng = random.Random(seed)
        return [Task(id=f"{seed}-{i}", prompt=f"rate {rate} #{seed % 1000}-{i}", system="Answer.", data={"rate": rate})
                for i in range(n or 8) for rate in [rng.choice(self.RATES)]]

    def reward(self, task: Task, answer: str) -> float:
        j = self.scored[task.id] % 4
        self.scored[task.id] += 1
        return float(j < task.data["rate"] * 4)

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        return Check(False, 0.0)


def config(run: Path, **train) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 48},
        "train": {"steps": 2, "batch_size": 4, "group_size": 4, "max_tokens": 6, "threads": 1,
                  "out": str(run), "checkpoint_every": 100, **train},
    })


def run(cfg: RunConfig, env) -> tuple[list[dict], list, list[dict]]:
    """Train on `env`'s tasks (the built-in server samples); the history, each step's batch, and metrics.jsonl."""
    batches: list = []
    history = train(cfg, log=lambda *_: None, progress=False,
                    orchestrator=lambda servers: Recording(batches, servers, env, cfg.train))
    rows = [json.loads(line) for line in (Path(cfg.train.out) / "metrics.jsonl").read_text().splitlines()]
    return history, batches, rows


def groups(batch) -> set[str]:
    """The prompts of the groups a batch trains on, as text."""
    return {ByteTokenizer().decode(s.prompt_ids) for s in batch.samples}


def test_skipping_zero_advantage_groups_fills_the_batch_with_groups_that_have_signal(tmp_path: Path):
    # the same steps without the discipline: groups without signal take places in the batch
    _, plain, _ = run(config(tmp_path / "plain"), HalfFlat())
    assert sum(b.counts["groups"] - b.counts["useful_groups"] for b in plain) > 0
    assert all(b.counts["groups"] == 4 and b.counts["extra_rounds"] == 0 for b in plain)

    history, batches, rows = run(config(tmp_path / "skip", skip_zero_advantage=True, max_rounds=10), HalfFlat())
    assert [h["step"] for h in history] == [0, 1]
    for b in batches:
        assert b.counts["useful_groups"] == b.counts["groups"] == 4, b.counts
        assert len(groups(b)) == 4 and all("graded" in g for g in groups(b))  # each group trains
        # what it took: the rounds past the first, and the groups without signal dropped on the way
        assert b.counts["extra_rounds"] >= 1 and b.counts["zero_advantage_groups"] >= 1
        assert b.counts["rollouts"] == 4 * (4 + b.counts["zero_advantage_groups"])
    assert rows == json.loads(json.dumps(history))
    for row, b in zip(rows, batches):
        assert (row["useful_groups"], row["extra_rounds"]) == (4, b.counts["extra_rounds"])
    assert all(h["tokens"] > 0 for h in history)


def test_the_extra_rounds_are_bounded_and_a_short_batch_still_trains_what_it_holds(tmp_path: Path):
    history, batches, rows = run(config(tmp_path / "run", steps=1, skip_zero_advantage=True, max_rounds=2),
                                 HalfFlat(flat_share=1.0))
    (b,) = batches
    # three rounds of 4, 4 and 4 tasks, none with signal: the step trains nothing, and says so
    assert b.counts["extra_rounds"] == 2 and b.counts["zero_advantage_groups"] == 12 and b.counts["rollouts"] == 48
    assert b.counts["useful_groups"] == b.counts["groups"] == 0 and b.samples == []
    assert rows[0]["extra_rounds"] == 2 and history[0]["tokens"] == 0


def test_the_difficulty_filter_keeps_exactly_the_tasks_in_range(tmp_path: Path, capsys):
    env = KnownSolveRates()
    difficulty = {"samples": 4, "min_solve_rate": 0.25, "max_solve_rate": 0.75}
    history, batches, rows = run(config(tmp_path / "run", difficulty=difficulty, max_rounds=10), env)
    drawn = {}
    for step in range(2):  # every task a step drew, in every round: the task set deals them from seeds
        for seed in _seeds(rows[step], step):
            drawn.update({t.id: t for t in env.tasks(None, seed=seed)})
    measured = {i for i, n in env.scored.items()}
    trained = {i for i, n in env.scored.items() if n > 4}
    assert all(env.scored[i] in (4, 8) for i in measured)  # measured with 4 samples; trained on with 4 more
    # kept: exactly the measured tasks whose rate lies in [1/4, 3/4], the bounds included
    assert trained == {i for i in measured if 0.25 <= drawn[i].data["rate"] <= 0.75}
    assert {drawn[i].data["rate"] for i in trained} == {0.25, 0.5, 0.75}
    for b, row in zip(batches, rows):
        assert b.counts["groups"] == 4 and len(groups(b)) == 4
        kept = row["tasks_measured"] - row["tasks_too_easy"] - row["tasks_too_hard"] - row["tasks_unmeasured"]
        assert kept == 4 and row["tasks_unmeasured"] == 0
    too_easy = sum(1 for i in measured if drawn[i].data["rate"] == 1.0)
    too_hard = sum(1 for i in measured if drawn[i].data["rate"] == 0.0)
    assert (sum(r["tasks_too_easy"] for r in rows), sum(r["tasks_too_hard"] for r in rows)) == (too_easy, too_hard)
    assert too_easy and too_hard  # the set did put tasks out of range before the filter
    assert "tasks in range 4/" in capsys.readouterr().out


def _seeds(row: dict, step: int) -> list[int]:
    """The task seeds of a step's rounds (rl.orchestrator.Orchestrator.collect)."""
    from rl.orchestrator import rollout_seed

    return [rollout_seed(0, step)] + [rollout_seed(0, step, "round", r) for r in range(1, row["extra_rounds"] + 1)]


def test_configs_the_discipline_cannot_run_are_refused():
    import pytest

    for bad in ({"train": {"difficulty": {"min_solve_rate": 0.8, "max_solve_rate": 0.5}}},
                {"train": {"difficulty": {"samples": 0}}}, {"train": {"max_rounds": -1}}):
        with pytest.raises(ValueError):
            RunConfig.model_validate(bad)
    for harness in ({"skip_zero_advantage": True}, {"difficulty": {}}):  # not yet through the agent's sessions
        with pytest.raises(ValueError, match="harness"):
            RunConfig.model_validate({"env": {"harness": True}, "train": harness})
