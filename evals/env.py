"""The Environment protocol: a task set that evaluation, the refiner's gate and RL training share.

An environment deals tasks deterministically from a seed (`tasks(n, seed=...)`) and checks a
finished rollout in its workspace (`check`); one may also define `prepare(task, workspace)`, run in the
rollout's fresh workspace (after the task's files are laid out) before its session starts. RL environments also score a bare answer (`reward`)
and give the system prompt a policy samples with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class Task:
    id: str
    prompt: str
    """The user's request."""
    system: str | None = None
    """A system prompt for environments sampled without the agent harness."""
    files: dict[str, str] = field(default_factory=dict)
    """Files laid out in the rollout's fresh workspace (relative path -> text)."""
    data: dict[str, Any] = field(default_factory=dict)
    """What scoring needs (the expected answer, a check command, ...)."""
    timeout: float | None = None
    """Seconds this task's rollout may take at most (a verifiers task's `timeout.agent`); the run's own
    timeout applies too."""


@dataclass
class Check:
    passed: bool
    reward: float
    detail: str = ""
    error: str | None = None
    """Why scoring itself failed (a scorer that raised): the rollout is failed, and this is kept with it."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Measures beside the reward (a verifiers task's metrics), written to results.jsonl."""


class MissingPackage(ValueError):
    """A task set named for a package that is not installed: the message names the install command."""


class Environment(Protocol):
    name: str

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        """`n` tasks (None: the set's default size); the same seed and n always give the same tasks."""
        ...

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        """Judge a finished rollout: its final answer and what it left in the workspace. Whatever of the
        workspace it runs, it runs confined, on a copy with its own check files (evals.scoring.Scratch)."""
        ...


class RLEnvironment(Environment, Protocol):
    """An environment a bare policy can be trained on: its reward needs only the answer."""

    def reward(self, task: Task, answer: str) -> float:
        """A score in [0, 1] for a final answer."""
        ...


def pick(tasks: list[Task], n: int | None, seed: int) -> list[Task]:
    """The deterministic selection of a fixed task list: shuffled by the seed, first n."""
    if n is not None and n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    order = list(tasks)
    random.Random(seed).shuffle(order)
    return order if n is None else order[:n]
