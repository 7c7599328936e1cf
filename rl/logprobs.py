"""Log-probs of sampled tokens from the final hidden states, a chunk of tokens at a time.

The plain path, `log_softmax(hidden @ W.T)`, materializes [tokens, vocab] logits and autograd keeps
them (and their softmax) for the backward: 16k tokens at a 150k vocabulary is ~10 GB in fp32.
`chunked_logprobs` keeps only each token's log-sum-exp between forward and backward; the backward
recomputes each chunk's logits, so at most one [chunk, vocab] block is alive at any time. (Keeping the
one block's softmax for the backward, where every token fits one chunk, saved a quarter of the head's
matmuls, but a LoRA run's checkpoint on two processes then differed from one process's past 1e-4:
tests/rl/test_dist_hf.py. Not kept until that is understood.)

    picked, entropy = chunked_logprobs(hidden, weight, targets, temperature=1.0)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 1 << 25
"""Logits per chunk by default (128 MiB in fp32): chunk tokens = CHUNK_ELEMENTS // vocab."""


def default_chunk(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab)


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     chunk: int | None = None, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T / temperature)[targets] in fp32 (or wider), for hidden [..., D], weight [V, D] and
    targets [...]; with gradients to hidden and weight. With `entropy`, also each position's entropy
    (no gradient). `chunk` tokens are computed at a time (default: `default_chunk(V)`)."""
    shape = targets.shape
    picked, ent = _Chunked.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), temperature,
                                 chunk or default_chunk(weight.shape[0]), entropy)
    return picked.view(shape), ent.view(shape) if entropy else None


def plain_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same through autograd over the whole [tokens, vocab] logits: the reference, and the baseline
    that bench/logprobs.py and bench/gpu.py measure against."""
    logp = F.log_softmax((hidden @ weight.to(hidden.dtype).T).to(_wide(hidden)) / temperature, dim=-1)
    picked = torch.gather(logp, -1, targets[..., None]).squeeze(-1)
    if not entropy:
        return picked, None
    with torch.no_grad():
        return picked, -(logp.exp() * logp).sum(-1)


def _scaled(logits: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    logits = logits.to(dtype)
    return logits if temperature == 1.0 else logits.div_(temperature)


def _wide(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, entropy):
        n, w = hidden.shape[0], weight.to(hidden.dtype)  # bf16 activations meet fp32 master weights
        picked = torch.empty(n, dtype=_wide(hidden), device=hidden.device)
        ent = torch.empty_like(picked) if entropy else None
        saved = torch.empty_like(picked)  # each token's log-sum-exp
        for s in range(0, n, chunk):
            logits = _scaled(hidden[s:s + chunk] @ w.T, picked.dtype, temperature)
            saved[s:s + chunk] = torch.logsumexp(logits, dim=-1)
            picked[s:s + chunk] = logits.gather(1, targets[s:s + chunk, None]).squeeze(1) - saved[s:s + chunk]
            if entropy:  # H = -sum p log p, with log p = logits - lse
                logp = logits.sub_(saved[s:s + chunk, None])
                ent[s:s + chunk] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, saved)
        ctx.temperature, ctx.chunk = temperature, chunk
        ent = ent if entropy else picked.new_empty(0)
        ctx.mark_non_differentiable(ent)
        return picked, ent

    @staticmethod
    def backward(ctx, grad_picked, _grad_entropy):
        hidden, weight, targets, saved = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        w = weight.to(hidden.dtype)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=saved.dtype, device=weight.device) if need_w else None
        # d log p[target] / d (h @ w.T) = (onehot(target) - softmax) / temperature, so with g the incoming
        # gradient / temperature: grad h = g (w[target] - softmax @ w), grad w = onehot.T @ (g h) - softmax.T @ (g h),
        # products of the softmax and [tokens, dim] terms alone (the softmax is read, never written)
        for s in range(0, hidden.shape[0], ctx.chunk):
            h, t, g = hidden[s:s + ctx.chunk], targets[s:s + ctx.chunk], grad_picked[s:s + ctx.chunk, None] / ctx.temperature
            probs = _scaled(h @ w.T, saved.dtype, ctx.temperature).sub_(saved[s:s + ctx.chunk, None]).exp_()
            probs = probs.to(hidden.dtype)
            if need_h:
                grad_h[s:s + ctx.chunk] = (w[t] - probs @ w) * g
            if need_w:
                gh = (h * g).to(hidden.dtype)
                if gh.dtype == grad_w.dtype:
                    grad_w.addmm_(probs.T, gh, alpha=-1)
                else:  # bf16 products, summed over chunks in fp32
                    grad_w -= (probs.T @ gh).to(grad_w.dtype)
                grad_w.index_add_(0, t, gh.to(grad_w.dtype))
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None, None
