"""`prime-agent refine loop` and `prime-agent eval --harness` as a person runs them, in a fresh folder,
against an OpenAI-compatible server whose model answers by its prompt."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from harness_store.store import HarnessStore
from tests.agent.test_refine import PLANNER, proposal
from tests.evals.test_refine_loop import GOOD, passes_bare, write_tasks

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def model(request: dict) -> Reply:
    """The agent right when its harness says `Add the two numbers exactly.` (or the first number is even);
    the planner proposes that note."""
    messages = request["messages"]
    system = messages[0]["content"]
    if system.startswith(PLANNER):
        return Reply(content=proposal(GOOD, summary="add exactly"))
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    a, b = map(int, re.search(r"What is (\d+) plus (\d+)", prompt).groups())  # type: ignore[union-attr]
    if not any(m["role"] == "tool" for m in messages):
        return Reply(code=[f"print({a} + {b})"])
    return Reply(content=str(a + b if "Add the two numbers exactly." in system or a % 2 == 0 else a + b + 1))


def prime_agent(*args: str, cwd: Path, server: OpenAIServer, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([PRIME_AGENT, *args, "--model", "fake", "--base-url", server.base_url], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the loop's fourteen rollouts and an eval's three, real sessions and kernels, on a loaded machine
def test_the_loop_from_the_command_line_then_the_first_harness_evaluated_on_the_test_split(tmp_path: Path):
    work = tmp_path / "work"  # a fresh folder: no .git, no .prime-agent
    work.mkdir()
    tasks = write_tasks(work / "sums.jsonl")
    with OpenAIServer(model) as server:
        ran = prime_agent("refine", "loop", "sums.jsonl", "--rounds", "1", "--train", "2", "--val", "3", "--test", "3",
                          "-j", "3", "--timeout", "120", "--out", "run", cwd=work, server=server)
        assert ran.returncode == 0, ran.stderr
        report = json.loads((work / "run" / "report.json").read_text())
        test_ids = report["splits"]["test"]
        assert report["rounds"][0]["kept"] is True and report["test"]["after"]["mean"] == 1.0
        assert "difference +0.667, 95% CI [+0.013, +1.000]" in ran.stdout
        assert re.search(r"│ +1 │ add exactly +│ 0.667 -> 1.000 │ yes +│ +0 │ +0 │", ran.stdout), ran.stdout
        assert (work / "run" / "refine.png").is_file()

        live = HarnessStore(work / ".prime-agent" / "harness", "project")
        head = live.head()
        assert [e.id for e in live.entries()] == ["add-exactly"] and head == report["harness_after"]
        logged = subprocess.run([PRIME_AGENT, "harness", "log", "--scope", "project"], cwd=work, capture_output=True,
                                text=True, timeout=60)
        assert "refine-loop  refine: add exactly  [add-exactly]" in logged.stdout

        # The test split with the first harness, which the live one no longer is: the live one is left as it is.
        only_test = work / "test.jsonl"
        only_test.write_text("".join(line + "\n" for line in tasks.read_text().splitlines()
                                     if json.loads(line)["id"] in test_ids))
        before = report["harness_before"]
        ran = prime_agent("eval", "test.jsonl", "--harness", before, "--out", "before", cwd=work, server=server)
        assert ran.returncode == 0, ran.stderr
        assert "harness: user@" not in ran.stderr and f"harness: project@{before[:12]}" in ran.stderr
        results = [json.loads(line) for line in (work / "before" / "results.jsonl").read_text().splitlines()]
        assert {r["harness_version"] for r in results} == {f"project@{before[:12]}"}
        wrong = prime_agent("eval", "test.jsonl", "--harness", "no-such-version", "--out", "x", cwd=work, server=server)
    expected_before = sum(passes_bare(json.loads(line)["prompt"]) for line in only_test.read_text().splitlines()) / 3
    rate = sum(r["outcome"] == "passed" for r in results) / len(results)
    assert rate == report["test"]["before"]["mean"] == expected_before < 1.0
    assert live.head() == head and [e.id for e in live.entries()] == ["add-exactly"]
    assert wrong.returncode == 2 and "--harness no-such-version: no harness scope holds 'no-such-version'" in wrong.stderr
