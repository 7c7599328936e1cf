"""Training end to end on CPU: SFT warm start, IPO steps through the policy server, resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evals.tasksets.reverse_text import ReverseText
from rl.config import RunConfig, load
from rl.losses import IcePopConfig
from rl.orchestrator import Orchestrator
from rl.serve import BackgroundServer, engine_from
from rl.train import sft, train

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reverse_text" / "config.toml"


def quick(tmp_path: Path, *overrides: str):
    """The example, shortened: fixed-length strings learn in a few hundred SFT steps of 32 demonstrations
    (the SFT was two thirds of the IPO test's CPU at the example's 64), and IPO at twice its rate in 25 steps."""
    return load(str(EXAMPLE), ["--train.out", json.dumps(str(tmp_path / "run")), "--env.options",
                               "{min_len = 5, max_len = 5}", "--sft.steps", "250", "--sft.batch_size", "32",
                               "--train.steps", "25", "--train.lr", "2e-3", "--train.checkpoint_every", "10", *overrides])


@pytest.mark.slow
@pytest.mark.timeout(600)  # 25 steps: under a minute alone, more beside the other long files at the start of a run
def test_reward_goes_up_with_ipo(tmp_path: Path):
    history = train(quick(tmp_path), log=lambda *_: None, progress=False)
    rewards = [h["reward_mean"] for h in history]
    assert len(rewards) == 25
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1, rewards  # here: 0.544 to 0.771
    assert max(h["mismatch_kl"] for h in history) <= 0.01
    run = tmp_path / "run"
    assert (run / "reward.png").stat().st_size > 1000
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 25
    assert (run / "checkpoints" / "step-25" / "COMPLETE").is_file()


@pytest.mark.slow
def test_resume_gives_the_same_next_step(tmp_path: Path):
    args = ["--sft.steps", "0", "--train.steps", "3", "--train.checkpoint_every", "2", "--train.batch_size", "4"]
    whole = train(quick(tmp_path / "a", *args), log=lambda *_: None, progress=False)
    resumed_run = tmp_path / "b" / "run"
    (resumed_run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "run" / "checkpoints" / "step-2", resumed_run / "checkpoints" / "step-2")
    again = train(quick(tmp_path / "b", *args), log=lambda *_: None, progress=False)
    assert [h["step"] for h in again] == [2]
    assert again[0]["loss"] == pytest.approx(whole[2]["loss"], abs=1e-7)
    assert again[0]["reward_mean"] == whole[2]["reward_mean"]


def test_config_overrides_and_errors(tmp_path: Path):
    cfg = load(str(EXAMPLE), ["--loss.name", "icepop", "--train.lr", "3e-4", "--loss.ratio_high", "4.0"])
    assert (cfg.loss, cfg.train.lr) == (IcePopConfig(ratio_high=4.0), 3e-4)
    with pytest.raises(ValueError, match="loss: name: not a loss"):
        load(str(EXAMPLE), ["--loss.name", "grpo"])
    with pytest.raises(ValueError, match="expected --section.field"):
        load(str(EXAMPLE), ["lr", "1"])
    with pytest.raises(ValueError, match="train.stpes: Extra inputs"):
        load(str(EXAMPLE), ["--train.stpes", "3"])


def test_rollouts_carry_tokens_logprobs_and_versions_and_failures_are_counted(tmp_path: Path):
    cfg = quick(tmp_path, "--train.batch_size", "3", "--train.group_size", "4")
    env = ReverseText(min_len=5, max_len=5)
    engine = engine_from(None, cfg.model)
    engine.version = 5
    with BackgroundServer(engine) as url:
        batch = Orchestrator(url, env, cfg.train).collect(step=0)
        assert batch.version == 5 and len(batch.rewards) == 12 and batch.counts["errored"] == 0
        for s in batch.samples:
            assert len(s.completion_ids) == len(s.inference_logprobs) > 0 and s.version == 5
            assert s.prompt_ids[0] == 256 and s.advantage != 0
        assert batch.counts["zero_advantage_groups"] + len({tuple(s.prompt_ids) for s in batch.samples}) == 3
    dead = Orchestrator("http://127.0.0.1:9/v1", env, cfg.train.model_copy(update={"request_timeout": 2.0}))
    failed = dead.collect(step=0)
    assert failed.samples == [] and failed.counts["errored"] == 12


@pytest.mark.slow
def test_sampling_ahead_never_trains_on_rollouts_older_than_allowed(tmp_path: Path):
    cfg = quick(tmp_path, "--sft.steps", "0", "--train.steps", "4", "--train.batch_size", "4",
                "--train.async_level", "2", "--train.max_off_policy_steps", "1")
    history = train(cfg, log=lambda *_: None, progress=False)
    assert [h["step"] for h in history] == [0, 1, 2, 3]
    assert all(h["off_policy_max"] <= 1 for h in history)


def test_policy_lag_makes_the_sampler_that_many_steps_old(tmp_path: Path):
    cfg = RunConfig.model_validate({
        "model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 32},
        "env": {"name": "reverse_text", "options": {"min_len": 3, "max_len": 4}},
        "train": {"steps": 5, "batch_size": 2, "group_size": 4, "max_tokens": 6, "policy_lag": 2,
                  "max_off_policy_steps": 2, "out": str(tmp_path / "run"), "checkpoint_every": 100},
    })
    history = train(cfg, log=lambda *_: None, progress=False)
    # sampled at step s by the weights of step max(0, s - 2); steps with no samples report 0
    assert [h["off_policy_max"] for h in history if h["samples"]] == [
        min(h["step"], 2) for h in history if h["samples"]]


def test_configs_that_cannot_run_are_refused_before_anything_runs():
    from rl.sample import Sample
    from rl.packing import padded

    for bad in (["--train.checkpoint_every", "0"], ["--train.group_size", "0"], ["--train.threads", "0"],
                ["--train.max_off_policy_steps", "-1"], ["--loss.eps", "-1"], ["--train.pack_length", "8"]):
        with pytest.raises(ValueError):
            load(str(EXAMPLE), bad)
    # a sampler lagging past max_off_policy_steps would train nothing: every rollout dropped as stale
    with pytest.raises(ValueError, match="policy_lag = 4 .* set max_off_policy_steps to at least 4"):
        load(str(EXAMPLE), ["--train.policy_lag", "4"])
    with pytest.raises(ValueError, match="prompt"):
        padded([Sample([], [1, 2], [0.0, 0.0], 1.0, 1.0, 0)])


def test_a_noisy_warm_start_on_a_task_set_without_wrong_answers_is_refused_naming_the_setting(tmp_path: Path):
    cfg = RunConfig.model_validate({
        "model": {"d_model": 16, "n_layer": 1, "n_head": 2, "max_seq": 32},
        "env": {"name": "rg:spell_backward"}, "sft": {"steps": 1, "noise": 0.5},
        "train": {"out": str(tmp_path / "run")},
    })
    with pytest.raises(ValueError, match="sft.noise = 0.5 .*'rg:spell_backward' has none"):
        sft(cfg, log=lambda *_: None)
    assert not (tmp_path / "run" / "sft").exists()


def test_a_lagged_run_is_not_resumed_inexactly(tmp_path: Path):
    from rl.train import CannotResume

    args = ["--sft.steps", "0", "--train.steps", "2", "--train.checkpoint_every", "1", "--train.batch_size", "2",
            "--train.policy_lag", "1"]
    train(quick(tmp_path, *args), log=lambda *_: None, progress=False)
    with pytest.raises(CannotResume, match="policy_lag"):
        train(quick(tmp_path, *args[:3], "3", *args[4:]), log=lambda *_: None, progress=False)
