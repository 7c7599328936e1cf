"""RL training: an SFT warm start, then policy-gradient steps on rollouts from the policy server.

    prime-agent rl train examples/reverse_text/config.toml [--loss.name icepop --train.lr 3e-4]
    prime-agent rl sft   examples/reverse_text/config.toml

One process on the CPU: the policy server runs in a thread beside the trainer, sampling with its
own copy of the weights, which the trainer replaces after every step (a hot reload).

N processes, the same config (rl/dist.py: FSDP2, gloo on CPU, NCCL on GPU; rank 0 samples and logs),
on one machine or several (examples/cluster/):

    torchrun --nproc_per_node 2 -m rl.train examples/reverse_text/config.toml [--section.field VALUE ...]
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint HOST:PORT -m rl.train CONFIG
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import shutil
import time
from collections import deque
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from evals.stats import mean_ci, wilson
from evals.tasksets import load_taskset, select
from rl import dist
from rl.config import RunConfig
from rl.envs import load as load_env
from rl.envs.harness import HarnessOrchestrator, policy_view, warm_start_system_prompt
from rl.fleet import Fleet
from rl.orchestrator import Orchestrator, rollout_seed
from rl.losses import LossConfig, LossInputs, compute
from rl.packing import MicroBatch, micro_batches
from rl.policy.checkpoint import MARKER, latest_checkpoint, load_policy, load_trainer_state, save_checkpoint
from rl.policy.policy import Policy, build_policy, token_logprobs
from rl.policy.tokenizer import ByteTokenizer
from rl.sample import Batch
from rl.serve import BackgroundServer, Engine


logger = logging.getLogger(__name__)

SAMPLED_SHARE_WARNING = 0.9
"""Below this share of the rollouts with signal becoming samples, a step warns: their signal is lost."""


class CannotResume(Exception):
    """The run directory holds a run that this configuration cannot continue exactly."""


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def evaluation_tasks(taskset: str, n: int | None, seed: int):
    """The tasks RL evaluates a checkpoint on: evaluation's own selection, so the same task set,
    seed and n mean the same tasks in `prime-agent eval`, the refiner's gate and here."""
    return select(taskset, n, seed)


# --- SFT warm start ----------------------------------------------------------------------------------

WARM_START_SEED = 10**9
"""Warm-start step s draws its tasks with seed WARM_START_SEED + s: apart from RL's (rl.orchestrator.rollout_seed)."""


