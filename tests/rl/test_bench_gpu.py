"""bench/gpu.py needs a GPU to measure; here its code path runs on the CPU with a tiny config."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from bench import gpu  # the repository root is on sys.path: tests/ is a package


def test_the_gpu_check_runs_on_the_cpu_in_its_dry_run():
    r = gpu.run(gpu.DRY, torch.device("cpu"), peak_tflops=989.0)
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in gpu.make_samples(
        gpu.DRY["samples"], gpu.TINY["vocab_size"], gpu.DRY["prompt"], gpu.DRY["completion"], seed=0)]
    assert r["tokens_per_step"] == sum(lengths) and r["rows_per_step"] * gpu.DRY["pack_length"] >= sum(lengths)
    assert math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["mfu"] is None
    assert r["flops_per_token"] > 6 * r["params"]  # every parameter is in a matmul (tied unembedding), plus attention
    assert 0 < r["logprob_memory_chunked_gb"] < r["logprob_memory_plain_gb"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_a_gpu_it_refuses_clearly(capsys):
    assert gpu.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
