"""Training environments, by name."""

from __future__ import annotations

from evals.env import Environment


def load(name: str, **options) -> Environment:
    if name == "reverse_text":
        from rl.envs.reverse_text import ReverseText

        return ReverseText(**options)
    raise ValueError(f"unknown environment {name!r}; known: reverse_text")
