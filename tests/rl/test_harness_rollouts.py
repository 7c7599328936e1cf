"""RL through the agent itself: rollouts are real sessions against the policy server, samples come
from their trajectories, training moves the weights, and the next rollouts sample the new ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from evals.env import Check, Task
from rl.config import EnvConfig, RunConfig, TrainConfig
from rl.envs.harness import HarnessOrchestrator
from rl.policy.policy import PolicyConfig, token_logprobs
from rl.serve import BackgroundServer, engine_from
from rl.train import train, train_step

TINY = PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=256)


class OddAnswers:
    """A stand-in task set whose check rewards answers of odd length: an untrained policy's answers
    vary, so groups do too (kernel_tasks' exact answers are beyond a policy this small)."""

    name = "odd_answers"

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        return [Task(id=f"odd{seed}-{i}", prompt=f"say something ({i})") for i in range(n or 1)]

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        odd = len(answer) % 2 == 1
        return Check(odd, float(odd), f"{len(answer)} characters")


def test_rollouts_through_the_agent_train_the_policy_and_the_next_sample_the_new_weights(tmp_path: Path, prime_home):
    torch.manual_seed(0)
    engine = engine_from(None, TINY, seed=3, truncate=True)
    cfg = RunConfig(model=TINY, env=EnvConfig(harness=True, max_steps=2, timeout=60),
                    train=TrainConfig(batch_size=2, group_size=4, max_tokens=12, lr=1e-2, threads=2))
    model = engine_from(None, TINY, seed=3).model  # the trainer's copy: the same weights
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    with BackgroundServer(engine) as url:
        orchestrator = HarnessOrchestrator(url, OddAnswers(), cfg.train, cfg.env, tmp_path)
        batch = asyncio.run(orchestrator.collect(0))
        assert batch.counts["rollouts"] == 8 and batch.counts["errored"] == 0 and len(batch.rewards) == 8
        assert batch.samples, batch.counts  # some group's rewards differed
        assert all(s.version == 0 and len(s.prompt_ids) + len(s.completion_ids) <= 256 for s in batch.samples)
        assert {round(s.advantage, 6) for s in batch.samples} != {0.0}
        sessions = list((tmp_path / "rollouts" / "step-0" / "sessions").iterdir())
        assert len(sessions) == 8 and all((d / "trajectory.jsonl").is_file() for d in sessions)
        metrics = train_step(model, opt, batch, cfg)
        assert metrics["tokens"] > 0 and metrics["grad_norm"] > 0
        engine.update(model.state_dict(), version=1)
        after = asyncio.run(orchestrator.collect(1))
    model.eval()
    with torch.no_grad():  # the new rollouts were sampled by the updated weights, exactly
        for s in after.samples:
            ids = s.prompt_ids + s.completion_ids
            trainer = token_logprobs(model, torch.tensor([ids]))[0]
            for j, (lp, m) in enumerate(zip(s.inference_logprobs, s.completion_mask)):
                if m:
                    assert abs(float(trainer[len(s.prompt_ids) + j - 1]) - lp) < 1e-3


def test_rl_train_runs_kernel_tasks_through_the_harness(tmp_path: Path, prime_home):
    cfg = RunConfig.model_validate({
        "model": TINY.model_dump(), "env": {"name": "kernel_tasks", "harness": True, "max_steps": 1, "timeout": 60},
        "train": {"steps": 1, "batch_size": 1, "group_size": 2, "max_tokens": 8, "out": str(tmp_path / "run"),
                  "checkpoint_every": 1},
    })
    (step,) = train(cfg, log=lambda *_: None, progress=False)
    assert step["rollouts"] == 2 and step["errored"] == 0 and step["reward_mean"] == 0.0  # untrained: no answers
    assert (tmp_path / "run" / "checkpoints" / "step-1").is_dir()
    assert len(list((tmp_path / "run" / "rollouts" / "step-0" / "sessions").iterdir())) == 2


def test_the_warm_start_sees_what_the_policy_sees_in_a_session(tmp_path: Path, prime_home):
    """rl.envs.harness.policy_view (what SFT trains on) is the prompt the server kept for a real rollout, from
    the system prompt its trajectory records; the warm start's own system prompt, from a session started as a
    rollout's is, is the rollouts' (the person's harness notes in it too) but for the workspace's path."""
    from agent.trajectory import ModelCall, SessionRecord, read_records
    from evals.tasksets.kernel_tasks import FILE_KINDS, KernelTasks
    from harness_store.store import Edit, HarnessStore
    from rl.envs.harness import policy_view, recorded_system_prompt, warm_start_system_prompt

    HarnessStore(prime_home / "harness", "user").apply(
        [Edit("create", "style", kind="prompt", title="Style", body="Answer in one line.")], summary="create style",
        trigger="test", source="user")
    cfg = RunConfig(model=TINY, env=EnvConfig(name="kernel_tasks", harness=True, max_steps=1, timeout=60,
                                              prompt_tokens=64),
                    train=TrainConfig(batch_size=4, group_size=1, max_tokens=8))
    env = KernelTasks(FILE_KINDS)
    with BackgroundServer(engine_from(None, TINY, truncate=True)) as url:
        orchestrator = HarnessOrchestrator(url, env, cfg.train, cfg.env, tmp_path)
        tasks = env.tasks(4, seed=1)
        results = asyncio.run(orchestrator.rollouts(tasks, 1, 0))
    warm = warm_start_system_prompt(cfg.train, cfg.env, tmp_path / "sft")
    (warm_start,) = [r for r in read_records(tmp_path / "sft" / "sessions" / "system-prompt" / "trajectory.jsonl")
                     if isinstance(r, SessionRecord)]
    assert "Answer in one line." in warm
    for task, (result, trajectory) in zip(tasks, results):
        records = read_records(trajectory)
        (call,) = [r for r in records if isinstance(r, ModelCall)]
        (start,) = [r for r in records if isinstance(r, SessionRecord)]
        system = recorded_system_prompt(records)
        assert call.prompt_token_ids == policy_view(task, system, cfg), task.prompt
        assert len(call.prompt_token_ids) == 64
        assert warm.replace(warm_start.cwd, start.cwd) == system and warm_start.cwd != start.cwd
        assert policy_view(task, warm, cfg) == call.prompt_token_ids


def test_rollouts_sample_as_the_trainer_scores_whatever_sampling_the_server_advertises():
    from agent.model import ServerModel, fitted
    from rl.envs.harness import agent_config

    says = ServerModel(context_window=8192, tools=False, sampling={"temperature": 0.2, "top_p": 0.9})
    model = fitted(agent_config("http://127.0.0.1:1/v1", TrainConfig(temperature=0.7), EnvConfig()).model, says)
    assert (model.temperature, model.extra_body["top_p"], model.action_format) == (0.7, 1.0, "text")
    assert model.context_window == 8192  # the policy's own context, read from its server
