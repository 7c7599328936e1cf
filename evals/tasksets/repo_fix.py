"""repo_fix: a dozen small repositories, each with one bug and a failing test; solved when the
test suite passes (`python -m pytest -q` in the workspace). For real models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from evals.env import Check, Task, pick

# name: (module source with the bug, test source)
REPOS: dict[str, tuple[str, str]] = {
    "add": ("def add(a, b):\n    return a - b\n", "from lib import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
    "mean": ("def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n",
             "from lib import mean\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"),
    "last": ("def last(xs):\n    return xs[len(xs)]\n", "from lib import last\n\ndef test_last():\n    assert last([1, 2, 9]) == 9\n"),
    "is_even": ("def is_even(n):\n    return n % 2 == 1\n",
                "from lib import is_even\n\ndef test_even():\n    assert is_even(4) and not is_even(7)\n"),
    "reverse": ("def reverse(s):\n    return s[::1]\n", "from lib import reverse\n\ndef test_reverse():\n    assert reverse('abc') == 'cba'\n"),
    "clamp": ("def clamp(x, lo, hi):\n    return max(hi, min(lo, x))\n",
              "from lib import clamp\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0 and clamp(2, 0, 3) == 2\n"),
    "count_words": ("def count_words(s):\n    return len(s.split(' ')) - 1\n",
                    "from lib import count_words\n\ndef test_count():\n    assert count_words('a b c') == 3\n"),
    "factorial": ("def factorial(n):\n    out = 1\n    for i in range(1, n):\n        out *= i\n    return out\n",
                  "from lib import factorial\n\ndef test_factorial():\n    assert factorial(5) == 120\n"),
    "maximum": ("def maximum(xs):\n    best = 0\n    for x in xs:\n        if x > best:\n            best = x\n    return best\n",
                "from lib import maximum\n\ndef test_negative():\n    assert maximum([-5, -2, -9]) == -2\n"),
    "dedupe": ("def dedupe(xs):\n    return list(set(xs))\n",
               "from lib import dedupe\n\ndef test_order_kept():\n    assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]\n"),
    "title": ("def title(s):\n    return s.capitalize()\n",
              "from lib import title\n\ndef test_title():\n    assert title('hello big world') == 'Hello Big World'\n"),
    "fizz": ("def fizz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)\n",
             "from lib import fizz\n\ndef test_fizzbuzz():\n    assert fizz(15) == 'FizzBuzz' and fizz(9) == 'Fizz' and fizz(7) == '7'\n"),
}
PROMPT = "The test suite of this repository fails. Find the bug and fix it so that `python -m pytest -q` passes."


class RepoFix:
    name = "repo_fix"

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        all_tasks = [Task(id=name, prompt=PROMPT, files={"lib.py": lib, "test_lib.py": test})
                     for name, (lib, test) in REPOS.items()]
        return pick(all_tasks, n, seed)

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=workspace,
                              capture_output=True, text=True, timeout=120)
        tail = (done.stdout.strip().splitlines() or [""])[-1]
        return Check(passed=done.returncode == 0, reward=float(done.returncode == 0), detail=tail)
