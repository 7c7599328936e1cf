"""The policy: a small byte-level decoder-only transformer, its tokenizer and chat template,
a batched KV-cache sampler, and checkpoints (safetensors + optimizer state, marker file last).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict

from rl.grammar import advance, mask_logits
from rl.hf import LoraSpec
from rl.logprobs import chunked_logprobs, plain_logprobs
from rl.textstream import TextStream

# --- tokenizer ------------------------------------------------------------------------------------


class ByteTokenizer:
    """UTF-8 bytes are tokens 0-255; then the special tokens of the chat template."""

    BOS, EOS, PAD, SYSTEM, USER, ASSISTANT, END = range(256, 263)
    vocab_size = 264
    bos: int | None = BOS
    """Kept at the head of a prompt cut to its tail (rl.serve.keep_tail)."""
    end: int = END
    """Ends the assistant's turn (a warm start's demonstrations end with it)."""
    ROLES = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
    NAMES = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>", SYSTEM: "<|system|>", USER: "<|user|>",
             ASSISTANT: "<|assistant|>", END: "<|end|>"}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def token_str(self, i: int) -> str:
        if i < 256:
            return bytes([i]).decode("utf-8", errors="replace")
        return self.NAMES.get(i, f"<{i}>")

    def detokenizer(self) -> TextStream:
        return TextStream(lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"))

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """<bos> then <|role|> text <|end|> per message, then <|assistant|> to generate."""
        ids = [self.BOS]
        for m in messages:
            role = m["role"] if m["role"] in self.ROLES else "user"  # tool results read as user text
            ids += [self.ROLES[role], *self.encode(m.get("content") or ""), self.END]
        if add_generation_prompt:
            ids.append(self.ASSISTANT)
        return ids


# --- model ----------------------------------------------------------------------------------------


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
        """The weights (`state`, as in `weights`) and config, as load_policy reads them."""
        save_weights(folder, self.weights(state), self.config)


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


# --- sampling -------------------------------------------------------------------------------------


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


@dataclass
class Job:
    """One request to a sampler (rl.serve.Engine, rl.engine.HFEngine): its prompts, one row each
    (`n` copies already expanded), and how to sample them."""

    prompts: list[list[int]]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stops: list[str]
    on_token: Callable[[int, int, float], bool] | None = None
    """on_token(row, token, logprob) streams each token; returning True stops that row (a stop string)."""
    ignore_eos: bool = False
    """Sample past the end-of-text tokens (benchmarks: every row decodes max_tokens)."""
    done: threading.Event = field(default_factory=threading.Event)
    result: list[Sampled] | None = None
    cached: list[int] | None = None
    """Per row, the prompt tokens whose keys and values came from a prefix cache."""
    version: int = 0
    error: BaseException | None = None
    cancelled: bool = False
    """Its client hung up: a sampler that can (rl.engine.HFEngine) drops its rows."""
    grammar: Any = None
    """A compiled grammar (rl.grammar.Grammars.compile): each row samples under a copy of its own."""


@torch.no_grad()
def generate(
    model: Policy,
    prompts: list[list[int]],
    *,
    max_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_ids: tuple[int, ...] = (ByteTokenizer.END, ByteTokenizer.EOS),
    generator: torch.Generator | None = None,
    on_token=None,
    row_max_tokens: list[int] | None = None,
    matchers: list | None = None,
    executor=None,
) -> list[Sampled]:
    """Sample a batch with a KV cache. Prompts are left-padded, so every row decodes in step.
    Logprobs are of each sampled token under the temperature-scaled distribution (the trainer
    computes the same). `on_token(row, token, logprob)` streams; returning True stops that row.
    `matchers` (rl/grammar.py; None for a free row) mask each row's logits before it samples."""
    model.eval()
    B, longest = len(prompts), max(len(p) for p in prompts)
    room = [model.config.max_seq - len(p) for p in prompts]  # each row's own context limit
    limits = [max(0, min(lim, r)) for lim, r in zip(row_max_tokens or [max_tokens] * B, room)]
    max_tokens = max(limits)
    ids = torch.full((B, longest), ByteTokenizer.PAD, dtype=torch.long)
    valid = torch.zeros(B, longest, dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        valid[i, longest - len(p):] = True
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    causal = torch.ones(longest, longest, dtype=torch.bool).tril()
    mask = (causal[None] & valid[:, None, :])[:, None]  # [B, 1, T, T]
    mask = mask | torch.eye(longest, dtype=torch.bool)[None, None]  # pad rows attend to themselves: no NaN
    caches = [[None, None] for _ in model.blocks]
    logits = model(ids, positions, mask, caches)[:, -1]
    out = [Sampled([], [], "length") for _ in range(B)]
    done = torch.tensor([lim == 0 for lim in limits], dtype=torch.bool)
    next_pos = positions[:, -1] + 1
    for _ in range(max_tokens):
        logits = logits.float()
        if matchers:
            mask_logits(logits, [None if done[i] else m for i, m in enumerate(matchers)], executor)
        logp = F.log_softmax(logits / max(temperature, 1e-6), dim=-1)
        if temperature <= 0:
            tok = logp.argmax(-1)
        else:
            probs = logp.exp()
            if top_p < 1.0:
                sorted_p, order = probs.sort(-1, descending=True)
                keep = sorted_p.cumsum(-1) - sorted_p < top_p
                probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        lp = logp.gather(1, tok[:, None]).squeeze(1)
        for i in range(B):
            if done[i]:
                continue
            t = int(tok[i])
            if matchers and matchers[i] is not None:
                advance(matchers[i], t)
            if t in stop_ids:  # kept (with its logprob): the policy chose to stop, and learns from it
                out[i].tokens.append(t)
                out[i].logprobs.append(float(lp[i]))
                out[i].finish_reason = "stop"
                done[i] = True
                if on_token:
                    on_token(i, t, float(lp[i]))
                continue
            out[i].tokens.append(t)
            out[i].logprobs.append(float(lp[i]))
            if on_token and on_token(i, t, float(lp[i])):
                out[i].finish_reason = "stop"
                done[i] = True
            elif len(out[i].tokens) >= limits[i]:
                done[i] = True
        if bool(done.all()):
            break
        valid = torch.cat([valid, torch.ones(B, 1, dtype=torch.bool)], dim=1)
        logits = model(tok[:, None], next_pos[:, None], valid[:, None, None, :], caches)[:, -1]
        next_pos = next_pos + 1
    return out


# --- checkpoints ----------------------------------------------------------------------------------

MARKER = "COMPLETE"
"""Written last: a checkpoint directory without it is unfinished and ignored."""


def save_weights(folder: Path, weights: dict[str, torch.Tensor], config: PolicyConfig) -> None:
    """Full weights and the model config: what load_policy and the policy server's reload read."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(config.model_dump_json(indent=1))


def save_checkpoint(path: Path, model: Policy, optimizer: torch.optim.Optimizer | None, step: int,
                    extra: dict | None = None) -> None:
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    state = {"step": step, "rng": torch.get_rng_state(), **(extra or {})}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    torch.save(state, tmp / "trainer.pt")
    (tmp / MARKER).write_text(str(step))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def load_policy(path: Path) -> nn.Module:
    """A checkpoint's model: a byte `Policy`, or a Hugging Face model (rl.hf.HFPolicy) where the checkpoint
    is a model directory or a LoRA adapter."""
    from safetensors.torch import load_file

    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    if (path / "adapter_config.json").is_file() or "model_type" in (path / "config.json").read_text():
        from rl.hf import load_hf

        return load_hf(path)
    model = Policy(PolicyConfig.model_validate_json((path / "config.json").read_text()))
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    return model


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / "trainer.pt", weights_only=False)


def latest_checkpoint(root: Path) -> Path | None:
    done = [p for p in root.glob("step-*") if re.fullmatch(r"step-\d+", p.name) and (p / MARKER).is_file()] \
        if root.is_dir() else []
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)
