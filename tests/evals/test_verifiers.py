"""`vf:TASKSET_ID`: a verifiers taskset built here and installed on the path (not shipped by us), through
`prime-agent eval` (real sessions, the fake model server), the refiner's gate and an RL environment:
selected by verifiers' own `shuffle(seed).take(n)`, scored by the task's own async rewards and metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.testing.openai_server import OpenAIServer, Reply
from evals.runner import read_results
from evals.tasksets import MissingPackage, load_taskset, select
from tests.conftest import needs

pytestmark = needs("verifiers", "verifiers")

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")
NAME = "pa_test_arith"
TASKSET = f'''
import asyncio

import verifiers.v1 as vf


class ArithConfig(vf.TasksetConfig):
    count: int = 10
    offset: int = 0


class ArithData(vf.TaskData):
    a: int
    b: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        if trace.last_reply == "boom":
            raise ValueError("the scorer cannot read boom")
        if trace.last_reply == "slow":
            await asyncio.sleep(30)
        return float(trace.last_reply == str(task.a + task.b))

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        for i in range(self.config.count):
            a = i + self.config.offset
            yield ArithTask(ArithData(prompt=f"What is {{a}} + {{2 * i}}?", a=a, b=2 * i,
                                      system_prompt="Answer with the number alone.",
                                      timeout=vf.TaskTimeout(scoring=1.0, agent=3.0 if a == 5 else None)),
                            self.config.task)


__all__ = ["ArithTaskset"]
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch) -> Path:
    """The taskset as an installed package: a module on the path (here and in the eval's processes)."""
    site = tmp_path / "site"
    (site / NAME).mkdir(parents=True)
    (site / NAME / "__init__.py").write_text(textwrap.dedent(TASKSET))
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop(NAME, None)


def verifiers_selection(n: int, seed: int, **config) -> list:
    from verifiers.v1.utils.loaders import load_taskset as vf_load, taskset_config_type

    taskset = vf_load(taskset_config_type(NAME).model_validate({"id": NAME, **config}))
    return list(taskset.shuffle(seed).take(n))


def answering(request: dict) -> Reply:
    """Right when a is even; 7 gets an answer the scorer raises on, 9 one it takes too long over; 5 (whose
    task gives the agent 3 s) never hears back."""
    q = next(m["content"] for m in request["messages"] if m["role"] == "user")
    a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", q).groups())
    if a == 7:
        return Reply(content="boom")
    if a == 9:
        return Reply(content="slow")
    if a == 5:
        return Reply(hang=True)
    return Reply(content=str(a + b) if a % 2 == 0 else str(a + b + 1))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_verifiers_taskset_through_eval_scored_by_its_own_rewards(installed: Path, project: Path, tmp_path: Path):
    spec, run = f"vf:{NAME}?count=10", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(installed), "PRIME_AGENT_MODEL": "fake"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([PRIME_AGENT, "eval", *args], cwd=project, env=env, capture_output=True, text=True,
                              timeout=400)
        assert done.returncode == 0, done.stderr
        return done

    with OpenAIServer(answering) as server:
        env["OPENAI_BASE_URL"] = server.base_url
        printed = cli(spec, "-n", "10", "--seed", "4", "-j", "2", "--timeout", "120", "--out", str(run)).stdout
        assert "mean reply_chars" in printed  # the summary averages the taskset's metrics
        results = read_results(run / "results.jsonl")
        chosen = verifiers_selection(10, 4, count=10)  # verifiers' own selection, the same order
        assert [r.task_id for r in results] == [str(t.data.idx) for t in chosen]
        for r, t in zip(results, chosen):
            a = t.data.a
            if a == 7:  # the task's reward raised: failed, its error kept
                assert (r.outcome, r.reward) == ("failed", 0.0) and "the scorer cannot read boom" in r.error, r
            elif a == 9:  # past the task's scoring timeout: timed out, as verifiers records it
                assert r.outcome == "timed_out" and "scoring ran past the task's 1s" in r.error, r
            elif a == 5:  # past the task's agent timeout (the run's is 120 s)
                assert r.outcome == "timed_out" and r.error == "the rollout ran past 3s", r
            else:
                right = a % 2 == 0
                assert (r.outcome, r.reward, r.error) == (("passed", 1.0, None) if right else ("failed", 0.0, None)), r
                assert r.metrics == {"reply_chars": float(len(str(a + t.data.b + (not right))))}
        rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        assert all("reply_chars" in row["metrics"] for row in rows if row["outcome"] == "passed")

        # --resume reruns only what is owed: two finished rollouts dropped from the file
        kept = [line for line in (run / "results.jsonl").read_text().splitlines()
                if json.loads(line)["task_id"] not in {"0", "2"}]
        (run / "results.jsonl").write_text("\n".join(kept) + "\n")
        before = len(server.requests)
        cli(spec, "--resume", str(run))
        assert len(server.requests) - before == 2
    assert [r.task_id for r in read_results(run / "results.jsonl")] == [r.task_id for r in results]


def test_the_seed_selects_what_verifiers_selects(installed: Path):
    for n, seed in ((4, 0), (6, 3), (10, 7)):
        ours = select(f"vf:{NAME}?count=12&offset=5", n, seed)
        theirs = verifiers_selection(n, seed, count=12, offset=5)
        assert [(t.id, t.prompt, t.system, t.data["key"]) for t in ours] == \
               [(str(t.data.idx), t.data.prompt, t.data.system_prompt, t.key) for t in theirs]
    assert [t.id for t in select(f"vf:{NAME}", 5, 1)] != [t.id for t in select(f"vf:{NAME}", 5, 2)]


def test_bad_names_and_options_are_refused(installed: Path):
    with pytest.raises(ValueError, match="taskset 'no_such_taskset_here' not found"):
        load_taskset("vf:no_such_taskset_here")
    with pytest.raises(ValueError, match="config refused the options.*bogus"):
        load_taskset(f"vf:{NAME}?bogus=1")
    with pytest.raises(ValueError, match="config refused the options.*count"):
        load_taskset(f"vf:{NAME}?count=many")


def test_without_the_package_the_message_names_the_install_command(monkeypatch):
    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")] or ["verifiers"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    with pytest.raises(MissingPackage, match=re.escape("pip install 'prime-agent[verifiers]'")):
        load_taskset("vf:anything")


def test_an_rl_environment_rewards_by_the_tasks_own_reward(installed: Path):
    from rl.envs import load

    env = load(f"vf:{NAME}", count=6, offset=1)
    tasks = env.tasks(3, seed=0)
    assert [t.id for t in tasks] == [str(t.data.idx) for t in verifiers_selection(3, 0, count=6, offset=1)]
    for t in tasks:
        a, b = map(int, re.search(r"(\d+) \+ (\d+)", t.prompt).groups())
        assert env.reward(t, str(a + b)) == 1.0 and env.reward(t, str(a + b + 1)) == 0.0


async def test_the_gate_judges_a_change_by_the_taskset(installed: Path, project: Path):
    from agent.events import Event
    from agent.session import Session
    from agent.testing.scripted import ScriptedModel
    from agent.types import Message
    from evals.gate import make_gate
    from tests.agent.test_refine import PLANNER, proposal, wait_for
    from tests.conftest import make_config

    bad = {"action": "create", "kind": "prompt", "id": "zero", "title": "Zero", "content": "Always answer 0.",
           "scope": "project", "reason": "none"}

    def respond(messages: list[Message]):
        if messages[0].content.startswith(PLANNER):
            return proposal(bad, summary="answer zero")
        if "Always answer 0." in messages[0].content:
            return "0"
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", messages[-1].content).groups())
        return str(a + b)

    events: list[Event] = []
    gate = lambda config, model, harness: make_gate(config, model, harness, f"vf:{NAME}?count=3&offset=1")  # noqa: E731
    async with Session(make_config(), ScriptedModel([respond] * 50), cwd=project, on_event=events.append,
                       gate=gate) as s:
        s.refine()
        rejected = await wait_for(events, "refinement.rejected")
    assert "gate: the change lowers the task set's pass count from 3 to 0 of 3" in rejected.reason


FILES = "pa_test_files"
FILES_TASKSET = '''
import verifiers.v1 as vf


class SumData(vf.TaskData):
    numbers: list[int]


class SumTask(vf.Task[SumData]):
    async def setup(self, trace, runtime):
        await runtime.write("numbers.txt", " ".join(map(str, self.data.numbers)).encode())
        trace.info["expected"] = sum(self.data.numbers)

    @vf.reward
    async def answer_file(self, trace, runtime) -> float:
        written = (await runtime.read("answer.txt")).decode().strip()
        return float(written == str(trace.info["expected"]))

    @vf.metric
    async def files_left(self, runtime) -> float:
        listed = await runtime.run(["ls"], {})
        return float(len(listed.stdout.split()))


class SumTaskset(vf.Taskset[SumTask]):
    def load(self):
        for i in range(4):
            yield SumTask(SumData(prompt="Write the sum of numbers.txt to answer.txt.", numbers=[i, 10, 2 * i]))


__all__ = ["SumTaskset"]
'''


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_task_with_files_is_set_up_and_scored_in_the_sessions_workspace(tmp_path: Path, monkeypatch):
    """The task's setup writes its file into the rollout's workspace before the session; the agent's
    cell reads it and writes an answer file; the task's reward reads that through the runtime."""
    from agent.config_models import Config
    from agent.model import OpenAIModel
    from evals.runner import EvalSpec, evaluate

    site = tmp_path / "site"
    (site / FILES).mkdir(parents=True)
    (site / FILES / "__init__.py").write_text(textwrap.dedent(FILES_TASKSET))
    monkeypatch.syspath_prepend(str(site))

    def solving(request: dict) -> Reply:
        tools = [m for m in request["messages"] if m["role"] == "tool"]
        if not tools:
            return Reply(code=["print(open('numbers.txt').read())"])
        if len(tools) == 1:
            numbers = list(map(int, tools[0]["content"].split()))
            wrong = numbers[0] == 1  # one rollout writes a wrong sum
            return Reply(code=[f"open('answer.txt', 'w').write('{sum(numbers) + wrong}')"])
        return Reply(content="Done.")

    try:
        with OpenAIServer(solving) as server:
            config = Config.model_validate({"model": {"name": "fake", "base_url": server.base_url, "max_retries": 0},
                                            "kernel": {"interrupt_grace": 1.0}, "refine": {"auto_every": 0}})
            model = OpenAIModel(config.model)
            results = await evaluate(EvalSpec(f"vf:{FILES}", None, 1, 2, 0, 120.0), config, model, tmp_path / "run")
            await model.close()
    finally:
        sys.modules.pop(FILES, None)
    by_task = {r.task_id: r for r in results}
    assert set(by_task) == {"0", "1", "2", "3"}
    for tid, r in by_task.items():
        assert (r.outcome, r.reward) == (("failed", 0.0) if tid == "1" else ("passed", 1.0)), r
        assert r.metrics == {"files_left": 2.0}  # numbers.txt and answer.txt: the workspace the session used


SLOW = "pa_test_slow_setup"
SLOW_TASKSET = '''
import asyncio

import verifiers.v1 as vf


class SlowTask(vf.Task):
    async def setup(self, trace, runtime):
        await asyncio.sleep(30)


class SlowTaskset(vf.Taskset[SlowTask]):
    def load(self):
        yield SlowTask(vf.TaskData(prompt="never asked", timeout=vf.TaskTimeout(setup=0.5)))


__all__ = ["SlowTaskset"]
'''


async def test_a_setup_past_its_deadline_times_the_rollout_out_before_any_model_call(tmp_path: Path, monkeypatch):
    from agent.config_models import Config
    from agent.model import OpenAIModel
    from evals.runner import EvalSpec, evaluate

    (tmp_path / "site" / SLOW).mkdir(parents=True)
    (tmp_path / "site" / SLOW / "__init__.py").write_text(SLOW_TASKSET)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        with OpenAIServer([]) as server:
            config = Config.model_validate({"model": {"name": "fake", "base_url": server.base_url, "max_retries": 0}})
            model = OpenAIModel(config.model)
            [result] = await evaluate(EvalSpec(f"vf:{SLOW}", None, 1, 1, 0, 60.0), config, model, tmp_path / "run")
            await model.close()
            assert not server.requests
    finally:
        sys.modules.pop(SLOW, None)
    assert (result.outcome, result.error) == ("timed_out", "setup ran past the task's 0.5s")
