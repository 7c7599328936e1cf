"""kernel_tasks: small arithmetic and string puzzles an agent solves by running code.

Generated from the seed; the answer is checked exactly (numbers and words, whitespace aside).
Each kind has a demonstration (the text-mode reply that computes the answer in the kernel) and a
distractor (a plausible guess answered without running anything), for warm starts.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from evals.env import Check, Task

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
KINDS = ("squares", "primes", "vowels", "sort")
FILE_KINDS = ("lines", "words", "total", "largest")
"""Questions about files laid out in the working directory: only running code finds the answer."""

CODE = {  # the cell that computes each kind's answer, from the task's own argument
    "squares": "final(sum(i*i for i in range({arg}+1)))",
    "primes": "final(sum(all(p%d for d in range(2,p)) for p in range(2,{arg})))",
    "vowels": "final(sum(c in 'aeiou' for c in {arg!r}))",
    "sort": "final(' '.join(sorted({arg!r}.split())))",
    "lines": "final(len(open('data.txt').readlines()))",
    "words": "final(len(open('notes.txt').read().split()))",
    "total": "final(sum(map(int, open('numbers.txt').read().split())))",
    "largest": "final(max(map(int, open('numbers.txt').read().split())))",
}


def _file_puzzle(rng: random.Random, kind: str) -> tuple[str, dict[str, str], str]:
    """(question, files, answer)."""
    intro = "Using the files in your working directory: "
    if kind in ("lines", "words"):
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 8))) for _ in range(rng.randint(3, 40))]
        text = "\n".join(lines) + "\n"
        if kind == "lines":
            return intro + "How many lines are in data.txt?", {"data.txt": text}, str(len(lines))
        return intro + "How many words are in notes.txt?", {"notes.txt": text}, str(len(text.split()))
    numbers = [rng.randint(-500, 999) for _ in range(rng.randint(5, 30))]
    files = {"numbers.txt": "\n".join(map(str, numbers)) + "\n"}
    if kind == "total":
        return intro + "Add up the numbers in numbers.txt: what is their sum?", files, str(sum(numbers))
    return intro + "Of the numbers in numbers.txt, which is the largest?", files, str(max(numbers))


def _puzzle(rng: random.Random, kind: str) -> tuple[str, int | str, str]:
    """(question, argument, answer)."""
    if kind == "squares":
        n = rng.randint(50, 500)
        return f"What is the sum of the squares of the integers from 1 to {n}?", n, str(sum(i * i for i in range(1, n + 1)))
    if kind == "primes":
        n = rng.randint(100, 2000)
        primes = [p for p in range(2, n) if all(p % d for d in range(2, int(p**0.5) + 1))]
        return f"How many prime numbers are smaller than {n}?", n, str(len(primes))
    if kind == "vowels":
        text = "".join(rng.choice(string.ascii_lowercase + "     ") for _ in range(rng.randint(40, 80))).strip()
        return f"How many vowels (a, e, i, o, u) are in this text: {text!r}?", text, str(sum(text.count(v) for v in "aeiou"))
    words = " ".join(rng.sample(WORDS, rng.randint(4, 7)))
    return (f"Sort these words alphabetically and answer with them joined by single spaces: {words}", words,
            " ".join(sorted(words.split())))


class KernelTasks:
    name = "kernel_tasks"

    def __init__(self, kinds: list[str] | tuple[str, ...] = KINDS):
        unknown = sorted(set(kinds) - set(KINDS + FILE_KINDS))
        if unknown or not kinds:
            raise ValueError(f"kernel_tasks kinds must be some of {', '.join(KINDS + FILE_KINDS)} (got {list(kinds)})")
        self.kinds = tuple(kinds)

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        rng = random.Random(seed)
        out = []
        for i in range(n if n is not None else 20):
            kind = self.kinds[i % len(self.kinds)]
            files: dict[str, str] = {}
            if kind in FILE_KINDS:
                (prompt, files, answer), arg = _file_puzzle(rng, kind), None
            else:
                prompt, arg, answer = _puzzle(rng, kind)
            out.append(Task(id=f"k{seed}-{i}", prompt=prompt + " Answer with the value alone.", files=files,
                            data={"answer": answer, "kind": kind, "arg": arg}))
        return out

    def reward(self, task: Task, answer: str) -> float:
        return float(" ".join(answer.strip().strip(".").split()) == task.data["answer"])

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        reward = self.reward(task, answer)
        return Check(passed=reward == 1.0, reward=reward, detail=f"expected {task.data['answer']!r}")

    def demonstration(self, task: Task) -> str:
        """The ideal reply in text mode: one cell that computes the answer and ends the turn with it."""
        return "```python\n" + CODE[task.data["kind"]].format(arg=task.data["arg"]) + "\n```"

    def distractor(self, task: Task) -> str:
        """A plausible guess, answered without running anything (and wrong)."""
        rng, answer = random.Random(task.id), task.data["answer"]
        if task.data["kind"] == "sort":
            words = answer.split()
            while words == answer.split():
                rng.shuffle(words)
            return " ".join(words)
        value = int(answer)
        return str(value + rng.choice([-1, 1]) * rng.randint(1, max(3, value // 20)))
