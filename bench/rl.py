"""RL benchmark: prints a table and writes bench/results/rl.json.

    .venv/bin/python bench/rl.py

Trainer tokens/s (forward, backward and AdamW step on batches of the example's shape), sampler
tokens/s with the KV cache at batch 1 and 16, and each loss's time per million tokens, for the
policy in examples/reverse_text/config.toml.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import load_average, save  # noqa: E402
from rl.config import load  # noqa: E402
from rl.losses import LOSSES, LossInputs, compute  # noqa: E402
from rl.policy.policy import Policy, token_logprobs  # noqa: E402
from rl.policy.sampler import generate  # noqa: E402
from rl.policy.tokenizer import ByteTokenizer  # noqa: E402


def trainer_tokens_per_s(model: Policy, batch: int, length: int, steps: int = 10) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 256, (batch, length))
    model.train()
    for i in range(steps + 2):
        if i == 2:
            t = time.perf_counter()
        loss = -token_logprobs(model, ids).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return batch * length * steps / (time.perf_counter() - t)


def sampler_tokens_per_s(model: Policy, batch: int, new_tokens: int) -> float:
    tok = ByteTokenizer()
    prompts = [tok.chat([{"role": "user", "content": f"prompt number {i}"}]) for i in range(batch)]
    generate(model, prompts, max_tokens=4)  # warm up
    t = time.perf_counter()
    out = generate(model, prompts, max_tokens=new_tokens, stop_ids=())
    return sum(len(o.tokens) for o in out) / (time.perf_counter() - t)


def loss_seconds_per_million(config, n: int = 1_000_000) -> float:
    g = torch.Generator().manual_seed(0)
    lq = -torch.rand(n, generator=g) * 3
    lp = (lq + torch.randn(n, generator=g) * 0.1).requires_grad_()
    adv, mask = torch.randn(n, generator=g), torch.rand(n, generator=g) > 0.1
    t = time.perf_counter()
    for _ in range(3):
        out = compute(LossInputs(lp, lq, adv, mask), config)
        out.per_token.sum().backward()
    return (time.perf_counter() - t) / 3


def main() -> None:
    started = load_average()
    cfg = load(str(ROOT / "examples" / "reverse_text" / "config.toml"), [])
    torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(0)
    model = Policy(cfg.model)
    figures = {
        "params": model.num_params(),
        "trainer_tokens_per_s": trainer_tokens_per_s(model, batch=128, length=32),
        "sampler_tokens_per_s_batch1": sampler_tokens_per_s(model, 1, 40),
        "sampler_tokens_per_s_batch16": sampler_tokens_per_s(model, 16, 40),
        **{f"loss_{c.name}_s_per_1M_tokens": loss_seconds_per_million(c) for c in (config() for config in LOSSES)},
    }
    for key, value in figures.items():
        print(f"{key:<36} {value:>12,.3f}" if isinstance(value, float) else f"{key:<36} {value:>12,}")
    save(ROOT / "bench" / "results" / "rl.json", {"figures": figures, "threads": cfg.train.threads}, started)


if __name__ == "__main__":
    main()
