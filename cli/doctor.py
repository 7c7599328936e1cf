"""`prime-agent doctor`: what a first day trips on, checked in one go, each with what to do about it.

The command itself (on PATH?), the sandbox (bubblewrap and user namespaces), the home (where, writable,
its size), the daemon (running, the same version as this command) and the model server (configured,
reachable, serving the model named). Exit 0 when nothing failed (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

MARKS = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--cwd", help="the project whose configuration is checked (default: the current directory)")


def main(args: argparse.Namespace) -> int:
    cwd = Path(args.cwd or ".").resolve()
    failed = False
    for check in (_command, _sandbox, _home, _daemon, lambda: _model(cwd)):
        for level, what, detail in check():
            print(f"{MARKS[level]}  {what:<9} {detail}")
            failed |= level == "fail"
    return 1 if failed else 0


def _command() -> list[tuple[str, str, str]]:
    from cli import invocation, version

    named = invocation()
    if named == "prime-agent":
        return [("ok", "command", f"prime-agent {version()} ({sys.executable})")]
    bin_dir = Path(sys.executable).parent
    return [("warn", "command", f"prime-agent {version()} is not on PATH (this is {named}): source "
             f"{bin_dir}/activate, or export PATH=\"{bin_dir}:$PATH\", or install it as a tool: pipx install . "
             "(or uv tool install .) in the checkout")]


def _sandbox() -> list[tuple[str, str, str]]:
    from agent.kernel.sandbox import unavailable

    why = unavailable()
    if why is None:
        return [("ok", "sandbox", f"bubblewrap confines the kernels ({shutil.which('bwrap')})")]
    return [("fail", "sandbox", f"{why}; on Debian or Ubuntu: sudo apt-get install bubblewrap (bash "
             "scripts/setup.sh does it); see docs/sandbox.md")]


def _home() -> list[tuple[str, str, str]]:
    from agent.config import home
    from daemon.prune import size

    root = home()
    where = f"{root}" + ("" if os.environ.get("PRIME_AGENT_HOME") else " (PRIME_AGENT_HOME not set: the default)")
    if not root.exists():
        return [("ok", "home", f"{where}: not made yet (the first session makes it)")]
    if not os.access(root, os.W_OK):
        return [("fail", "home", f"{where}: not writable by you")]
    sessions = root / "sessions"
    count = sum(1 for d in sessions.iterdir() if d.is_dir()) if sessions.is_dir() else 0
    taken = size(root)
    free = shutil.disk_usage(root).free
    level = "warn" if free < 1 << 30 else "ok"
    hint = "; prime-agent sessions prune [--older-than DAYS] frees what old sessions take" if count else ""
    return [(level, "home", f"{where}: {taken / 1e6:,.0f} MB in it, {count} session folder(s), "
             f"{free / 1e9:,.1f} GB free{hint}")]


def _daemon() -> list[tuple[str, str, str]]:
    from agent.config import home
    from cli import version
    from daemon.client import Client, DaemonUnavailable, daemon_pid

    if not (home() / "run" / "daemon.lock").exists() or daemon_pid() is None:  # asked without making a thing
        return [("ok", "daemon", "not running (the app and the commands that need it start it)")]

    async def status():
        async with Client() as client:
            return await client.status()

    try:
        s = asyncio.run(status())
    except DaemonUnavailable as e:
        return [("fail", "daemon", f"pid {daemon_pid()} holds the lock but does not answer: {e.message}; "
                 "prime-agent daemon stop")]
    if s.version != version():
        return [("warn", "daemon", f"pid {s.pid} runs prime-agent {s.version}, this command is {version()}: "
                 "prime-agent daemon stop, and the next command starts the new one")]
    return [("ok", "daemon", f"pid {s.pid}, {s.sessions} sessions ({s.live_sessions} live), socket {s.socket}")]


def _model(cwd: Path) -> list[tuple[str, str, str]]:
    from agent.config import ConfigError, load_config
    from agent.server_models import ListingError, listed_models

    try:
        model = load_config(cwd).model
    except ConfigError as e:
        return [("fail", "model", f"the configuration does not load: {e}")]
    if not model.configured:
        return [("fail", "model", "no model configured: export PRIME_AGENT_MODEL (and OPENAI_BASE_URL for a server "
                 "other than OpenAI's), or pass --model and --base-url; the README's 'Pointing it at a model'")]
    where = model.base_url or "OpenAI's API"
    try:
        names = asyncio.run(listed_models(model.base_url, model.api_key))
    except ListingError as e:
        if e.reached:  # it answers, and lists nothing (transformers serve, some proxies): the turns will tell
            return [("warn", "model", f"{model.name} at {where}: the server answers but lists no models ({e})")]
        return [("fail", "model", f"{model.name} at {where}: no answer ({e}); is the server running?")]
    if model.name not in names:
        return [("warn", "model", f"{model.name} at {where}: the server lists {', '.join(names[:8]) or 'no models'}"
                 f"{' ...' if len(names) > 8 else ''}, not {model.name}")]
    return [("ok", "model", f"{model.name} at {where}")]
