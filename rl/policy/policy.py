"""The policy: a small byte-level decoder-only transformer (`Policy`), or a Hugging Face causal LM
(`build_policy`, rl/hf.py), and the log-probabilities the trainer scores tokens with (`token_logprobs`)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from rl.hf import LoraSpec
from rl.logprobs import chunked_logprobs, plain_logprobs
from rl.policy.tokenizer import ByteTokenizer


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    d_model: int = 128
    """Width of the residual stream."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block."""
    max_seq: int = 256
    """Longest sequence (prompt plus completion) in tokens."""
    vocab_size: int = ByteTokenizer.vocab_size
    """Token ids the embedding holds: the byte tokenizer's."""
    hf: str | None = None
    """A Hugging Face causal LM instead of the byte policy (rl/hf.py): a model name, a local model
    directory, or a config.json built with random weights. The fields above then do not apply."""
    lora: LoraSpec | None = None
    """With `hf`: train a LoRA adapter on the model instead of all its weights."""


class Block(nn.Module):
    def __init__(self, c: PolicyConfig):
        super().__init__()
        self.n_head = c.n_head
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(), nn.Linear(4 * c.d_model, c.d_model))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # [k, v] of earlier positions, extended in place
            if cache[0] is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[0], cache[1] = k, v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


class Policy(nn.Module):
    def __init__(self, config: PolicyConfig):
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.max_seq, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln = nn.LayerNorm(config.d_model)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                caches: list | None = None, hidden: bool = False) -> torch.Tensor:
        """Logits [B, T, V], or with `hidden` the final hidden states [B, T, D] (logits = hidden @
        output_weight.T). Without `mask` attention is causal; `caches` (one [k, v] per block) makes
        this a decoding step over cached keys."""
        B, T = ids.shape
        if positions is None:
            positions = torch.arange(T, device=ids.device).expand(B, T)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        x = self.tok(ids) + self.pos(positions.clamp(max=self.config.max_seq - 1))
        for i, block in enumerate(self.blocks):
            x = block(x, mask, caches[i] if caches is not None else None)
        x = self.ln(x)
        return x if hidden else x @ self.output_weight.T

    @property
    def output_weight(self) -> torch.Tensor:
        return self.tok.weight  # tied output embedding

    @property
    def context(self) -> int:
        """Longest sequence in tokens."""
        return self.config.max_seq

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def weights(self, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """What a sampler loads (rl.serve.Engine.update): `state`, this module's state_dict (default: its
        own; under FSDP2 the full one rl.dist.gathered collects)."""
        return self.state_dict() if state is None else state

    def save(self, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """The weights (`state`, as in `weights`) and config, as `load` reads them (and the policy server's
        reload, through rl.policy.checkpoint.load_policy)."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.weights(state).items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(self.config.model_dump_json(indent=1))

    @classmethod
    def load(cls, folder: Path) -> Policy:
        """What `save` wrote."""
        from safetensors.torch import load_file

        model = cls(PolicyConfig.model_validate_json((folder / "config.json").read_text()))
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        return model


def build_policy(config: PolicyConfig) -> nn.Module:
    """The byte `Policy`, or with `config.hf` a Hugging Face causal LM."""
    if config.hf:
        from rl.hf import load_hf

        return load_hf(config.hf, lora=config.lora)
    return Policy(config)


def token_logprobs(model: nn.Module, ids: torch.Tensor, temperature: float = 1.0, entropy: bool = False, *,
                   positions: torch.Tensor | None = None, segments: torch.Tensor | None = None,
                   chunk: int | None = None, plain: bool = False, where: torch.Tensor | None = None):
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, shape [B, T-1], under the temperature-scaled policy;
    with `entropy`, also the (detached) entropy of each position's distribution. With `where` (bool
    [B, T-1]), only at those positions, flat in row order: the output head, by far the widest product,
    then runs on the tokens a loss reads and no others (a prompt's, padding).

    Computed from the final hidden states `chunk` tokens at a time (rl/logprobs.py), so the
    [tokens, vocab] logits never exist whole; `plain` takes the full-logits path instead. Packed rows
    pass `positions` and `segments` (which sample each token belongs to): attention then stays
    within a sample. `model` is a `Policy` or anything with its `forward(..., hidden=True)` and
    `output_weight` (rl/hf.py)."""
    mask = block_causal_mask(segments[:, :-1]) if segments is not None else None
    hidden = model(ids[:, :-1], positions[:, :-1] if positions is not None else None, mask, hidden=True)
    targets = ids[:, 1:]
    if where is not None:
        hidden, targets = hidden[where], targets[where]
    if plain:
        picked, ent = plain_logprobs(hidden, model.output_weight, targets, temperature, entropy)
    else:
        picked, ent = chunked_logprobs(hidden, model.output_weight, targets, temperature, chunk, entropy)
    return (picked, ent) if entropy else picked


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] bool: token q attends to token k iff k <= q and both belong to the same segment."""
    T = segments.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    return ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]

