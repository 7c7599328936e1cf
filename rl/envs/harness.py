"""Rollouts through the agent itself: each rollout is a real session (kernel, turn loop, text-mode
cells) against the policy server, scored by the environment's check, and trained on from its
trajectory (rl.data) — the code path that serves users is the one that makes training data.

    orchestrator = HarnessOrchestrator(base_url, env, cfg.train, cfg.env, run_dir)
    for batch in orchestrator.batches(start, steps): ...      # what rl.train.train consumes

Sessions run in this process, or with `[rollouts] ray` as tasks on a Ray cluster (evals/cluster.py); a
subclass may run them elsewhere (the demo runs them in the daemon) by overriding `rollouts`. Rollouts are on-policy (sampled, then trained on); advantages (rl.advantages) are
relative to each task's group.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from agent.config_models import Config
from agent.layout import SessionLayout
from agent.providers import open_model
from agent.trajectory import MessageRecord, Record, read_records
from evals.cluster import Cluster
from evals.env import Environment, Task
from evals.runner import EvalSpec, Result, prompt_of, rollout, rollout_layout, rollout_session, workspace
from evals.tasksets import task_key
from rl.advantages import Excluded, group_advantages
from rl.config import EnvConfig, RolloutsConfig, RunConfig, TrainConfig
from rl.data import IngestCounts, samples
from rl.orchestrator import rollout_seed
from rl.policy.tokenizer import ByteTokenizer
from rl.sample import Batch
from rl.serve import keep_tail


def agent_config(base_url: str | None, train: TrainConfig, env: EnvConfig) -> Config:
    """The agent as RL drives it: text mode (the policy has no tool calling), logprobs and the
    server's prompt ids recorded, no background refinement, a short budget."""
    return Config.model_validate(agent_overrides(base_url, train, env))


def agent_overrides(base_url: str | None, train: TrainConfig, env: EnvConfig) -> dict:
    """agent_config's settings as config overrides (what a daemon session is created with). The guards
    against a model that loops are off: a policy's loops are samples to learn from, kept whole (its
    completions are bounded by `train.max_tokens`, its turns by `env.max_steps` and `env.timeout`)."""
    return {
        "model": {"name": "prime-policy", "base_url": base_url, "action_format": "text", "base_prompt": env.base_prompt,
                  "stream": False, "repetition_limit": 0,
                  "record_logprobs": True, "temperature": train.temperature, "max_completion_tokens": train.max_tokens,
                  "max_retries": 1, "timeout": train.request_timeout,
                  # top_p pinned: the trainer scores tokens over the whole distribution, whatever sampling
                  # defaults the server advertises for the model (agent.model.fitted)
                  "extra_body": {"top_p": 1.0,
                                 **({"truncate_prompt_tokens": env.prompt_tokens} if env.prompt_tokens else {})}},
        "budget": {"max_steps": env.max_steps, "max_seconds": env.timeout, "max_repeats": None},
        "kernel": {"interrupt_grace": 1.0, "cell_timeout": min(30.0, env.timeout)},
        "compaction": {"enabled": False},
        "refine": {"auto_every": 0},
    }


def policy_view(task: Task, system: str, cfg: RunConfig, tok=None, context: int | None = None) -> list[int]:
    """The tokens the policy (reading `tok`, default the byte tokenizer, in `context` tokens, default
    model.max_seq) sees of a rollout's first request: the session's system prompt `system` (as its
    trajectory records it: `recorded_system_prompt`) and the task, cut to what the server keeps."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt_of(task)}]
    tok = tok or ByteTokenizer()
    ids = tok.chat(messages)
    limit = context or cfg.model.max_seq
    keep = cfg.env.prompt_tokens or max(1, limit - min(cfg.train.max_tokens, limit // 2))  # as rl.serve keeps it
    return keep_tail(ids, keep, tok.bos)


def recorded_system_prompt(records: list[Record]) -> str:
    """The system prompt a session's first request carried, from its trajectory."""
    for r in records:
        if isinstance(r, MessageRecord) and r.message.role == "system":
            return r.message.content
    raise ValueError("the trajectory records no system prompt (the session never started)")


def warm_start_system_prompt(train: TrainConfig, env: EnvConfig, run_dir: Path) -> str:
    """The system prompt a rollout's session is given, for the warm start to show the policy before any
    rollout ran: a session started as `rollouts` starts one (the agent's settings, a throwaway workspace),
    asked nothing, and its prompt read from its trajectory (kept in `run_dir`/sessions/system-prompt). Its
    workspace's path is another temporary one than each rollout's, of the same length."""
    config = agent_config(None, train, env)  # no server: the session asks nothing of a model
    layout = SessionLayout.of("system-prompt", run_dir)

    async def start() -> None:
        with workspace() as work:
            async with rollout_session(config, open_model(config.model), Path(work), layout.dir):
                pass

    shutil.rmtree(layout.dir, ignore_errors=True)  # a session id is one session's
    asyncio.run(start())
    return recorded_system_prompt(read_records(layout.trajectory))


