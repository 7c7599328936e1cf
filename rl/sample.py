"""What training is made of: `Sample` (one sequence the trainer scores, its completion with the
inference logprobs it was sampled with and its advantage), `Batch` (a step's samples, with the rewards
and counts of the rollouts they came from) and `TokenSample` (a session's trajectory as tokens and a
loss mask, before it has an advantage: rl/data.py makes them, `to_sample` turns one into a `Sample`).

Rollouts (rl/orchestrator.py, rl/envs/harness.py) and ingested sessions (rl/data.py, rl/atif.py) make
them; packing (rl/packing.py), the data-parallel split (rl/dist.py) and the trainer (rl/train.py) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    inference_logprobs: list[float]
    advantage: float
    reward: float
    version: int
    completion_mask: list[bool] | None = None
    """Which completion tokens the policy sampled (None: all). A multi-turn sample's completion
    also holds what the harness inserted between its replies: masked, logprob 0."""


@dataclass
class Batch:
    step: int
    samples: list[Sample]
    rewards: list[float]
    """Every scored rollout's reward of the groups sampled for training, including groups that train nothing
    and those dropped for having no signal (train.skip_zero_advantage); not the difficulty filter's
    estimating rollouts: with train.difficulty it is the reward on the tasks kept."""
    version: int
    """The oldest policy version that sampled its rollouts (-1: none sampled)."""
    counts: dict[str, int] = field(default_factory=dict)
    """rollouts, errored, timed_out, zero_advantage_groups, stale (dropped for max_off_policy_steps);
    signal_rollouts (those with an advantage: their group's rewards differ) and unsampled_rollouts (of those,
    the ones that yielded no sample), whose ratio the trainer reports as `sampled_share`; groups (tasks
    sampled for training and kept), useful_groups (of those, the ones with signal) and extra_rounds (rounds
    of tasks drawn past the first to fill the batch: train.skip_zero_advantage, train.difficulty); with
    train.difficulty, tasks_measured, tasks_too_easy, tasks_too_hard and tasks_unmeasured (every estimating
    rollout failed)."""


@dataclass
class TokenSample:
    session_id: str
    ids: list[int]
    mask: list[bool]
    """True where the policy sampled the token (trainable); False where the harness inserted it."""
    logprobs: list[float]
    """The inference logprob of each sampled token; 0.0 where masked."""
    harness_version: str | None
    turns: list[str] = field(default_factory=list)
    reward: float | None = None

    @property
    def trainable(self) -> int:
        return sum(self.mask)

    def to_sample(self, advantage: float, version: int = 0) -> Sample:
        """The trainer's form: the masked history before the first sampled token is the prompt."""
        first = self.mask.index(True)
        return Sample(self.ids[:first], self.ids[first:], self.logprobs[first:], advantage,
                      self.reward if self.reward is not None else 0.0, version, completion_mask=self.mask[first:])
