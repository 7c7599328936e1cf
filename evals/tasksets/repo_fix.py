"""repo_fix: a dozen small repositories, each with one bug and a failing test; solved when the
task's own tests pass. For real models.

The check (docs/evals.md, "Scorers run confined") runs pytest on a copy of the workspace with the
task's test file written back over whatever the agent left there (evals.scoring.Scratch), in a sandbox
of its own, and so that nothing else of the workspace's can speak for pytest: an isolated interpreter
(`-I`: no working directory, PYTHON* variables or user site on the path, so no planted `pytest.py`,
`unittest.py` or `sitecustomize.py` loads), no conftest.py (`--noconftest`), no configuration of the
workspace's (`-c /dev/null`: no pytest.ini, pyproject.toml, setup.cfg or tox.ini addopts), no plugins
but pytest's own. It passes only on evidence: a JUnit report, written outside the copy, in which
exactly the task's own tests ran and passed, and exit code 0 (a solution that exits at import
writes no report).
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
from pathlib import Path
from xml.etree import ElementTree

from agent.config_models import SandboxConfig
from evals.env import Check, Task, pick
from evals.scoring import Scratch

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
TIMEOUT = 120.0
"""Seconds the task's tests may run; past them the check fails."""
REPORT_CAP = 1 << 20


class RepoFix:
    name = "repo_fix"

    def __init__(self, sandbox: SandboxConfig | None = None):
        self.sandbox = sandbox
        """The sandbox settings a scorer's box follows (secret stores, environment, limits, `required`)."""

    def tasks(self, n: int | None, *, seed: int) -> list[Task]:
        all_tasks = [Task(id=name, prompt=PROMPT, files={"lib.py": lib, "test_lib.py": test})
                     for name, (lib, test) in REPOS.items()]
        return pick(all_tasks, n, seed)

    def check(self, task: Task, answer: str, workspace: Path) -> Check:
        tests = {rel: text for rel, text in task.files.items() if Path(rel).name.startswith("test_")}
        with Scratch(workspace, self.sandbox, restore=tests) as scratch:
            report = scratch.out / "junit.xml"
            argv = [sys.executable, "-I", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
                    "-c", os.devnull, f"--rootdir={scratch.work}", f"--junitxml={report}", *tests]
            ran = asyncio.run(scratch.run(argv, TIMEOUT, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}))
            try:
                xml = scratch.read(report, REPORT_CAP)
            except OSError:
                xml = None
        passed, why = verdict(ran.code, xml, expected(tests))
        tail = f"ran past {TIMEOUT:g}s" if ran.timed_out else (ran.stdout.strip().splitlines() or [""])[-1]
        return Check(passed, float(passed), scratch.note(why or tail))


def expected(tests: dict[str, str]) -> set[tuple[str, str]]:
    """(classname, name) of each test function in the task's test files, as a JUnit report names them."""
    return {(".".join(Path(rel).with_suffix("").parts), node.name) for rel, text in tests.items()
            for node in ast.parse(text).body if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


def verdict(code: int | None, xml: bytes | None, tests: set[tuple[str, str]]) -> tuple[bool, str | None]:
    """Whether the report shows exactly `tests`, each passed, from a run that exited 0; and if not, why
    (None: the run's own output says it)."""
    if code != 0:
        return False, None
    if xml is None:
        return False, "no test report: the test run ended before writing one"
    try:
        cases = list(ElementTree.fromstring(xml).iter("testcase"))
    except ElementTree.ParseError:
        return False, "the test report is not JUnit XML"
    ran = {(c.get("classname"), c.get("name")) for c in cases}
    if ran != tests or len(cases) != len(tests):
        return False, f"the report shows {len(cases)} tests, not the task's {len(tests)}"
    if failed := [c.get("name") for c in cases if any(e.tag in ("failure", "error", "skipped") for e in c)]:
        return False, f"the report shows {', '.join(failed)} not passing"
    return True, None