def sft(cfg: RunConfig, log=print, env=None) -> Path:
    """Cross-entropy on the environment's demonstrations (`env`'s, default cfg.env's); returns the
    checkpoint directory."""
    out = Path(cfg.train.out) / "sft"
    if (done := latest_checkpoint(out)) is not None:
        log(f"sft: using {done}")
        return done
    torch.manual_seed(cfg.train.seed)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    env = env or load_env(cfg.env.name, **cfg.env.options)
    if cfg.sft.noise > 0 and not callable(getattr(env, "distractor", None)):
        raise ValueError(f"sft.noise = {cfg.sft.noise:g} shows wrong answers, and the task set {cfg.env.name!r} has none to "
                         "show (no distractor): set sft.noise = 0")
    model = build_policy(cfg.model)
    tok = tokenizer(model)
    opt = torch.optim.AdamW(trainable(model), lr=cfg.sft.lr)
    noise = random.Random(cfg.train.seed)
    # harness rollouts begin with the system prompt a session is given: the warm start shows it too
    system = warm_start_system_prompt(cfg.train, cfg.env, out) if cfg.env.harness else None
    started = time.time()
    for step in range(cfg.sft.steps):
        tasks = env.tasks(cfg.sft.batch_size, seed=WARM_START_SEED + step)
        rows, masks = [], []
        for t in tasks:
            prompt = policy_view(t, system, cfg, tok, model.context) if cfg.env.harness else tok.chat(
                ([{"role": "system", "content": t.system}] if t.system else []) + [{"role": "user", "content": t.prompt}])
            shown = env.distractor(t) if noise.random() < cfg.sft.noise else env.demonstration(t)
            answer = tok.encode(shown) + [tok.end]
            rows.append(prompt + answer)
            masks.append([0] * (len(prompt) - 1) + [1] * len(answer))
        ids, mask = pad(rows, 0), pad(masks, 0).float()  # padding: after each row, never attended to
        model.train()
        loss = -(token_logprobs(model, ids) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == cfg.sft.steps - 1:
            log(f"sft step {step:4d}  loss {loss.item():.3f}  {time.time() - started:.0f}s")
    path = out / f"step-{cfg.sft.steps}"
    save_checkpoint(path, model, None, 0)
    return path


def tokenizer(model):
    """The tokenizer the model reads: a Hugging Face model's own, else the byte tokenizer."""
    return getattr(model, "tokenizer", None) or ByteTokenizer()


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the optimizer updates: every weight, or a LoRA adapter's alone."""
    return [p for p in model.parameters() if p.requires_grad]


def kept(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (rl.dist.gathered's) as it is now, for a sampler `train.policy_lag` steps behind: a copy of what
    training changes in place, the frozen rest shared (a LoRA run's base is not copied every step: at a 64-step
    lag on SmolLM2 that was 64 copies of the model, 35 GB). With N processes all is copied: what FSDP gathers may
    sit in buffers it reuses."""
    if dist.world() > 1:
        return {k: v.detach().clone() for k, v in state.items()}
    changing = {p.untyped_storage().data_ptr() for p in trainable(model)}
    return {k: v.detach().clone() if v.untyped_storage().data_ptr() in changing else v for k, v in state.items()}


# --- one optimizer step ------------------------------------------------------------------------------


def train_step(model: Policy, opt: torch.optim.Optimizer, batch: Batch, cfg: RunConfig,
               loss_tokens: int | None = None) -> dict[str, float]:
    """Token-level loss on the batch's samples, normalised by its loss-mask tokens (or by `loss_tokens`:
    a data-parallel rank's share divides by the whole batch's); one AdamW step. With train.pack_length
    the samples are packed into micro-batches of that many tokens (rl/packing.py)."""
    model.train()
    opt.zero_grad()
    micro = dist.even(micro_batches(batch.samples, cfg.train.pack_length))
    m = backward(model, micro, cfg.train.temperature, cfg.loss, loss_tokens)
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable(model), cfg.train.max_grad_norm)
    opt.step()
    return {**m, "trained_tokens": trained_tokens(batch), "grad_norm": float(grad_norm)}


def trained_tokens(batch: Batch) -> int:
    """Every token the step's forward and backward ran over, prompt and completion (what the step's time
    buys), beside `tokens`, the loss-mask tokens alone (what the loss divides by)."""
    return sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples)


def backward(model: torch.nn.Module, micro: list[MicroBatch], temperature: float, loss: LossConfig,
             loss_tokens: int | None = None) -> dict[str, float]:
    """Forward and backward of each micro-batch in turn, the gradients adding up to those of the whole
    step: each micro-batch's summed token loss is divided by the loss-mask tokens of the whole step
    (`loss_tokens` where the step spans data-parallel ranks). Returns the step's loss, token count,
    entropy and loss metrics, as if computed in one piece."""
    tokens = sum(int(m.loss_mask.sum()) for m in micro)
    divisor = max(loss_tokens or tokens, 1)
    device = next(model.parameters()).device
    total, kept = 0.0, []
    for m in micro:
        m = m.to(device)
        mask = m.loss_mask  # log-probs of the loss tokens alone, flat
        trainer, entropy = token_logprobs(model, m.ids, temperature, entropy=True, positions=m.positions,
                                          segments=m.segments, where=mask)
        inference, advantages = m.inference[mask], m.advantages[mask]
        out = compute(LossInputs(trainer, inference, advantages, torch.ones_like(trainer, dtype=torch.bool)), loss)
        part = out.per_token.sum() / divisor
        part.backward()
        total += part.item()
        kept.append((trainer.detach(), inference, advantages, entropy))
    trainer, inference, advantages, entropy = (torch.cat(t) for t in zip(*kept))
    # the metrics over every loss token of the step at once (they are means and maxima over it)
    metrics = compute(LossInputs(trainer, inference, advantages, torch.ones_like(trainer, dtype=torch.bool)), loss).metrics
    return {"loss": total, "tokens": tokens, "entropy": float(entropy.mean()) if tokens else 0.0, **metrics}


# --- the run -------------------------------------------------------------------------------------------


def train(cfg: RunConfig, log=print, progress: bool = True, orchestrator=None) -> list[dict]:
    """RL steps; returns the metrics of each. `orchestrator(servers)`, if given, makes what samples the
    batches from the rollout servers (an rl.fleet.Fleet: the built-in policy server, or train.rollout_urls;
    default: from the config). Under torchrun every rank
    runs this (rl/dist.py): rank 0 samples, logs, writes metrics and returns them; the other ranks
    train their shares and return []."""
    main = dist.rank() == 0
    if not main:
        log, progress = (lambda *_: None), False
    out = Path(cfg.train.out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    env = load_env(cfg.env.name, **cfg.env.options)

    # --- weights: resume, else a named start, else the SFT warm start, else fresh
    resume = latest_checkpoint(out / "checkpoints")
    if resume is not None and cfg.train.policy_lag:
        raise CannotResume(f"{out} holds a run with train.policy_lag: the weights the sampler is behind on are not "
                         "checkpointed, so resuming would not continue it exactly; start it in a new train.out")
    start, state = 0, None
    if resume is not None:
        model, state = load_policy(resume), load_trainer_state(resume)
        start = state["step"]
        log(f"resuming from {resume} (step {start})")
    elif cfg.train.init_from:
        model = load_policy(latest_checkpoint(Path(cfg.train.init_from)) or Path(cfg.train.init_from))
    elif cfg.sft.steps > 0:
        model = load_policy(dist.on_main(lambda: sft(cfg, log)))  # the other ranks wait for rank 0's
    else:
        torch.manual_seed(cfg.train.seed)
        model = build_policy(cfg.model)
    # rank 0's sampler, with its own copy of the weights, unless external servers sample (rollout_urls);
    # the agent's prompt is far longer than a byte policy's context: keep its tail
    external = cfg.train.rollout_servers()
    engine = sampler_engine(model, start, cfg) if main and not external else None
    vocab_size = int(model.output_weight.shape[0])  # the ids this policy can train on
    model = dist.shard(model, cfg.train.shard_frozen)
    # fused: one kernel per weight, not a dozen (TRL's default too)
    opt = torch.optim.AdamW(trainable(model), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, fused=True)
    if state is not None:
        dist.load_state(resume, model, opt, state)
        torch.set_rng_state(state["rng"])

    metrics_path = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()] if resume and metrics_path.exists() \
        else []
    # a step's row, and an evaluation's of the weights after `step` steps (the last one's kept on resume)
    rows = [r for r in rows if r["step"] < start or (r.get("kind") == "eval" and r["step"] <= start)]
    history, evals = [r for r in rows if r.get("kind") != "eval"], [r for r in rows if r.get("kind") == "eval"]
    if main:
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluating = evaluation(cfg, env) if main and cfg.eval.every else None
    if evaluating and (warning := not_held_out(cfg)):
        logger.warning(warning)
        log(f"WARNING {warning}")

    lagged: deque = deque()
    with BackgroundServer(engine) if engine else nullcontext() as base_url, \
            _Progress(cfg.train.steps, start, progress) if main else nullcontext() as bar:
        sampler = servers = None  # rank 0 samples; with N processes each rank trains on its share of every batch
        if main:
            urls, reload_urls = zip(*external) if external else ([base_url], None)
            servers = Fleet(list(urls), reload_urls and list(reload_urls), version=start,
                            timeout=cfg.train.request_timeout, model=cfg.train.rollout_model)
        if main and orchestrator is not None:
            sampler = orchestrator(servers)
        elif main and cfg.env.harness:
            sampler = HarnessOrchestrator(servers.url, env, cfg.train, cfg.env, out, vocab_size=vocab_size,
                                          rollouts=cfg.rollouts)
        elif main:
            sampler = Orchestrator(servers, env, cfg.train, tokenizer=tokenizer(model))
        publish = partial(_reload, out / "weights", model, servers) if external else \
            (lambda state, version: engine.update(model.weights(state), version))
        if external:  # an external server may hold other weights (a resumed run's are newer)
            state = dist.gathered(model)
            if main:
                publish(state, start)
        if evaluating and start == 0:  # where the run begins
            evals.append(evaluate(sampler, *evaluating, cfg, 0, out, metrics_path, bar))
        batches = sampler.batches(start, cfg.train.steps) if main else None
        waited = time.time()
        for batch, share, loss_tokens in dist.scatter(batches, start, cfg.train.steps):
            step = batch.step
            t = time.time()
            m = train_step(model, opt, share, cfg, loss_tokens) if share.samples else \
                {"loss": 0.0, "tokens": 0, "trained_tokens": 0}
            m = dist.reduce_metrics(m)
            state = dist.gathered(model)  # the whole model on rank 0, for the sampler and checkpoints
            if main:
                if cfg.train.policy_lag:  # the sampler gets these weights policy_lag steps from now
                    lagged.append((kept(model, state), step + 1))
                    if len(lagged) > cfg.train.policy_lag:
                        publish(*lagged.popleft())
                else:
                    publish(state, step + 1)  # the next rollouts sample the new policy
                m.update(step=step, reward_mean=_mean(batch.rewards), off_policy_max=max(
                    (step - s.version for s in batch.samples), default=0), samples=len(batch.samples), **batch.counts,
                    seconds=time.time() - t, sampling_seconds=t - waited)
                m["tokens_per_s"] = m["trained_tokens"] / max(m["seconds"], 1e-9)
                m["sampled_share"] = sampled_share(batch.counts)
                if external:  # servers that left the rotation while this step sampled, or on its reload
                    m["servers_live"], m["servers_lost"] = len(servers.live), servers.take_failures()
                _check_finite(m)
                history.append(m)
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(m) + "\n")
                bar.line(console_line(m))
                for warning in filter(None, [lost_signal(m), *map(lost_server, m.get("servers_lost", []))]):
                    logger.warning(warning)
                    bar.warn(warning)
                if evaluating and ((step + 1) % cfg.eval.every == 0 or step + 1 == cfg.train.steps):
                    evals.append(evaluate(sampler, *evaluating, cfg, step + 1, out, metrics_path, bar))
            if (step + 1) % cfg.train.checkpoint_every == 0 or step + 1 == cfg.train.steps:
                dist.save(out / "checkpoints" / f"step-{step + 1}", model, opt, step + 1, state)
            waited = time.time()
    if engine is not None and hasattr(engine, "stop"):  # the HF sampler's thread: not mid-step at exit
        engine.stop()
    if not main:
        return []
    plot(history, out / "reward.png", evals)
    return history


# --- evaluation during training ------------------------------------------------------------------------


def evaluation(cfg: RunConfig, env) -> tuple:
    """What [eval] evaluates on: the task set that scores (the training environment unless eval.taskset names
    one) and its fixed selection, the one `prime-agent eval` makes for that set, -n and --seed."""
    e = cfg.eval
    taskset = load_taskset(e.taskset) if e.taskset else env
    if not callable(getattr(taskset, "reward", None)):
        raise ValueError(f"eval.taskset {e.taskset!r} judges agent sessions only (no reward for a bare answer): "
                         "evaluate it with `prime-agent eval`")
    tasks = evaluation_tasks(e.taskset, e.tasks, e.seed) if e.taskset else env.tasks(e.tasks, seed=e.seed)
    return taskset, tasks


def not_held_out(cfg: RunConfig) -> str | None:
    """The warning of an evaluation that selects a training step's tasks: the training environment's under the
    seed that step deals its first round with (rl.orchestrator.rollout_seed), whose first train.batch_size tasks
    are then the step's. Tasks alike in content under different seeds (a word list's words) are not caught."""
    e, t = cfg.eval, cfg.train
    if e.taskset not in (None, cfg.env.name):
        return None
    first = rollout_seed(t.seed, 0)
    if not first <= e.seed < first + t.steps:
        return None
    return (f"eval.seed {e.seed} selects the tasks training step {e.seed - first} trains on: the evaluation is not on "
            f"held-out tasks; choose a seed no step deals with (steps deal {first}..{first + t.steps - 1})")


def evaluate(sampler: Orchestrator, taskset, tasks: list, cfg: RunConfig, step: int, out: Path, metrics_path: Path,
             bar) -> dict:
    """The weights the rollout servers hold after `step` steps, on the evaluation's tasks: an eval row appended to
    metrics.jsonl (with the oldest policy version that answered) and printed; every task's rewards in results.json
    (written whole, then moved in place)."""
    e, started = cfg.eval, time.time()
    groups = sampler.rollouts(tasks, e.rollouts, rollout_seed(e.seed, 0, "eval"))  # the same seed every time
    scored = [[r if isinstance(r, str) else taskset.reward(t, r.text) for r in g] for t, g in zip(tasks, groups)]
    rewards = [r for group in scored for r in group if not isinstance(r, str)]
    versions = [r.version for g in groups for r in g if not isinstance(r, str)]
    reward_ci, solve_rate_ci = intervals(scored)
    row = {"kind": "eval", "step": step, "policy_version": min(versions, default=None),
           "taskset": e.taskset or cfg.env.name, "tasks": len(tasks),
           "rollouts": len(tasks) * e.rollouts, "reward_mean": _mean(rewards), "reward_ci": reward_ci,
           "solve_rate": _mean([float(r >= 1.0) for r in rewards]), "solve_rate_ci": solve_rate_ci,
           "errored": sum(r == "errored" for g in scored for r in g),
           "timed_out": sum(r == "timed_out" for g in scored for r in g), "seconds": time.time() - started}
    results = {**row, "results": [{"task_id": t.id, "rewards": group} for t, group in zip(tasks, scored)]}
    tmp = out / "results.json.partial"
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(out / "results.json")
    with open(metrics_path, "a") as f:
        f.write(json.dumps(row) + "\n")
    bar.note(f"eval {step:4d}  reward {row['reward_mean']:.3f} {_interval(reward_ci, '.3f')}  solved "
             f"{row['solve_rate']:.0%} {_interval(solve_rate_ci, '.0%')}  {row['tasks']} tasks x {e.rollouts}  "
             f"({row['errored'] + row['timed_out']} failed)  {row['seconds']:.1f}s")
    return row


def intervals(scored: list[list[float | str]]) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """95% intervals of an evaluation's mean reward and solve rate (reward 1), from each task's scored rollouts
    (a string: one excluded). The unit is the task, since a task's rollouts are not independent draws: the
    normal approximation over the tasks' mean rewards (evals.stats.mean_ci); for the solve rate, the normal
    approximation over the tasks' solved shares, or Wilson's interval over the tasks where that collapses to a
    point (every task solved every time, or none ever) or every task has one scored rollout. None when nothing
    was scored."""
    groups = [[r for r in g if not isinstance(r, str)] for g in scored]
    groups = [g for g in groups if g]
    if not groups:
        return None, None
    shares = [sum(r >= 1.0 for r in g) / len(g) for g in groups]
    reward_ci = mean_ci([sum(g) / len(g) for g in groups])
    if all(len(g) == 1 for g in groups) or set(shares) <= {0.0} or set(shares) <= {1.0}:
        solve_ci = wilson(int(sum(shares)), len(groups))
    else:
        solve_ci = mean_ci(shares)
    return reward_ci, solve_ci


def _interval(ci: tuple[float, float] | None, spec: str) -> str:
    return "(-)" if ci is None else f"({ci[0]:{spec}}-{ci[1]:{spec}})"


def sampled_share(counts: dict[str, int]) -> float | None:
    """The share of a step's rollouts with signal (an advantage) that became samples; None when none had
    signal (every group's rewards alike, or nothing judged)."""
    signal = counts.get("signal_rollouts", 0)
    return (signal - counts.get("unsampled_rollouts", 0)) / signal if signal else None


def console_line(m: dict) -> str:
    """A step's line: the reward, the loss, and what trained: every token of its samples a second (a step that
    trained nothing says so, not 0 tok/s)."""
    share = m.get("sampled_share")
    trained = f"{m['tokens_per_s']:,.0f} tok/s" if m["tokens"] else "nothing trained"
    line = (f"step {m['step']:4d}  reward {m['reward_mean']:.3f}  loss {m['loss']:+.4f}  "
            f"mismatch_kl {m.get('mismatch_kl', 0):.2e}  masked {m.get('masked_fraction', 0):.3f}  "
            f"off_policy {m['off_policy_max']}  samples {m['samples']} "
            f"({'-' if share is None else f'{share:.0%}'} of rollouts with signal)  {trained}")
    if "useful_groups" in m:  # the batch: groups with signal, and what it took to find them
        line += f"  groups {m['useful_groups']}/{m['groups']} with signal"
        rounds = m["extra_rounds"]
        line += f" (+{rounds} round{'s' if rounds > 1 else ''})" if rounds else ""
    if "tasks_measured" in m:
        kept = m["tasks_measured"] - m["tasks_too_easy"] - m["tasks_too_hard"] - m["tasks_unmeasured"]
        line += (f"  tasks in range {kept}/{m['tasks_measured']} ({m['tasks_too_easy']} too easy, "
                 f"{m['tasks_too_hard']} too hard)")
    if "servers_live" in m:
        line += f"  servers live {m['servers_live']}"
    return line


def lost_server(failure: str) -> str:
    """The warning of a rollout server that left the rotation: training goes on with the others."""
    return f"rollout server out of rotation, training goes on with the others: {failure}"


def lost_signal(m: dict) -> str | None:
    """The warning of a step where under SAMPLED_SHARE_WARNING of the rollouts with signal became samples."""
    share = m.get("sampled_share")
    if share is None or share >= SAMPLED_SHARE_WARNING:
        return None
    signal, lost = m["signal_rollouts"], m["unsampled_rollouts"]
    return (f"step {m['step']}: only {signal - lost} of {signal} rollouts with signal became samples ({share:.0%}); "
            f"{lost} trained nothing (replies without logprobs: {m.get('replies_without_logprobs', 0)}, "
            f"not the policy's tokens: {m.get('foreign_replies', 0)})")


def sampler_engine(model: torch.nn.Module, version: int, cfg: RunConfig):
    """The built-in policy server's sampler, on a copy of the model's weights (a LoRA adapter merged in)."""
    if not cfg.model.hf:
        return Engine(copy.deepcopy(model), version=version, truncate=cfg.env.harness)
    from rl.engine import HFEngine

    return HFEngine(model.plain(), version=version, truncate=cfg.env.harness,
                    dtype=getattr(torch, cfg.train.sampler_dtype))


def _reload(folder: Path, model: torch.nn.Module, servers: Fleet, state: dict[str, torch.Tensor],
            version: int) -> None:
    """New weights (the model's `state`, rl.dist.gathered's) for the external rollout servers
    (train.rollout_urls): written once where they can read them (a LoRA run's adapter alone), loaded by every
    live server at once before the next request (one that fails leaves the rotation: rl/fleet.py); the
    previous version's folder is then removed."""
    path = folder / f"step-{version}"
    if isinstance(model, Policy):
        model.save(path, state=state)
    else:
        model.save(path, tied_head=True, state=state)
    (path / MARKER).write_text(str(version))
    servers.reload(path, version)
    for old in folder.glob("step-*"):
        if old != path:
            shutil.rmtree(old)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _check_finite(m: dict) -> None:
    bad = [k for k, v in m.items() if isinstance(v, float) and not math.isfinite(v) and k != "reward_mean"]
    if bad:
        raise FloatingPointError(f"step {m['step']}: non-finite {', '.join(bad)}")


def plot(history: list[dict], path: Path, evals: list[dict] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([h["step"] for h in history], [h["reward_mean"] for h in history], label="training rollouts")
    if evals:
        means = [r["reward_mean"] for r in evals]  # a row from before the intervals has none: a bar of 0
        cis = [r.get("reward_ci") or (m, m) for r, m in zip(evals, means)]
        # the interval is over task means, the mean over rollouts: with rollouts excluded they may part slightly
        below = [max(0.0, m - lo) for m, (lo, _) in zip(means, cis)]
        above = [max(0.0, hi - m) for m, (_, hi) in zip(means, cis)]
        ax.errorbar([r["step"] for r in evals], means, yerr=[below, above], fmt="o-", capsize=3,
                    label="evaluation (95% interval)")
        ax.legend(loc="lower right")
    ax.set_xlabel("step")
    ax.set_ylabel("reward mean")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class _Progress:
    """A rich progress bar with a console line per step (or plain lines when off)."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.total, self.start, self.enabled = total, start, enabled

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, TimeRemainingColumn

            self.progress = Progress("[progress.description]{task.description}", BarColumn(), "{task.completed}/{task.total}",
                                     TimeRemainingColumn())
            self.progress.start()
            self.task = self.progress.add_task("training", total=self.total, completed=self.start)
        return self

    def line(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text, soft_wrap=True)
            self.progress.advance(self.task)
        else:
            print(text, flush=True)

    def note(self, text: str) -> None:
        """A line on the console that is not a step's (the bar does not advance)."""
        if self.enabled:
            self.progress.console.print(text, soft_wrap=True, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        """A warning on the console, in bold red (the step's line is already printed)."""
        if self.enabled:
            self.progress.console.print(f"WARNING {text}", style="bold red", soft_wrap=True, markup=False,
                                        highlight=False)
        else:
            print(f"WARNING {text}", flush=True)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()


def main(argv: list[str] | None = None) -> int:
    """`torchrun --nproc_per_node N -m rl.train CONFIG [--section.field VALUE ...]`: the run on N processes
    (one process: `python -m rl.train CONFIG`, the same as `prime-agent rl train CONFIG`)."""
    import sys

    from rl.config import load

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0].startswith("-"):
        print("usage: torchrun --nproc_per_node N -m rl.train CONFIG [--section.field VALUE ...]", file=sys.stderr)
        return 2
    try:
        cfg = load(args[0], args[1:])
        with dist.process_group():
            train(cfg)
    except (ValueError, OSError, CannotResume) as e:
        print(f"rl.train: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
