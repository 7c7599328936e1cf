"""Chunked vs plain log-probs at a 32k vocabulary: peak memory and time of forward + backward.
Prints a table and writes bench/results/logprobs.json.

    .venv/bin/python bench/logprobs.py

Two cases: the output head alone (hidden states [tokens, d] and a [vocab, d] weight, the part
chunking changes) and a whole step of `token_logprobs` through a small byte-policy transformer.
Each (case, path) runs in a fresh process, so one cannot inherit another's memory, and is measured
two ways:
- `peak_alloc_mb`: the most tensor memory alive at once during forward + backward, above what was
  alive before it: torch's profiler (profile_memory) records every allocation and free of the CPU
  allocator, and the running sum of their sizes peaks there. Exact for tensors; blind to memory
  that is not a tensor (oneDNN scratch, Python objects).
- `peak_rss_mb`: the rise of the process's peak resident set (getrusage ru_maxrss) over one
  forward + backward, measured before anything else ran it: whole-process and physical, so it also
  counts allocator slack, but never tensors that were allocated and not touched.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save
from rl.logprobs import chunked_logprobs, plain_logprobs
from rl.policy.policy import Policy, PolicyConfig, token_logprobs

VOCAB = 32_000
CASES = {
    "head": {"tokens": 4096, "d_model": 512},
    "policy": {"batch": 4, "length": 1024, "d_model": 256, "n_layer": 2, "n_head": 4},
}


def make(case: str, path: str):
    """A closure running one forward + backward of `case` by `path` ("plain" | "chunked")."""
    torch.manual_seed(0)
    c = CASES[case]
    if case == "head":
        hidden = torch.randn(c["tokens"], c["d_model"], requires_grad=True)
        weight = (torch.randn(VOCAB, c["d_model"]) * 0.02).requires_grad_()
        targets = torch.randint(0, VOCAB, (c["tokens"],))
        fn = plain_logprobs if path == "plain" else chunked_logprobs

        def step() -> None:
            hidden.grad = weight.grad = None
            fn(hidden, weight, targets)[0].sum().backward()

        return step, c["tokens"]
    model = Policy(PolicyConfig(d_model=c["d_model"], n_layer=c["n_layer"], n_head=c["n_head"], max_seq=c["length"],
                                vocab_size=VOCAB))
    ids = torch.randint(0, VOCAB, (c["batch"], c["length"] + 1))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        token_logprobs(model, ids, plain=path == "plain").sum().backward()

    return step, c["batch"] * c["length"]


def peak_allocated(step) -> int:
    """Most bytes of tensors alive at once during `step`, above those alive before it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        events = json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"]
    live = peak = 0
    for e in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        live += e["args"]["Bytes"]
        peak = max(peak, live)
    return peak


def measure(case: str, path: str) -> dict:
    """In this process, which must be fresh: peak RSS first (nothing has run the step yet)."""
    torch.set_num_threads(2)
    step, tokens = make(case, path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024  # KiB on Linux
    alloc = peak_allocated(step)
    t = time.perf_counter()
    for _ in range(3):
        step()
    seconds = (time.perf_counter() - t) / 3
    return {"case": case, "path": path, "tokens": tokens, "peak_alloc_mb": alloc / 2**20, "peak_rss_mb": rss / 2**20,
            "seconds": seconds, "tokens_per_s": tokens / seconds}


def main() -> None:
    load = load_average()
    rows = []
    for case in CASES:
        for path in ("plain", "chunked"):
            out = subprocess.run([sys.executable, __file__, "--one", case, path], capture_output=True, text=True,
                                 check=True)
            rows.append(json.loads(out.stdout.splitlines()[-1]))
    print(f"vocabulary {VOCAB:,}; logits of one token row: {VOCAB * 4 / 1024:.0f} KiB in fp32")
    print(f"{'case':<8} {'path':<8} {'tokens':>7} {'peak alloc MB':>14} {'peak RSS MB':>12} {'s/step':>7} {'tok/s':>9}")
    for r in rows:
        print(f"{r['case']:<8} {r['path']:<8} {r['tokens']:>7,} {r['peak_alloc_mb']:>14,.1f} {r['peak_rss_mb']:>12,.1f} "
              f"{r['seconds']:>7.3f} {r['tokens_per_s']:>9,.0f}")
    ratios = {}
    for case in CASES:
        plain, chunked = (next(r for r in rows if r["case"] == case and r["path"] == p) for p in ("plain", "chunked"))
        ratios[case] = plain["peak_alloc_mb"] / chunked["peak_alloc_mb"]
        print(f"{case}: chunked peak tensor memory is {ratios[case]:.1f}x lower")
    save(ROOT / "bench" / "results" / "logprobs.json",
         {"vocab": VOCAB, "cases": CASES, "rows": rows, "peak_alloc_ratio": ratios, "threads": 2}, load)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(measure(sys.argv[2], sys.argv[3])))
    else:
        main()
