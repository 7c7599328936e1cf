"""Evaluation benchmark: prints a table and writes bench/results/eval.json (eval-ray.json with --ray).

    .venv/bin/python bench/eval.py [--rollouts 24] [--ray]

Rollouts per minute of `kernel_tasks` at concurrency 1 and 8 against the fake OpenAI-compatible
server (each rollout: a real session, one cell, one answer), and the overhead per rollout beyond
the model's own time (the rollout's wall time minus its model calls, from its trajectory).

--ray: the same rollouts in this process and as Ray tasks (evals/cluster.py) on local nodes started
here with `ray start` (each `--cpus` CPUs, no dashboard): one node, then two; rollouts per minute at
one rollout in flight and at one per CPU of the cluster, and what a Ray task adds to a rollout: at one
in flight, the run's wall time beyond its rollouts' own (each timed where it ran), per rollout, less the
same in this process (what the machine's load does to the rollouts themselves cancels out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.config_models import Config  # noqa: E402
from agent.providers import open_model  # noqa: E402
from agent.testing.openai_server import OpenAIServer, Reply  # noqa: E402
from agent.trajectory import ModelCall, read_records  # noqa: E402
from bench.report import load_average, save  # noqa: E402
from evals.runner import EvalSpec, evaluate, rollout_layout  # noqa: E402
from evals.tasksets import select  # noqa: E402


def answers(n: int):
    expected = {t.prompt: t.data["answer"] for t in select("kernel_tasks", n, 0)}

    def script(request: dict) -> Reply:
        prompt = next(m["content"] for m in request["messages"] if m["role"] == "user")
        if not any(m["role"] == "tool" for m in request["messages"]):
            return Reply(code=["print('working')"])
        return Reply(content=expected[prompt])

    return script


async def measure(n: int, concurrency: int, work: Path, cluster=None) -> dict[str, float]:
    with OpenAIServer(answers(n)) as server:
        config = Config.model_validate({"model": {"name": "bench", "base_url": server.base_url}, "refine": {"auto_every": 0}})
        model = open_model(config.model)
        run = work / f"c{concurrency}-{os.urandom(4).hex()}"
        t = time.perf_counter()
        results = await evaluate(EvalSpec("kernel_tasks", n, 1, concurrency, 0, 120), config, model, run,
                                 cluster=cluster)
        wall = time.perf_counter() - t
        await model.close()
    assert all(r.outcome == "passed" for r in results), [r.outcome for r in results]
    overhead = []
    for r in results:
        records = read_records(rollout_layout(run, r).trajectory)
        overhead.append(r.seconds - sum(x.duration for x in records if isinstance(x, ModelCall)))
    return {"rollouts_per_min": n / wall * 60, "overhead_per_rollout_s": statistics.median(overhead),
            "seconds_per_rollout": wall / n, "nodes": len({r.node for r in results}),
            "outside_rollout_s": (wall - sum(r.seconds for r in results) / concurrency) / n}


@contextlib.contextmanager
def local_nodes(work: Path, cpus: int):
    """A Ray head on 127.0.0.1 (`ray start --block`, in a process group of its own); `add()` starts
    another node; all are killed on leaving."""
    ray = str(Path(sys.executable).parent / "ray")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    os.environ["RAY_AUTH_MODE"] = env["RAY_AUTH_MODE"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = ["--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--object-store-memory=78643200",
            "--disable-usage-stats", "--block"]
    started: list[subprocess.Popen] = []

    def start(*flags: str) -> None:
        started.append(subprocess.Popen([ray, "start", *flags, *node], env=env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def add() -> None:
        import ray as ray_

        start(f"--address=127.0.0.1:{port}")
        while sum(n["Alive"] for n in ray_.nodes()) < len(started):
            time.sleep(0.2)

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's sockets live under it
    start("--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}")
    try:
        yield f"127.0.0.1:{port}", add
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(temp, ignore_errors=True)


def join(address: str):
    """The cluster at `address`, once its head takes a driver."""
    import ray

    from evals.cluster import Cluster, ClusterError

    for _ in range(300):
        try:
            return Cluster.connect(address)
        except ClusterError:
            ray.shutdown()
            time.sleep(0.2)
    raise SystemExit(f"the Ray head at {address} took no driver")


def ray_figures(n: int, cpus: int, work: Path) -> dict[str, dict[str, float]]:
    figures = {"in-process c1": asyncio.run(measure(n, 1, work)),
               f"in-process c{cpus}": asyncio.run(measure(n, cpus, work))}
    with local_nodes(work, cpus) as (address, add):
        cluster = join(address)
        try:
            figures["ray 1 node c1"] = asyncio.run(measure(n, 1, work, cluster))
            figures[f"ray 1 node c{cpus}"] = asyncio.run(measure(n, cpus, work, cluster))
            add()
            figures[f"ray 2 nodes c{2 * cpus}"] = asyncio.run(measure(n, 2 * cpus, work, cluster))
        finally:
            cluster.close()
    figures["ray 1 node c1"]["ray_overhead_per_rollout_s"] = (figures["ray 1 node c1"]["outside_rollout_s"]
                                                              - figures["in-process c1"]["outside_rollout_s"])
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=24)
    ap.add_argument("--ray", action="store_true", help="in-process against Ray tasks on 1 and 2 local nodes")
    ap.add_argument("--cpus", type=int, default=2, help="with --ray: CPUs each node offers (rollouts at once)")
    ap.add_argument("--out", help="default: bench/results/eval.json (eval-ray.json with --ray)")
    args = ap.parse_args()
    args.out = args.out or str(ROOT / "bench" / "results" / ("eval-ray.json" if args.ray else "eval.json"))
    load = load_average()
    if args.ray:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
            figures = ray_figures(args.rollouts, args.cpus, Path(tmp))
        print(f"{'run':<22} {'rollouts/min':>13} {'s/rollout':>10} {'nodes':>6} {'outside rollouts (s)':>21} "
              f"{'Ray overhead/rollout (s)':>25}")
        for name, f in figures.items():
            extra = f"{f['ray_overhead_per_rollout_s']:>25.3f}" if "ray_overhead_per_rollout_s" in f else ""
            print(f"{name:<22} {f['rollouts_per_min']:>13.1f} {f['seconds_per_rollout']:>10.2f} {f['nodes']:>6} "
                  f"{f['outside_rollout_s']:>21.3f} {extra}")
        save(args.out, {"figures": figures, "rollouts": args.rollouts, "cpus": args.cpus}, load)
        return
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PRIME_AGENT_HOME"] = str(Path(tmp) / "home")
        figures = {f"c{c}": asyncio.run(measure(args.rollouts, c, Path(tmp))) for c in (1, 8)}
    print(f"{'concurrency':<12} {'rollouts/min':>13} {'overhead/rollout (s)':>21}")
    for c, f in figures.items():
        print(f"{c:<12} {f['rollouts_per_min']:>13.1f} {f['overhead_per_rollout_s']:>21.3f}")
    save(args.out, {"figures": figures, "rollouts": args.rollouts}, load)


if __name__ == "__main__":
    main()
