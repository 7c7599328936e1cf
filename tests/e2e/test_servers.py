"""Servers nobody here wrote, run for real on the local SmolLM2-135M-Instruct (`smollm2`): a turn of
`prime-agent run` against each completes. vLLM's turn is in tests/rl/test_vllm.py (one vLLM server for it
and the RL runs), the project's own policy server's in tests/e2e/test_smollm2.py; the recorded quirks of
servers that cannot run here are replayed in tests/agent/test_quirks.py. docs/servers.md's table of servers says which is which."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.rl.servers import assert_completed, run_turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # real models on 2 shared cores: minutes

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(argv: list[str], port: int, model: str, env: dict[str, str], log: Path, ready_s: float) -> Iterator[str]:
    """The server started with `argv` in a process group of its own, once a one-token chat answers; its
    base URL. Stopped, with all it started, on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no answer in {ready_s:.0f} s:\n{log.read_text()[-3000:]}"
            try:  # `transformers serve` answers GET /v1/models with a 500 offline: ask what users ask
                r = httpx.post(f"{url}/chat/completions", timeout=60, json={
                    "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_a_turn_against_transformers_serve_completes(smollm2: Path, project: Path, tmp_path: Path):
    """transformers' own OpenAI-compatible server, on the local model directory, offline. What it does
    differently (seen here, transformers 5.23): `GET /v1/models` fails offline, the model name must be
    the path it was started with, no `[DONE]` ends a stream, the usage comes in the finish chunk, and
    `n` and `logprobs` are ignored (said once by the session when it records logprobs)."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [str(VENV_BIN / "transformers"), "serve", str(smollm2), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32"]
    with serving(argv, port, str(smollm2), env, tmp_path / "transformers.log", ready_s=300) as url:
        events, run = run_turn(url, str(smollm2), project, "model.record_logprobs=true")
    finished = assert_completed(events, run)
    assert "paris" in finished["answer"].lower()
    notes = [e["text"] for e in events if e["type"] == "note"]
    assert len(notes) == 1 and "returned no logprobs" in notes[0]
