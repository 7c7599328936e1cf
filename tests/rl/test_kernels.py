"""rl/_kernels.c, the policy server's attention in a prefill and the elementwise steps of a layer
(built by the install): what torch's own ops compute, for the shapes and strides rl/decoder.py hands
them, on each instruction set this CPU runs them on (AVX-512, AVX2), and torch's ops where a kernel does
not take them. Which ran is read from a profile: torch's op, or none."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rl.decoder import _causal, _native, _rms_norm, _rotate, _silu_mul

SETS = _native.supported() if _native is not None else ["not built"]


@pytest.fixture(params=SETS)
def isa(request):
    """The kernels on each instruction set this CPU runs them on, in turn."""
    assert _native is not None, "rl/_kernels.c was not built: `pip install -e .` needs a C compiler with OpenMP"
    before = _native.use(request.param)
    yield request.param
    _native.use(before)


@pytest.fixture
def declined():
    """The kernels as on a CPU with neither set: each declines, and torch's ops run."""
    before = _native.use(None) if _native is not None else None
    yield
    if _native is not None:
        _native.use(before)


def ran(prof, name: str) -> int:
    return sum(e.count for e in prof.key_averages() if e.key == name)


TORCH = {"attention": "aten::scaled_dot_product_attention", "rms_norm": "aten::rms_norm", "silu": "aten::silu",
         "rotary": "aten::neg"}
"""An op that torch's way runs and the kernel's does not (the rotary embedding's rotate_half negates)."""


def turned_by_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """The first `heads` heads of x [n, new, heads, dim] turned by the rotary embedding as transformers does it."""
    half, qk = x.shape[-1] // 2, x[:, :, :heads]
    return qk * cos[:, :, None] + torch.cat((-qk[..., half:], qk[..., :half]), -1) * sin[:, :, None]


def attend(n: int, heads: int, kv_heads: int, dim: int, new: int, t: int, dtype=torch.float32):
    """`_causal` on random queries, keys and values laid out as rl/decoder.py hands them, torch's attention
    under the same mask, and how many times torch's attention ran in `_causal`."""
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
    return got, expected, ran(prof, TORCH["attention"]) + ran(prof, "aten::_scaled_dot_product_flash_attention_for_cpu")


@pytest.mark.parametrize("n, heads, kv_heads, dim, new, t", [
    (1, 9, 3, 64, 1024, 0),   # SmolLM2's layout, a fresh 1k-token prompt
    (1, 9, 3, 64, 1000, 24),  # after a chat template's cached first block
    (2, 9, 3, 64, 77, 300),   # two rows after a long cached head, a tail shorter than a block
    (1, 8, 2, 128, 333, 5),   # a head size of 128, four query heads to a key/value head
    (1, 4, 4, 64, 40, 0),     # no grouping
    (3, 9, 3, 64, 1, 50),     # one new token a row
    (1, 15, 5, 64, 517, 1),   # rows that do not fill the last register tile
])
def test_each_query_attends_to_the_columns_up_to_its_own_as_torch_computes(isa, n, heads, kv_heads, dim, new, t):
    got, expected, torchs = attend(n, heads, kv_heads, dim, new, t)
    assert torchs == 0
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    assert got.transpose(1, 2).is_contiguous()  # [n, new, heads, dim]: the output projection's input as it is


@pytest.mark.parametrize("dim, dtype, new, t, cpu", [
    (16, torch.float32, 40, 0, "best"), (16, torch.float32, 40, 3, "best"), (16, torch.float32, 20, 30, "best"),
    (64, torch.bfloat16, 40, 3, "best"), (64, torch.float32, 40, 3, "declined"),
], ids=["head-16-fresh", "head-16-short-head", "head-16-long-head", "bfloat16", "neither-set"])
def test_what_the_kernel_does_not_take_torch_attends_the_same_way(dim, dtype, new, t, cpu, request):
    if cpu == "declined":  # else the fastest set this CPU has
        request.getfixturevalue(cpu)
    got, expected, torchs = attend(2, 4, 2, dim, new, t, dtype)
    assert torchs >= 1
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got, expected, atol=tolerance, rtol=tolerance), (got - expected).abs().max()


