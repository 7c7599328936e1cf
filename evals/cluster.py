"""Rollouts on a Ray cluster (`eval --ray`, `refine loop --ray`, RL's `[rollouts] ray`): docs/cluster.md.

    cluster = Cluster.connect("HOST:PORT", urls=[...], num_cpus=1)   # ClusterError: cannot reach it
    results = await evaluate(spec, config, model, run_dir, cluster=cluster)

Each rollout is a Ray task (`_remote`): on whichever node runs it, the task set is loaded, a session
runs in a fresh workspace on a private copy of the harness the driver sent, the environment scores it
there (evals/scoring.py, as in one process), and the task returns its `Result` (with the node's id as
`node`) and its session folder, which the driver lays out in the run folder as a local rollout's. Only
then is a row written, so a rollout whose node died and which Ray ran again elsewhere (`RETRIES`) has
one row. An exception escaping the rollout (a bug, not a node) is an `error` row and never retried.

The model's API key goes inside the task's argument (Ray's object store), wrapped so that no repr
shows it; never in `runtime_env`, whose variables the dashboard and the logs show. With several model
URLs each rollout goes to the one with the fewest rollouts in flight (as rl/fleet.py picks a server).
Every node runs the same install of prime-agent (and `ray`, the `cluster` extra) as the driver; a task
set given as a file is read at the same path on every node.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import os
import signal
import socket
import tarfile
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.config_models import Config
from evals.env import Task

RETRIES = 3
"""Times Ray runs a rollout again whose node or worker process died (never for an exception)."""


CLEANUP = 15.0
"""Seconds `close` waits for cancelled rollouts to stop their kernels and remove their workspaces."""


class ClusterError(RuntimeError):
    """The cluster cannot be reached or used; the message says why and what to do."""


class Secret:
    """A value that no repr, log line or error message shows (the model's API key)."""

    def __init__(self, value: str | None):
        self.value = value

    def __repr__(self) -> str:
        return "Secret(***)" if self.value else "Secret(None)"


@dataclass
class Job:
    """What one Ray task needs (its argument, pickled): the config has no API key in it."""

    taskset: str
    task: Task
    rollout: int
    key: str
    spec: Any  # evals.runner.EvalSpec
    config: Config
    harness: Any  # an ObjectRef of the packed harness scopes
    options: dict
    """The task set's options (an RL config's `[env] options`)."""


class Cluster:
    def __init__(self, address: str, urls: list[str] | None = None, num_cpus: float = 1.0):
        self.address, self.urls, self.num_cpus = address, list(urls or []), num_cpus
        self.in_flight = {u: 0 for u in self.urls}
        self._harness: dict[Any, Any] = {}
        self.cancelled: list[Any] = []
        """Ray tasks cancelled, which `close` gives time to clean up (leaving, the driver ends every task of its
        job at once: a rollout killed so leaves its workspace on the node)."""

    @classmethod
    def connect(cls, address: str, urls: list[str] | None = None, num_cpus: float = 1.0) -> Cluster:
        """Join the Ray cluster at `address` (`auto`, `HOST:PORT`, `ray://HOST:PORT`) as its driver."""
        try:
            import ray
        except ImportError:
            raise ClusterError("--ray needs the ray package: pip install 'prime-agent[cluster]' "
                               "(scripts/setup.sh cluster)") from None
        if num_cpus <= 0:
            raise ClusterError(f"num_cpus per rollout must be positive, not {num_cpus}")
        probe(address)
        try:
            ray.init(address=address, namespace="prime-agent", log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False, ignore_reinit_error=True)  # a process joins one cluster
        except Exception as e:  # ConnectionError, a version mismatch, a refused client: say which cluster
            raise ClusterError(f"cannot join the Ray cluster at {address}: {type(e).__name__}: {e}") from None
        return cls(address, urls, num_cpus)

    def close(self) -> None:
        import ray

        if self.cancelled:
            ray.wait(self.cancelled, num_returns=len(self.cancelled), timeout=CLEANUP)
        ray.shutdown()

    async def rollout(self, taskset: str, task: Task, r: int, key: str, spec, config: Config, run_dir: Path,
                      harness_roots: dict | None = None, options: dict | None = None):
        """One rollout as a Ray task; its Result (with `node`) once it finished, its session laid out in
        `run_dir` as a local rollout's. Cancelled, it cancels the Ray task."""
        import ray
        from ray.exceptions import RayError

        from evals.runner import Result, rollout_layout

        url = min(self.urls, key=lambda u: self.in_flight[u]) if self.urls else None  # ties: the first listed
        model = config.model.model_copy(update={"api_key": None, **({"base_url": url} if url else {})})
        job = Job(_loadable(taskset), task, r, key, spec, config.model_copy(update={"model": model}),
                  self._packed(harness_roots), options or {})
        remote = _remote_function()
        ref = remote.options(num_cpus=self.num_cpus, max_retries=RETRIES, retry_exceptions=False,
                             name=f"rollout {task.id}-{r}").remote(job, Secret(config.model.api_key))
        if url:
            self.in_flight[url] += 1
        try:
            result, folder = await ref
        except asyncio.CancelledError:
            ray.cancel(ref, recursive=True)  # the rollout's own cleanup stops its kernel
            self.cancelled.append(ref)
            raise
        except RayError as e:  # its node died past RETRIES, or the task could not run at all
            return Result(task.id, r, key, "error", error=f"{type(e).__name__}: {_first_line(e)}")
        finally:
            if url:
                self.in_flight[url] -= 1
        unpack(folder, rollout_layout(run_dir, result).dir)
        return result

    def _packed(self, roots: dict | None):
        """The harness scopes a rollout runs on, packed and put in the object store once: `roots`, or
        the user's live harness (a local rollout's project scope is its empty workspace's)."""
        import ray

        from agent.config import home

        roots = {k: v for k, v in (roots or {"user": home() / "harness"}).items() if k != "session"}
        ident = tuple(sorted((k, str(v)) for k, v in roots.items()))
        if ident not in self._harness:
            self._harness[ident] = ray.put({scope: pack(Path(root)) for scope, root in roots.items()})
        return self._harness[ident]


def probe(address: str) -> None:
    """A HOST:PORT address that nothing answers is refused at once (Ray itself would wait a minute)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"not a Ray address: {address!r} (auto, HOST:PORT or ray://HOST:PORT)")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e} (is `ray start --head` "
                           "running there, and the port open?)") from None


def pack(root: Path) -> bytes:
    """Folder `root` as a tar archive (empty where it does not exist)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        if root.is_dir():
            tar.add(root, arcname=".")
    return out.getvalue()


def unpack(data: bytes, target: Path) -> None:
    """A `pack`ed folder at `target` (made, or added to), nothing of it outside (tarfile's data filter)."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(target, filter="data")


def _loadable(taskset: str) -> str:
    """A task set named by a file, by its absolute path: a node loads it from there."""
    path = Path(taskset)
    return str(path.resolve()) if path.suffix in (".jsonl", ".py") and path.is_file() else taskset


def _first_line(e: BaseException) -> str:
    return next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)[:500]


@functools.cache
def _remote_function():
    import ray

    return ray.remote(rollout_task)


def rollout_task(job: Job, secret: Secret):
    """On a node: the rollout, its session folder packed. Whatever goes wrong is its `error` row."""
    import ray

    from evals.runner import Result, rollout_layout

    node = ray.get_runtime_context().get_node_id()
    result = Result(job.task.id, job.rollout, job.key, "error")
    # Ray's cancel is a SIGINT in this (the main) thread (`_thread.interrupt_main`), which a node started
    # with SIGINT ignored (`ray start` in a script's background job) would drop: the rollout, its kernel
    # and its workspace would go on. Heard here, before the rollout, it is a KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="pa-ray-") as tmp:
        run_dir = Path(tmp) / "run"
        try:
            config = confined(job.config.model_copy(update={"model": job.config.model.model_copy(
                update={"api_key": secret.value})}))
            roots = {scope: Path(tmp) / "harness" / scope for scope in ray.get(job.harness)}
            for scope, data in ray.get(job.harness).items():
                unpack(data, roots[scope])
            roots.setdefault("project", Path(tmp) / "harness" / "project")  # a local rollout's: empty, its own
            result = asyncio.run(_rollout(job, config, run_dir, roots))
        except asyncio.CancelledError:  # Ray's cancel, heard by the rollout (_rollout): its cleanup ran
            raise KeyboardInterrupt from None  # what Ray takes for a cancelled task
        except Exception as e:  # a bug, not a node: an error row, not a retry
            result.error = f"{type(e).__name__}: {e}"
        result = replace(result, node=node)
        folder = pack(rollout_layout(run_dir, result).dir)
    return result, folder


def confined(config: Config) -> Config:
    """A rollout's config on a node: the file of the cluster's token (`RAY_AUTH_TOKEN_PATH`; its default,
    ~/.ray/, is a secret store already) hidden from its kernel and scorers, which could otherwise run
    code on every node outside their sandbox."""
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if not token:
        return config
    return config.model_copy(update={"sandbox": config.sandbox.model_copy(
        update={"hidden": [*config.sandbox.hidden, str(Path(token).resolve())]})})


async def _rollout(job: Job, config: Config, run_dir: Path, roots: dict):
    from agent.providers import open_model
    from evals.runner import rollout

    # From here Ray's cancel (a SIGINT) cancels the rollout, once: its cleanup (the session's close, which
    # stops the kernel; the workspace's removal) runs to its end, whatever second cancel comes. The
    # loop hears it at once, even while the rollout waits on a socket.
    rolling = asyncio.current_task()
    assert rolling is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, lambda: rolling.cancelling() or rolling.cancel())
    model = open_model(config.model)
    try:
        env = _environment(job.taskset, config.sandbox.model_dump_json(), json.dumps(job.options, sort_keys=True))
        return await rollout(env, job.task, job.rollout,
                             job.key, job.spec, config, model, run_dir, roots)
    finally:
        await model.close()


@functools.lru_cache(maxsize=8)
def _environment(taskset: str, sandbox: str, options: str):
    """A task set, loaded once per worker process."""
    from agent.config_models import SandboxConfig
    from evals.tasksets import load_taskset

    return load_taskset(taskset, scoring_sandbox=SandboxConfig.model_validate_json(sandbox), **json.loads(options))

