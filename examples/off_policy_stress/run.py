"""The off-policy stress study: reverse-text with the sampler forced k steps behind the trainer
(`train.policy_lag`), for each loss, in one of two settings (--setting):

- stress (the default): the lag alone, nothing dropped (max_off_policy_steps = k), sampling then training,
  at a learning rate 3x the base config's, high enough that the policy moves;
- prime-rl: prime-rl's defaults: sampling one step ahead (async_level 1), rollouts older than 8 steps
  dropped (max_off_policy_steps 8: a lag past it never trains, so it is not run), and prime-rl's learning
  rate for a LoRA adapter (1e-4, its reverse-text LoRA example; the byte policy keeps its config's own).

    .venv/bin/python examples/off_policy_stress/run.py                 # reduced grid (~5 min here)
    .venv/bin/python examples/off_policy_stress/run.py --grid full     # 4 lags x 5 losses x 3 seeds
    .venv/bin/python examples/off_policy_stress/run.py --model smollm2 # SmolLM2-135M, LoRA: 4 lags x 3 losses
    .venv/bin/python examples/off_policy_stress/run.py --model smollm2 --setting prime-rl

Every run starts from one shared SFT warm start (examples/reverse_text/config.toml's, or smollm2.toml's
with --model smollm2, cached in the output folder). Per run: the reward curve, the fraction of loss tokens
the loss masked, the mismatch KL between trainer and sampler, the largest gradient norm, and whether
anything went non-finite, kept in OUT/runs/NAME/row.json: a run already there is not run again, so an
invocation can be resumed, and N can share OUT (--part I/N each; start the others once the first has
the warm start). Writes OUT/results.json, OUT/table.md and OUT/reward_curves.png from every
run in OUT/runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rl.config import load  # noqa: E402
from rl.train import sft, train  # noqa: E402

LOSSES = {"ipo-0.2": ("ipo", 0.2), "ipo-0.3": ("ipo", 0.3), "icepop": ("icepop", None), "ppo": ("ppo", None),
          "cispo": ("cispo", None)}
GRIDS = {
    "reduced": {"lags": [0, 16], "losses": ["ipo-0.2", "icepop"], "seeds": [0], "steps": 30},
    "full": {"lags": [0, 4, 16, 64], "losses": list(LOSSES), "seeds": [0, 1, 2], "steps": 60},
    # k = 0 runs once: on-policy, with one optimizer step a batch and the sampler holding the trainer's weights,
    # the ratio is 1 and these losses take the same step (the byte study's curves are identical to 3 decimals)
    "smollm2": {"lags": [0, 4, 16, 64], "losses": ["ipo-0.2", "icepop", "ppo"], "seeds": [0], "steps": 150,
                "once_at_0": True},
}
FINAL_EVAL = ["--eval.tasks", "100", "--eval.rollouts", "4", "--eval.seed", "777777"]
"""The trainer's last weights on 100 held-out reverse-text tasks (no step nor the warm start deals from seed
777777), 4 rollouts each, sampled as training samples: `prime-agent eval`'s selection for that seed."""
MODELS = {  # the base config, and a learning rate 3x its own: high enough that the policy moves
    "byte": (ROOT / "examples" / "reverse_text" / "config.toml", 3e-3),
    "smollm2": (ROOT / "examples" / "reverse_text" / "smollm2.toml", 6e-4),
}
PRIME_RL = {"async_level": 1, "max_off_policy_steps": 8, "lr": {"byte": 1e-3, "smollm2": 1e-4}}
"""prime-rl's defaults (orchestrator max_async_level 1, max_off_policy_steps 8) and learning rate for LoRA
(examples/reverse_text/rl_lora.toml: 1e-4); the byte policy, which has no prime-rl counterpart, keeps its own."""


def setting_overrides(setting: str, lag: int) -> list[str]:
    """How a run samples in `setting`: the stress setting drops nothing, prime-rl's drops what it drops."""
    if setting == "stress":
        return ["--train.max_off_policy_steps", str(lag)]
    return ["--train.async_level", str(PRIME_RL["async_level"]),
            "--train.max_off_policy_steps", str(PRIME_RL["max_off_policy_steps"])]


