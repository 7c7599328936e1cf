"""Hugging Face causal LMs as the policy (transformers).

    [model]
    hf = "smollm2-135m-instruct" # a model pulled with `prime-agent models pull` (rl/models.py)
    hf = "path/to/model-dir"     # weights, tokenizer and its chat template, from a local directory
    hf = "path/to/config.json"   # that architecture with random weights (benchmarks, no download)

`HFPolicy` offers the trainer what the byte `Policy` does: `forward(..., hidden=True)` for the
final hidden states and `output_weight` for the unembedding, so log-probs come from
rl/logprobs.py a chunk at a time. Weights stay fp32, the master copy the optimizer updates; on a
GPU the forward runs in bf16 under autocast.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from rl.models import resolve
from rl.textstream import TextStream

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of architectures whose logits are not hidden @ output_weight.T alone."""


class HFPolicy(nn.Module):
    def __init__(self, inner: nn.Module, tokenizer: HFTokenizer | None = None):
        super().__init__()
        head = inner.get_output_embeddings()
        transforms = [k for k in LOGIT_TRANSFORMS if getattr(inner.config, k, None) not in (None, 1.0)]
        if head is None or getattr(head, "bias", None) is not None or transforms:
            raise ValueError(f"{type(inner).__name__}: logits are not hidden states times an output weight "
                             f"({', '.join(transforms) or 'output head'}); not supported")
        self.inner, self.tokenizer = inner, tokenizer
        # no dropout, even in train mode: the trainer must score tokens as the sampler did
        for m in inner.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
            if isinstance(getattr(m, "attention_dropout", None), float):  # a rate the attention kernel reads
                m.attention_dropout = 0.0

    @property
    def output_weight(self) -> torch.Tensor:
        return self.inner.get_output_embeddings().weight

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, V], or with `hidden` the final hidden states [B, T, D]. `mask` is a bool
        [B, 1, T, T] (True: attend), as rl.model.block_causal_mask makes; without it attention is
        causal (and a packed row's samples are told apart by the resets of `positions`)."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=ids.is_cuda):
            out = self.inner.base_model(input_ids=ids, position_ids=positions, attention_mask=self._mask(mask),
                                        use_cache=False)
            h = out.last_hidden_state
            return h if hidden else h @ self.output_weight.T

    def _mask(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        impl = self.inner.config._attn_implementation
        if mask is None or impl == "sdpa":  # sdpa takes the bool mask as it is
            return mask
        if impl == "eager":  # added to the attention scores
            return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
        return None  # flash and flex kernels read packing from the position ids

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class HFTokenizer:
    """The model's tokenizer with ByteTokenizer's face: encode, decode, chat."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = len(tok)
        self.bos = tok.bos_token_id if getattr(tok, "add_bos_token", False) else None
        """Kept at the head of a prompt cut to its tail, when the tokenizer starts every text with it."""

    def token_str(self, i: int) -> str:
        return self.tok.decode([i])

    def detokenizer(self) -> TextStream:
        return TextStream(self.decode)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """The tokenizer's chat template; a tokenizer without one gets "role: text" lines."""
        if self.tok.chat_template:
            return list(self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                     tokenize=True, return_dict=False))
        text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
        return self.encode(text + ("assistant:" if add_generation_prompt else ""))


def load_hf(spec: str | Path, attn_implementation: str = "sdpa") -> HFPolicy:
    """A model directory (weights, and its tokenizer when there is one) or the name of a pulled one, or a
    config.json built with random weights (seeded by torch's global generator) and no tokenizer. fp32 either way."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = resolve(spec)
    if path.is_file():
        config = AutoConfig.for_model(**json.loads(path.read_text()))
        return HFPolicy(AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                                         dtype=torch.float32))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: neither a config.json nor a model directory")
    inner = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation, dtype=torch.float32,
                                                 local_files_only=True)
    has_tokenizer = any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True)) if has_tokenizer else None
    return HFPolicy(inner, tokenizer)
