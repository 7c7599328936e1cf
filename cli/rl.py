"""`prime-agent rl train|sft CONFIG [--section.field VALUE ...]`, `rl serve`, `rl ingest`, and `rate`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    if command == "rate":
        p.add_argument("session", help="session id, directory, or 'last'")
        p.add_argument("score", type=float)
        p.add_argument("--note", default="", help="why (kept beside the score)")
        return
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in [("train", "SFT warm start (if configured), then RL"), ("sft", "only the SFT warm start")]:
        a = actions.add_parser(name, help=text)
        a.add_argument("config", help="a TOML run config, e.g. examples/reverse_text/config.toml")
        a.add_argument("overrides", nargs=argparse.REMAINDER, help="--section.field VALUE ...")
    ingest = actions.add_parser("ingest", help="turn session trajectories into token-level training samples")
    ingest.add_argument("sessions", nargs="*", metavar="SESSION",
                        help="session ids or directories ('last' works); with --format atif, ATIF JSON files")
    ingest.add_argument("--format", choices=["session", "atif"], default="session",
                        help="atif: trajectories in ATIF v1.8 (another agent's, or `trajectory export --format atif`)")
    ingest.add_argument("--all", action="store_true", help="every session under $PRIME_AGENT_HOME/sessions")
    ingest.add_argument("--rubric", metavar="FILE.py:FUNC", help="reward unrated sessions with FUNC(records) -> float")
    ingest.add_argument("-o", "--output", default="samples.jsonl", help="JSONL file to write (default samples.jsonl)")
    serve = actions.add_parser("serve", help="an OpenAI-compatible server for the policy")
    what = serve.add_mutually_exclusive_group()
    what.add_argument("--checkpoint", help="a byte-policy checkpoint directory (default: fresh weights)")
    what.add_argument("--model", metavar="NAME|DIR",
                      help="a Hugging Face causal LM: a name `prime-agent models list` shows, or a model directory")
    serve.add_argument("--served-model-name", metavar="ID",
                       help="the id /v1/models lists, and the only model name requests to --model may give "
                            "(default: the model's name)")
    serve.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                       help="weights and activations of --model (float32: greedy decoding as plain transformers)")
    serve.add_argument("--prefix-cache-mb", type=int, metavar="MB",
                       help="memory for the keys and values of shared prompt heads (0: no prefix cache; "
                            "default: one full context's, --max-model-len tokens)")
    serve.add_argument("--max-num-seqs", type=int, default=64, metavar="N",
                       help="rows of --model decoding at once (more requests wait)")
    serve.add_argument("--max-num-batched-tokens", type=int, default=2048, metavar="TOKENS",
                       help="new prompt tokens of --model per prefill pass (longer prompts are prefilled in chunks): "
                            "bounds the memory a wave of requests takes")
    serve.add_argument("--max-model-len", type=int, metavar="TOKENS",
                       help="the context of --model (default: its config's max_position_embeddings)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--truncate", action="store_true",
                       help="keep the last tokens of prompts longer than the policy's context (e.g. the agent's prompt)")


def main(args: argparse.Namespace) -> int:
    if args.command == "rate":
        return rate(args)
    if args.action == "ingest":
        return ingest(args)
    if args.action == "serve":
        from rl.serve import main as serve

        return serve(args)
    from rl.config import load
    from rl.dist import process_group
    from rl.train import CannotResume, sft, train

    try:
        cfg = load(args.config, args.overrides)
    except (ValueError, OSError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    if args.action == "sft":
        print(f"wrote {sft(cfg)}")
        return 0
    try:
        with process_group():  # under torchrun (the documented form is `torchrun ... -m rl.train CONFIG`)
            history = train(cfg)
    except CannotResume as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    if history:
        first, last = history[0]["reward_mean"], history[-1]["reward_mean"]
        print(f"reward {first:.3f} -> {last:.3f} over {len(history)} steps; run in {cfg.train.out}")
    return 0


def _session_dir(ref: str) -> Path:
    from cli.trajectory import find_trajectory

    return find_trajectory(ref).parent


def ingest(args: argparse.Namespace) -> int:
    from agent.layout import session_layouts
    from agent.trajectory import TrajectoryError
    from rl.data import ingest as run
    from rl.data import load_rubric, write

    try:
        rubric = load_rubric(args.rubric) if args.rubric else None
        if args.format == "atif":
            from rl.atif import ingest_atif

            if args.all or not args.sessions:
                raise ValueError("name the ATIF files to ingest (--all is for sessions)")
            samples, counts = ingest_atif([Path(p) for p in args.sessions], rubric)
        else:
            dirs = ([s.dir for s in session_layouts()] if args.all
                    else [_session_dir(s) for s in args.sessions])
            if not dirs:
                raise ValueError("name sessions to ingest, or pass --all")
            samples, counts = run(dirs, rubric)
    except (FileNotFoundError, ValueError, TrajectoryError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    write(samples, Path(args.output))
    print(f"{counts.samples} samples, {counts.trainable_tokens:,} trainable tokens from {counts.sessions} sessions "
          f"-> {args.output}")
    print(f"replies {counts.replies}: {counts.skipped_no_logprobs} without logprobs and {counts.foreign} from another "
          "model (kept as masked text); "
          f"chains cut {counts.splits}; samples without a reward {counts.unrewarded} "
          "(rate them: prime-agent rate SESSION 0..1, or pass --rubric)")
    return 0


def rate(args: argparse.Namespace) -> int:
    from rl.data import rate as record

    try:
        record(_session_dir(args.session), args.score, args.note)
    except (FileNotFoundError, ValueError) as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    print(f"rated {args.session}: {args.score:g}")
    return 0
