"""The real SmolLM2-135M-Instruct, pulled from the package registry (`smollm2`), served by
`prime-agent rl serve --model` and driven as users drive it: the official `openai` client, plain
transformers for reference, and `prime-agent run` in text mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.rl.servers import alone_and_together, policy_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a real model on 2 cores, maybe loaded: minutes

QUESTIONS = ["What is the capital of France?", "Write a ```python cell that prints 2 + 2.", "Name three colors.",
             "Give me one tip for writing clean code."]


@pytest.fixture(scope="module")
def served(smollm2: Path):
    with policy_server("--model", str(smollm2), "--served-model-name", "smollm2") as url:
        yield url


def test_the_served_model_answers_in_english_with_a_logprob_and_token_id_per_token(served: str):
    client = openai.OpenAI(base_url=served, api_key="none")
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": QUESTIONS[0]}],
                                       max_tokens=24, temperature=0, logprobs=True)
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    assert len(choice.model_extra["token_ids"]) == len(choice.logprobs.content) == r.usage.completion_tokens
    assert all(t.logprob <= 0 for t in choice.logprobs.content)


def test_the_served_model_is_listed_with_its_context_no_tools_and_its_cards_sampling(served: str):
    (model,) = openai.OpenAI(base_url=served, api_key="none").models.list().data
    assert (model.max_model_len, model.tools) == (8192, False)  # ChatML without tools
    assert model.sampling_defaults == {"temperature": 0.2, "top_p": 0.9}  # written by the pull, from its card


ACCEPTANCE = "How many lines does data.txt have? Answer by running Python code."
RUNAWAY = "Add a function mul(a, b) to calc.py and a test"
"""Issue 52: SmolLM2 wrote for ten minutes on it, until Ctrl-C."""


@pytest.mark.timeout(1200)  # six runs of a 135M model at once, on two cores other workers share
def test_prime_agent_run_with_no_settings_fits_the_model_runs_a_cell_and_ends_by_itself(served: str, tmp_path: Path):
    """No -c flags at all (issue 35's acceptance). The session reads the server: 8,192 tokens of context
    (so the short base prompt), no tools (so text mode), the card's sampling (temperature 0.2, top_p 0.9).
    Five users ask the acceptance question, `--max-turns 3` each; a sixth, greedy, gives issue 52's task
    with no budget but the defaults: its turn ends by itself, done, or stopped by a guard saying which.
    The server batches the six runs' requests: the sixth costs the suite little time."""
    env = {**os.environ, "OPENAI_BASE_URL": served, "PRIME_AGENT_MODEL": "smollm2"}
    runs = []
    for i in range(6):
        project = tmp_path / f"project-{i}"
        (project / ".git").mkdir(parents=True)
        (project / "data.txt").write_text("a\nb\nc\nd\ne\nf\ng\n")
        (project / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        args = ["--json", "--max-turns", "3", ACCEPTANCE] if i < 5 else ["--json", "-c", "model.temperature=0", RUNAWAY]
        # output to files: a pipe read only after the runs before it end would stop its run at 64 KB of
        # events (a token each), and the six would take turns instead of sharing the server's batches
        with open(tmp_path / f"out-{i}", "w") as out, open(tmp_path / f"err-{i}", "w") as err:
            runs.append(subprocess.Popen([str(Path(sys.executable).parent / "prime-agent"), "run", *args], cwd=project,
                                         stdout=out, stderr=err, text=True,
                                         env={**env, "PRIME_AGENT_HOME": str(tmp_path / f"home-{i}")}))
    ran = []
    try:
        for i, run in enumerate(runs):
            run.wait(timeout=1100)
            stdout, stderr = (tmp_path / f"out-{i}").read_text(), (tmp_path / f"err-{i}").read_text()
            events = [json.loads(line) for line in stdout.splitlines()]
            assert events and events[-1]["type"] == "turn.finished", stderr[-3000:]
            (started,) = [e for e in events if e["type"] == "session.started"]
            notes = [e["text"] for e in events if e["type"] == "note"]
            assert started["context_window"] == 8192 and len(notes) == 2
            assert "text mode" in notes[0] and "short base prompt" in notes[1]
            ran.append(any(e["type"] == "cell.finished" for e in events))
        runaway, finished = runs[-1], events[-1]
    finally:  # a run the test gave up on leaves nothing running (SIGINT: run stops its kernel)
        for run in runs:
            if run.poll() is None:
                run.send_signal(signal.SIGINT)
                try:
                    run.wait(30)
                except subprocess.TimeoutExpired:
                    run.kill()
    assert sum(ran[:5]) >= 4, ran
    if finished["outcome"] == "completed":
        assert runaway.returncode == 0, stderr[-3000:]
    else:
        assert (finished["outcome"], runaway.returncode) == ("budget_exhausted", 4), stderr[-3000:]
        assert any(setting in finished["error"] for setting in ("budget.max_repeats", "model.repetition_limit",
                                                                  "budget.max_seconds")), finished["error"]
        assert f"prime-agent: turn budget_exhausted: {finished['error']}" in stderr
    assert finished["steps"] < 20


def test_greedy_replies_equal_plain_transformers_token_for_token(smollm2: Path, served: str):
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(smollm2)
    client = openai.OpenAI(base_url=served, api_key="none")
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        expected = model.generate(**ids, max_new_tokens=32, do_sample=False)[0, ids["input_ids"].shape[1]:].tolist()
        r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=32, temperature=0)
        assert r.model_extra["prompt_token_ids"] == ids["input_ids"][0].tolist()  # the tokenizer's own template
        assert r.choices[0].model_extra["token_ids"] == expected, question


def test_thirty_two_simultaneous_requests_each_equal_their_own_request_served_alone(served: str):
    alone, together = alone_and_together(served, "smollm2", [f"{QUESTIONS[i % len(QUESTIONS)]} (question {i})"
                                                             for i in range(32)])
    assert together == alone


def test_prime_agent_run_on_the_served_model_runs_a_cell_and_records_its_tokens(served: str, project: Path,
                                                                                prime_home: Path):
    # a kernel_tasks file question ("total"); greedy, SmolLM2 closes a ```python cell for it with the short
    # base prompt (for the line and word counts it often runs past its budget inside the fence)
    (project / "numbers.txt").write_text("12\n-40\n7\n300\n")
    env = {**os.environ, "OPENAI_BASE_URL": served, "PRIME_AGENT_MODEL": "smollm2"}
    run = subprocess.run([str(Path(sys.executable).parent / "prime-agent"), "run", "--json",
                          "--set", 'model.action_format="text"', "--set", "model.record_logprobs=true",
                          "--set", 'model.base_prompt="short"', "--set", "model.temperature=0",
                          "--set", "model.max_completion_tokens=200", "--max-turns", "2",
                          "Using the files in your working directory: Add up the numbers in numbers.txt: what is their sum?"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=600)
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert events and events[-1]["type"] == "turn.finished", run.stderr
    assert [e for e in events if e["type"] == "cell.finished"], run.stdout
    (trajectory,) = prime_home.glob("sessions/*/trajectory.jsonl")
    records = [json.loads(line) for line in trajectory.read_text().splitlines()]
    sampled = [r["message"] for r in records if r["kind"] == "message" and r["message"]["role"] == "assistant"]
    assert sampled and all(m["token_ids"] and len(m["token_ids"]) == len(m["logprobs"]) for m in sampled)
    assert [r for r in records if r["kind"] == "model_call" and r.get("prompt_token_ids")]


def test_an_adapter_hot_reloaded_into_the_served_base_samples_as_base_and_adapter_served_together(
        smollm2: Path, tmp_path: Path):
    """On the real model the big projections are packed for oneDNN (rl.engine.HFEngine._pack): the adapter
    is merged into the weights the server started with all the same."""
    from rl.hf import LoraSpec, load_hf
    from rl.policy.sampler import Job
    from rl.serve import hf_engine

    torch.manual_seed(0)  # the same adapter every run: peft draws A at random too
    policy = load_hf(smollm2)
    policy.add_lora(LoraSpec(r=4, layers=2))
    with torch.no_grad():  # a trained adapter, not peft's initial one (B = 0 changes nothing); large enough
        for name, p in policy.named_parameters():  # that it changes the greedy reply for certain
            if "lora_B" in name:
                p.normal_(std=0.5)
    policy.save(tmp_path / "adapter")

    def greedy(engine) -> list[int]:
        prompt = engine.tok.chat([{"role": "user", "content": "Name three colours."}])
        job = engine.submit(Job([prompt], 16, 0.0, 1.0, None, []))
        assert job.done.wait(120) and job.error is None
        return job.result[0].tokens

    base = hf_engine(str(smollm2))
    before = greedy(base)
    base.load(tmp_path / "adapter")
    assert greedy(base) == greedy(hf_engine(str(tmp_path / "adapter"))) != before
