"""Data-parallel training across processes: torchrun, FSDP2 and torch.distributed.checkpoint.

    torchrun --nproc_per_node 2 -m rl.train examples/reverse_text/config.toml [--section.field VALUE ...]

The same config runs in one process (`prime-agent rl train CONFIG`: no process group, nothing here
changes a thing) or in N, on one machine or many (`--nnodes M --rdzv_backend c10d --rdzv_endpoint
HOST:PORT`; train.out on a filesystem they share). With N, every rank holds a shard of the model,
the byte policy or a Hugging Face one, a LoRA adapter's included (`fully_shard` on each block, then
the root); gloo on CPU, NCCL on GPU with bf16 parameters in the forward and fp32 gradient reduction
(set up, never run: no GPU was at hand; train_step moves its micro-batches to the model's device).
Rank 0 alone samples: it runs the policy server and the orchestrator, splits each step's batch into
N shares of about equal token count and scatters them. Every rank's loss divides by the loss tokens
of the whole batch (all-reduced), and gradients are summed across ranks, not averaged, so N processes
take the same step as one process on the same batch, up to the order of float additions. After the
step rank 0 gathers the full weights for the sampler; only rank 0 logs and writes metrics. A
checkpoint is what one process writes (the byte policy's weights, a model directory, a PEFT adapter)
with a `dcp/` folder beside it: the trained parameters' and the optimizer's shards, written by every
rank, loadable at any N.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from rl.policy.checkpoint import MARKER, save_checkpoint
from rl.sample import Batch, Sample
from rl.packing import MicroBatch

T = TypeVar("T")


@contextmanager
def process_group():
    """A process group for the ranks torchrun started (WORLD_SIZE > 1), torn down on exit; nothing
    with one process. NCCL with one GPU per rank where there are GPUs, else gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        yield
        dist.barrier()  # every rank done before any tears down: gloo can abort on a peer already gone
    finally:
        dist.destroy_process_group()


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def on_main(fn: Callable[[], T]) -> T:
    """fn() on rank 0 while the others wait; every rank gets its result."""
    if world() == 1:
        return fn()
    box = [fn() if rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# --- the model -------------------------------------------------------------------------------------


def shard(model: torch.nn.Module, shard_frozen: bool = False) -> torch.nn.Module:
    """FSDP2: each block (`model.blocks`), then the root (embeddings, final norm), sharded across the
    ranks; on GPU the forward and backward run on bf16 copies of the fp32 weights, gradients reduced in
    fp32. Gradients are summed, not averaged: the loss is already normalised by the whole batch's tokens.
    Frozen weights (a LoRA run's base) stay whole on every rank, never all-gathered, unless `shard_frozen`
    (train.shard_frozen): then FSDP2 gathers them for each forward and again for the backward."""
    if world() == 1:
        return model
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    precision = MixedPrecisionPolicy()
    if torch.cuda.is_available():
        model.to(torch.device("cuda", torch.cuda.current_device()))
        precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    frozen = set() if shard_frozen else {p for p in model.parameters() if not p.requires_grad}
    for block in model.blocks:
        fully_shard(block, mp_policy=precision, ignored_params=frozen)
    fully_shard(model, mp_policy=precision, ignored_params=frozen)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # gloo has no pre-scaled sum
    return model


def gathered(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole state_dict on rank 0, on the CPU ({} on the other ranks); every rank must call
    it. `model.weights(state)` makes it what a sampler loads, `model.save(folder, state=state)` a checkpoint.
    Frozen parameters (a LoRA run's base) never change: they are gathered on the first call and kept on
    rank 0, and later calls gather only the trained ones (on SmolLM2 with LoRA over two processes, gathering
    the whole model took 14% of each step's training: bench/rl_hf.py)."""
    if world() == 1:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    kept = getattr(model, "_gathered_frozen", None)
    if kept is None:  # the first call: everything (fresh CPU tensors: cpu_offload), the frozen part kept
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        frozen = {k for k, v in model.state_dict(keep_vars=True).items()  # a tied head: under both names
                  if isinstance(v, torch.nn.Parameter) and not v.requires_grad}
        model._gathered_frozen = {k: v for k, v in state.items() if k in frozen}
        return state
    trained = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                   ignore_frozen_params=True))
    return {**kept, **trained} if rank() == 0 else trained


# --- the batch -------------------------------------------------------------------------------------


def loss_tokens(samples: list[Sample]) -> int:
    """The loss-mask tokens of these samples: what train_step's loss divides by."""
    return sum(sum(s.completion_mask) if s.completion_mask is not None else len(s.completion_ids) for s in samples)


def split(samples: list[Sample], n: int) -> list[list[Sample]]:
    """n shares of about equal token count (prompt and completion: what a forward pass costs): longest
    first, each to the lightest share so far. Deterministic."""
    shares: list[list[Sample]] = [[] for _ in range(n)]
    load = [0] * n
    for s in sorted(samples, key=lambda s: -(len(s.prompt_ids) + len(s.completion_ids))):
        i = load.index(min(load))
        shares[i].append(s)
        load[i] += len(s.prompt_ids) + len(s.completion_ids)
    for share in shares:
        if not share and samples:  # every rank must run forward and backward (FSDP's collectives):
            # one left without a sample gets a copy whose loss mask is empty, so it adds no gradient
            share.append(replace(samples[0], completion_mask=[False] * len(samples[0].completion_ids)))
    return shares


def even(micro: list[MicroBatch]) -> list[MicroBatch]:
    """The same number of micro-batches on every rank: each forward and backward runs FSDP's
    collectives, so a rank with fewer packed rows repeats its last with nothing on the loss mask."""
    if world() == 1:
        return micro
    most = _tensor([len(micro)])
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    blank = replace(micro[-1], loss_mask=torch.zeros_like(micro[-1].loss_mask))
    return micro + [blank] * (int(most.item()) - len(micro))


def scatter(batches: Iterable[Batch] | None, start: int, stop: int) -> Iterator[tuple[Batch, Batch, int | None]]:
    """(batch, share, loss tokens) per step. Rank 0 passes the orchestrator's batches: each is split
    by token count and one share goes to each rank; the others pass None and get theirs. `batch` is
    the whole step's batch on rank 0 and the share elsewhere; loss tokens are the whole batch's
    (None with one process: train_step counts them itself)."""
    if world() == 1:
        for batch in batches:
            yield batch, batch, None
        return
    it = iter(batches) if rank() == 0 else None
    for _ in range(start, stop):
        batch = next(it) if it is not None else None
        shares = [replace(batch, samples=s, rewards=[]) for s in split(batch.samples, world())] if batch else None
        out: list[Batch | None] = [None]
        dist.scatter_object_list(out, shares, src=0)
        share = out[0]
        total = _tensor([loss_tokens(share.samples)])  # a padding sample counts nothing
        dist.all_reduce(total)
        yield batch if batch is not None else share, share, int(total.item())


def reduce_metrics(m: dict[str, float]) -> dict[str, float]:
    """One rank's train_step metrics made the whole step's: the loss and tokens summed, rates averaged
    weighted by each rank's loss tokens, the largest ratio. Ranks with nothing to train pass
    {"loss": 0.0, "tokens": 0, "trained_tokens": 0}, as they all do on the same steps."""
    if world() == 1:
        return m
    means = [k for k in ("entropy", "masked_fraction", "clipped_fraction", "mismatch_kl") if k in m]
    n = m["tokens"]
    sums = _tensor([m["loss"], float(n), float(m["trained_tokens"])] + [m[k] * n if n else 0.0 for k in means])
    dist.all_reduce(sums)
    total = max(sums[1].item(), 1.0)
    out = {**m, "loss": sums[0].item(), "tokens": int(sums[1].item()), "trained_tokens": int(sums[2].item()),
           **{k: sums[3 + i].item() / total for i, k in enumerate(means)}}
    if "max_ratio" in m:
        top = _tensor([m["max_ratio"]])
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        out["max_ratio"] = top.item()
    return out


def _tensor(values: list[float]) -> torch.Tensor:
    """Values to all-reduce, where the backend reduces: NCCL on the rank's GPU, gloo on the CPU."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    return torch.tensor(values, dtype=torch.float64, device=device)


# --- checkpoints -----------------------------------------------------------------------------------


def _trained():
    """What `dcp/` holds: the parameters that train (a LoRA run's adapter alone) and their optimizer state.
    Loading them leaves the frozen ones as they are (not strict); dcp.load fails on any that it lacks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


def save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int,
         state: dict[str, torch.Tensor]) -> None:
    """A checkpoint; every rank calls it. One process: save_checkpoint. N: every rank writes its shards
    of the trained parameters and the optimizer to `dcp/`, then rank 0 the model from the `gathered`
    `state` (what load_policy and the policy server read), the step and rng state, and the marker last."""
    if world() == 1:
        save_checkpoint(path, model, opt, step)
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = path.with_name(path.name + ".partial")
    if rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, opt, options=_trained())
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp / "dcp")
    if rank() == 0:
        model.save(tmp, state=state)
        torch.save({"step": step, "rng": torch.get_rng_state()}, tmp / "trainer.pt")
        (tmp / MARKER).write_text(str(step))
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    dist.barrier()


def load_state(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    """The optimizer state saved at `path` (the model's weights are loaded already). A distributed
    checkpoint's shards load at any number of ranks; a one-process checkpoint's whole state, into
    sharded parameters too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    if (path / "dcp").is_dir():
        import torch.distributed.checkpoint as dcp

        model_state, optim_state = get_state_dict(model, opt, options=_trained())
        dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=path / "dcp", no_dist=world() == 1)
        set_state_dict(model, opt, model_state_dict=model_state, optim_state_dict=optim_state, options=_trained())
    elif world() == 1:
        opt.load_state_dict(state["optimizer"])
    else:  # keyed by the index of each parameter the optimizer updates; the sharded form is keyed by name
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        saved = state["optimizer"]
        whole = {"state": {names[i]: v for i, v in saved["state"].items()},
                 "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]]}
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, opt, whole, options=StateDictOptions(full_state_dict=True))
