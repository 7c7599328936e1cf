"""The losses, checked by hand on small tensors and against a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from rl.config import load
from rl.losses import (
    LOSSES, CISPOConfig, DPPOConfig, IcePopConfig, IPOConfig, LossInputs, PPOConfig, compute,
)


def inputs(lp: list[float], lq: list[float], adv: list[float], mask: list[bool] | None = None):
    t = torch.tensor([lp], dtype=torch.float64, requires_grad=True)
    return t, torch.tensor([lq], dtype=torch.float64), torch.tensor([adv], dtype=torch.float64), \
        torch.tensor([mask if mask is not None else [True] * len(lp)])


def loss(config, lp, lq, adv, mask):
    return compute(LossInputs(lp, lq, adv, mask), config)


CONFIGS = [config() for config in LOSSES]
"""Every loss at its defaults."""


def test_ipo_keeps_tokens_within_eps_and_caps_the_ratio():
    # p=0.5 q=0.5 (kept, r=1); p=0.9 q=0.5 (|p-q| = 0.4 > 0.3: masked); p=0.6 q=0.4 (kept, r=1.5)
    lp, lq, adv, mask = inputs([math.log(0.5), math.log(0.9), math.log(0.6)], [math.log(0.5), math.log(0.5), math.log(0.4)],
                               [1.0, 1.0, -2.0])
    out = loss(IPOConfig(), lp, lq, adv, mask)
    assert torch.allclose(out.per_token, torch.tensor([[-1.0, 0.0, 3.0]], dtype=torch.float64))
    out.per_token.sum().backward()
    # d/dlp of -A * r = -A * r (since dr/dlp = r); masked token: zero
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, 0.0, 3.0]], dtype=torch.float64))
    assert out.metrics["masked_fraction"] == pytest.approx(1 / 3)

    big, q, a, m = inputs([0.0], [-20.0], [1.0])
    capped = loss(IPOConfig(eps=2.0, max_ratio=10.0), big, q, a, m)
    capped.per_token.sum().backward()
    assert capped.per_token.item() == -10.0 and big.grad.item() == pytest.approx(-10.0)  # min(r, C) * grad log p


def test_dppo_masks_by_the_sign_of_the_advantage():
    # p - q = +0.3 for both tokens; A > 0 masks it (> 0.2), A < 0 keeps it (>= -0.2)
    lp, lq, adv, mask = inputs([math.log(0.8), math.log(0.8)], [math.log(0.5), math.log(0.5)], [1.0, -1.0])
    out = loss(DPPOConfig(), lp, lq, adv, mask)
    out.per_token.sum().backward()
    # the kept token: -sg(min(r, 10)) * A * log p, r = 1.6, as the paper's code computes it
    assert out.per_token[0, 0].item() == 0.0 and out.per_token[0, 1].item() == pytest.approx(1.6 * math.log(0.8))
    assert lp.grad[0].tolist() == pytest.approx([0.0, 1.6])
    big, q, a, m = inputs([0.0], [-20.0], [-1.0])  # p - q ~ +1 with A < 0: kept; r ~ 5e8, its weight capped at 10
    capped = loss(DPPOConfig(), big, q, a, m)
    capped.per_token.sum().backward()
    assert big.grad.item() == pytest.approx(10.0) and capped.metrics["clipped_fraction"] == 1.0


def test_icepop_keeps_ratios_in_range_inclusive():
    lp, lq, adv, mask = inputs([math.log(0.5), math.log(0.5), math.log(0.5)], [math.log(0.1), math.log(0.5), math.log(0.6)],
                               [1.0, 1.0, 1.0])
    out = loss(IcePopConfig(ratio_high=5.0), lp, lq, adv, mask)
    assert torch.allclose(out.per_token, torch.tensor([[-5.0, -1.0, -0.5 / 0.6]], dtype=torch.float64))  # r = 5 kept
    out2 = loss(IcePopConfig(ratio_high=4.0), lp, lq, adv, mask)
    assert out2.per_token[0, 0].item() == 0.0


def test_ppo_clips_and_cispo_keeps_every_gradient():
    lp, lq, adv, mask = inputs([math.log(0.6)], [math.log(0.4)], [1.0])  # r = 1.5
    ppo = loss(PPOConfig(), lp, lq, adv, mask)
    ppo.per_token.sum().backward()
    assert ppo.per_token.item() == pytest.approx(-1.2) and lp.grad.item() == 0.0  # clipped: no gradient
    lp, lq, adv, mask = inputs([math.log(0.6)], [math.log(0.06)], [2.0])  # r = 10 > 5
    cispo = loss(CISPOConfig(), lp, lq, adv, mask)
    cispo.per_token.sum().backward()
    assert cispo.per_token.item() == pytest.approx(-5.0 * 2.0 * math.log(0.6))
    assert lp.grad.item() == pytest.approx(-10.0)  # -sg(clip(r)) * A
    assert cispo.metrics["clipped_fraction"] == 1.0


def test_kl_tau_adds_a_penalty_on_loss_tokens():
    lp, lq, adv, mask = inputs([math.log(0.6)], [math.log(0.4)], [0.0])
    out = loss(IPOConfig(kl_tau=0.5), lp, lq, adv, mask)
    assert out.per_token.item() == pytest.approx(0.5 * math.log(1.5) ** 2)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_masked_extreme_and_nan_tokens_never_make_nan(config):
    lp = torch.tensor([[-100.0, float("nan"), -0.5, float("-inf")]], requires_grad=True)
    lq = torch.tensor([[-10.0, -1.0, float("nan"), -0.5]])
    adv = torch.tensor([[1.0, float("nan"), 1.0, 2.0]])
    mask = torch.tensor([[True, False, False, False]])
    out = loss(config, lp, lq, adv, mask)
    out.per_token.sum().backward()
    assert torch.isfinite(out.per_token).all() and torch.isfinite(lp.grad).all()
    assert (out.per_token[0, 1:] == 0).all() and (lp.grad[0, 1:] == 0).all()
    assert all(math.isfinite(v) for v in out.metrics.values())


def reference(name: str, lp: torch.Tensor, lq: torch.Tensor, a: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The formulas written plainly in float64."""
    r = torch.exp(lp - lq)
    p, q = torch.exp(lp), torch.exp(lq)
    if name == "ipo":
        keep, per = (p - q).abs() <= 0.3, -a * r.clamp(max=1e4)
    elif name == "dppo":
        keep = torch.where(a > 0, p - q <= 0.2, p - q >= -0.2)
        per = -r.clamp(max=10.0) * a * lp
    elif name == "icepop":
        keep, per = (r >= 0.2) & (r <= 5.0), -a * r
    elif name == "ppo":
        keep, per = torch.ones_like(m), -torch.minimum(a * r, a * r.clamp(0.8, 1.2))
    else:
        keep, per = torch.ones_like(m), -r.clamp(max=5.0) * a * lp
    return torch.where(keep & m, per, torch.zeros_like(per))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_matches_a_float64_reference_on_random_inputs(config):
    g = torch.Generator().manual_seed(7)
    lq = -torch.rand(8, 32, generator=g, dtype=torch.float64) * 4
    lp = (lq + torch.randn(8, 32, generator=g, dtype=torch.float64) * 0.5).clamp(max=0)
    a = torch.randn(8, 32, generator=g, dtype=torch.float64)
    m = torch.rand(8, 32, generator=g) > 0.2
    out = loss(config, lp.float(), lq.float(), a.float(), m)
    assert torch.allclose(out.per_token.double(), reference(config.name, lp, lq, a, m), rtol=1e-4, atol=1e-5)


