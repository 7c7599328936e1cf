"""Whole RL runs on a Hugging Face model (the tiny llama of tests/rl/conftest.py): the warm start, IPO
steps sampled by the built-in server with hot reload, checkpoints that plain transformers and peft
load, exact resume, and a LoRA adapter served merged into its base."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rl.config import load
from rl.engine import HFEngine
from rl.hf import load_hf
from rl.policy.policy import token_logprobs
from rl.policy.sampler import Job
from rl.serve import BackgroundServer, hf_engine
from rl.train import kept, sft, train, trainable


@pytest.fixture(scope="module")
def warm(tiny_llama: Path, tmp_path_factory) -> Path:
    """The tiny llama after a short warm start: it reverses some of the text, so groups' rewards differ."""
    out = tmp_path_factory.mktemp("warm")
    return sft(quick(tiny_llama, out, "--sft.steps", "40", "--sft.batch_size", "16", "--sft.lr", "3e-3"),
               log=lambda *_: None)


def quick(model: Path, out: Path, *overrides: str):
    return load(None, ["--model.hf", json.dumps(str(model)), "--env.name", '"reverse_text"',
                       "--env.options", "{min_len = 3, max_len = 4}", "--sft.steps", "0", "--train.steps", "3",
                       "--train.batch_size", "4", "--train.group_size", "4", "--train.max_tokens", "6",
                       "--train.lr", "1e-3", "--train.checkpoint_every", "2", "--train.threads", "1",
                       "--train.out", json.dumps(str(out)),
                       *overrides])


def run(cfg) -> list[dict]:
    return train(cfg, log=lambda *_: None, progress=False)


def sampled(engine: HFEngine, prompts: list[list[int]], temperature: float, seed: int = 0):
    job = engine.submit(Job(prompts, 8, temperature, 1.0, seed, []))
    assert job.done.wait(60) and job.error is None
    return job.result


def test_a_warm_started_run_checkpoints_a_directory_plain_transformers_loads(warm: Path, tmp_path: Path):
    history = run(quick(warm, tmp_path / "run", "--sft.steps", "3", "--sft.batch_size", "4"))
    assert [h["step"] for h in history] == [0, 1, 2]
    assert max(abs(h["mismatch_kl"]) for h in history) < 1e-6  # the sampler had the trainer's weights each step
    assert all(h["samples"] > 0 for h in history)
    last = tmp_path / "run" / "checkpoints" / "step-3"
    plain = AutoModelForCausalLM.from_pretrained(last, local_files_only=True)
    ours = load_hf(last)
    assert plain.state_dict().keys() == ours.inner.state_dict().keys()
    assert all(torch.equal(v, ours.inner.state_dict()[k]) for k, v in plain.state_dict().items())
    assert not all(torch.equal(v, load_hf(warm).inner.state_dict()[k]) for k, v in plain.state_dict().items())
    assert (last / "tokenizer.json").is_file() and (tmp_path / "run" / "sft" / "step-3" / "config.json").is_file()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_resumed_run_takes_the_same_next_step(warm: Path, tmp_path: Path, lora: bool):
    extra = ["--model.lora", "{r = 4, alpha = 8}"] if lora else []
    whole = run(quick(warm, tmp_path / "a", *extra))
    assert all(h["samples"] > 0 for h in whole)
    resumed = tmp_path / "b" / "checkpoints"
    resumed.mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-2", resumed / "step-2")
    again = run(quick(warm, tmp_path / "b", *extra))
    assert [h["step"] for h in again] == [2]
    assert again[0]["loss"] == pytest.approx(whole[2]["loss"], abs=1e-7)
    assert again[0]["reward_mean"] == whole[2]["reward_mean"]


def test_a_bfloat16_sampler_differs_from_the_trainer_by_a_mismatch_measured_every_step(warm: Path, tmp_path: Path):
    history = run(quick(warm, tmp_path / "run", "--train.sampler_dtype", '"bfloat16"', "--train.steps", "2"))
    assert all(1e-7 < abs(h["mismatch_kl"]) < 0.1 for h in history), [h["mismatch_kl"] for h in history]


