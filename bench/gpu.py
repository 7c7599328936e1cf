"""The GPU check: the trainer's step on a model of Qwen3-0.6B's shape, sized to finish in well under
8 minutes on one H200. Prints a table and writes bench/results/gpu.json. Needs the `hf` extra.

    .venv/bin/python bench/gpu.py             # refuses (exit 2) without a CUDA device
    .venv/bin/python bench/gpu.py --dry-run   # the same code path on the CPU with a tiny config

Random weights from the config below (no download), fp32 master weights with the forward in bf16
(autocast), AdamW. Each step trains `rl.train.train_step` with the IPO loss on packed rows of 4,096
tokens (`train.pack_length`): samples of random prompt and completion lengths, inference logprobs
near the model's own, one advantage per sample.

Figures:
- tokens/s: sample tokens (padding excluded) per second of the whole optimizer step (packing,
  moving the rows to the device, forward and backward per row, clip, AdamW).
- MFU: model FLOPs per second over the device's dense bf16 peak (`--peak-tflops`, default the
  H200's 989). Model FLOPs per token = 6 x matmul parameters (the tied unembedding counted once, as
  a matmul) + 12 x layers x heads x head_dim x (keys each query attends, averaged: the packed
  samples' causal spans), the usual accounting; recomputation (the chunked log-probs' second pass
  over the unembedding) is work done but not counted.
- peak memory: torch.cuda.max_memory_allocated over the timed steps.
- log-prob memory: one forward and backward of `token_logprobs` over one packed row, plain (full
  [tokens, vocab] logits) vs chunked, each as its peak above the memory allocated before it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save
from rl.config import RunConfig
from rl.hf import HFPolicy
from rl.policy.policy import token_logprobs
from rl.sample import Batch, Sample
from rl.packing import micro_batches
from rl.train import train_step

QWEN3_0_6B = {  # Qwen/Qwen3-0.6B's config.json, architecture fields
    "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_act": "silu", "attention_bias": False,
}
TINY = {**QWEN3_0_6B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "max_position_embeddings": 512}
FULL = {"config": QWEN3_0_6B, "pack_length": 4096, "samples": 64, "prompt": (256, 1024), "completion": (256, 2048),
        "warmup": 2, "steps": 5}
DRY = {"config": TINY, "pack_length": 256, "samples": 8, "prompt": (16, 64), "completion": (16, 96), "warmup": 1,
       "steps": 1}


def make_samples(n: int, vocab: int, prompt: tuple[int, int], completion: tuple[int, int], seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, c = rng.randint(*prompt), rng.randint(*completion)
        ids = [rng.randrange(vocab) for _ in range(p + c)]
        lps = [-math.log(vocab) + rng.gauss(0, 0.05) for _ in range(c)]  # near a random model's own
        out.append(Sample(ids[:p], ids[p:], lps, rng.uniform(-1, 1), 0.0, 0))
    return out


def flops_per_token(cfg: dict, model: torch.nn.Module, samples: list[Sample]) -> float:
    """Training FLOPs per sample token: 6 x matmul parameters + attention over the causal spans."""
    embedding = cfg["vocab_size"] * cfg["hidden_size"]
    params = sum(p.numel() for p in model.parameters())
    matmul = params - (0 if cfg["tie_word_embeddings"] else embedding)  # tied: the table is the unembedding matmul
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    keys = sum(n * (n + 1) / 2 for n in lengths) / sum(lengths)  # keys per query, averaged over tokens
    attention = 12 * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * cfg["head_dim"] * keys
    return 6 * matmul + attention


class Memory:
    """Peak tensor memory above a baseline: CUDA's allocator statistics on a GPU; on the CPU (dry run)
    the profiler's allocation events, as bench/logprobs.py measures them."""

    def __init__(self, device: torch.device):
        self.device = device

    def peak(self, fn) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base
        from bench.logprobs import peak_allocated

        return peak_allocated(fn)


