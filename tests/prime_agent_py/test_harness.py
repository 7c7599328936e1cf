"""`vf-eval` (verifiers' own command line) evaluates a taskset built here with our agent as its harness
(`--env.agent.harness.id prime_agent_py`): verifiers' ACP runner starts `prime-agent acp` in the
subprocess runtime, every model call goes through verifiers' interception server to the fake model,
each rollout is scored by the taskset's own reward, and `--resume` reruns only what is owed.

verifiers' runner is a script `uv` (the test extra's) prepares once: the first run here fetches its
`agent-client-protocol` and `httpx` from the package registry into uv's cache."""

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
from daemon.client import Client
from daemon.paths import socket_file
from tests.conftest import needs
from tests.daemon.conftest import no_daemon_left_behind  # noqa: F401 - the fixture is autouse

pytestmark = needs("verifiers", "verifiers")

BIN = Path(sys.executable).parent
NAME = "pa_vf_sums"
TASKSET = '''
import verifiers.v1 as vf


class SumData(vf.TaskData):
    a: int
    b: int


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply == str(task.a + task.b))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for a in range(4):
            yield SumTask(SumData(prompt=f"What is {a} + 10?", a=a, b=10, system_prompt="Answer with the number alone.",
                                  timeout=vf.TaskTimeout(agent=300.0)), self.config.task)


__all__ = ["SumTaskset"]
'''


class Model:
    """The fake model: a word and a cell that prints the sum (one more than it for odd `a`: wrong),
    then the cell's output as the answer (the reply verifiers scores: the last message alone). `failing`: the first call for `a` in it answers 400, once."""

    def __init__(self, failing: set[int] = frozenset()):
        self.failing = set(failing)

    def __call__(self, request: dict) -> Reply:
        messages = request["messages"]
        if messages[-1]["role"] == "tool":
            return Reply(content=messages[-1]["content"].strip().splitlines()[-1])
        prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", prompt).groups())
        if a in self.failing:
            self.failing.discard(a)
            return Reply(status=400, error={"message": "no such luck", "type": "invalid_request_error"})
        return Reply(content="Adding up.", code=[f"print({a} + {b}{' + 1' if a % 2 else ''})"])


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / NAME).mkdir(parents=True)
    (site / NAME / "__init__.py").write_text(textwrap.dedent(TASKSET))
    return site


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vf_eval_scores_a_taskset_with_our_agent_and_resume_keeps_finished_rollouts(installed: Path, project: Path,
                                                                                   tmp_path: Path):
    out = tmp_path / "outputs"
    env = {**os.environ, "PYTHONPATH": str(installed), "PATH": f"{BIN}:{os.environ['PATH']}",
           "HOME": str(tmp_path / "user"),  # verifiers' cache (~/.cache/verifiers: runtimes, uv scripts)
           "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv")),  # shared: a cache
           "FAKE_KEY": "not-needed"}
    model = Model(failing={2})
    with OpenAIServer(model) as server:
        args = [NAME, "--env.agent.harness.id", "prime_agent_py", "--env.agent.runtime.type", "subprocess",
                "-m", "fake", "--client.base-url", server.base_url, "--client.api-key-var", "FAKE_KEY",
                "-c", "2", "-o", str(out), "--run.name", "sums", "--no-push", "--no-rich"]

        def vf_eval(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN / "vf-eval"), *args], cwd=project, env=env, capture_output=True,
                                  text=True, timeout=700)

        done = vf_eval(*args)
        traces = out / "sums" / "traces.jsonl"
        assert done.returncode == 0 and traces.exists(), done.stderr[-4000:]
        rows = _rows(traces)
        assert sorted(rows) == [0, 1, 2, 3], done.stderr[-4000:]
        for a, row in rows.items():
            trace = row["traces"][0]
            if a == 2:  # its model call failed: an errored rollout, owed on resume
                assert (row["ok"], trace["stop_condition"]) == (False, "provider_error"), trace
                continue
            assert row["ok"] and trace["root_reply"] == str(a + 10 + a % 2), trace
            assert trace["rewards"] == {"correct": {"score": 1.0 if a % 2 == 0 else 0.0, "weight": 1.0}}
            # our agent's two model calls, each recorded by the interception: a cell, then the answer
            cell, answer = (trace["nodes"][call["node"]]["message"] for call in trace["calls"])
            assert cell["content"] == "Adding up." and [c["name"] for c in cell["tool_calls"]] == ["ipython"]
            assert json.loads(cell["tool_calls"][0]["arguments"])["code"].startswith(f"print({a} + 10")
            assert answer == {"role": "assistant", "content": str(a + 10 + a % 2)}
            assert [n["message"]["role"] for n in trace["nodes"]] == ["system", "user", "assistant", "tool", "assistant"]
            assert trace["nodes"][0]["message"]["content"].startswith("You are Prime Agent")
        finished = {a: json.dumps(row, sort_keys=True) for a, row in rows.items() if a != 2}

        before = len(server.requests)
        done = vf_eval("@", str(out / "sums" / "configs" / "resolved" / "eval.json"), "--resume")
        assert done.returncode == 0, done.stderr[-4000:]
        rows = _rows(traces)
        assert sorted(rows) == [0, 1, 2, 3]
        assert rows[2]["traces"][0]["rewards"]["correct"]["score"] == 1.0 and len(server.requests) - before == 2  # only the owed one ran
        assert {a: json.dumps(row, sort_keys=True) for a, row in rows.items() if a != 2} == finished

    # each rollout was a session of ours, in the daemon the agent started: one turn each
    sessions = _sessions()
    assert len(sessions) == 5 and all(s.turns == 1 for s in sessions), sessions


def _rows(traces: Path) -> dict[int, dict]:
    """The run's rollouts by their task's `a`."""
    return {row["traces"][0]["task"]["data"]["a"]: row for row in map(json.loads, traces.read_text().splitlines())}


def _sessions():
    import asyncio

    async def listed():
        async with Client(socket=socket_file()) as client:
            return await client.sessions()

    return asyncio.run(listed())


def test_a_bad_option_is_refused_naming_the_field_before_anything_runs(installed: Path, project: Path, tmp_path: Path):
    done = subprocess.run([str(BIN / "vf-eval"), NAME, "--env.agent.harness.id", "prime_agent_py",
                           "--env.agent.harness.sandbox", "yolo", "--env.agent.runtime.type", "subprocess",
                           "-o", str(tmp_path / "outputs"), "--no-push", "--no-rich"], cwd=project,
                          env={**os.environ, "PYTHONPATH": str(installed), "HOME": str(tmp_path / "user")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "--env.agent.harness.sandbox" in done.stdout + done.stderr
    assert "'read-only', 'workspace-write' or 'full-access'" in done.stdout + done.stderr
    assert not (tmp_path / "outputs").exists()
