"""Every sampled token trains: on a policy whose token ids lie past the byte policy's vocabulary (a tiny
llama with a 512-token BPE vocabulary, warm-started to answer by a cell or by a guess), every rollout of a
group whose rewards differ becomes a sample whose trainable tokens are exactly the ids the server sampled;
a step whose rollouts with signal yield no sample reports it and warns."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from agent.trajectory import MessageRecord, ModelCall, read_records
from evals.env import Check, Task
from evals.runner import Result
from rl.config import RunConfig, load
from rl.envs.harness import HarnessOrchestrator
from rl.policy.tokenizer import ByteTokenizer
from rl.serve import BackgroundServer, hf_engine
from rl.train import SAMPLED_SHARE_WARNING, sft, train
from tests.rl.conftest import WIDE_VOCAB

GROUP = 4


class CellOrGuess:
    """Answered by a cell (`final(7)`: an odd length, reward 1) or by a guess ("no": even, 0). A warm start on
    both, half and half, samples either, so groups' rewards differ."""

    name = "cell_or_guess"

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        return [Task(id=f"t{seed}-{i}", prompt=f"Answer with the number ({i}).") for i in range(n or 1)]

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        odd = len(answer) % 2 == 1
        return Check(odd, float(odd), f"{len(answer)} characters")

    def demonstration(self, task: Task) -> str:
        return "```python\nfinal(7)\n```"

    def distractor(self, task: Task) -> str:
        return "no"


def config(model: Path, out: Path, *overrides: str) -> RunConfig:
    return load(None, ["--model.hf", json.dumps(str(model)), "--env.name", '"kernel_tasks"', "--env.harness", "true",
                       "--env.max_steps", "1", "--env.timeout", "60", "--env.prompt_tokens", "48",
                       "--env.base_prompt", '"short"', "--train.steps", "1", "--train.batch_size", "3",
                       "--train.group_size", str(GROUP), "--train.max_tokens", "24", "--train.threads", "1",
                       "--train.out", json.dumps(str(out)), *overrides])


@pytest.fixture(scope="module")
def warm(wide_llama: Path, tmp_path_factory) -> Path:
    """The wide llama after a warm start on cells and guesses, half and half."""
    cfg = config(wide_llama, tmp_path_factory.mktemp("warm"), "--sft.steps", "60", "--sft.batch_size", "16",
                 "--sft.lr", "3e-3", "--sft.noise", "0.5")
    return sft(cfg, log=lambda *_: None, env=CellOrGuess())


def with_signal(results: list[tuple[Result, Path]]) -> list[tuple[Result, Path]]:
    """The judged rollouts of groups whose rewards differ (rewards are 0 or 1: each has an advantage)."""
    out = []
    for g in range(0, len(results), GROUP):
        judged = [(r, p) for r, p in results[g:g + GROUP] if r.outcome in ("passed", "failed")]
        if len({r.reward for r, _ in judged}) > 1:
            out += judged
    return out


def sampled(trajectory: Path) -> tuple[list[int], list[float]]:
    """The token ids and logprobs the server returned for the session's replies, in order."""
    records = read_records(trajectory)
    replies = [r.message for r in records if isinstance(r, MessageRecord) and r.message.role == "assistant"]
    calls = [r for r in records if isinstance(r, ModelCall)]
    assert [len(m.token_ids) for m in replies] == [c.usage.completion_tokens for c in calls]
    return [t for m in replies for t in m.token_ids], [lp for m in replies for lp in m.logprobs]


def trained(batch) -> list[tuple[list[int], list[float]]]:
    return sorted(([t for t, m in zip(s.completion_ids, s.completion_mask) if m],
                   [lp for lp, m in zip(s.inference_logprobs, s.completion_mask) if m]) for s in batch.samples)


def test_every_rollout_of_a_group_with_signal_trains_exactly_the_tokens_the_server_sampled(warm: Path,
                                                                                          tmp_path: Path, prime_home):
    cfg, env = config(warm, tmp_path), CellOrGuess()

    def orchestrator(**vocab_size: int) -> HarnessOrchestrator:
        return HarnessOrchestrator(url, env, cfg.train, cfg.env, tmp_path, **vocab_size)

    with BackgroundServer(hf_engine(str(warm), truncate=True)) as url:
        results = asyncio.run(orchestrator().rollouts(env.tasks(3, seed=0), GROUP, 0))
    signal = with_signal(results)
    assert signal, [r.outcome for r, _ in results]
    assert {r.cells > 0 for r, _ in signal} == {True, False}  # answered by a cell, and without one
    expected = sorted(sampled(path) for _, path in signal)
    assert max(max(ids) for ids, _ in expected) >= ByteTokenizer.vocab_size

    for vocab_size in ({}, {"vocab_size": WIDE_VOCAB}):  # by default the server's replies; or checked, the policy's
        batch = orchestrator(**vocab_size).batch(0, results)
        assert (batch.counts["signal_rollouts"], batch.counts["unsampled_rollouts"]) == (len(signal), 0)
        assert len(batch.samples) == len(signal) and trained(batch) == expected

    # checked against the byte policy's vocabulary (the bug): the replies with an id past it train nothing
    batch = orchestrator(vocab_size=ByteTokenizer.vocab_size).batch(0, results)
    lost = sum(max(ids) >= ByteTokenizer.vocab_size for ids, _ in expected)
    assert lost and batch.counts["unsampled_rollouts"] == batch.counts["foreign_replies"] == lost
    assert batch.counts["signal_rollouts"] == len(signal)


