"""Rollouts on Ray (evals/cluster.py): a real head and a real worker, started once with `ray start` on
127.0.0.1 for this module, each node one CPU, a small object store and no dashboard."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.config_models import Config
from agent.providers import open_model
from agent.testing.openai_server import OpenAIServer, Reply
from cli.main import main as cli
from evals.cluster import Cluster, ClusterError
from evals.runner import EvalSpec, evaluate, read_results
from evals.tasksets import select
from tests.conftest import SIGINT_IGNORED

RAY = str(Path(sys.executable).parent / "ray")
KEY = "sk-test-4f1c9e7b2d"
NODE = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=78643200", "--disable-usage-stats",
        "--block"]
SETTINGS = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
            "RAY_health_check_failure_threshold": "3", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}
"""A killed node declared dead within seconds (Ray's default: half a minute); token authentication, as
docs/cluster.md advises, with a token of the module's own (RAY_AUTH_TOKEN_PATH) for nodes and driver."""


@dataclass
class Nodes:
    address: str
    temp: Path
    head: subprocess.Popen
    worker: subprocess.Popen
    cluster: Cluster
    head_id: str
    worker_id: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(ready, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while not (value := ready()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g}s"
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module")
def nodes():
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's sockets live under it
    (temp / "token").write_text(secrets.token_hex(32))
    settings = {**SETTINGS, "RAY_AUTH_TOKEN_PATH": str(temp / "token")}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)  # the driver's (this process's) too, before it imports ray: it reads them then
    import ray

    (temp / "tmp").mkdir()  # the rollouts' workspaces, a killed node's too: removed with the rest
    env = {**os.environ, "PRIME_AGENT_HOME": str(temp / "home"), "TMPDIR": str(temp / "tmp")}
    port = free_port()
    started = [subprocess.Popen([*SIGINT_IGNORED, RAY, "start", "--head", f"--port={port}", "--include-dashboard=false",
                                 f"--temp-dir={temp}", *NODE], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        until(lambda: _answers(port), "the head")
        started.append(subprocess.Popen([*SIGINT_IGNORED, RAY, "start", f"--address=127.0.0.1:{port}", *NODE], env=env,
                                        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cluster = until(lambda: _join(f"127.0.0.1:{port}"), "joining the cluster")
        alive = until(lambda: len(live := [n for n in ray.nodes() if n["Alive"]]) == 2 and live, "two nodes")
        head = next(n["NodeID"] for n in alive if "node:__internal_head__" in n["Resources"])
        worker = next(n["NodeID"] for n in alive if n["NodeID"] != head)
        yield Nodes(f"127.0.0.1:{port}", temp, *started, cluster, head, worker)
        cluster.close()
    finally:
        for p in reversed(started):
            _stop(p)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        shutil.rmtree(temp, ignore_errors=True)


def _join(address: str) -> Cluster | None:
    """The cluster, once its head takes a driver (on a loaded machine, a while after its port answers)."""
    import ray

    try:
        return Cluster.connect(address)
    except ClusterError:
        ray.shutdown()
        return None


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _stop(p: subprocess.Popen) -> None:
    """A node's whole process group: `ray start --block` and the raylet, workers and kernels under it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def solver(n: int):
    """A model that runs one cell, then answers each kernel_tasks task right."""
    expected = {t.prompt: t.data["answer"] for t in select("kernel_tasks", n, 0)}

    def script(request: dict) -> Reply:
        prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if not any(m["role"] == "tool" for m in request["messages"]):
            return Reply(code=["print('working')"])
        return Reply(content=expected[prompt])

    return script


def config(server: OpenAIServer, **model) -> Config:
    return Config.model_validate({"model": {"name": "m", "base_url": server.base_url, **model},
                                  "refine": {"auto_every": 0}})


def test_a_node_lost_mid_run_costs_no_rollout_and_the_key_never_shows(nodes: Nodes, tmp_path: Path) -> None:
    """12 tasks on two nodes, the worker's process group killed after its first result: its rollouts
    run again on the head; 12 of 12 pass, one row each, the rows name both nodes. The API key reached
    every rollout (the server refuses any request without it) and no file of Ray's holds it."""
    run = tmp_path / "run"
    killed: list[threading.Thread] = []
    mid_rollout: list[int] = []

    def kill_mid_rollout() -> None:  # once the worker runs its next rollout: that one is lost with it
        mid_rollout.extend(until(lambda: _kernels(nodes.worker.pid), "the worker's next rollout"))
        os.killpg(nodes.worker.pid, signal.SIGKILL)

    def on_result(result) -> None:
        assert (result.task_id, result.rollout) in {(r.task_id, r.rollout) for r in read_results(run / "results.jsonl")}
        if result.node == nodes.worker_id and not killed:
            killed.append(threading.Thread(target=kill_mid_rollout))
            killed[0].start()

    with OpenAIServer(solver(12), api_key=KEY) as server:
        cfg = config(server, api_key=KEY)
        model = open_model(cfg.model)
        results = asyncio.run(evaluate(EvalSpec("kernel_tasks", 12, 1, 2, 0, 120), cfg, model, run,
                                       on_result=on_result, cluster=nodes.cluster))
    assert killed, "the worker ran no rollout"
    killed[0].join()
    assert mid_rollout, "the worker was not killed mid-rollout"
    assert [r.outcome for r in results] == ["passed"] * 12, [(r.outcome, r.error) for r in results]
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["rollout"]) for r in rows) == sorted((r.task_id, 0) for r in results)
    assert {r["node"] for r in rows} == {nodes.head_id, nodes.worker_id}
    assert all((run / "sessions" / f"{r.task_id}-0" / "trajectory.jsonl").is_file() for r in results)
    leaked = [str(p) for p in nodes.temp.rglob("*") if p.is_file() and KEY.encode() in _bytes(p)]
    assert not leaked, leaked


def _bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_a_bug_in_a_rollout_is_an_error_row_run_once(nodes: Nodes, tmp_path: Path) -> None:
    """An exception in a rollout (here its task set's setup) is its `error` row; Ray does not run it again."""
    attempts = tmp_path / "attempts"
    taskset = tmp_path / "buggy.py"
    taskset.write_text(f"""
from pathlib import Path
from evals.env import Check, Task

class Buggy:
    name = "buggy"
    def tasks(self, n, *, seed):
        return [Task("t0", "say hi")]
    def prepare(self, task, workspace):
        with open({str(attempts)!r}, "a") as f:
            f.write("attempt\\n")
        raise RuntimeError("a bug in prepare")
    def check(self, task, answer, workspace):
        return Check(True, 1.0)

environment = Buggy()
""")
    with OpenAIServer([]) as server:
        cfg = config(server)
        results = asyncio.run(evaluate(EvalSpec(str(taskset), None, 1, 1, 0, 60), cfg, open_model(cfg.model),
                                       tmp_path / "run", cluster=nodes.cluster))
    assert [(r.outcome, r.error) for r in results] == [("error", "RuntimeError: a bug in prepare")]
    assert attempts.read_text() == "attempt\n"


def test_cancelling_the_run_cancels_its_ray_tasks(nodes: Nodes, tmp_path: Path) -> None:
    """What Ctrl-C does to `eval --ray` (asyncio.run cancels the run): the rollout running on a node
    stops, and no Ray task is left running it, though the nodes ignore SIGINT (started with SIGINT_IGNORED); its
    kernel and workspace are gone."""
    workspaces = set((nodes.temp / "tmp").glob("pa-*"))  # pa-ray-*, pa-eval-*: a killed node's are left there
    with OpenAIServer(lambda request: Reply(hang=True)) as server:
        cfg = config(server)

        async def run() -> None:
            going = asyncio.create_task(evaluate(EvalSpec("kernel_tasks", 1, 1, 1, 0, 120), cfg,
                                                 open_model(cfg.model), tmp_path / "run", cluster=nodes.cluster))
            await asyncio.to_thread(until, lambda: server.requests, "the rollout's first model call")
            assert _kernels(nodes.head.pid)
            going.cancel()
            with pytest.raises(asyncio.CancelledError):
                await going

        asyncio.run(run())
        until(lambda: not _kernels(nodes.head.pid), "the rollout's end", 30)
        until(lambda: set((nodes.temp / "tmp").glob("pa-*")) <= workspaces, "the rollout's workspace removed", 30)
    assert not (tmp_path / "run" / "results.jsonl").read_text()


def _kernels(under: int) -> list[int]:
    """The kernels (ipykernel processes) running beneath process `under` (a node's `ray start`)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ipykernel" in (proc / "cmdline").read_bytes() and under in _ancestors(int(proc.name)):
                out.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return out


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        out.append(pid)
    return out


def test_a_rollout_s_kernel_cannot_read_the_cluster_s_token(nodes: Nodes, tmp_path: Path) -> None:
    """With the token a process runs code on every node, outside any sandbox: a rollout's cell reads
    the file it is in and gets nothing."""
    path = os.environ["RAY_AUTH_TOKEN_PATH"]

    def script(request: dict) -> Reply:
        if not any(m["role"] == "tool" for m in request["messages"]):
            return Reply(code=[f"print('token:', repr(open({path!r}).read()))"])
        return Reply(content="done")

    with OpenAIServer(script) as server:
        cfg = config(server)
        asyncio.run(evaluate(EvalSpec("kernel_tasks", 1, 1, 1, 0, 60), cfg, open_model(cfg.model), tmp_path / "run",
                             cluster=nodes.cluster))
    read = [m["content"] for r in server.requests for m in r["messages"] if m["role"] == "tool"]
    assert read and "token:" in read[0], read
    assert Path(path).read_text() not in read[0]


def test_each_rollout_goes_to_the_model_server_with_the_fewest_in_flight(nodes: Nodes, tmp_path: Path) -> None:
    with OpenAIServer(solver(2)) as a, OpenAIServer(solver(2)) as b:
        cfg = config(a)
        cluster = Cluster.connect(nodes.address, urls=[a.base_url, b.base_url])
        results = asyncio.run(evaluate(EvalSpec("kernel_tasks", 2, 1, 2, 0, 120), cfg, open_model(cfg.model),
                                       tmp_path / "run", cluster=cluster))
    assert [r.outcome for r in results] == ["passed"] * 2
    assert len(a.requests) == len(b.requests) == 2  # one rollout each: a cell, then the answer


def test_rl_rollouts_run_on_the_cluster_and_their_trajectories_come_back(nodes: Nodes, tmp_path: Path) -> None:
    """`[rollouts] ray`: the policy server's rollouts run on a node (the head: the worker is gone), each
    trajectory, with the policy's logprobs, in the run folder for the trainer."""
    from rl.config import EnvConfig, RolloutsConfig, RunConfig, TrainConfig
    from rl.data import IngestCounts, samples
    from rl.envs import load
    from rl.envs.harness import HarnessOrchestrator
    from rl.policy.policy import PolicyConfig
    from rl.serve import BackgroundServer, engine_from

    from agent.trajectory import read_records

    tiny = PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=256)
    cfg = RunConfig(model=tiny, env=EnvConfig(name="kernel_tasks", harness=True, max_steps=1, timeout=60),
                    train=TrainConfig(batch_size=1, group_size=1, max_tokens=8, threads=1),
                    rollouts=RolloutsConfig(ray=nodes.address))
    env = load("kernel_tasks")
    with BackgroundServer(engine_from(None, tiny, seed=3, truncate=True)) as url:
        orchestrator = HarnessOrchestrator(url, env, cfg.train, cfg.env, tmp_path, rollouts=cfg.rollouts)
        done = asyncio.run(orchestrator.rollouts(env.tasks(1, seed=0), 1, 0))
    assert [(r.outcome, r.node) for r, _ in done] == [("failed", nodes.head_id)], [r for r, _ in done]
    assert all(samples(read_records(path), IngestCounts()) for _, path in done)


@pytest.mark.parametrize("command", [["eval", "kernel_tasks", "-n", "1"],
                                     ["refine", "loop", "kernel_tasks", "--train", "1", "--val", "1", "--test", "1"]])
def test_an_unreachable_cluster_is_a_clear_error_and_no_run(command: list[str], tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = cli([*command, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--ray", f"127.0.0.1:{free_port()}",
                "--out", str(out)])
    assert code != 0
    assert "cannot reach the Ray cluster at 127.0.0.1:" in capsys.readouterr().err
    assert not out.exists()


def test_ray_rollouts_are_sessions_through_the_harness() -> None:
    from rl.config import RunConfig

    with pytest.raises(ValueError, match="rollouts.ray: Ray runs rollouts through the harness"):
        RunConfig.model_validate({"rollouts": {"ray": "auto"}})
