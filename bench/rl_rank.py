"""One process of a bench/rl_hf.py training run, alone or under torchrun: rl.train's run, each step's
training timed on this rank and written to OUT/timing/rank-R.json.

    python -m torch.distributed.run --standalone --nproc_per_node 2 bench/rl_rank.py CONFIG [--a.b V ...] --train.out OUT

A step's training is its optimizer step (forward, backward, AdamW: rl.train.train_step), the metrics'
all-reduce and the gather of the whole model that rank 0 hands its sampler (rl.dist.gathered); sampling,
and the batch's scatter while rank 0 samples, are outside it. Its communication is the time this rank's
thread spends in torch.distributed's collectives (FSDP2's all-gathers and reduce-scatters, ours) and
waiting on their results, counted once where they nest; the weights' gather is kept apart.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as tdist

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rl import dist, train as training  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_gather", "broadcast", "barrier")
"""torch.distributed's functions that FSDP2 and rl.dist call through the module at call time."""


class Clock:
    """Seconds in collectives while `on`; a collective inside another (or its wait) counts once."""

    def __init__(self) -> None:
        self.on, self.depth, self.seconds = False, 0, 0.0

    def counted(self, fn):
        def timed(*args, **kwargs):
            if not self.on or self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.depth -= 1
        return timed


def main(argv: list[str]) -> int:
    out = Path(json.loads(argv[argv.index("--train.out") + 1]))
    clock, steps = Clock(), []
    for name in COLLECTIVES:
        setattr(tdist, name, clock.counted(getattr(tdist, name)))
    work = torch._C._distributed_c10d.Work  # an async collective's wait (FSDP2 prefetches)
    work.wait = clock.counted(work.wait)
    real_step, real_reduce, real_gathered = training.train_step, dist.reduce_metrics, dist.gathered

    def train_step(model, opt, share, cfg, loss_tokens):
        clock.on, clock.seconds = True, 0.0
        started = time.perf_counter()
        m = real_step(model, opt, share, cfg, loss_tokens)
        steps.append({"tokens": sum(len(s.prompt_ids) + len(s.completion_ids) for s in share.samples),
                      "started": started, "optimizer_s": time.perf_counter() - started})
        return m

    def reduce_metrics(m):
        m = real_reduce(m)
        if steps and clock.on:
            steps[-1]["comm_s"] = clock.seconds
        return m

    def gathered(model):
        if not (steps and clock.on):
            return real_gathered(model)
        clock.on = False
        started = time.perf_counter()
        state = real_gathered(model)
        now = time.perf_counter()
        steps[-1].update(gather_s=now - started, train_s=now - steps[-1].pop("started"))
        return state

    training.train_step, dist.reduce_metrics, dist.gathered = train_step, reduce_metrics, gathered
    code = training.main(argv)
    (out / "timing").mkdir(parents=True, exist_ok=True)
    (out / "timing" / f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(steps))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
