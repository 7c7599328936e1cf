"""Sequence packing: a packed step trains exactly like the padded step on the same samples."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from rl.config import RunConfig
from rl.losses import CISPOConfig, IPOConfig
from rl.policy.policy import Policy, PolicyConfig
from rl.sample import Batch, Sample
from rl.packing import micro_batches, packed
from rl.train import backward, train_step


def samples(n: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [rng.randrange(256) for _ in range(rng.randint(2, 12))]
        completion = [rng.randrange(256) for _ in range(rng.randint(1, 10))]
        mask = [rng.random() > 0.2 for _ in completion]  # as if the harness inserted some tokens
        # inference logprobs near the trainer's (~log 1/264), so that ipo keeps most tokens
        lps = [rng.uniform(-6.5, -4.5) if m else 0.0 for m in mask]
        out.append(Sample(prompt, completion, lps, rng.uniform(-1, 1), 0.0, 0, completion_mask=mask))
    return out


def test_samples_pack_whole_into_fixed_length_rows_with_their_own_positions():
    batch = samples(9)
    rows = packed(batch, 24)
    assert all(m.ids.shape == (1, 24) for m in rows)
    assert len(rows) < len(batch)  # some rows hold several samples
    placed = sorted(int(s) for m in rows for s in m.segments.unique() if s >= 0)
    assert placed == list(range(9))
    for m in rows:
        for seg in m.segments.unique():
            where = (m.segments[0] == seg).nonzero().squeeze(1)
            assert torch.equal(m.positions[0, where], torch.arange(len(where)))  # contiguous, from 0
            if seg >= 0:
                s = batch[int(seg)]
                assert m.ids[0, where].tolist() == s.prompt_ids + s.completion_ids
                # the loss mask stands where the sample predicts its sampled tokens
                assert m.loss_mask[0, where[0]:where[-1]].tolist()[len(s.prompt_ids) - 1:] == s.completion_mask
    assert sum(int(m.loss_mask.sum()) for m in rows) == sum(sum(s.completion_mask) for s in batch)
    with pytest.raises(ValueError, match="does not fit train.pack_length = 8"):
        packed(batch, 8)


@pytest.mark.parametrize("loss", [IPOConfig(), CISPOConfig()], ids=lambda c: c.name)
def test_a_packed_step_has_the_loss_gradients_and_metrics_of_the_padded_step(loss):
    torch.manual_seed(0)
    model = Policy(PolicyConfig(d_model=32, n_layer=2, n_head=2, max_seq=32))
    batch = samples(10, seed=1)

    def run(pack_length):
        model.zero_grad()
        m = backward(model, micro_batches(batch, pack_length), 0.9, loss)
        return m, {n: p.grad.clone() for n, p in model.named_parameters()}

    (plain, plain_grads), (pack, pack_grads) = run(None), run(40)
    assert len(micro_batches(batch, 40)) > 1  # the gradients really accumulate over micro-batches
    assert plain["tokens"] == pack["tokens"] and plain["masked_fraction"] < 0.5
    for key, value in plain.items():
        assert pack[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for name, grad in plain_grads.items():
        assert torch.allclose(pack_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_train_step_packs_when_pack_length_is_set():
    torch.manual_seed(0)
    model = Policy(PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=32))
    batch = Batch(0, samples(6, seed=2), [], 0)
    stepped = []
    for pack_length in (None, 32):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)  # Adam would amplify rounding on near-zero gradients
        cfg = RunConfig.model_validate({"model": m.config.model_dump(), "train": {"pack_length": pack_length}})
        metrics = train_step(m, opt, batch, cfg)
        stepped.append((metrics, m.state_dict()))
    (a, wa), (b, wb) = stepped
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-7) for k in wa)
    assert not torch.equal(wa["tok.weight"], model.state_dict()["tok.weight"])
