"""Sampling the byte policy: a batched KV-cache sampler (`generate`), and the request a sampler serves
(`Job`: rl.serve.Engine's and rl.engine.HFEngine's)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rl.grammar import advance, mask_logits
from rl.policy.policy import Policy
from rl.policy.tokenizer import ByteTokenizer


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
