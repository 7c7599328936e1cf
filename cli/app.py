"""`prime-agent [--resume [ID] | -c] [--model NAME] [--base-url URL]`: the app in this directory.

Starts (or reaches) the daemon, then opens a new session here, the one named, or with `-c` the
latest one here. On exit the session goes on in the daemon; the command prints how to come back.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent.config import ConfigError, load_config
from daemon.client import DaemonError, connect
from daemon.schemas import ModelKey


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prime-agent", description="The Prime Agent app (other commands: prime-agent --help).")
    p.add_argument("--resume", nargs="?", const="", metavar="ID", help="attach to session ID (without ID: choose one)")
    p.add_argument("-c", "--continue", dest="cont", action="store_true", help="attach to the latest session here")
    p.add_argument("--model", help="model name for a new session (PRIME_AGENT_MODEL)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint for a new session (OPENAI_BASE_URL)")
    p.add_argument("--cwd", help="project directory (default: the current directory)")
    p.add_argument("--sandbox", choices=["read-only", "workspace-write", "full-access"],
                   help="how the OS confines a new session's code (sandbox.mode); full-access: none, shown loudly")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    cwd = Path(args.cwd or ".").resolve()
    overrides: dict = {}
    for key, value in {"name": args.model, "base_url": args.base_url}.items():
        if value:
            overrides.setdefault("model", {})[key] = value
    try:
        config = load_config(cwd, overrides)
    except ConfigError as e:
        print(f"prime-agent: {e}", file=sys.stderr)
        return 2
    new_session = args.resume is None and not args.cont
    if new_session and not config.model.configured:
        from cli.run import NO_MODEL

        print(NO_MODEL, file=sys.stderr)
        return 2
    try:
        session_id = asyncio.run(_run(config, cwd, args))
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 1
    if session_id:
        print(f"[detached: session {session_id} goes on in the daemon; prime-agent --resume {session_id}]",
              file=sys.stderr)
    return 0


async def _run(config, cwd: Path, args: argparse.Namespace) -> str | None:
    from tui.app import NewSession, PrimeApp

    client = await connect(key=ModelKey.of(config.model))  # given with each session it creates or prompts
    try:
        session_id = args.resume or None
        if args.cont:
            here = [s for s in await client.sessions() if Path(s.cwd) == cwd]
            if not here:
                raise DaemonError(404, "not_found", f"no session in {cwd} to continue; run prime-agent to start one")
            session_id = max(here, key=lambda s: s.updated).id
        app = PrimeApp(client, cwd, session_id=session_id, choose=args.resume == "",
                       new=NewSession(config.model.name, config.model.base_url, config.budget.model_dump(),
                                      args.sandbox))
        await app.run_async()
        return app.session_id
    finally:
        await client.close()
