"""RL on the ecosystem's environments: `[env] name = "rg:..."` trains through the same loop as the
built-ins (evals' task sets behind rl.envs.load)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl.config import RunConfig
from rl.train import train
from tests.conftest import needs

pytestmark = needs("reasoning-gym", "reasoning_gym")


def test_a_reasoning_gym_dataset_trains_with_its_scorer_as_reward(tmp_path: Path):
    cfg = RunConfig.model_validate({
        "model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 256},
        "env": {"name": "rg:spell_backward?min_word_len=3", "options": {"max_word_len": 4}},
        "sft": {"steps": 2, "batch_size": 4},  # the warm start on the dataset's own answers
        "train": {"steps": 2, "batch_size": 2, "group_size": 4, "max_tokens": 6, "out": str(tmp_path / "run"),
                  "checkpoint_every": 100},
    })
    history = train(cfg, log=lambda *_: None, progress=False)
    assert [h["step"] for h in history] == [0, 1]
    assert all(h["rollouts"] == 8 and h["errored"] == 0 for h in history)  # every answer scored, none lost
    assert all(0.0 <= h["reward_mean"] <= 1.0 for h in history)
