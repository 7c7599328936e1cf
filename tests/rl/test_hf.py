"""Hugging Face causal LMs as the policy: tiny models built from configs and saved locally, never
downloaded. Skipped only where transformers is not installed (the `test` extra installs it)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from rl.hf import HFPolicy, load_hf
from rl.losses import CISPOConfig, IPOConfig, LossInputs, compute
from rl.packing import micro_batches
from rl.policy.policy import PolicyConfig, build_policy, token_logprobs
from rl.train import backward

from .test_packing import samples

pytest.importorskip("transformers")  # rl.hf imports it only when a model is loaded

CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64, "vocab_size": 300,
             "bos_token_id": 0, "eos_token_id": 0},
    "qwen3": {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 300,
              "max_position_embeddings": 64, "tie_word_embeddings": True},
}


def config_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(CONFIGS[name]))
    return path


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logprobs_from_hidden_states_match_the_models_own_logits(tmp_path: Path, name: str):
    torch.manual_seed(0)
    model = build_policy(PolicyConfig(hf=str(config_file(tmp_path, name))))
    assert isinstance(model, HFPolicy)
    ids = torch.randint(0, 300, (2, 20))
    weights = torch.randn(2, 19)
    reference = torch.log_softmax(model.inner(ids).logits[:, :-1].float() / 0.8, -1).gather(2, ids[:, 1:, None])[..., 0]
    (reference * weights).sum().backward()
    expected = grads(model)
    model.zero_grad()
    chunked = token_logprobs(model, ids, 0.8, chunk=7)
    (chunked * weights).sum().backward()
    assert torch.allclose(chunked, reference, atol=1e-5)
    assert expected.keys() == grads(model).keys()
    for n, g in grads(model).items():
        assert torch.allclose(g, expected[n], rtol=1e-4, atol=1e-6), n


@pytest.mark.parametrize(("name", "attention"), [("gpt2", "sdpa"), ("gpt2", "eager"), ("qwen3", "sdpa")])
def test_a_packed_step_equals_the_padded_step_for_hf_models(tmp_path: Path, name: str, attention: str):
    torch.manual_seed(0)
    model = load_hf(config_file(tmp_path, name), attn_implementation=attention)
    batch = samples(8, seed=3)
    out = []
    for pack_length in (None, 40):
        model.zero_grad()
        out.append((backward(model, micro_batches(batch, pack_length), 1.0, IPOConfig()), grads(model)))
    (plain, plain_grads), (pack, pack_grads) = out
    assert pack["loss"] == pytest.approx(plain["loss"], rel=1e-5) and pack["tokens"] == plain["tokens"]
    for n, g in plain_grads.items():
        assert torch.allclose(pack_grads[n], g, rtol=1e-4, atol=1e-6), n


@pytest.mark.parametrize("loss", [IPOConfig(), CISPOConfig()], ids=lambda c: c.name)
def test_a_step_is_the_textbook_step_on_the_model_transformers_builds(loss):
    """The trainer's step (log-probs of the loss tokens alone,
    GPT-2's gelu_new run as torch's fused kernel) has the loss of the textbook step to 1e-6, and its gradients,
    entropy and metrics: full logits at every position of the model as transformers builds it, the loss over
    the mask, divided by its tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.activations import NewGELUActivation

    torch.manual_seed(0)
    inner = AutoModelForCausalLM.from_config(AutoConfig.for_model(**CONFIGS["gpt2"]), attn_implementation="sdpa")
    reference = copy.deepcopy(inner).eval()  # eval: no dropout, as HFPolicy has none
    policy = HFPolicy(inner)
    assert any(isinstance(m, NewGELUActivation) for m in reference.modules())
    assert not any(isinstance(m, NewGELUActivation) for m in policy.modules())
    (m,) = micro_batches(samples(8, seed=4), None)
    metrics = backward(policy, [m], 0.9, loss)

    logp = torch.log_softmax(reference(m.ids[:, :-1]).logits / 0.9, -1)
    out = compute(LossInputs(logp.gather(2, m.ids[:, 1:, None])[..., 0], m.inference, m.advantages, m.loss_mask), loss)
    textbook = out.per_token.sum() / m.loss_mask.sum()
    textbook.backward()
    assert abs(metrics["loss"] - textbook.item()) < 1e-6 and abs(textbook.item()) > 1e-3
    assert metrics["tokens"] == int(m.loss_mask.sum())
    entropy = -(logp.exp() * logp).sum(-1)[m.loss_mask].mean()
    assert metrics["entropy"] == pytest.approx(float(entropy), rel=1e-5)
    for key, value in out.metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    expected = grads(reference)
    assert expected.keys() == grads(policy.inner).keys()
    for n, g in grads(policy.inner).items():
        assert torch.allclose(g, expected[n], rtol=1e-4, atol=1e-6), n


def test_a_local_model_directory_loads_weights_tokenizer_and_chat_template(tmp_path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(["reverse the text", "hello world"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}" \
               "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|end|>", chat_template=template)
    torch.manual_seed(0)
    original = load_hf(config_file(tmp_path, "gpt2"))
    original.inner.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")

    loaded = build_policy(PolicyConfig(hf=str(tmp_path / "model")))
    assert all(torch.equal(a, b) for a, b in zip(original.state_dict().values(), loaded.state_dict().values()))
    messages = [{"role": "user", "content": "hello world"}]
    ids = loaded.tokenizer.chat(messages)
    assert loaded.tokenizer.decode(ids) == "<|user|>hello world<|assistant|>"
    assert ids[-len(loaded.tokenizer.encode("<|assistant|>")):] == loaded.tokenizer.encode("<|assistant|>")
    with pytest.raises(FileNotFoundError, match="neither a model directory, a config.json nor a known model name"):
        load_hf(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="neither a config.json nor a model directory"):
        load_hf(tmp_path)  # a directory, but no model in it


def test_a_run_config_names_a_model_that_is_there_and_an_adapter_only_on_one(tmp_path: Path):
    from rl.config import load

    cfg = load(None, ["--model.hf", json.dumps(str(config_file(tmp_path, "gpt2"))), "--model.lora", "{r = 4}"])
    assert (cfg.model.lora.r, cfg.model.lora.alpha) == (4, 32.0)
    with pytest.raises(ValueError, match="hf: .*neither a model directory, a config.json nor a known model name"):
        load(None, ["--model.hf", json.dumps(str(tmp_path / "nothing"))])
    with pytest.raises(ValueError, match="lora: an adapter trains on a Hugging Face model"):
        load(None, ["--model.lora", "{r = 4}"])
