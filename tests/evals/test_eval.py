"""`prime-agent eval`: real sessions over task sets, exact outcome counts, resume, selection, compare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config_models import Config
from agent.model import OpenAIModel
from agent.testing.openai_server import OpenAIServer, Reply
from evals.runner import EvalSpec, compare, evaluate, read_results, summarize
from evals.tasksets import select
from evals.tasksets.repo_fix import REPOS

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")
FIXES = {"add": ("a - b", "a + b"), "reverse": ("s[::1]", "s[::-1]"), "is_even": ("== 1", "== 0")}
FIXED = set(FIXES)  # the scripted model fixes these, and gives up on the rest
HANGS, BREAKS = "mean", "last"  # one rollout never hears back; one meets a server error


def which(messages: list[dict]) -> str | None:
    """The repo_fix task a conversation is about, from the lib.py the agent printed."""
    for m in messages:
        if m.get("role") == "tool":
            for name, (lib, _) in REPOS.items():
                if lib.strip() in m["content"]:
                    return name
    return None


def scripted(request: dict) -> Reply:
    messages = request["messages"]
    task = which(messages)
    if task is None:
        return Reply(code=["print(read('lib.py'))"])
    if task == HANGS:
        return Reply(hang=True)
    if task == BREAKS:
        return Reply(status=500, content="the server fell over")
    if task in FIXED:
        done = sum(m["role"] == "tool" for m in messages)
        old, new = FIXES[task]
        return Reply(code=[f"edit('lib.py', {old!r}, {new!r})"]) if done == 1 else Reply(content="Fixed it.")
    return Reply(content="I could not find the bug.")


REQUESTS = {name: 3 if name in FIXED else 2 for name in REPOS}  # calls each rollout makes


def agent_config(server: OpenAIServer) -> Config:
    return Config.model_validate({"model": {"name": "fake", "base_url": server.base_url, "max_retries": 0},
                                  "kernel": {"interrupt_grace": 1.0}, "refine": {"auto_every": 0}})


@pytest.mark.slow
@pytest.mark.timeout(300)  # twelve rollouts four at a time, each up to 15 s, on a loaded machine
async def test_repo_fix_outcomes_are_counted_exactly(tmp_path: Path):
    with OpenAIServer(scripted) as server:
        config = agent_config(server)
        model = OpenAIModel(config.model)
        spec = EvalSpec("repo_fix", n=None, rollouts=1, concurrency=4, seed=0, timeout=15.0)  # a loaded machine: only the hang times out
        results = await evaluate(spec, config, model, tmp_path / "run")
        await model.close()
    by_task = {r.task_id: r.outcome for r in results}
    assert {t for t, o in by_task.items() if o == "passed"} == FIXED
    assert by_task[HANGS] == "timed_out" and by_task[BREAKS] == "error"
    s = summarize(results)
    assert s.counts == {"passed": 3, "failed": 7, "timed_out": 1, "error": 1}
    assert s.pass_rate == pytest.approx(3 / 10)  # timed-out and errored rollouts are not failures
    on_disk = read_results(tmp_path / "run" / "results.jsonl")
    assert [(r.task_id, r.outcome) for r in on_disk] == [(r.task_id, r.outcome) for r in results]
    assert all(r.session_id and (tmp_path / "run" / "sessions").is_dir() for r in on_disk)


@pytest.mark.slow
def test_a_killed_eval_resumes_with_only_what_is_owed(project: Path, tmp_path: Path):
    run, tmp = tmp_path / "run", tmp_path / "tmp"  # the eval's own TMPDIR
    tmp.mkdir()
    with OpenAIServer(scripted) as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "PRIME_AGENT_MODEL": "fake", "TMPDIR": str(tmp)}
        args = [PRIME_AGENT, "eval", "repo_fix", "-n", "6", "--seed", "3", "-j", "1", "--timeout", "15", "--out", str(run)]
        p = subprocess.Popen(args, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        deadline = time.monotonic() + 60
        while (len(read_results(run / "results.jsonl")) < 3 or not list(tmp.glob("pa-eval-*"))) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)  # a rollout in flight: its workspace stays behind
        p.wait()
        left = list(tmp.glob("pa-eval-*"))
        assert left and all(w.is_dir() and str(p.pid) in w.name for w in left)
        planted = tmp / "pa-eval-1-99999999-planted"  # a gone host's name on a link a kernel could have made
        planted.symlink_to(project)
        (project / "keep.txt").write_text("mine")
        kept = [r for r in read_results(run / "results.jsonl") if r.outcome in ("passed", "failed", "timed_out")]
        before = len(server.requests)
        resumed = subprocess.run([PRIME_AGENT, "eval", "repo_fix", "--resume", str(run)], cwd=project, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        spent = len(server.requests) - before
    selected = [t.id for t in select("repo_fix", 6, 3)]
    owed = [t for t in selected if t not in {r.task_id for r in kept}]
    assert owed and spent == sum(REQUESTS[t] for t in owed)
    final = read_results(run / "results.jsonl")
    assert [r.task_id for r in final] == selected
    expected = {t: ("passed" if t in FIXED else "timed_out" if t == HANGS else "error" if t == BREAKS else "failed")
                for t in selected}
    assert {r.task_id: r.outcome for r in final} == expected
    assert "pass rate" in resumed.stderr or "pass rate" in resumed.stdout
    assert list(tmp.glob("pa-eval-*")) == [planted] and (project / "keep.txt").exists()  # the killed one's
    # workspace went with the resume's first rollout, each of the resume's own as it ended; the link stays


def test_the_same_seed_selects_the_same_tasks_everywhere(tmp_path: Path):
    from rl.train import evaluation_tasks

    cli = [t.id for t in select("kernel_tasks", 5, 7)]
    assert cli == [t.id for t in evaluation_tasks("kernel_tasks", 5, 7)]
    assert [t.id for t in select("repo_fix", 5, 7)] == [t.id for t in select("repo_fix", 5, 7)]
    assert [t.id for t in select("repo_fix", 5, 7)] != [t.id for t in select("repo_fix", 5, 8)]
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": "p", "check": "True"}) for i in range(9)))
    assert [t.id for t in select(str(tasks), 3, 1)] == [t.id for t in select(str(tasks), 3, 1)]


def test_compare_reports_per_task_differences_and_noise():
    from evals.runner import Result

    def run(passing: set[str]) -> list[Result]:
        return [Result(f"t{i}", 0, "k", "passed" if f"t{i}" in passing else "failed", 1.0) for i in range(12)]

    small = compare(run({"t1", "t2"}), run({"t1", "t3"}))
    assert small["differences"] == {"t2": (1.0, 0.0), "t3": (0.0, 1.0)} and not small["beyond_noise"]
    big = compare(run(set()), run({f"t{i}" for i in range(10)}))
    assert big["gained"] == 10 and big["beyond_noise"]


def test_builtin_checks_judge_answers_and_workspaces(tmp_path: Path):
    from evals.tasksets import load_taskset

    kernel = load_taskset("kernel_tasks")
    task = kernel.tasks(1, seed=0)[0]
    assert kernel.check(task, task.data["answer"] + ".", tmp_path).passed
    assert not kernel.check(task, "41", tmp_path).passed
    repo = load_taskset("repo_fix")
    add = next(t for t in repo.tasks(None, seed=0) if t.id == "add")
    for rel, text in add.files.items():
        (tmp_path / rel).write_text(text)
    assert not repo.check(add, "", tmp_path).passed
    (tmp_path / "lib.py").write_text(add.files["lib.py"].replace("a - b", "a + b"))
    assert repo.check(add, "", tmp_path).passed


def test_bad_input_is_refused_clearly(project: Path, tmp_path: Path):
    env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "PRIME_AGENT_MODEL": "m"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PRIME_AGENT, "eval", *args], cwd=project, env=env, capture_output=True, text=True, timeout=60)

    assert "must be at least 1" in cli("repo_fix", "-j", "0").stderr
    assert "not an eval run to resume" in cli("repo_fix", "--resume", str(tmp_path / "nope")).stderr
    assert "not an eval run (no results.jsonl)" in cli("compare", str(tmp_path), str(tmp_path)).stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "results.jsonl").write_text("")
    assert "is not empty; pass --resume" in cli("repo_fix", "--out", str(tmp_path / "busy")).stderr
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "prompt": "p"}\n{"id": "a", "prompt": "q"}\n')
    assert "task id 'a' is used twice" in cli(str(dup), "--out", str(tmp_path / "o")).stderr


async def test_a_task_file_outside_the_workspace_is_an_error_not_a_write(tmp_path: Path):
    from evals.runner import lay_out

    with pytest.raises(ValueError, match="outside the workspace"):
        lay_out({"../escape.txt": "x"}, tmp_path / "work")
    assert not (tmp_path / "escape.txt").exists()


def test_kernel_tasks_demonstrations_compute_the_answer_and_guesses_miss(tmp_path: Path, monkeypatch):
    from evals.runner import lay_out
    from evals.tasksets.kernel_tasks import FILE_KINDS, KINDS, KernelTasks

    env = KernelTasks(KINDS + FILE_KINDS)
    for task in env.tasks(24, seed=5):  # three of each kind
        work = tmp_path / task.id
        work.mkdir()
        lay_out(task.files, work)
        monkeypatch.chdir(work)
        demo = env.demonstration(task)
        assert demo.startswith("```python\n") and demo.endswith("\n```")
        answers: list[str] = []
        exec(demo.removeprefix("```python\n").removesuffix("```"), {"final": lambda a: answers.append(repr(a))})
        assert env.check(task, answers[0].strip("'"), work).passed, (task.prompt, demo)
        assert env.reward(task, env.distractor(task)) == 0.0
    assert [t.data["kind"] for t in KernelTasks(["lines", "total"]).tasks(4, seed=0)] == ["lines", "total"] * 2
    with pytest.raises(ValueError, match="kinds"):
        KernelTasks(["riddles"])
