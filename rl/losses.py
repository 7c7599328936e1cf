"""Token-level policy-gradient losses for training on samples from an inference engine.

p = trainer probability of the sampled token, q = inference probability, r = p / q, A = advantage.
Every loss returns a per-token loss (zero off the loss mask, gradients flowing to the trainer's
logprobs) and metrics; the trainer sums it and divides by the loss-mask tokens of the step.

    out = compute("ipo", trainer_logprobs, inference_logprobs, advantages, loss_mask)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULTS: dict[str, dict[str, float | None]] = {
    "ipo": {"eps": 0.3, "max_ratio": 1e4, "kl_tau": 0.0},
    "dppo": {"delta_low": 0.2, "delta_high": 0.2, "max_ratio": 1e4, "kl_tau": 0.0},
    "icepop": {"ratio_low": 0.2, "ratio_high": 5.0, "kl_tau": 0.0},
    "ppo": {"ratio_low": 0.8, "ratio_high": 1.2, "max_ratio": 1e4, "kl_tau": 0.0},
    "cispo": {"ratio_low": None, "ratio_high": 5.0, "kl_tau": 0.0},
}


@dataclass
class LossOutput:
    per_token: torch.Tensor
    """Same shape as the inputs; zero where the loss mask is false."""
    metrics: dict[str, float]


def compute(name: str, trainer_logprobs: torch.Tensor, inference_logprobs: torch.Tensor, advantages: torch.Tensor,
            loss_mask: torch.Tensor, **overrides: float | None) -> LossOutput:
    if name not in DEFAULTS:
        raise ValueError(f"unknown loss {name!r}; one of {', '.join(DEFAULTS)}")
    unknown = set(overrides) - set(DEFAULTS[name])
    if unknown:
        raise ValueError(f"loss {name!r} takes {sorted(DEFAULTS[name])}, not {sorted(unknown)}")
    h = {**DEFAULTS[name], **overrides}
    mask = loss_mask.bool()
    # Off the mask, inputs may be anything (padding, NaN): replace them before any arithmetic,
    # so no NaN or inf can reach a value or a gradient through a masked position.
    lp = torch.where(mask, trainer_logprobs, torch.zeros_like(trainer_logprobs))
    lq = torch.where(mask, inference_logprobs, torch.zeros_like(inference_logprobs)).detach()
    adv = torch.where(mask, advantages, torch.zeros_like(advantages)).detach()
    log_r = lp - lq
    r = torch.exp(log_r.clamp(max=50.0))  # exp(50) ~ 5e21 is finite; max_ratio caps it further below
    r_det = r.detach()

    if name in ("ipo", "dppo"):
        diff = _prob_diff(lp.detach(), lq)  # p - q, computed stably from the logprobs
        if name == "ipo":
            keep = diff.abs() <= h["eps"]
        else:
            keep = torch.where(adv > 0, diff <= h["delta_high"], diff >= -h["delta_low"])
        per = -adv * _capped(log_r, h["max_ratio"])
        clipped = r_det > h["max_ratio"]
    elif name == "icepop":
        keep = (r_det >= h["ratio_low"]) & (r_det <= h["ratio_high"])
        per = -adv * r
        clipped = torch.zeros_like(mask)
    elif name == "ppo":
        keep = torch.ones_like(mask)
        rc = _capped(log_r, h["max_ratio"])
        per = -torch.minimum(adv * rc, adv * rc.clamp(h["ratio_low"], h["ratio_high"]))
        clipped = (r_det < h["ratio_low"]) | (r_det > h["ratio_high"])
    else:  # cispo: a stop-gradient weight on the REINFORCE term, so every token keeps a gradient
        keep = torch.ones_like(mask)
        low = h["ratio_low"] if h["ratio_low"] is not None else -math.inf
        weight = r_det.clamp(min=low, max=h["ratio_high"])
        per = -weight * adv * lp
        clipped = (r_det > h["ratio_high"]) | (r_det < low)

    keep = keep & mask
    per = torch.where(keep, per, torch.zeros_like(per))
    if h.get("kl_tau"):
        per = per + torch.where(mask, h["kl_tau"] * log_r**2, torch.zeros_like(per))
    n = mask.sum().clamp(min=1)
    with torch.no_grad():
        metrics = {
            "masked_fraction": float(((~keep) & mask).sum() / n),
            "clipped_fraction": float((clipped & mask).sum() / n),
            "mismatch_kl": float(torch.where(mask, r_det - log_r.detach() - 1, torch.zeros_like(r_det)).sum() / n),
            "max_ratio": float(torch.where(mask, r_det, torch.zeros_like(r_det)).max()) if bool(mask.any()) else 0.0,
        }
    return LossOutput(per, metrics)


def _prob_diff(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """p - q from the logprobs, factored from the larger side so nothing overflows and expm1
    keeps precision when p and q are close: p(1 - e^-d) if d = lp - lq > 0, else q(e^d - 1)."""
    d = lp - lq
    return torch.where(d > 0, torch.exp(lp) * -torch.expm1(-d.clamp(min=0)), torch.exp(lq) * torch.expm1(d.clamp(max=0)))


def _capped(log_r: torch.Tensor, cap: float) -> torch.Tensor:
    """min(r, cap) in value, with gradient min(r, cap) * grad(log p), also past the cap."""
    r = torch.exp(log_r.detach().clamp(max=math.log(cap) + 1))
    return r.clamp(max=cap) * (1 + log_r - log_r.detach())
