"""Our IPO training step against TRL's GRPOTrainer step, on the same model and the same batch, in one
run. Prints a table and writes bench/results/rl_vs_trl.json. Needs the `bench` extra (trl).

    .venv/bin/pip install -e ".[bench]" && .venv/bin/python bench/rl_vs_trl.py [--profile]

`--profile` then prints where each trainer's step spends its time (torch.profiler, one more step each).

The model is a GPT-2-style causal LM from a config with random weights (no download), the same
initial weights on both sides, fp32 on the CPU. The batch is pre-made: prompts and completions of
fixed lengths (no padding, so both sides process exactly the same tokens), inference logprobs and
one advantage per completion. Generation and reward scoring are not timed on either side.

What is timed, per optimizer step, is what each trainer does between "a batch of scored
rollouts" and "weights updated":
- ours: `rl.train.train_step`: the log-probs of the loss positions from the final hidden states
  (chunked; here the batch fits one chunk, whose softmax the backward reuses), the IPO loss against the
  inference logprobs, backward, grad-norm clip, AdamW step. `rl.hf.HFPolicy` runs GPT-2's `gelu_new` as
  torch's fused kernel of the same function (equal up to rounding): part of our trainer, not of the model
  TRL is given, which runs as transformers builds it.
- TRL: the body of `Trainer`'s inner loop for one step: `GRPOTrainer.training_step` (its
  `compute_loss`: the log-probs through TRL's fused, chunked LM head, entropies, the clipped
  GRPO objective with `loss_type="bnpo"`, normalised by the batch's completion tokens like ours,
  against `old_per_token_logps` set to the same inference logprobs, then backward), then
  `_clip_grad_norm`, `optimizer.step()` (TRL's default AdamW), `model.zero_grad()`.
  `_prepare_inputs` is replaced by the identity on the trainer instance, so the step trains on the
  pre-made batch instead of generating one; nothing else of TRL is changed.
tokens/s counts every token of the batch (prompt + completion), the same figure on both sides. Each
step's CPU seconds (both threads) are kept beside its wall seconds, and the load average before and
after: on a shared machine the wall ratio moves with the load.
"""

from __future__ import annotations

import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save
from rl.config import RunConfig
from rl.hf import HFPolicy
from rl.sample import Batch, Sample
from rl.train import train_step

MODEL = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 512, "vocab_size": 8192,
         "bos_token_id": 0, "eos_token_id": 0}
BATCH, GROUP, PROMPT, COMPLETION = 16, 8, 64, 192
STEPS, WARMUP = 6, 1
LR = 1e-5


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(BATCH, generator=g).view(-1, GROUP)
    return {
        "prompt_ids": torch.randint(0, MODEL["vocab_size"], (BATCH, PROMPT), generator=g),
        "completion_ids": torch.randint(0, MODEL["vocab_size"], (BATCH, COMPLETION), generator=g),
        # near the random model's own logprobs (~ -log V), so IPO keeps most tokens
        "logprobs": -torch.log(torch.tensor(float(MODEL["vocab_size"]))) + 0.05 * torch.randn(BATCH, COMPLETION,
                                                                                           generator=g),
        "advantages": (rewards - rewards.mean(1, keepdim=True)).view(-1),
    }


