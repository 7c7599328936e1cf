"""Data-parallel training: torchrun with two processes (gloo, FSDP2) on the CPU, against one process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rl.config import load
from rl.dist import split
from rl.sample import Sample
from rl.train import train

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "reverse_text" / "config.toml"
TINY = ["--model.d_model", "32", "--model.n_layer", "2", "--model.n_head", "2", "--sft.steps", "20",
        "--sft.batch_size", "16", "--train.batch_size", "4", "--train.group_size", "4", "--train.threads", "1",
        "--train.checkpoint_every", "2", "--env.options", "{min_len = 5, max_len = 5}"]
"""The reverse-text example, shrunk to seconds: a tiny model, a short warm start, small batches."""


def one_process(out: Path, steps: int) -> list[dict]:
    cfg = load(str(EXAMPLE), [*TINY, "--train.out", json.dumps(str(out)), "--train.steps", str(steps)])
    return train(cfg, log=lambda *_: None, progress=False)


def torchrun(out: Path, steps: int, *overrides: str) -> list[dict]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "rl.train",
               str(EXAMPLE), *TINY, "--train.out", json.dumps(str(out)), "--train.steps", str(steps), *overrides]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def same_steps(a: list[dict], b: list[dict]) -> None:
    """The same rollouts (rewards exactly: rank 0 samples with the seeds one process uses) and the same
    update up to the order of float additions across ranks."""
    assert [h["step"] for h in a] == [h["step"] for h in b]
    assert [h["reward_mean"] for h in a] == [h["reward_mean"] for h in b]
    for x, y in zip(a, b):
        assert (x["samples"], x["tokens"]) == (y["samples"], y["tokens"])
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
        assert x["entropy"] == pytest.approx(y["entropy"], rel=1e-5)


@pytest.mark.slow
def test_two_processes_train_like_one_and_resume_from_a_distributed_checkpoint(tmp_path: Path):
    one = one_process(tmp_path / "one", 4)
    two = torchrun(tmp_path / "two", 4)
    assert len(two) == 4 and sum(h["samples"] for h in two) > 0
    same_steps(one, two)
    assert (tmp_path / "two" / "checkpoints" / "step-4" / "dcp" / ".metadata").is_file()

    # stopped after two steps, started again: it resumes from the distributed checkpoint and goes on
    # as the run that never stopped
    assert len(torchrun(tmp_path / "stopped", 2)) == 2
    same_steps(torchrun(tmp_path / "stopped", 4), two)

    # packed rows: the ranks' shares pack into different numbers of rows, and still step together
    packed = torchrun(tmp_path / "packed", 2, "--train.pack_length", "64")
    same_steps(one[:2], packed)

    # the same checkpoint resumes in one process (the shards load whole)
    (tmp_path / "single" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "two" / "checkpoints" / "step-2", tmp_path / "single" / "checkpoints" / "step-2")
    same_steps(one_process(tmp_path / "single", 4), two[2:])


def test_shares_balance_tokens_not_samples_and_no_rank_is_left_empty():
    def sample(n: int) -> Sample:
        return Sample([1] * n, [2] * 4, [0.0] * 4, 1.0, 1.0, 0)

    samples = [sample(40), sample(10), sample(10), sample(10), sample(10)]
    shares = split(samples, 2)
    assert sorted(len(s) for s in shares) == [1, 4]  # 44 tokens against 4 x 14 = 56
    assert sorted(x for s in shares for x in map(id, s)) == sorted(map(id, samples))
    lonely = split([sample(3)], 2)
    assert lonely[0][0].completion_mask is None and lonely[1][0].completion_mask == [False] * 4
    assert split([], 2) == [[], []]