def test_a_run_names_its_loss_and_sets_only_that_loss_fields():
    assert load(None, []).loss == IPOConfig()  # no [loss]: ipo at its defaults
    assert load(None, ["--loss.eps", "0.2"]).loss == IPOConfig(eps=0.2)  # no name: ipo
    assert load(None, ["--loss.name", "icepop", "--loss.ratio_high", "4"]).loss == IcePopConfig(ratio_high=4.0)
    with pytest.raises(ValueError, match="field loss: name: not a loss; one of ipo, dppo"):
        load(None, ["--loss.name", "grpo"])
    with pytest.raises(ValueError, match="field loss.ipo.ratio_high: Extra inputs are not permitted"):
        load(None, ["--loss.ratio_high", "2.0"])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_extreme_ratios_on_loss_tokens_stay_finite(config):
    lp = torch.tensor([[-110.0, -0.01, -2.0]], requires_grad=True)
    lq = torch.tensor([[-2.0, -60.0, -110.0]])
    out = loss(config, lp, lq, torch.tensor([[1.0, 1.0, -1.0]]), torch.tensor([[True, True, True]]))
    out.per_token.sum().backward()
    assert torch.isfinite(out.per_token).all() and torch.isfinite(lp.grad).all()


def test_ipo_judges_p_minus_q_right_when_q_is_tiny():
    lp, lq, adv, mask = inputs([-0.01], [-60.0], [1.0])  # |p - q| ~ 0.99
    out = loss(IPOConfig(), lp, lq, adv, mask)
    assert out.per_token.item() == 0.0 and out.metrics["masked_fraction"] == 1.0
