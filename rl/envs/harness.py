"""Rollouts through the agent itself: each rollout is a real session (kernel, turn loop, text-mode
cells) against the policy server, scored by the environment's check, and trained on from its
trajectory (rl.data) — the code path that serves users is the one that makes training data.

    orchestrator = HarnessOrchestrator(base_url, env, cfg.train, cfg.env, run_dir)
    for batch in orchestrator.batches(start, steps): ...      # what rl.train.train consumes

Rollouts are on-policy (sampled, then trained on); advantages are relative to each task's group.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from agent.config import Config
from agent.model import OpenAIModel
from agent.trajectory import read_records
from evals.env import Environment
from evals.runner import EvalSpec, Result, rollout
from evals.tasksets import task_key
from rl.config import EnvConfig, TrainConfig
from rl.data import IngestCounts, samples
from rl.orchestrator import Batch


def agent_config(base_url: str, train: TrainConfig, env: EnvConfig) -> Config:
    """The agent as RL drives it: text mode (the policy has no tool calling), logprobs and the
    server's prompt ids recorded, no background refinement, a short budget."""
    return Config.model_validate({
        "model": {"name": "prime-policy", "base_url": base_url, "action_format": "text", "stream": False,
                  "record_logprobs": True, "temperature": train.temperature, "max_completion_tokens": train.max_tokens,
                  "max_retries": 1, "timeout": train.request_timeout},
        "budget": {"max_steps": env.max_steps, "max_seconds": env.timeout},
        "kernel": {"interrupt_grace": 1.0, "cell_timeout": min(30.0, env.timeout)},
        "compaction": {"enabled": False},
        "refine": {"auto_every": 0},
    })


class HarnessOrchestrator:
    def __init__(self, base_url: str, env: Environment, train: TrainConfig, env_config: EnvConfig, run_dir: Path):
        self.env, self.train, self.env_config, self.run_dir = env, train, env_config, run_dir
        self.config = agent_config(base_url, train, env_config)

    def batches(self, start: int, steps: int):
        for step in range(start, steps):
            yield asyncio.run(self.collect(step))

    async def collect(self, step: int) -> Batch:
        t = self.train
        tasks = self.env.tasks(t.batch_size, seed=t.seed * 1_000_003 + step)
        spec = EvalSpec(taskset=self.env.name, n=t.batch_size, rollouts=t.group_size, concurrency=max(1, t.threads),
                        seed=step, timeout=self.env_config.timeout)
        model = OpenAIModel(self.config.model)
        step_dir = self.run_dir / "rollouts" / f"step-{step}"
        slots = asyncio.Semaphore(spec.concurrency)

        async def one(task, r: int) -> Result:
            async with slots:
                return await rollout(self.env, task, r, task_key(task, {"step": step}), spec, self.config, model, step_dir)

        try:
            results = await asyncio.gather(*(one(task, r) for task in tasks for r in range(t.group_size)))
        finally:
            await model.close()
        counts = {"rollouts": len(results), "errored": 0, "timed_out": 0, "zero_advantage_groups": 0, "stale": 0,
                  "replies_without_logprobs": 0}
        batch = Batch(step, [], [], step, counts)  # sampled by the weights after `step` updates
        for g in range(len(tasks)):
            group = [r for r in results[g * t.group_size:(g + 1) * t.group_size] if r.outcome in ("passed", "failed")]
            counts["errored"] += sum(r.outcome == "error" for r in results[g * t.group_size:(g + 1) * t.group_size])
            counts["timed_out"] += sum(r.outcome == "timed_out" for r in results[g * t.group_size:(g + 1) * t.group_size])
            rewards = [r.reward or 0.0 for r in group]
            batch.rewards += rewards
            if len(set(rewards)) < 2:  # nothing to learn from a group that scored alike
                counts["zero_advantage_groups"] += 1
                continue
            mean = statistics.fmean(rewards)
            scale = (statistics.pstdev(rewards) or 1.0) if t.std_normalize else 1.0
            for result, reward in zip(group, rewards):
                ingest = IngestCounts()
                records = read_records(step_dir / "sessions" / f"{result.task_id}-{result.rollout}" / "trajectory.jsonl")
                for s in samples(records, ingest):
                    sample = s.to_sample((reward - mean) / scale, step)
                    sample.reward = reward
                    batch.samples.append(sample)
                counts["replies_without_logprobs"] += ingest.skipped_no_logprobs
        return batch