def test_trainer_and_sampler_agree_on_every_sampled_token_with_an_adapter_merged(tiny_llama: Path):
    policy = load_hf(tiny_llama)
    policy.add_lora(load(None, ["--model.hf", json.dumps(str(tiny_llama)), "--model.lora", "{r = 4}"]).model.lora)
    torch.manual_seed(1)
    with torch.no_grad():  # a trained adapter, not peft's initial one (B = 0 changes nothing)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    engine = HFEngine(policy.plain())
    prompts = [engine.tok.chat([{"role": "user", "content": t}]) for t in ("abc", "hello there", "x")]
    for row, (prompt, s) in enumerate(zip(prompts, sampled(engine, prompts, temperature=1.0))):
        ids = torch.tensor([prompt + s.tokens])
        with torch.no_grad():
            trainer = token_logprobs(policy, ids)[0, len(prompt) - 1:]
        assert (trainer - torch.tensor(s.logprobs)).abs().max() < 1e-3, row


def test_a_lagged_step_keeps_a_copy_of_the_adapter_and_shares_the_frozen_base(tiny_llama: Path):
    policy = load_hf(tiny_llama)
    policy.add_lora(load(None, ["--model.hf", json.dumps(str(tiny_llama)), "--model.lora", "{r = 4}"]).model.lora)
    state = policy.state_dict()
    before = {k: v.clone() for k, v in state.items()}
    later = kept(policy, state)
    adapter = [k for k in state if ".lora_" in k]
    assert adapter and all(later[k].data_ptr() != state[k].data_ptr() for k in adapter)
    assert all(later[k] is state[k] for k in state if k not in adapter)  # the base: not copied at every step
    with torch.no_grad():  # an optimizer step, in place
        for p in trainable(policy):
            p.add_(1.0)
    assert all(torch.equal(later[k], before[k]) for k in state)  # what the lagged sampler gets is the old step


def test_a_lora_run_saves_an_adapter_peft_loads_and_the_server_reloads_it_alone(warm: Path, tmp_path: Path):
    run(quick(warm, tmp_path / "run", "--model.lora", "{r = 4, alpha = 8, layers = 1}", "--train.steps", "2",
              "--train.lr", "0.05"))  # a large step: greedy choices change
    adapter = tmp_path / "run" / "checkpoints" / "step-2"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert config["base_model_name_or_path"] == str(warm)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    assert weights and all((".lora_A." in k or ".lora_B." in k) and ".layers.1." in k for k in weights)  # the top block
    assert any(v.abs().sum() > 0 for k, v in weights.items() if ".lora_B." in k)  # it trained
    assert not (adapter / "model.safetensors").exists()

    base = AutoModelForCausalLM.from_pretrained(warm, local_files_only=True)
    plain = PeftModel.from_pretrained(base, adapter).eval()  # plain transformers + peft
    served = hf_engine(str(adapter))
    prompts = [served.tok.chat([{"role": "user", "content": t}]) for t in ("abc", "olleh")]
    for prompt, s in zip(prompts, sampled(served, prompts, temperature=0.0)):
        out = plain.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
        assert s.tokens == out[:len(s.tokens)] and len(s.tokens) > 0

    engine = hf_engine(str(warm))  # the base alone; then the adapter alone, over HTTP
    before = [s.tokens for s in sampled(engine, prompts, temperature=0.0)]
    import httpx2 as httpx

    with BackgroundServer(engine) as url:
        reply = httpx.post(f"{url}/reload", json={"path": str(adapter)}, timeout=60)
        assert reply.status_code == 200, reply.text
    after = [s.tokens for s in sampled(engine, prompts, temperature=0.0)]
    assert after == [s.tokens for s in sampled(served, prompts, temperature=0.0)]
    assert engine.version == 2 and after != before
