"""Chunked log-probs from hidden states: the same values and gradients as the full-logits path,
without keeping [tokens, vocab] logits for the backward."""

from __future__ import annotations

import pytest
import torch

from rl.logprobs import chunked_logprobs, plain_logprobs
from rl.policy.policy import Policy, PolicyConfig, token_logprobs


@pytest.mark.parametrize("chunk", [3, None])  # 7 tokens in chunks of 3, or one block
def test_the_chunked_function_passes_gradcheck_in_float64(chunk: int | None):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    assert torch.autograd.gradcheck(lambda h, w: chunked_logprobs(h, w, targets, 0.7, chunk=chunk)[0], (hidden, weight))


@pytest.mark.parametrize("chunk", [16, None])  # 120 tokens: 7 full chunks and a ragged one, or one block
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_and_plain_agree_in_value_entropy_and_gradient_at_a_32k_vocabulary(temperature: float,
                                                                                   chunk: int | None):
    torch.manual_seed(0)
    model = Policy(PolicyConfig(d_model=32, n_layer=1, n_head=2, max_seq=64, vocab_size=32_000))
    ids = torch.randint(0, 32_000, (3, 41))
    weights = torch.randn(3, 40)  # a loss that weighs each token differently, like advantages do

    def run(**kw):
        model.zero_grad()
        picked, entropy = token_logprobs(model, ids, temperature, entropy=True, **kw)
        (picked * weights).sum().backward()
        return picked.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, chunked = run(plain=True), run(chunk=chunk)
    assert torch.allclose(chunked[0], plain[0], rtol=1e-5, atol=1e-5)
    assert torch.allclose(chunked[1], plain[1], rtol=1e-5, atol=1e-5)
    for name, grad in plain[2].items():  # float32 sums of 120 x 32k terms: rounding scales with the largest
        torch.testing.assert_close(chunked[2][name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(), msg=name)


@pytest.mark.parametrize("chunk", [16, None])
def test_bf16_hidden_states_meet_fp32_weights(chunk: int | None):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 16, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(1000, 16, generator=g).requires_grad_()  # the fp32 master copy
    targets = torch.randint(0, 1000, (50,), generator=g)

    def run(h):
        hidden.grad = weight.grad = None
        picked = chunked_logprobs(h, weight, targets, chunk=chunk)[0]
        picked.sum().backward()
        return picked, hidden.grad, weight.grad

    c, ch, cw = run(hidden)
    assert c.dtype == torch.float32 and ch.dtype == torch.bfloat16 and cw.dtype == torch.float32
    p, ph, pw = run(hidden.float())  # the same inputs in fp32 throughout
    for x, ref in ((c, p), (ch, ph), (cw, pw)):
        assert (x.float() - ref).norm() / ref.norm() < 1e-2  # bf16 rounding, nothing worse


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps from forward to backward while `fn` runs."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def test_the_chunked_path_keeps_no_logits_for_the_backward():
    tokens, vocab, d = 512, 32_000, 64
    hidden = torch.randn(tokens, d, requires_grad=True)
    weight = torch.randn(vocab, d, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    logits_bytes = tokens * vocab * 4
    plain = saved_bytes(lambda: plain_logprobs(hidden, weight, targets))
    chunked = saved_bytes(lambda: chunked_logprobs(hidden, weight, targets, chunk=64))
    assert plain >= logits_bytes  # log_softmax's output, [tokens, vocab]
    # hidden, weight, targets and one log-sum-exp per token
    assert chunked == (tokens * d + vocab * d + tokens) * 4 + tokens * 8