def timed(steps: dict, rounds: int = STEPS, warmup: int = WARMUP) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU seconds per step of each trainer, their steps interleaved round by round, so that load
    from other processes on a shared machine falls on both alike."""
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in steps}
    for i in range(warmup + rounds):
        for name, step in steps.items():
            t, cpu = time.perf_counter(), time.process_time()
            step()
            if i >= warmup:
                out[name][0].append(time.perf_counter() - t)
                out[name][1].append(time.process_time() - cpu)
    return out


def profiled(steps: dict, rows: int = 15) -> None:
    """One more step of each trainer under torch.profiler: the operators that take the most CPU time."""
    from torch.profiler import ProfilerActivity, profile

    for name, step in steps.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        print(f"\n{name}: one step, by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=48))


def ours(inner: torch.nn.Module, data: dict):
    model = HFPolicy(inner)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)  # as rl.train.train makes it
    cfg = RunConfig.model_validate({"loss": {"name": "ipo"}, "train": {"lr": LR, "max_grad_norm": 1.0}})
    samples = [Sample(data["prompt_ids"][i].tolist(), data["completion_ids"][i].tolist(), data["logprobs"][i].tolist(),
                      float(data["advantages"][i]), 0.0, 0) for i in range(BATCH)]
    batch = Batch(0, samples, [0.0] * BATCH, 0)
    return lambda: train_step(model, opt, batch, cfg)


def trl(inner: torch.nn.Module, data: dict, out_dir: str):
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    # a local tokenizer so TRL loads none from the hub; the batch is token ids already
    vocab = {f"t{i}": i for i in range(MODEL["vocab_size"])}
    word = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    word.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=word, pad_token="t0", eos_token="t0")
    args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=BATCH, num_generations=GROUP,
                      max_completion_length=COMPLETION, gradient_accumulation_steps=1, learning_rate=LR,
                      max_grad_norm=1.0, beta=0.0, loss_type="bnpo", use_cpu=True, bf16=False, report_to="none",
                      logging_steps=10**9, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=inner, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["t1 t2"] * BATCH}), processing_class=tok)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1
    trainer._prepare_inputs = lambda inputs: inputs  # train on the pre-made batch; generate nothing
    model = trainer.model
    inputs = {
        "prompt_ids": data["prompt_ids"], "prompt_mask": torch.ones_like(data["prompt_ids"]),
        "completion_ids": data["completion_ids"], "completion_mask": torch.ones_like(data["completion_ids"]),
        "advantages": data["advantages"], "old_per_token_logps": data["logprobs"],
        "num_items_in_batch": torch.tensor(BATCH * COMPLETION),
    }

    def step() -> None:
        trainer.training_step(model, dict(inputs), inputs["num_items_in_batch"])
        trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        model.zero_grad()

    return step


def main() -> None:
    import trl as trl_package
    from transformers import AutoConfig, AutoModelForCausalLM

    load = load_average()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    inner = AutoModelForCausalLM.from_config(AutoConfig.for_model(**MODEL), attn_implementation="sdpa",
                                             dtype=torch.float32)
    for m in inner.modules():  # neither side trains with dropout (RL must score tokens as sampled)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    data = make_batch()
    tokens = BATCH * (PROMPT + COMPLETION)
    with tempfile.TemporaryDirectory() as tmp:
        steps = {"prime-agent ipo": ours(copy.deepcopy(inner), data), "trl grpo": trl(copy.deepcopy(inner), data, tmp)}
        times = timed(steps)
        if "--profile" in sys.argv[1:]:
            profiled(steps)
    rows = {name: {"median_s": statistics.median(t), "min_s": min(t), "tokens_per_s": tokens / statistics.median(t),
                   "cpu_median_s": statistics.median(cpu), "seconds": t, "cpu_seconds": cpu}
            for name, (t, cpu) in times.items()}
    ratio = rows["prime-agent ipo"]["tokens_per_s"] / rows["trl grpo"]["tokens_per_s"]
    ratio_min = rows["trl grpo"]["min_s"] / rows["prime-agent ipo"]["min_s"]
    ratio_cpu = rows["trl grpo"]["cpu_median_s"] / rows["prime-agent ipo"]["cpu_median_s"]
    params = sum(p.numel() for p in inner.parameters())
    print(f"model gpt2-style {params / 1e6:.1f}M params (layers {MODEL['n_layer']}, width {MODEL['n_embd']}, "
          f"vocab {MODEL['vocab_size']}); batch {BATCH} x ({PROMPT} prompt + {COMPLETION} completion) = {tokens:,} "
          f"tokens; {STEPS} timed steps each, interleaved, after {WARMUP} warm-up; 2 threads; trl {trl_package.__version__}")
    print(f"{'trainer':<18} {'median s/step':>14} {'min s/step':>11} {'tokens/s':>10} {'CPU s/step':>11}")
    for name, r in rows.items():
        print(f"{name:<18} {r['median_s']:>14.3f} {r['min_s']:>11.3f} {r['tokens_per_s']:>10,.0f} "
              f"{r['cpu_median_s']:>11.3f}")
    print(f"ratio (ours / trl, tokens/s): {ratio:.2f} at the median step, {ratio_min:.2f} at the fastest; "
          f"{ratio_cpu:.2f} in CPU seconds")
    save(ROOT / "bench" / "results" / "rl_vs_trl.json",
         {"model": MODEL, "params": params, "batch": BATCH, "group": GROUP, "prompt": PROMPT, "completion": COMPLETION,
          "tokens_per_step": tokens, "rows": rows, "ratio": ratio, "ratio_min": ratio_min, "ratio_cpu": ratio_cpu,
          "trl": trl_package.__version__, "threads": 2}, load)


if __name__ == "__main__":
    main()