class Recorded(HarnessOrchestrator):
    """The harness orchestrator, keeping the batches it made."""

    batches_made: list

    async def collect(self, step: int):
        batch = await super().collect(step)
        self.batches_made.append(batch)
        return batch


@pytest.mark.parametrize("vocab_size", [None, ByteTokenizer.vocab_size])
def test_a_step_reports_the_share_of_rollouts_with_signal_that_trained_and_warns_when_it_is_low(
        warm: Path, tmp_path: Path, prime_home, vocab_size: int | None, caplog, capsys):
    cfg, made = config(warm, tmp_path / "run"), []

    def orchestrator(servers) -> Recorded:
        o = Recorded(servers.url, CellOrGuess(), cfg.train, cfg.env, tmp_path / "run", vocab_size=vocab_size)
        o.batches_made = made
        return o

    with caplog.at_level(logging.WARNING, logger="rl.train"):
        (step,) = train(cfg, log=lambda *_: None, progress=False, orchestrator=orchestrator)
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row == json.loads(json.dumps(step))
    (batch,) = made
    signal, lost = row["signal_rollouts"], row["unsampled_rollouts"]
    assert signal > 0, row  # the warm start's groups differ
    assert row["sampled_share"] == (signal - lost) / signal and row["samples"] == len(batch.samples)
    assert row["tokens"] == sum(sum(s.completion_mask) for s in batch.samples)
    # tok/s counts every token the step trained over, the prompts' too, not the loss tokens alone
    assert row["trained_tokens"] == sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples)
    assert row["tokens_per_s"] == pytest.approx(row["trained_tokens"] / row["seconds"])
    console = capsys.readouterr().out
    assert f"samples {row['samples']} ({row['sampled_share']:.0%} of rollouts with signal)" in console
    if row["tokens"]:
        assert row["tokens_per_s"] > 0 and f"{row['tokens_per_s']:,.0f} tok/s" in console
    else:
        assert "nothing trained" in console and "tok/s" not in console
    warnings = [r.getMessage() for r in caplog.records if r.name == "rl.train"]
    if vocab_size is None:  # every rollout with signal trained
        assert row["sampled_share"] == 1.0 and not warnings and "WARNING" not in console
    else:  # the bug: most replies hold an id past the byte policy's, and the step says so
        assert row["sampled_share"] < SAMPLED_SHARE_WARNING
        (warning,) = warnings
        assert f"only {signal - lost} of {signal} rollouts with signal became samples" in warning
        assert f"WARNING {warning}" in console


@pytest.mark.slow
@pytest.mark.timeout(900)  # the real model on 2 cores, maybe loaded
def test_every_rollout_of_smollm2_with_signal_trains_exactly_the_tokens_the_server_sampled(smollm2: Path,
                                                                                          tmp_path: Path, prime_home):
    cfg, env = config(smollm2, tmp_path, "--env.prompt_tokens", "1024", "--train.max_tokens", "32"), CellOrGuess()
    with BackgroundServer(hf_engine(str(smollm2), truncate=True)) as url:
        orchestrator = HarnessOrchestrator(url, env, cfg.train, cfg.env, tmp_path)
        results = asyncio.run(orchestrator.rollouts(env.tasks(2, seed=0), GROUP, 0))
    signal = with_signal(results)
    assert signal, [(r.outcome, r.reward) for r, _ in results]  # its replies' lengths differ
    expected = sorted(sampled(path) for _, path in signal)
    assert max(max(ids) for ids, _ in expected) >= ByteTokenizer.vocab_size  # the ids the byte check dropped
    batch = orchestrator.batch(0, results)
    assert (batch.counts["signal_rollouts"], batch.counts["unsampled_rollouts"]) == (len(signal), 0)
    assert len(batch.samples) == len(signal) and trained(batch) == expected
