"""reverse_text: reverse a short random string; reward = difflib.SequenceMatcher ratio.

Tasks are generated locally from a seed (no downloads).
"""

from __future__ import annotations

import difflib
import random
import string
from pathlib import Path

from evals.env import Check, Task

SYSTEM = "Reverse the text."


class ReverseText:
    name = "reverse_text"

    def __init__(self, min_len: int = 3, max_len: int = 10, alphabet: str = string.ascii_lowercase):
        self.min_len, self.max_len, self.alphabet = min_len, max_len, alphabet

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        rng = random.Random(seed)
        out = []
        for i in range(n if n is not None else 20):
            text = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
            out.append(Task(id=f"{seed}-{i}", prompt=text, system=SYSTEM, data={"target": text[::-1]}))
        return out

    def reward(self, task, answer: str) -> float:
        return difflib.SequenceMatcher(None, answer.strip(), task.data["target"]).ratio()

    def check(self, task, answer: str, workspace: Path) -> Check:
        reward = self.reward(task, answer)
        return Check(passed=answer.strip() == task.data["target"], reward=reward, detail=f"ratio {reward:.3f}")

    def demonstration(self, task) -> str:
        """The ideal answer, for SFT warm-starts."""
        return task.data["target"]

    def distractor(self, task) -> str:
        """A plausible wrong answer (the text as given, not reversed), for noisy warm-starts."""
        return task.prompt