def run_one(base: Path, out: Path, warm: Path, loss: str, lag: int, seed: int, steps: int, lr: float,
            extra: list[str]) -> dict:
    name, eps = LOSSES[loss]
    overrides = ["--train.init_from", str(warm), "--train.policy_lag", str(lag), "--train.steps", str(steps),
                 "--train.lr", str(lr), "--train.seed", str(seed), "--train.out", f'"{out}"',
                 "--train.checkpoint_every", "1000000", "--loss.name", name, *extra]
    if eps is not None:
        overrides += ["--loss.eps", str(eps)]
    cfg = load(str(base), overrides)
    started = time.time()
    row = {"loss": loss, "lag": lag, "seed": seed, "steps": steps, "lr": lr}
    try:
        history = train(cfg, log=lambda *_: None, progress=False)
        row["nonfinite"] = False
    except FloatingPointError as e:  # the trainer stops on NaN/inf: that is a result here
        history = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] if (out / "metrics.jsonl").exists() else []
        row["nonfinite"], row["error"] = True, str(e)
    trained = [h for h in history if h.get("tokens")]
    row.update(
        seconds=time.time() - started,
        reward=[h["reward_mean"] for h in history],
        reward_start=statistics.fmean(h["reward_mean"] for h in history[:max(3, steps // 10)]) if history else math.nan,
        reward_end=statistics.fmean(h["reward_mean"] for h in history[-max(5, steps // 10):]) if history else math.nan,
        masked_fraction=statistics.fmean(h.get("masked_fraction", 0.0) for h in trained) if trained else math.nan,
        mismatch_kl=statistics.fmean(h.get("mismatch_kl", 0.0) for h in trained) if trained else math.nan,
        grad_norm_max=max((h["grad_norm"] for h in trained), default=math.nan),
        off_policy_max=max((h["off_policy_max"] for h in history), default=0),
        stale_fraction=sum(h.get("stale", 0) for h in history)
        / max(sum(h.get("stale", 0) + h["samples"] for h in history), 1),
    )
    return row


def final_eval(base: Path, weights: Path, out: Path) -> dict:
    """`weights` (a run's checkpoints, or the warm start) evaluated on FINAL_EVAL's tasks by the training's own
    evaluation (a run of no steps); kept in `out`."""
    if not (out / "results.json").is_file():
        cfg = load(str(base), ["--train.init_from", f'"{weights}"', "--train.steps", "0", "--eval.every", "1",
                               *FINAL_EVAL, "--train.out", f'"{out}"'])
        train(cfg, log=lambda *_: None, progress=False)
    result = json.loads((out / "results.json").read_text())
    return {"reward": result["reward_mean"], "ci": result["reward_ci"]}


def table(rows: list[dict]) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["lag"], r["loss"]), []).append(r)
    lines = ["| lag k | loss | reward start | reward end (±sd over seeds) | final policy, held out | masked fraction "
             "| mismatch KL | max grad norm | dropped stale | non-finite |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (lag, loss), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], list(LOSSES).index(kv[0][1]))):
        ends = [r["reward_end"] for r in rs]
        spread = f" ± {statistics.stdev(ends):.3f}" if len(ends) > 1 else ""
        lines.append(
            f"| {lag} | {loss} | {statistics.fmean(r['reward_start'] for r in rs):.3f} | {statistics.fmean(ends):.3f}{spread} "
            f"| {held_out(rs)} "
            f"| {statistics.fmean(r['masked_fraction'] for r in rs):.3f} | {statistics.fmean(r['mismatch_kl'] for r in rs):.2e} "
            f"| {max(r['grad_norm_max'] for r in rs):.2f} "
            f"| {statistics.fmean(r.get('stale_fraction', 0.0) for r in rs):.3f} "
            f"| {sum(r['nonfinite'] for r in rs)}/{len(rs)} |")
    return "\n".join(lines) + "\n"


def held_out(rows: list[dict]) -> str:
    """The final policies' held-out reward: the mean over seeds (with its 95% interval where one seed ran)."""
    finals = [r["final"] for r in rows if "final" in r]
    if not finals:
        return "-"
    if len(finals) > 1:
        return f"{statistics.fmean(f['reward'] for f in finals):.3f}"
    low, high = finals[0]["ci"]
    return f"{finals[0]['reward']:.3f} ({low:.3f}-{high:.3f})"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted({r["lag"] for r in rows})
    w = max(1, min(len(r["reward"]) for r in rows if r["reward"]) // 15)  # a long run's curves: a moving average
    fig, axes = plt.subplots(1, len(lags), figsize=(4.5 * len(lags), 3.4), sharey=True, squeeze=False)
    for ax, lag in zip(axes[0], lags):
        for loss in LOSSES:
            curves = [r["reward"] for r in rows if r["lag"] == lag and r["loss"] == loss and r["reward"]]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
            ax.plot(range(w - 1, n), [statistics.fmean(mean[i - w + 1:i + 1]) for i in range(w - 1, n)], label=loss)
        ax.set_title(f"policy lag k = {lag}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean reward" + (f" ({w}-step moving average)" if w > 1 else ""))
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=list(MODELS), default="byte")
    p.add_argument("--grid", choices=list(GRIDS), help="default: smollm2's for that model, else reduced")
    p.add_argument("--lags", help="comma-separated: these lags of the grid only")
    p.add_argument("--losses", help="comma-separated: these losses of the grid only")
    p.add_argument("--steps", type=int, help="RL steps per run (default: the grid's)")
    p.add_argument("--setting", choices=["stress", "prime-rl"], default="stress",
                   help="stress: the lag alone at 3x the config's learning rate; prime-rl: its defaults and rate")
    p.add_argument("--lr", type=float, help="default: the setting's")
    p.add_argument("--batch-size", type=int, help="tasks per step (default: the base config's)")
    p.add_argument("--group-size", type=int, help="rollouts per task (default: the base config's)")
    p.add_argument("--part", default="1/1", help="I/N: the I-th of N shares of the grid's runs, for N invocations at once")
    p.add_argument("--final-eval", action="store_true",
                   help="evaluate each run's last weights (and the warm start) on 100 held-out tasks")
    p.add_argument("--out", default="outputs/off_policy_stress")
    args = p.parse_args()
    part, parts = map(int, args.part.split("/"))
    grid = GRIDS[args.grid or ("smollm2" if args.model == "smollm2" else "reduced")]
    base, lr = MODELS[args.model]
    lr = args.lr or (lr if args.setting == "stress" else PRIME_RL["lr"][args.model])
    out, steps = Path(args.out), args.steps or grid["steps"]
    lags = [int(k) for k in args.lags.split(",")] if args.lags else grid["lags"]
    if args.setting == "prime-rl":  # a lag past max_off_policy_steps trains nothing (the config refuses it)
        for k in [k for k in lags if k > PRIME_RL["max_off_policy_steps"]]:
            print(f"k={k}: not run: prime-rl drops rollouts more than {PRIME_RL['max_off_policy_steps']} steps old, "
                  "so this lag never trains", flush=True)
        lags = [k for k in lags if k <= PRIME_RL["max_off_policy_steps"]]
    extra = [*(["--train.batch_size", str(args.batch_size)] if args.batch_size else []),
             *(["--train.group_size", str(args.group_size)] if args.group_size else [])]
    out.mkdir(parents=True, exist_ok=True)
    print("warm start (SFT once, reused by every run and by later invocations)", flush=True)
    warm = sft(load(str(base), ["--train.out", f'"{out}"']), log=lambda *_: None)
    losses = args.losses.split(",") if args.losses else grid["losses"]
    grid_runs = [(lag, loss, seed) for lag in lags
                 for loss in (losses[:1] if lag == 0 and grid.get("once_at_0") else losses)
                 for seed in grid["seeds"]]
    for lag, loss, seed in grid_runs[part - 1::parts]:
        run_dir = out / "runs" / f"k{lag}-{loss}-s{seed}"
        if (run_dir / "row.json").is_file():
            print(f"k={lag:<3} {loss:<8} seed {seed}: done before, kept", flush=True)
            continue
        row = run_one(base, run_dir, warm, loss, lag, seed, steps, lr, [*extra, *setting_overrides(args.setting, lag)])
        (run_dir / "row.json").write_text(json.dumps(row))
        print(f"k={lag:<3} {loss:<8} seed {seed}: reward {row['reward_start']:.3f} -> {row['reward_end']:.3f}  "
              f"masked {row['masked_fraction']:.3f}  mismatch_kl {row['mismatch_kl']:.2e}  "
              f"grad<= {row['grad_norm_max']:.2f}  {'NON-FINITE ' if row['nonfinite'] else ''}({row['seconds']:.0f}s)",
              flush=True)
    if args.final_eval:  # the trainer's last weights, where the reward curve shows the sampler's (k steps old)
        warm_final = final_eval(base, warm, out / "final_eval" / "warm_start")
        print(f"warm start, held out: {warm_final['reward']:.3f}", flush=True)
        for f in sorted((out / "runs").glob("*/row.json")):
            row = json.loads(f.read_text())
            if "final" not in row:
                row["final"] = final_eval(base, f.parent / "checkpoints", out / "final_eval" / f.parent.name)
                f.write_text(json.dumps(row))
    rows = [json.loads(f.read_text()) for f in sorted((out / "runs").glob("*/row.json"))]
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    (out / "table.md").write_text(table(rows))
    plot(rows, out / "reward_curves.png")
    print(table(rows))
    print(f"wrote {out / 'results.json'}, {out / 'table.md'}, {out / 'reward_curves.png'} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
