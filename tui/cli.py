"""The `prime-agent` command line. Each command lives in tui/commands/ and is imported only when run."""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prime-agent",
        description="A coding agent whose one tool is a persistent IPython kernel. With no command (or with "
                    "--resume [ID], -c, --model, --base-url), opens the app in this directory.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser("demo", add_help=False, help="the closed loop offline: agent sessions train the local policy "
                          "with IPO, then a before/after table (prime-agent demo --help)")
    demo.add_argument("args", nargs=argparse.REMAINDER)  # main() hands them over as they are

    run = sub.add_parser("run", help="run one task headless in the current directory and print the answer")
    run.add_argument("task", help="the task; '-' reads it from standard input")
    run.add_argument("--cwd", help="project directory (default: the current directory)")
    run.add_argument("--model", help="model name (PRIME_AGENT_MODEL)")
    run.add_argument("--base-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    run.add_argument("--max-turns", type=int, metavar="N", help="model calls allowed in the turn (budget.max_steps)")
    run.add_argument("--session-dir", help="where to keep the session (default: $PRIME_AGENT_HOME/sessions/<id>)")
    run.add_argument("--json", action="store_true", help="print one JSON event per line instead of text")
    run.add_argument("--daemon", action="store_true",
                     help="run in a daemon session, which outlives this command (the daemon starts if needed)")
    run.add_argument("-c", "--config", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config field, e.g. -c model.temperature=0.2 (repeatable)")

    traj = sub.add_parser("trajectory", help="work with session trajectories")
    traj_sub = traj.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = traj_sub.add_parser("export", help="export a session's conversations for fine-tuning")
    export.add_argument("session", help="session id, session directory, trajectory file, or 'last'")
    export.add_argument("--format", choices=["openai-chat"], default="openai-chat")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    _add_harness(sub)
    _add_daemon(sub)
    rate = sub.add_parser("rate", help="rate a session 0..1: the reward its training samples carry")
    rate.add_argument("session", help="session id, directory, or 'last'")
    rate.add_argument("score", type=float)
    rate.add_argument("--note", default="", help="why (kept beside the score)")

    refine = sub.add_parser("refine", help="refine the harness from a session, or decide a pending refinement")
    refine.add_argument("what", metavar="SESSION|approve|reject", help="a session id (or 'last'), or approve/reject")
    refine.add_argument("id", nargs="?", help="with approve/reject: the refinement id")
    refine.add_argument("--session", help="with approve/reject: the session the refinement belongs to")
    refine.add_argument("--instructions", help="what the refinement should focus on")
    refine.add_argument("--mode", choices=["auto", "review", "dry-run"], help="override refine.mode")

    ev = sub.add_parser("eval", help="evaluate the agent on a task set (or: eval compare RUN_A RUN_B)")
    ev.add_argument("taskset", help="reverse_text, kernel_tasks, repo_fix, a .jsonl file or a .py module; or 'compare'")
    ev.add_argument("runs", nargs="*", help="with compare: two run directories")
    ev.add_argument("--model", help="model name (PRIME_AGENT_MODEL)")
    ev.add_argument("--base-url", help="OpenAI-compatible endpoint (OPENAI_BASE_URL)")
    ev.add_argument("-n", type=int, help="how many tasks (default: the set's own size)")
    ev.add_argument("-r", "--rollouts", type=int, default=1, help="rollouts per task")
    ev.add_argument("-c", "--concurrency", type=int, default=4, help="rollouts at once")
    ev.add_argument("--seed", type=int, default=0, help="task selection seed")
    ev.add_argument("--timeout", type=float, default=600.0, help="seconds per rollout")
    ev.add_argument("--out", help="run directory (default: outputs/evals/<taskset>--<model>/<run id>)")
    ev.add_argument("--resume", metavar="DIR", help="finish a run: keep its results, rerun errored and missing rollouts")

    rl = sub.add_parser("rl", help="train the policy with RL, or serve it")
    rl_sub = rl.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in [("train", "SFT warm start (if configured), then RL"), ("sft", "only the SFT warm start")]:
        p_ = rl_sub.add_parser(name, help=text)
        p_.add_argument("config", help="a TOML run config, e.g. examples/reverse_text/config.toml")
        p_.add_argument("overrides", nargs=argparse.REMAINDER, help="--section.field VALUE ...")
    ingest = rl_sub.add_parser("ingest", help="turn session trajectories into token-level training samples")
    ingest.add_argument("sessions", nargs="*", metavar="SESSION", help="session ids or directories ('last' works)")
    ingest.add_argument("--all", action="store_true", help="every session under $PRIME_AGENT_HOME/sessions")
    ingest.add_argument("--rubric", metavar="FILE.py:FUNC", help="reward unrated sessions with FUNC(records) -> float")
    ingest.add_argument("-o", "--output", default="samples.jsonl", help="JSONL file to write (default samples.jsonl)")
    serve = rl_sub.add_parser("serve", help="an OpenAI-compatible server for the policy")
    serve.add_argument("--checkpoint", help="a checkpoint directory (default: fresh weights)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--truncate", action="store_true",
                       help="keep the last tokens of prompts longer than the policy's context (e.g. the agent's prompt)")
    return p


def _add_harness(sub: argparse._SubParsersAction) -> None:
    h = sub.add_parser("harness", help="the versioned harness: notes, memories, skills, subagents")
    actions = h.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str, default_scope: str | None) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help)
        p.add_argument("--scope", choices=["user", "project", "session"], default=default_scope,
                       help=f"which scope (default: {default_scope or 'the merged view'})")
        p.add_argument("--session", metavar="ID", help="the session whose session scope to use")
        p.add_argument("--project", metavar="DIR", help="the project (default: the current directory's)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p = action("list", "entries in force, narrowest scope first", None)
    p.add_argument("--kind", choices=["prompt", "memory", "skill", "subagent"])
    p = action("show", "one entry in full", None)
    p.add_argument("id")
    p = action("log", "changes, newest first", "user")
    p.add_argument("-n", type=int, default=20, metavar="N", help="how many (default 20)")
    p = action("diff", "what changed: the last change, or from A to B (refinement ids or commits)", "user")
    p.add_argument("a", nargs="?")
    p.add_argument("b", nargs="?")
    p = action("rollback", "undo one change (a new commit), or restore a whole earlier state with --to", "user")
    p.add_argument("ref", help="refinement id or commit")
    p.add_argument("--to", action="store_true", help="restore the whole scope as it was at REF")
    p = action("import", "import Agent Skills folders (.claude/skills, .agents/skills, or one skill)", "user")
    p.add_argument("path")


def _add_daemon(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("daemon", help="the background daemon that keeps sessions alive")
    actions = d.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = actions.add_parser("start", help="start it (in the background, unless --foreground)")
    start.add_argument("--foreground", action="store_true", help="run in this terminal; Ctrl-C or SIGTERM stops it")
    start.add_argument("--tcp", metavar="HOST:PORT", help="also listen on TCP; requests need the bearer token")
    actions.add_parser("stop", help="stop it: running turns are interrupted and recorded first")
    status = actions.add_parser("status", help="pid, socket, version, uptime, sessions")
    status.add_argument("--json", action="store_true")

    p = sub.add_parser("sessions", help="the daemon's sessions")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("send", help="send a message to a daemon session (prints the turn id)")
    p.add_argument("session")
    p.add_argument("text", help="the message; '-' reads it from standard input")
    p.add_argument("--mode", choices=["prompt", "steer", "follow_up"], default="prompt",
                   help="steer: reach the running turn at its next model call (default: a new turn, queued)")
    p.add_argument("--wait", action="store_true", help="show the turn's events and print its answer")
    p = sub.add_parser("attach", help="follow a session's events; Ctrl-C detaches and leaves it running")
    p.add_argument("session")
    p.add_argument("--all", action="store_true", help="replay the whole history first")
    p.add_argument("--after", type=int, metavar="SEQ", help="replay events after this seq first")
    p.add_argument("--json", action="store_true", help="one JSON event per line")
    p = sub.add_parser("kernel", help="print the connection file of a session's live kernel (jupyter console --existing FILE)")
    p.add_argument("session")


APP_FLAGS = ("--resume", "-c", "--continue", "--model", "--base-url", "--cwd")


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:  # `prime-agent sessions | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in APP_FLAGS or any(a.startswith(f + "=") for a in argv[:1] for f in APP_FLAGS):
        from tui.commands.app import main as app

        return app(argv)
    if argv[0] == "demo":  # its own options, --help included
        from tui.commands.demo import main as demo

        return demo(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from tui.commands.run import main as command
    elif args.command == "harness":
        from tui.commands.harness import main as command
    elif args.command == "refine":
        from tui.commands.refine import main as command
    elif args.command == "rl":
        from tui.commands.rl import main as command
    elif args.command == "eval":
        from tui.commands.eval import main as command
    elif args.command == "rate":
        from tui.commands.rl import rate as command
    elif args.command == "daemon":
        from tui.commands.daemon import main as command
    elif args.command in ("sessions", "send", "attach", "kernel"):
        from tui.commands.sessions import main as command
    else:
        from tui.commands.trajectory import main as command
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
