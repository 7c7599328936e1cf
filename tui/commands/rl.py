"""`prime-agent rl train|sft CONFIG [--section.field VALUE ...]` and `prime-agent rl serve`."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    if args.action == "serve":
        from rl.serve import main as serve

        return serve(args)
    from rl.config import load
    from rl.train import sft, train

    try:
        cfg = load(args.config, args.overrides)
    except (ValueError, OSError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    if args.action == "sft":
        print(f"wrote {sft(cfg)}")
        return 0
    history = train(cfg)
    if history:
        first, last = history[0]["reward_mean"], history[-1]["reward_mean"]
        print(f"reward {first:.3f} -> {last:.3f} over {len(history)} steps; run in {cfg.train.out}")
    return 0
