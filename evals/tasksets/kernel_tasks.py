"""kernel_tasks: small arithmetic and string puzzles an agent solves by running code.

Generated from the seed; the answer is checked exactly (numbers and words, whitespace aside).
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from evals.env import Check, Task

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def _puzzle(rng: random.Random, kind: int) -> tuple[str, str]:
    if kind == 0:
        n = rng.randint(50, 500)
        return f"What is the sum of the squares of the integers from 1 to {n}?", str(sum(i * i for i in range(1, n + 1)))
    if kind == 1:
        n = rng.randint(100, 2000)
        primes = [p for p in range(2, n) if all(p % d for d in range(2, int(p**0.5) + 1))]
        return f"How many prime numbers are smaller than {n}?", str(len(primes))
    if kind == 2:
        text = "".join(rng.choice(string.ascii_lowercase + "     ") for _ in range(rng.randint(40, 80))).strip()
        return f"How many vowels (a, e, i, o, u) are in this text: {text!r}?", str(sum(text.count(v) for v in "aeiou"))
    words = rng.sample(WORDS, rng.randint(4, 7))
    return f"Sort these words alphabetically and answer with them joined by single spaces: {' '.join(words)}", " ".join(sorted(words))


class KernelTasks:
    name = "kernel_tasks"

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        rng = random.Random(seed)
        out = []
        for i in range(n if n is not None else 20):
            prompt, answer = _puzzle(rng, i % 4)
            out.append(Task(id=f"k{seed}-{i}", prompt=prompt + " Answer with the value alone.", data={"answer": answer}))
        return out

    def reward(self, task: Task, answer: str) -> float:
        return float(" ".join(answer.strip().strip(".").split()) == task.data["answer"])

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        reward = self.reward(task, answer)
        return Check(passed=reward == 1.0, reward=reward, detail=f"expected {task.data['answer']!r}")
