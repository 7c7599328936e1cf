"""The Environment protocol: a task set that evaluation, the refiner's gate and RL training share.

An environment deals tasks (deterministically from a seed) and scores an answer. RL environments
also give the chat messages a policy samples from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Task:
    id: str
    prompt: str
    """The user's request."""
    system: str | None = None
    """A system prompt for environments sampled without the agent harness."""
    data: dict[str, Any] = field(default_factory=dict)
    """What scoring needs (the expected answer, ...)."""


class Environment(Protocol):
    name: str

    def tasks(self, n: int, *, seed: int) -> list[Task]:
        """`n` tasks; the same seed and n always give the same tasks."""
        ...

    def reward(self, task: Task, answer: str) -> float:
        """A score in [0, 1] for a final answer."""
        ...