class HarnessOrchestrator:
    def __init__(self, base_url: str, env: Environment, train: TrainConfig, env_config: EnvConfig, run_dir: Path,
                 vocab_size: int | None = None, rollouts: RolloutsConfig | None = None):
        """`rollouts`: with its `ray` set, each rollout is a task on that Ray cluster (evals/cluster.py)."""
        self.env, self.train, self.env_config, self.run_dir = env, train, env_config, run_dir
        self.cluster = Cluster.connect(rollouts.ray, num_cpus=rollouts.num_cpus) if rollouts and rollouts.ray else None
        self.config = agent_config(base_url, train, env_config)
        self.vocab_size = vocab_size
        """The policy's vocabulary: a reply with a token id past it is not this policy's and stays masked
        text (counted as `foreign_replies`). None: every reply is the policy's, the rollout server being the
        policy in training. Never the byte policy's by default: a Hugging Face policy's ids lie past it."""

    def batches(self, start: int, steps: int):
        for step in range(start, steps):
            yield asyncio.run(self.collect(step))

    async def rollouts(self, tasks: list[Task], group: int, step: int) -> list[tuple[Result, Path]]:
        """`group` rollouts of each task, in order: each one's result and its trajectory file."""
        spec = EvalSpec(taskset=self.env.name, n=len(tasks), rollouts=group, concurrency=self.train.threads or os.cpu_count() or 1,
                        seed=step, timeout=self.env_config.timeout)
        model = open_model(self.config.model)
        step_dir = self.run_dir / "rollouts" / f"step-{step}"
        slots = asyncio.Semaphore(spec.concurrency)

        async def one(task: Task, r: int) -> tuple[Result, Path]:
            key = task_key(task, {"step": step})
            async with slots:
                if self.cluster is None:
                    result = await rollout(self.env, task, r, key, spec, self.config, model, step_dir)
                else:
                    result = await self.cluster.rollout(self.env_config.name, task, r, key, spec, self.config, step_dir,
                                                        options=self.env_config.options)
            return result, rollout_layout(step_dir, result).trajectory

        try:
            return await asyncio.gather(*(one(task, r) for task in tasks for r in range(group)))
        finally:
            await model.close()

    async def collect(self, step: int) -> Batch:
        tasks = self.env.tasks(self.train.batch_size, seed=rollout_seed(self.train.seed, step))
        return self.batch(step, await self.rollouts(tasks, self.train.group_size, step))

    def batch(self, step: int, results: list[tuple[Result, Path]]) -> Batch:
        """The training batch of a step's rollouts (each task's group in turn, as `rollouts` returns them).
        A rollout with an advantage (its group's rewards differ, and it was judged) is counted in
        `signal_rollouts`; one of those that yields no sample (its replies without logprobs, or not the
        policy's) in `unsampled_rollouts`: its signal is lost, which the trainer reports (rl.train)."""
        t = self.train
        counts = {"rollouts": len(results), "errored": 0, "timed_out": 0, "zero_advantage_groups": 0, "stale": 0,
                  "signal_rollouts": 0, "unsampled_rollouts": 0, "replies_without_logprobs": 0, "foreign_replies": 0}
        batch = Batch(step, [], [], step, counts)  # sampled by the weights after `step` updates
        for g in range(0, len(results), t.group_size):
            rollouts = results[g:g + t.group_size]
            scored = [_reward(r) for r, _ in rollouts]
            batch.rewards += [r for r in scored if not isinstance(r, str)]
            advantages = group_advantages(scored, counts, std_normalize=t.std_normalize)
            for (_, path), reward, advantage in zip(rollouts, scored, advantages):
                if advantage is None:
                    continue
                counts["signal_rollouts"] += 1
                ingest = IngestCounts()
                made = [s.to_sample(advantage, step) for s in samples(read_records(path), ingest, self.vocab_size)]
                for sample in made:
                    sample.reward = reward
                batch.samples += made
                counts["unsampled_rollouts"] += not made
                counts["replies_without_logprobs"] += ingest.skipped_no_logprobs
                counts["foreign_replies"] += ingest.foreign
        return batch


def _reward(result: Result) -> float | Excluded:
    """A judged rollout's reward, or why it has none."""
    if result.outcome in ("passed", "failed"):
        return result.reward or 0.0
    return "timed_out" if result.outcome == "timed_out" else "errored"