@pytest.mark.parametrize("rows", [1, 16, 1024])  # a decode step's rows (one thread) and a prefill's (all)
def test_the_elementwise_steps_compute_what_torchs_ops_do(isa, rows):
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
    assert [ran(prof, op) for op in (TORCH["rms_norm"], TORCH["silu"], TORCH["rotary"])] == [0, 0, 0]
    assert torch.allclose(normed, F.rms_norm(h, (576,), weight, 1e-5), atol=1e-5, rtol=1e-5)
    expected = F.silu(g[:, :1536]) * g[:, 1536:]
    assert torch.allclose(gated, expected, atol=1e-5, rtol=1e-5), (gated - expected).abs().max()
    qk = turned_by_torch(x, cos, sin, heads + kv)
    assert torch.allclose(turned[:, :, : heads + kv], qk, atol=1e-5, rtol=1e-5)
    assert torch.equal(turned[:, :, heads + kv :], x[:, :, heads + kv :])  # the values are not turned
    assert torch.equal(k[:, :, t : t + new], turned[:, :, heads : heads + kv].transpose(1, 2))  # as turned
    assert torch.equal(v[:, :, t : t + new], x[:, :, heads + kv :].transpose(1, 2))
    assert not k[:, :, :t].any() and not k[:, :, t + new :].any()  # nothing else written


@pytest.mark.parametrize("width, cpu", [(36, "best"), (64, "declined")], ids=["width-36", "neither-set"])
def test_an_elementwise_step_the_kernels_do_not_take_is_torchs(width, cpu, request):
    if cpu == "declined":  # 36: no multiple of a vector (8 or 16 floats), on the fastest set this CPU has
        request.getfixturevalue(cpu)
    h, weight = torch.randn(4, width), torch.randn(width)
    g = torch.randn(4, 2 * width)
    x, k = torch.randn(1, 4, 8, width), torch.zeros(1, 2, 4, width)  # heads of `width`
    cos, sin = torch.randn(1, 4, width), torch.randn(1, 4, width)
    with torch.profiler.profile() as prof:
        normed, gated = _rms_norm(h, weight, 1e-6), _silu_mul(g)
        _rotate(x.clone(), cos, sin, k, k.clone(), 0, 4)
    assert [ran(prof, op) for op in (TORCH["rms_norm"], TORCH["silu"], TORCH["rotary"])] == [1, 1, 1]
    assert torch.allclose(normed, F.rms_norm(h, (width,), weight, 1e-6), atol=1e-6)
    assert torch.allclose(gated, F.silu(g[:, :width]) * g[:, width:], atol=1e-6)
    assert k.any()


def test_rows_of_whole_avx2_vectors_but_not_avx512_ones_run_on_the_kernels_all_the_same(isa):
    # heads of 16 (a tiny test llama's), 48, 80: on AVX-512 such a step runs AVX2's code, not torch's ops
    torch.manual_seed(0)
    h, weight, g = torch.randn(5, 24), torch.randn(24), torch.randn(5, 2 * 40)
    n, new, heads, kv, dim = 1, 5, 4, 2, 16
    x = torch.randn(n, new, heads + 2 * kv, dim)
    cos, sin = torch.randn(n, new, dim), torch.randn(n, new, dim)
    k, v = torch.zeros(n, kv, new, dim), torch.zeros(n, kv, new, dim)
    with torch.profiler.profile() as prof:
        normed, gated = _rms_norm(h, weight, 1e-6), _silu_mul(g)
        turned = _rotate(x.clone(), cos, sin, k, v, 0, heads)
    assert [ran(prof, op) for op in (TORCH["rms_norm"], TORCH["silu"], TORCH["rotary"])] == [0, 0, 0]
    assert torch.allclose(normed, F.rms_norm(h, (24,), weight, 1e-6), atol=1e-5)
    assert torch.allclose(gated, F.silu(g[:, :40]) * g[:, 40:], atol=1e-5)
    assert torch.allclose(turned[:, :, : heads + kv], turned_by_torch(x, cos, sin, heads + kv), atol=1e-5)
    assert torch.equal(k, turned[:, :, heads : heads + kv].transpose(1, 2))
