"""Training environments, by name (they implement evals' Environment protocol)."""

from __future__ import annotations

from evals.env import RLEnvironment


def load(name: str, **options) -> RLEnvironment:
    if name == "reverse_text":
        from evals.tasksets.reverse_text import ReverseText

        return ReverseText(**options)
    raise ValueError(f"unknown environment {name!r}; known: reverse_text")
