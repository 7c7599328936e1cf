"""The `prime-agent` command line: `main()` finds the command and hands it to its module.

One module per command area (cli/run.py, cli/sessions.py, ...), each with its commands' arguments
beside their handlers. A module is imported only when its command runs (`import openai` alone
costs 0.5 s), so COMMANDS names each command's module and its line of help: `prime-agent --help`
lists every command without importing any of them.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from typing import NamedTuple

from cli import version


class Command(NamedTuple):
    module: str
    """Where it lives: `add_arguments(parser, name)` builds its arguments, `main(args) -> int` runs it."""
    help: str
    """Its line in `prime-agent --help`."""


COMMANDS = {  # in the order --help lists them
    "demo": Command("cli.demo", "the closed loop offline: agent sessions train the local policy with IPO, then a "
                    "before/after table (prime-agent demo --help)"),
    "run": Command("cli.run", "run one task headless in the current directory and print the answer"),
    "trajectory": Command("cli.trajectory", "work with session trajectories"),
    "harness": Command("cli.harness", "the versioned harness: notes, memories, skills, subagents"),
    "daemon": Command("cli.daemon", "the background daemon that keeps sessions alive"),
    "sessions": Command("cli.sessions", "the daemon's sessions"),
    "send": Command("cli.sessions", "send a message to a daemon session (prints the turn id)"),
    "attach": Command("cli.sessions", "follow a session's events; Ctrl-C detaches and leaves it running"),
    "kernel": Command("cli.sessions",
                      "print the connection file of a session's live kernel (jupyter console --existing FILE)"),
    "schedule": Command("cli.schedule", "prompts the daemon fires on a clock, and heartbeats: add, list, pause "
                        "(--all works with the daemon stopped), resume, remove"),
    "rewind": Command("cli.rewind", "go back to before a turn: files, conversation, harness and kernel (--list: "
                      "the turns)"),
    "rate": Command("cli.rl", "rate a session 0..1: the reward its training samples carry"),
    "refine": Command("cli.refine", "refine the harness from a session, or decide a pending refinement"),
    "eval": Command("cli.eval", "evaluate the agent on a task set (or: eval compare RUN_A RUN_B)"),
    "rl": Command("cli.rl", "train the policy with RL, or serve it"),
    "models": Command("cli.models", "pull known models into $PRIME_AGENT_HOME/models, list them"),
    "mcp": Command("cli.mcp", "MCP servers: list them (state, tools), add or remove one"),
    "hooks": Command("cli.hooks", "your commands at each step of a turn, in Claude Code's shape: list, add, remove, "
                     "trust (the project's)"),
    "trust": Command("cli.trust", "the project's files the host acts on (.prime-agent/config.toml, .mcp.json, "
                     "AGENTS.md...): review and trust them, --list, --revoke"),
    "web": Command("cli.web", "the web page on the daemon: watch and steer sessions from a browser, a phone too"),
    "acp": Command("cli.acp", "the agent over the Agent Client Protocol on stdio, for editors (Zed...), Harbor and "
                   "verifiers; its sessions are the daemon's"),
    "doctor": Command("cli.doctor", "check what a first day trips on: the command on PATH, bubblewrap, the home, "
                      "the daemon, the model server"),
}

APP_FLAGS = ("--resume", "-c", "--continue", "--model", "--base-url", "--cwd", "--sandbox", "--set", "--")
"""With no command, or one of these first, `prime-agent` opens the app (cli/app.py); so does a
prompt first (`prime-agent "fix the bug"`)."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line, with the arguments of `command` built (the other commands are only named)."""
    p = argparse.ArgumentParser(
        prog="prime-agent",
        description="A coding agent whose one tool is a persistent IPython kernel. With no command (or with "
                    "a prompt, --resume [ID], -c, --model, --base-url, --sandbox, --set KEY=VALUE), opens the app in "
                    "this directory: prime-agent \"fix the failing test\" sends it as the first message.")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, c in COMMANDS.items():
        parser = sub.add_parser(name, help=c.help, add_help=name != "demo")  # the demo has its own --help
        if name == command:
            importlib.import_module(c.module).add_arguments(parser, name)
    return p


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost parser that `args` went through (`prime-agent daemon start`'s, not the top's)."""
    while subs := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]:
        chosen = getattr(args, subs[0].dest, None)
        if chosen not in subs[0].choices:
            break
        parser = subs[0].choices[chosen]
    return parser


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"prime-agent {version()}")
        parser.exit()


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:  # `prime-agent sessions | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str]) -> int:
    first = argv[0] if argv else None
    if first is None or first in APP_FLAGS or any(first.startswith(f + "=") for f in APP_FLAGS) or (
            not first.startswith("-") and len(first.split()) > 1):  # a prompt; one word is more likely a typo
        from cli.app import main as app

        return app(argv)
    if argv == ["help"]:  # what a newcomer types first
        build_parser().print_help()
        return 0
    if argv[0] == "demo":  # its own options, --help included
        from cli.demo import main as demo

        return demo(argparse.Namespace(args=argv[1:]))
    # The top level takes no values, so the first word that is not an option names the command.
    command = next((a for a in argv if not a.startswith("-")), None)
    trailing: list[str] = []
    if command == "mcp" and "--" in argv:  # `mcp add NAME [options] -- COMMAND ARGS...`: taken as they are
        at = argv.index("--")
        argv, trailing = argv[:at], argv[at + 1:]
    parser = build_parser(command)
    if command is not None and command not in COMMANDS:  # one word, not a command: a typo more likely than a prompt
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        parser.error(f"unknown command {command!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                     + f" (to open the app with it as the first message: prime-agent -- {command})")
    if command is None:  # options alone, none of them the app's: say which, not that a command is missing
        unknown = next((a for a in argv if a not in ("-h", "--help", "--version")), None)
        if unknown is not None:
            parser.error(f"unknown option {unknown}: a command comes first (prime-agent --help lists them); "
                         f"the app takes {', '.join(APP_FLAGS)}")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command they were given to, with its usage
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if trailing:
        args.argv = trailing
    return importlib.import_module(COMMANDS[args.command].module).main(args)


if __name__ == "__main__":
    sys.exit(main())
