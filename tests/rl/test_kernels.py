"""rl/_kernels.c, the policy server's attention in a prefill and the elementwise steps of a layer
(built by the install): what torch's own ops compute, for the shapes and strides rl/decoder.py hands
them, and torch's ops where a kernel does not take them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl.decoder import _causal, _native, _rms_norm, _rotate, _silu_mul


def attend(n: int, heads: int, kv_heads: int, dim: int, new: int, t: int, dtype=torch.float32):
    """`_causal` on random queries, keys and values laid out as rl/decoder.py hands them, torch's attention
    under the same mask, and how many times the native kernel ran."""
    torch.manual_seed(0)
    fused = torch.randn(n, new, heads + 2 * kv_heads, dim, dtype=dtype)  # the decoder's q/k/v projection
    q = fused[:, :, :heads].transpose(1, 2)
    k = torch.randn(n, kv_heads, t + new + 7, dim, dtype=dtype)  # the slots have room beyond the columns in use
    v = torch.randn(n, kv_heads, t + new + 7, dim, dtype=dtype)
    k[:, :, t : t + new] = fused[:, :, heads : heads + kv_heads].transpose(1, 2)
    v[:, :, t : t + new] = fused[:, :, heads + kv_heads :].transpose(1, 2)
    k, v = k[:, :, : t + new], v[:, :, : t + new]
    with torch.profiler.profile() as prof:
        got = _causal(q, k, v, t, dim**-0.5)
    visible = torch.ones(new, t + new, dtype=torch.bool).tril(diagonal=t)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=dim**-0.5, enable_gqa=True)
    return got, expected, sum(e.count for e in prof.key_averages() if e.key == "rl::causal_attention")


@pytest.mark.parametrize("n, heads, kv_heads, dim, new, t", [
    (1, 9, 3, 64, 1024, 0),   # SmolLM2's layout, a fresh 1k-token prompt
    (1, 9, 3, 64, 1000, 24),  # after a chat template's cached first block
    (2, 9, 3, 64, 77, 300),   # two rows after a long cached head, a tail shorter than a block
    (1, 8, 2, 128, 333, 5),   # a head size of 128, four query heads to a key/value head
    (1, 4, 4, 64, 40, 0),     # no grouping
    (3, 9, 3, 64, 1, 50),     # one new token a row
    (1, 15, 5, 64, 517, 1),   # rows that do not fill the last register tile
])
def test_each_query_attends_to_the_columns_up_to_its_own_as_torch_computes(n, heads, kv_heads, dim, new, t):
    assert _native is not None, "rl/_kernels.c was not built: `pip install -e .` needs a C compiler with OpenMP"
    got, expected, ran = attend(n, heads, kv_heads, dim, new, t)
    assert ran == 1
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    assert got.transpose(1, 2).is_contiguous()  # [n, new, heads, dim]: the output projection's input as it is


@pytest.mark.parametrize("dim, dtype, new, t", [
    (16, torch.float32, 40, 0), (16, torch.float32, 40, 3), (16, torch.float32, 20, 30), (64, torch.bfloat16, 40, 3),
], ids=["head-16-fresh", "head-16-short-head", "head-16-long-head", "bfloat16"])
def test_what_the_kernel_does_not_take_torch_attends_the_same_way(dim, dtype, new, t):
    got, expected, ran = attend(2, 4, 2, dim, new, t, dtype)
    assert ran == 0
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got, expected, atol=tolerance, rtol=tolerance), (got - expected).abs().max()


def ran(prof, name: str) -> int:
    return sum(e.count for e in prof.key_averages() if e.key == name)


@pytest.mark.parametrize("rows", [1, 16, 1024])  # a decode step's rows (one thread) and a prefill's (all)
def test_the_elementwise_steps_compute_what_torchs_ops_do(rows):
    assert _native is not None
    torch.manual_seed(0)
    h, weight = torch.randn(rows, 576) * 3, torch.randn(576)
    g = torch.randn(rows, 2 * 1536) * 4
    g[0, :7] = torch.tensor([-100.0, -89.0, -30.0, 0.0, 30.0, 89.0, 100.0])  # where exp over- and underflows
    n, new, heads, kv, dim, t = 1, rows, 9, 3, 64, 5
    x = torch.randn(n, new, heads + 2 * kv, dim)
    cos, sin = torch.randn(n, new, dim), torch.randn(n, new, dim)
    k, v = torch.zeros(n, kv, t + new + 3, dim), torch.zeros(n, kv, t + new + 3, dim)
    with torch.profiler.profile() as prof:
        normed, gated = _rms_norm(h, weight, 1e-5), _silu_mul(g)
        turned = _rotate(x.clone(), cos, sin, k, v, t, heads)
    assert (ran(prof, "rl::rms_norm"), ran(prof, "rl::silu_mul"), ran(prof, "rl::rotary")) == (1, 1, 1)
    assert torch.allclose(normed, F.rms_norm(h, (576,), weight, 1e-5), atol=1e-5, rtol=1e-5)
    expected = F.silu(g[:, :1536]) * g[:, 1536:]
    assert torch.allclose(gated, expected, atol=1e-5, rtol=1e-5), (gated - expected).abs().max()
    half = dim // 2
    qk = x[:, :, : heads + kv]
    qk = qk * cos[:, :, None] + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin[:, :, None]
    assert torch.allclose(turned[:, :, : heads + kv], qk, atol=1e-5, rtol=1e-5)
    assert torch.equal(turned[:, :, heads + kv :], x[:, :, heads + kv :])  # the values are not turned
    assert torch.equal(k[:, :, t : t + new], turned[:, :, heads : heads + kv].transpose(1, 2))  # as turned
    assert torch.equal(v[:, :, t : t + new], x[:, :, heads + kv :].transpose(1, 2))
    assert not k[:, :, :t].any() and not k[:, :, t + new :].any()  # nothing else written


def test_an_elementwise_step_the_kernels_do_not_take_is_torchs():
    h, weight = torch.randn(4, 40), torch.randn(40)  # a width that is no multiple of 16
    g = torch.randn(4, 2 * 40)
    x, k = torch.randn(1, 4, 8, 16), torch.zeros(1, 2, 4, 16)  # heads of 16: halves of 8
    cos, sin = torch.randn(1, 4, 16), torch.randn(1, 4, 16)
    with torch.profiler.profile() as prof:
        normed, gated = _rms_norm(h, weight, 1e-6), _silu_mul(g)
        _rotate(x.clone(), cos, sin, k, k.clone(), 0, 4)
    assert ran(prof, "rl::rotary") == 1  # called, declined: torch's ops ran
    assert torch.allclose(normed, F.rms_norm(h, (40,), weight, 1e-6), atol=1e-6)
    assert torch.allclose(gated, F.silu(g[:, :40]) * g[:, 40:], atol=1e-6)
    assert k.any()
