"""`prime-agent [PROMPT] [--resume [ID] | -c] [--model NAME] [--base-url URL] [--set KEY=VALUE]...`:
the app in this directory.

Starts (or reaches) the daemon, then opens a new session here, the one named, or with `-c` the one
last used here (prompted, or a turn begun or ended), and sends PROMPT when one is given. On exit the
session goes on in the daemon (one it made and nobody prompted is not kept); the command prints how
to come back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path

from agent.config import ConfigError, home, load_config, merge, shorten
from cli import invocation
from cli.overrides import add_set, looks_like_override, read_overrides
from daemon.client import DaemonError, connect
from daemon.schemas import ModelKey
from tui.images import terminal_graphics


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prime-agent", description="The Prime Agent app (other commands: prime-agent --help).")
    p.add_argument("prompt", nargs="?", help="sent as the first message once the app is open")
    p.add_argument("--resume", nargs="?", const="", metavar="ID", help="attach to session ID (without ID: choose one)")
    p.add_argument("-c", "--continue", dest="cont", action="store_true", help="attach to the latest session here")
    p.add_argument("--model", help="model name for a new session (PRIME_AGENT_MODEL)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint for a new session (OPENAI_BASE_URL)")
    p.add_argument("--cwd", help="project directory (default: the current directory)")
    p.add_argument("--sandbox", choices=["read-only", "workspace-write", "full-access"],
                   help="how the OS confines a new session's code (sandbox.mode); full-access: none, shown loudly")
    add_set(p, " for a new session")
    return p


def model_source(args: argparse.Namespace, sets: dict) -> str:
    """Where the model's name came from, in the words a person would look for it."""
    if args.model:
        return "--model"
    if "name" in sets.get("model", {}):
        return "--set model.name"
    if os.environ.get("PRIME_AGENT_MODEL"):
        return "$PRIME_AGENT_MODEL"
    user = home() / "config.toml"
    try:
        import tomllib

        if "name" in tomllib.loads(user.read_text()).get("model", {}):
            return shorten(user)
    except (OSError, ValueError, AttributeError):
        pass
    return "the project's .prime-agent/config.toml"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.cont and looks_like_override(args.prompt) and "--" not in argv:
        print(f"prime-agent: in the app -c is --continue (the latest session here), and {args.prompt!r} would be "
              f"sent to the model as a message. To override a config field: --set {args.prompt}; to send it "
              f"anyway: prime-agent -c -- {shlex.quote(args.prompt)}", file=sys.stderr)
        return 2
    cwd = Path(args.cwd or ".").resolve()
    try:
        sets = read_overrides(args, "")
        if "daemon" in sets:
            raise ConfigError("--set daemon.*: the daemon reads [daemon] from config.toml when it starts, "
                              "not per session")
        overrides: dict = {}
        merge(overrides, sets)
        for key, value in {"name": args.model, "base_url": args.base_url}.items():
            if value:
                overrides.setdefault("model", {})[key] = value
        config = load_config(cwd, overrides)
    except ConfigError as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    new_session = args.resume is None and not args.cont
    if new_session and not config.model.configured:
        from cli.run import no_model

        print(no_model(config.model), file=sys.stderr)
        return 2
    try:
        session_id = asyncio.run(_run(config, cwd, args, sets, terminal_graphics()))  # asked before the app runs
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 1
    if session_id:
        print(f"[detached: session {session_id} goes on in the daemon; {invocation()} --resume {session_id}]",
              file=sys.stderr)
    return 0


async def _run(config, cwd: Path, args: argparse.Namespace, sets: dict, graphics: type | None = None) -> str | None:
    from tui.app import NewSession, PrimeApp

    client = await connect(key=ModelKey.of(config.model))  # given with each session it creates or prompts
    try:
        session_id = args.resume or None
        if session_id:  # an id nobody knows is an error here, not an empty app
            try:
                await client.session(session_id)
            except DaemonError as e:
                if e.status != 404:
                    raise
                raise DaemonError(404, "not_found", f"--resume {session_id}: no such session "
                                  "(prime-agent sessions lists them; --resume alone lets you choose)") from None
        if args.cont:
            here = [s for s in await client.sessions() if Path(s.cwd) == cwd and s.elsewhere is None]
            if not here:
                raise DaemonError(404, "not_found", f"no session in {cwd} to continue; run prime-agent to start one")
            session_id = max(here, key=lambda s: s.updated).id  # the one last prompted here
        app = PrimeApp(client, cwd, session_id=session_id, choose=args.resume == "", prompt=args.prompt,
                       graphics=graphics,
                       new=NewSession(config.model.name, config.model.base_url, config.budget.model_dump(),
                                      args.sandbox, config=sets or None, model_source=model_source(args, sets)))
        await app.run_async()
        return await app.leave()  # a session it made and nobody prompted is not kept
    finally:
        await client.close()
