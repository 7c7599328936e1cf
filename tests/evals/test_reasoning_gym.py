"""`rg:DATASET` through `prime-agent eval`: real sessions against the fake model server, tasks fixed by
seed, answers scored by reasoning-gym's own scorers, a raising scorer a failed rollout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from evals.runner import read_results
from evals.tasksets import MissingPackage, load_taskset, select
from tests.conftest import needs

pytestmark = needs("reasoning-gym", "reasoning_gym")

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def question(request: dict) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


def factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def answering(request: dict) -> Reply:
    """Right on even words and numbers, wrong on odd ones; a factorization of a number ending in 1 or 3
    is answered in words, which prime_factorization's scorer raises on."""
    q = question(request)
    if word := re.search(r"backward \(example: sun -> nus\): (\S+)", q):
        w = word.group(1)
        right = len(w) % 2 == 0
        return Reply(content=f"<answer>{w[::-1]}</answer>" if right else w)
    number = int(re.search(r"prime factorization of (\d+)", q).group(1))
    if number % 10 in (1, 3):
        return Reply(content="no idea")
    right = number % 2 == 0
    return Reply(content=" × ".join(map(str, factors(number if right else number + 2))))


def eval_run(project: Path, server: OpenAIServer, taskset: str, out: Path, *args: str) -> list:
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "PRIME_AGENT_MODEL": "fake"}
    done = subprocess.run([PRIME_AGENT, "eval", taskset, "--out", str(out), "-j", "2", "--timeout", "60", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return read_results(out / "results.jsonl")


@pytest.mark.slow
@pytest.mark.timeout(600)  # three eval runs: a loaded machine takes minutes
def test_reasoning_gym_through_eval_fixed_by_seed_and_scored_by_its_scorer(project: Path, tmp_path: Path):
    spell, factor = "rg:spell_backward", "rg:prime_factorization?min_value=10&max_value=99"
    with OpenAIServer(answering) as server:
        first = eval_run(project, server, spell, tmp_path / "a", "-n", "6", "--seed", "11")
        again = eval_run(project, server, spell, tmp_path / "b", "-n", "6", "--seed", "11")
        mixed = eval_run(project, server, factor, tmp_path / "c", "-n", "12", "--seed", "2")
    tasks = select(spell, 6, 11)
    words = {t.id: t.prompt.rsplit(" ", 1)[-1] for t in tasks}
    assert [r.task_id for r in first] == [r.task_id for r in again] == list(words)  # fixed by the seed
    assert [t.prompt for t in tasks] == [t.prompt for t in select(spell, 6, 11)] != [t.prompt for t in select(spell, 6, 12)]
    env = load_taskset(spell)
    for r in first + again:  # reasoning-gym's scorer decides: full marks for the reversed word alone
        right = len(words[r.task_id]) % 2 == 0
        assert r.outcome == ("passed" if right else "failed") and (r.reward == 1.0) == right, r
        assert r.reward == env.reward(next(t for t in tasks if t.id == r.task_id),
                                      words[r.task_id][::-1] if right else words[r.task_id])
    assert {r.outcome for r in first} == {"passed", "failed"}  # both kinds of answer were met

    numbers = {t.id: int(re.search(r"of (\d+)", t.prompt).group(1)) for t in select(factor, 12, 2)}
    kinds = {"raised": 0, "right": 0, "wrong": 0}
    for r in mixed:
        n = numbers[r.task_id]
        if n % 10 in (1, 3):  # the scorer raised on words: failed, its error kept, never an error of the run
            kinds["raised"] += 1
            assert (r.outcome, r.reward, r.check) == ("failed", 0.0, "prime_factorization: the scorer raised"), r
            assert r.error and r.error.startswith("ValueError:")
        elif n % 2 == 0:
            kinds["right"] += 1
            assert (r.outcome, r.reward, r.error) == ("passed", 1.0, None), r
        else:
            kinds["wrong"] += 1
            assert (r.outcome, r.error) == ("failed", None) and r.reward < 1.0, r
    assert all(kinds.values()), kinds
    rows = [json.loads(line) for line in (tmp_path / "c" / "results.jsonl").read_text().splitlines()]
    assert any(row["error"] and row["outcome"] == "failed" for row in rows)


def test_a_mix_and_configs_come_from_the_name(tmp_path: Path):
    mix = load_taskset("rg:composite?spell_backward=1&chain_sum=3&chain_sum.min_terms=2&chain_sum.max_terms=2")
    tasks = mix.tasks(24, seed=5)
    assert [t.id for t in tasks] == [t.id for t in mix.tasks(24, seed=5)]
    by = {d: [t for t in tasks if t.data["dataset"] == d] for d in ("spell_backward", "chain_sum")}
    assert len(by["chain_sum"]) > len(by["spell_backward"]) > 0
    assert all(t.prompt.count(" + ") + t.prompt.count(" - ") == 1 for t in by["chain_sum"])  # two terms each
    listed = load_taskset("rg:spell_backward,chain_sum")
    assert {t.data["dataset"] for t in listed.tasks(12, seed=0)} == {"spell_backward", "chain_sum"}
    task = by["chain_sum"][0]
    assert mix.check(task, f"so: <answer>{task.data['answer']}</answer>", tmp_path).passed
    assert not mix.check(task, "7777777", tmp_path).passed
    first = load_taskset("rg:spell_backward?min_word_len=8").tasks(5, seed=1)
    assert all(len(t.prompt.rsplit(" ", 1)[-1]) >= 8 for t in first)
    assert [t.id for t in load_taskset("rg:spell_backward?size=7").tasks(None, seed=0)][-1] == "spell_backward-0-6"


@pytest.mark.parametrize("spec, message", [
    ("rg:no_such_family", "reasoning-gym has no dataset 'no_such_family'"),
    ("rg:chain_sum?bogus=1", "reasoning-gym refused the config"),
    ("rg:spell_backward?seed=3", "the seed is the selection's"),
    ("rg:composite", "a mix names its datasets"),
    ("rg:chain_sum?x=1&x=2", "option 'x' is given twice"),
])
def test_bad_names_are_refused_naming_the_task_set(spec: str, message: str):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_taskset(spec)


def test_without_the_package_the_message_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if it were not installed
    with pytest.raises(MissingPackage, match=re.escape("pip install 'prime-agent[reasoning-gym]'")):
        load_taskset("rg:spell_backward")


def test_rl_trains_on_the_same_datasets():
    from rl.envs import load

    env = load("rg:composite", datasets=[{"name": "spell_backward", "weight": 1, "config": {"max_word_len": 5}}])
    task = env.tasks(3, seed=0)[0]
    assert env.reward(task, env.demonstration(task)) == 1.0 and env.reward(task, "zzz") == 0.0
    assert [t.id for t in env.tasks(3, seed=0)] == [t.id for t in load_taskset(env.name, **{
        "datasets": [{"name": "spell_backward", "weight": 1, "config": {"max_word_len": 5}}]}).tasks(3, seed=0)]


def test_a_curriculum_deals_harder_tasks_once_the_reward_passes_its_threshold(tmp_path: Path):
    env = load_taskset("rg:spell_backward?curriculum=0.75&curriculum_window=4")
    easy = env.tasks(8, seed=0)
    assert env.level == 0 and {len(t.data["answer"]) for t in easy} == {3}
    for t in easy[:4]:  # wrong answers: the level holds
        assert not env.check(t, "zzz", tmp_path).passed
    assert env.level == 0
    for t in easy[4:]:  # four right answers in the window: the next level
        assert env.check(t, t.data["answer"], tmp_path).passed
    assert env.level == 1
    harder = env.tasks(30, seed=1)
    assert max(len(t.data["answer"]) for t in harder) > 3 and all(t.data["level"] == 1 for t in harder)
    assert env.check(easy[0], easy[0].data["answer"], tmp_path).passed  # a level-0 task still scores as dealt
    with pytest.raises(ValueError, match="no curriculum|a curriculum is for one dataset"):
        load_taskset("rg:spell_backward,chain_sum?curriculum=0.5")
