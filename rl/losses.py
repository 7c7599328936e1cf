"""Token-level policy-gradient losses for training on samples from an inference engine.

p = trainer probability of the sampled token, q = inference probability, r = p / q, A = advantage.
One function per loss, each taking `LossInputs` and its own config, whose fields hold its defaults;
`compute` picks the function by the config's type. Every loss returns a per-token loss (zero off the
loss mask, gradients flowing to the trainer's logprobs) and metrics; the trainer sums it and divides
by the loss-mask tokens of the step.

    out = compute(LossInputs(trainer_logprobs, inference_logprobs, advantages, loss_mask), IPOConfig(eps=0.2))

A run's `[loss]` table is one of these configs, chosen by `name` (unset: ipo): `name = "icepop"`,
`ratio_high = 4.0`; or `--loss.name icepop --loss.ratio_high 4` on the command line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

# --- inputs and outputs ------------------------------------------------------------------------------


@dataclass
class LossInputs:
    """Per-token tensors of one shape (the trainer's: [tokens], the loss tokens of a micro-batch, flat)."""

    trainer_logprobs: torch.Tensor
    """float: log p of each sampled token under the trainer; the gradients flow through it."""
    inference_logprobs: torch.Tensor
    """float: log q, the same token's logprob as the sampler reported it."""
    advantages: torch.Tensor
    """float: A of the sample the token belongs to."""
    loss_mask: torch.Tensor
    """bool: the tokens trained on. Elsewhere the other tensors may hold anything (padding, NaN)."""


@dataclass
class LossOutputs:
    per_token: torch.Tensor
    """The inputs' shape; zero where the loss mask is false."""
    metrics: dict[str, float]
    """Over the loss-mask tokens: masked_fraction (dropped by the loss), clipped_fraction, mismatch_kl
    (mean r - log r - 1, the k3 estimate of KL(q || p)), max_ratio."""


# --- configs -----------------------------------------------------------------------------------------


class _Loss(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """Which loss; a `[loss]` table without one is ipo's."""
    kl_tau: float = Field(0.0, ge=0)
    """Weight of tau * (log r)^2, added on every loss token (kept or not)."""


class IPOConfig(_Loss):
    """IPO: drop a token when its probability moved more than eps between sampler and trainer."""

    name: Literal["ipo"] = "ipo"
    eps: float = Field(0.3, gt=0)
    """Keep a token iff |p - q| <= eps."""
    max_ratio: float = Field(1e4, gt=0)
    """Cap on the ratio's value and gradient."""


class DPPOConfig(_Loss):
    """DPPO (Binary-TV, "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv 2602.04879): drop a
    token whose probability moved past delta in the direction its advantage pushes; the kept ones are
    REINFORCE weighted by the capped ratio, detached, as the paper's code (sail-sg/Stable-RL) computes it."""

    name: Literal["dppo"] = "dppo"
    delta_low: float = Field(0.2, ge=0)
    """With A <= 0, keep a token iff p - q >= -delta_low."""
    delta_high: float = Field(0.2, ge=0)
    """With A > 0, keep a token iff p - q <= delta_high."""
    max_ratio: float = Field(10.0, gt=0)
    """Cap on the detached weight min(r, max_ratio) (the paper's code: clip_ratio_c, 10)."""


class IcePopConfig(_Loss):
    """IcePop: drop a token whose ratio leaves [ratio_low, ratio_high]."""

    name: Literal["icepop"] = "icepop"
    ratio_low: float = Field(0.2, ge=0)
    """Keep a token iff r >= ratio_low..."""
    ratio_high: float = Field(5.0, gt=0)
    """...and r <= ratio_high."""


class PPOConfig(_Loss):
    """PPO's clipped surrogate, against the sampler's probabilities."""

    name: Literal["ppo"] = "ppo"
    ratio_low: float = Field(0.8, ge=0)
    """The ratio is clipped to [ratio_low, ratio_high] in the surrogate."""
    ratio_high: float = Field(1.2, gt=0)
    """See ratio_low."""
    max_ratio: float = Field(1e4, gt=0)
    """Cap on the ratio's value and gradient."""


class CISPOConfig(_Loss):
    """CISPO: REINFORCE weighted by the clipped ratio, detached, so every token keeps a gradient."""

    name: Literal["cispo"] = "cispo"
    ratio_low: float | None = Field(None, ge=0)
    """The weight's lower clip (None: none)."""
    ratio_high: float = Field(5.0, gt=0)
    """The weight's upper clip."""


def _loss_name(value: Any) -> str:
    return value.get("name", "ipo") if isinstance(value, dict) else getattr(value, "name", "")


LossConfig = Annotated[
    Annotated[IPOConfig, Tag("ipo")] | Annotated[DPPOConfig, Tag("dppo")] | Annotated[IcePopConfig, Tag("icepop")]
    | Annotated[PPOConfig, Tag("ppo")] | Annotated[CISPOConfig, Tag("cispo")],
    Discriminator(_loss_name, custom_error_type="loss_name",
                  custom_error_message="name: not a loss; one of ipo, dppo, icepop, ppo, cispo"),
]
"""A run's `[loss]`: the config of one loss, chosen by its `name` (unset: ipo)."""


# --- the losses --------------------------------------------------------------------------------------


def ipo(x: LossInputs, c: IPOConfig) -> LossOutputs:
    t = _Tokens.of(x)
    keep = _prob_diff(t.lp.detach(), t.lq).abs() <= c.eps  # |p - q|, computed stably from the logprobs
    per = -t.adv * _capped(t.log_r, c.max_ratio)
    return t.outputs(per, keep, t.ratio > c.max_ratio, c.kl_tau)


def dppo(x: LossInputs, c: DPPOConfig) -> LossOutputs:
    t = _Tokens.of(x)
    diff = _prob_diff(t.lp.detach(), t.lq)  # p - q
    keep = torch.where(t.adv > 0, diff <= c.delta_high, diff >= -c.delta_low)
    per = -t.ratio.clamp(max=c.max_ratio) * t.adv * t.lp  # the weight detached: the gradient is REINFORCE's, reweighted
    return t.outputs(per, keep, t.ratio > c.max_ratio, c.kl_tau)


def icepop(x: LossInputs, c: IcePopConfig) -> LossOutputs:
    t = _Tokens.of(x)
    keep = (t.ratio >= c.ratio_low) & (t.ratio <= c.ratio_high)
    per = -t.adv * torch.exp(t.log_r.clamp(max=50.0))
    return t.outputs(per, keep, torch.zeros_like(t.mask), c.kl_tau)


def ppo(x: LossInputs, c: PPOConfig) -> LossOutputs:
    t = _Tokens.of(x)
    rc = _capped(t.log_r, c.max_ratio)
    per = -torch.minimum(t.adv * rc, t.adv * rc.clamp(c.ratio_low, c.ratio_high))
    clipped = (t.ratio < c.ratio_low) | (t.ratio > c.ratio_high)
    return t.outputs(per, torch.ones_like(t.mask), clipped, c.kl_tau)


def cispo(x: LossInputs, c: CISPOConfig) -> LossOutputs:
    t = _Tokens.of(x)
    low = c.ratio_low if c.ratio_low is not None else -math.inf
    weight = t.ratio.clamp(min=low, max=c.ratio_high)  # detached: the gradient is REINFORCE's, reweighted
    per = -weight * t.adv * t.lp
    clipped = (t.ratio > c.ratio_high) | (t.ratio < low)
    return t.outputs(per, torch.ones_like(t.mask), clipped, c.kl_tau)


LOSSES: dict[type[_Loss], Callable[[LossInputs, Any], LossOutputs]] = {
    IPOConfig: ipo, DPPOConfig: dppo, IcePopConfig: icepop, PPOConfig: ppo, CISPOConfig: cispo}


def compute(x: LossInputs, config: LossConfig) -> LossOutputs:
    """The loss `config` configures, on `x`."""
    return LOSSES[type(config)](x, config)


# --- shared parts ------------------------------------------------------------------------------------


@dataclass
class _Tokens:
    """The inputs with every value off the loss mask replaced by 0 before any arithmetic, so no NaN or inf
    can reach a value or a gradient through a masked position."""

    mask: torch.Tensor
    lp: torch.Tensor
    """log p, with its gradient."""
    lq: torch.Tensor
    adv: torch.Tensor
    log_r: torch.Tensor
    """log p - log q, with its gradient."""
    ratio: torch.Tensor
    """r, detached; exp(50) ~ 5e21 is finite, and the caps take it further down."""

    @classmethod
    def of(cls, x: LossInputs) -> _Tokens:
        mask = x.loss_mask.bool()
        lp = torch.where(mask, x.trainer_logprobs, torch.zeros_like(x.trainer_logprobs))
        lq = torch.where(mask, x.inference_logprobs, torch.zeros_like(x.inference_logprobs)).detach()
        adv = torch.where(mask, x.advantages, torch.zeros_like(x.advantages)).detach()
        log_r = lp - lq
        return cls(mask, lp, lq, adv, log_r, torch.exp(log_r.detach().clamp(max=50.0)))

    def outputs(self, per: torch.Tensor, keep: torch.Tensor, clipped: torch.Tensor, kl_tau: float) -> LossOutputs:
        """The per-token loss on the kept loss tokens (plus the kl_tau term on every loss token), and the metrics."""
        mask, r = self.mask, self.ratio
        keep = keep & mask
        per = torch.where(keep, per, torch.zeros_like(per))
        if kl_tau:
            per = per + torch.where(mask, kl_tau * self.log_r**2, torch.zeros_like(per))
        n = mask.sum().clamp(min=1)
        with torch.no_grad():
            metrics = {
                "masked_fraction": float(((~keep) & mask).sum() / n),
                "clipped_fraction": float((clipped & mask).sum() / n),
                "mismatch_kl": float(torch.where(mask, r - self.log_r.detach() - 1, torch.zeros_like(r)).sum() / n),
                "max_ratio": float(torch.where(mask, r, torch.zeros_like(r)).max()) if bool(mask.any()) else 0.0,
            }
        return LossOutputs(per, metrics)


def _prob_diff(lp: torch.Tensor, lq: torch.Tensor) -> torch.Tensor:
    """p - q from the logprobs, factored from the larger side so nothing overflows and expm1
    keeps precision when p and q are close: p(1 - e^-d) if d = lp - lq > 0, else q(e^d - 1)."""
    d = lp - lq
    return torch.where(d > 0, torch.exp(lp) * -torch.expm1(-d.clamp(min=0)), torch.exp(lq) * torch.expm1(d.clamp(max=0)))


def _capped(log_r: torch.Tensor, cap: float) -> torch.Tensor:
    """min(r, cap) in value, with gradient min(r, cap) * grad(log p), also past the cap."""
    r = torch.exp(log_r.detach().clamp(max=math.log(cap) + 1))
    return r.clamp(max=cap) * (1 + log_r - log_r.detach())
