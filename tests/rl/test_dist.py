"""Data-parallel training: torchrun with two processes (gloo, FSDP2) on the CPU, against one process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rl.config import load
from rl.dist import split
from rl.sample import Sample
from rl.train import train
from tests.rl.distributed import ROOT, same_steps
from tests.rl.distributed import torchrun as launch

EXAMPLE = ROOT / "examples" / "reverse_text" / "config.toml"
TINY = ["--model.d_model", "32", "--model.n_layer", "2", "--model.n_head", "2", "--sft.steps", "20",
        "--sft.batch_size", "16", "--train.batch_size", "4", "--train.group_size", "4", "--train.threads", "1",
        "--train.checkpoint_every", "2", "--env.options", "{min_len = 5, max_len = 5}"]
"""The reverse-text example, shrunk to seconds: a tiny model, a short warm start, small batches."""


def one_process(out: Path, steps: int) -> list[dict]:
    cfg = load(str(EXAMPLE), [*TINY, "--train.out", json.dumps(str(out)), "--train.steps", str(steps)])
    return train(cfg, log=lambda *_: None, progress=False)


def torchrun(out: Path, steps: int, *overrides: str) -> list[dict]:
    return launch(EXAMPLE, out, *TINY, "--train.steps", str(steps), *overrides)


@pytest.mark.slow
@pytest.mark.timeout(900)  # four runs, three under torchrun: past 120 s on 2 loaded cores
def test_two_processes_train_like_one_and_resume_from_a_distributed_checkpoint(tmp_path: Path):
    one = one_process(tmp_path / "one", 4)
    two = torchrun(tmp_path / "two", 4)
    assert len(two) == 4 and sum(h["samples"] for h in two) > 0
    same_steps(one, two)
    assert (tmp_path / "two" / "checkpoints" / "step-4" / "dcp" / ".metadata").is_file()

    # stopped after two steps, started again: it resumes from the distributed checkpoint and goes on
    # as the run that never stopped; its rows packed, the ranks' shares into different numbers of rows,
    # and still stepping together
    packed = torchrun(tmp_path / "stopped", 2, "--train.pack_length", "64")
    same_steps(one[:2], packed)
    same_steps(torchrun(tmp_path / "stopped", 4, "--train.pack_length", "64"), two)

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