def profile(model, opt, batch, run_cfg, rows: int) -> str:
    """One more step under torch.profiler: the ops that took the most device time (CPU time on a dry run)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        train_step(model, opt, batch, run_cfg)
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def run(spec: dict, device: torch.device, peak_tflops: float, profile_rows: int = 0) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = spec["config"]
    inner = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), attn_implementation="sdpa",
                                             dtype=torch.float32)
    model = HFPolicy(inner).to(device)
    samples = make_samples(spec["samples"], cfg["vocab_size"], spec["prompt"], spec["completion"], seed=0)
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    rows = micro_batches(samples, spec["pack_length"])  # as train_step packs them, for the figures below
    run_cfg = RunConfig.model_validate({"loss": {"name": "ipo"}, "train": {"pack_length": spec["pack_length"]}})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
    batch = Batch(0, samples, [], 0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(spec["warmup"]):
        train_step(model, opt, batch, run_cfg)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, metrics = [], {}
    for _ in range(spec["steps"]):
        t = time.perf_counter()
        metrics = train_step(model, opt, batch, run_cfg)
        sync()
        times.append(time.perf_counter() - t)
    step_peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    if profile_rows:
        print(profile(model, opt, batch, run_cfg, profile_rows))
    seconds = sorted(times)[len(times) // 2]
    flops = flops_per_token(cfg, model, samples)

    memory = Memory(device)
    row = rows[0].to(device)

    def logprobs(plain: bool):
        def go() -> None:
            model.zero_grad(set_to_none=True)
            token_logprobs(model, row.ids, positions=row.positions, segments=row.segments, plain=plain).sum().backward()
        return go

    opt.zero_grad(set_to_none=True)
    lp = {name: memory.peak(logprobs(name == "plain")) for name in ("plain", "chunked")}
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        "params": model.num_params(), "pack_length": spec["pack_length"], "rows_per_step": len(rows),
        "tokens_per_step": tokens, "padding_fraction": 1 - tokens / (len(rows) * spec["pack_length"]),
        "step_seconds": seconds, "tokens_per_s": tokens / seconds, "flops_per_token": flops,
        "tflops": flops * tokens / seconds / 1e12,
        "mfu": flops * tokens / seconds / (peak_tflops * 1e12) if device.type == "cuda" else None,
        "peak_memory_gb": step_peak / 2**30 if step_peak is not None else None,
        "logprob_memory_plain_gb": lp["plain"] / 2**30, "logprob_memory_chunked_gb": lp["chunked"] / 2**30,
        "loss": metrics["loss"], "masked_fraction": metrics["masked_fraction"], "seconds_all": times,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny config on the CPU: the same code path, no GPU")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense bf16 peak (H200: 989)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the timed steps, profile one more and print its N costliest ops")
    args = ap.parse_args(argv)
    load = load_average()
    if not args.dry_run and not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA device and none is present (use --dry-run to check it on the CPU)",
              file=sys.stderr)
        return 2
    if args.dry_run:
        torch.set_num_threads(2)
    r = run(DRY if args.dry_run else FULL, torch.device("cpu" if args.dry_run else "cuda"), args.peak_tflops,
          args.profile)
    shape = "tiny qwen3 (dry run)" if args.dry_run else "qwen3-0.6b shape"
    print(f"{shape}, {r['params'] / 1e6:.1f}M params, on {r['device']}; IPO, packed rows of {r['pack_length']:,} "
          f"tokens, {r['rows_per_step']} rows per step ({r['padding_fraction']:.1%} padding)")
    table = [
        ("tokens per step", f"{r['tokens_per_step']:,}"),
        ("step seconds (median)", f"{r['step_seconds']:.3f}"),
        ("tokens/s", f"{r['tokens_per_s']:,.0f}"),
        ("model TFLOP/s", f"{r['tflops']:.1f}"),
        ("MFU", f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (cpu)"),
        ("peak memory GB (step)", f"{r['peak_memory_gb']:.2f}" if r["peak_memory_gb"] is not None else "n/a (cpu)"),
        ("log-prob memory GB, plain", f"{r['logprob_memory_plain_gb']:.3f}"),
        ("log-prob memory GB, chunked", f"{r['logprob_memory_chunked_gb']:.3f}"),
    ]
    for name, value in table:
        print(f"{name:<30} {value:>14}")
    save(ROOT / "bench" / "results" / ("gpu-dry-run.json" if args.dry_run else "gpu.json"), r, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
