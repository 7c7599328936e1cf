"""Where the policy server's prefill spends its time, op by op: one cold prefill of a ~1k-token prompt
(nothing cached) by rl/engine.py's HFEngine in this process, under torch.profiler.

    .venv/bin/python bench/prefill.py [--model NAME|DIR] [--tokens 1024] [--head 0] [--top 15]
        [--heap serving|glibc|mmap-1mb] [--kernels best|avx512f|avx2|torch]

It times `--repeats` prefills of new prompts (the first, right after the model loads, as a server's
first request; then the median of the rest), profiles one more, and prints the ops that took the
most self CPU time, and their share by kind: matmuls (oneDNN), attention, and the elementwise rest
(RMSNorm, the rotary embedding, SiLU and its mul, copies). rl/_kernels.c's kernels are named `rl::...`
(`rl::causal_attention`, `rl::rms_norm`, `rl::rotary`, `rl::silu_mul`); where it is not built, or
with `--kernels torch`, torch's ops run and are named instead. `--kernels avx2` runs them on AVX2 on a CPU
that has AVX-512 too (`best`: the fastest this CPU has, as the server does). Writes
bench/results/prefill.json. `--head N`: every prompt begins with the same N tokens, found in the
prefix cache after the first (a server's cold prompt finds its chat template's first block there).
Each prefill's page faults are counted. `--heap`: glibc's heap as `prime-agent rl serve` sets it
(`serving`: `rl.engine.serving_heap`), glibc's defaults (`glibc`, a trainer's process), or every block
of 1 MB and more mmapped (`mmap-1mb`: what the server set before, each activation a fresh mapping).
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from bench.report import load_average, save  # noqa: E402
from rl.decoder import _native, kernels  # noqa: E402
from rl.engine import HFEngine, serving_heap  # noqa: E402
from rl.hf import load_hf  # noqa: E402
from rl.pull import resolve  # noqa: E402

KINDS = {"matmul": ("mkldnn", "linear", "addmm", "mm", "matmul"), "attention": ("attention",)}


def kind(op: str) -> str:
    name = op.removeprefix("aten::").removeprefix("mkldnn::")
    return next((k for k, words in KINDS.items() if any(w in name for w in words)), "elementwise and the rest")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="an installed model's name or an HF directory")
    ap.add_argument("--tokens", type=int, default=1024, help="the prompt's length")
    ap.add_argument("--head", type=int, default=0, help="tokens every prompt begins with (cached after the first)")
    ap.add_argument("--repeats", type=int, default=3, help="prefills timed before the profiled one")
    ap.add_argument("--top", type=int, default=15, help="ops in the table")
    ap.add_argument("--heap", choices=("serving", "glibc", "mmap-1mb"), default="serving", help="glibc's heap settings")
    ap.add_argument("--kernels", choices=("best", "avx512f", "avx2", "torch"), default="best",
                    help="the instruction set rl/_kernels.c runs on, or torch's ops")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefill.json"))
    args = ap.parse_args()
    if args.kernels != "best":
        if _native is None:
            ap.error("rl/_kernels.c was not built: only --kernels best (torch's ops) runs")
        try:
            _native.use(None if args.kernels == "torch" else args.kernels)
        except ValueError as e:
            ap.error(str(e))

    load = load_average()
    if args.heap == "serving":
        serving_heap()
    elif args.heap == "mmap-1mb":
        ctypes.CDLL(None).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    engine = HFEngine(load_hf(resolve(args.model)), thread=False)
    vocab = engine.vocab_size

    def prompt(i: int) -> list[int]:  # after the head they differ: nothing more is found in the prefix cache
        head = [(j * 31) % (vocab - 1000) + 500 for j in range(args.head)]
        return head + [(i * 7919 + j * 104729) % (vocab - 1000) + 500 for j in range(args.tokens - args.head)]

    times, faults = [], []
    with torch.inference_mode():
        for i in range(args.repeats + 1):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t = time.perf_counter()
            engine._prefill([prompt(i)])
            times.append(time.perf_counter() - t)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine._prefill([prompt(args.repeats + 1)])
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops) or 1
    shares: dict[str, float] = {}
    for e in ops:
        shares[kind(e.key)] = shares.get(kind(e.key), 0.0) + e.self_cpu_time_total / total
    print(f"prefill of {args.tokens} tokens (a {args.head}-token head), {torch.get_num_threads()} threads: "
          f"first {times[0]:.3f} s, then median {statistics.median(times[1:]):.3f} s; "
          f"page faults a prefill {statistics.median(faults[1:]):,.0f} ({args.heap} heap); kernels {kernels()}")
    print(f"{'op':<44}{'calls':>8}{'self ms':>10}{'share':>8}")
    for e in ops[: args.top]:
        print(f"{e.key[:43]:<44}{e.count:>8}{e.self_cpu_time_total / 1e3:>10.1f}{e.self_cpu_time_total / total:>8.1%}")
    print("by kind: " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])))
    save(args.out, {"tokens": args.tokens, "head": args.head, "threads": torch.get_num_threads(), "first_s": times[0],
                    "median_s": statistics.median(times[1:]), "page_faults": statistics.median(faults[1:]),
                    "heap": args.heap, "kernels": kernels(), "shares": shares,
                    "top": [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3}
                            for e in ops[: args.top]]}, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
