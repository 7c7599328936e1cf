"""`prime-agent hooks list|add|remove|trust`: the person's hooks (agent/hooks.py), in Claude Code's
shape: `$PRIME_AGENT_HOME/hooks.json` (yours: they run) and `<project>/.prime-agent/hooks.json`
(the project's: they run once you trusted the file as it is, `hooks trust` or `prime-agent trust`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness_store import safefs
from agent.config import PROJECT_HOOKS, ConfigError, home, load_config, project_root
from agent.hooks import EVENTS, HooksError, HooksFile, read
from agent.trust import TrustStore
from cli.trust import review


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("--project", action="store_true", help="the project's hooks file, not yours")
    p.add_argument("--cwd", type=Path, default=Path("."), help="the project (default: the current directory)")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser("list", help="every hook in force here, and the project's if it waits for your trust")
    add = sub.add_parser("add", help="add a command hook: hooks add EVENT 'COMMAND' [--matcher REGEX] [--timeout S]")
    add.add_argument("event", choices=EVENTS, metavar="EVENT", help=", ".join(EVENTS))
    add.add_argument("hook_command", metavar="COMMAND", help="a shell command; the event's JSON comes on its stdin")
    add.add_argument("--matcher", help="a regular expression over the whole tool name (ipython, mcp__SERVER__TOOL, rlm)")
    add.add_argument("--timeout", type=float, help="seconds before it is killed (default 60)")
    remove = sub.add_parser("remove", help="remove every hook of EVENT whose command is COMMAND")
    remove.add_argument("event", choices=EVENTS, metavar="EVENT")
    remove.add_argument("hook_command", metavar="COMMAND")
    trust = sub.add_parser("trust", help="show the project's hooks file and trust it as it is")
    trust.add_argument("--yes", "-y", action="store_true", help="trust it without asking")


def main(args: argparse.Namespace) -> int:
    root = project_root(args.cwd)
    try:
        if args.action == "list":
            return _list(args.cwd)
        if args.action == "trust":
            return review(TrustStore(home()), args.cwd, args.yes, only=[PROJECT_HOOKS], runs=("hook",))
        return _edit(args, root)
    except (HooksError, ConfigError, OSError) as e:
        print(f"prime-agent hooks: {e}", file=sys.stderr)
        return 1


def _list(cwd: Path) -> int:
    config = load_config(cwd)
    for source, f in config.hooks:
        for event, groups in f.hooks.items():
            for group in groups:
                for spec in group.hooks:
                    what = spec.command if spec.type == "command" else f"POST {spec.url}"
                    print(f"{source:8} {event:19} {group.matcher or '*':20} {what} ({spec.timeout:g}s)")
    for line in config.ignored:
        if PROJECT_HOOKS in line or "the hook does not run" in line:
            print(f"not in force: {line}")
    if not config.hooks:
        print(f"no hooks: add one with `prime-agent hooks add EVENT 'COMMAND'` ({home() / 'hooks.json'})")
    return 0


def _edit(args: argparse.Namespace, root: Path) -> int:
    path = root / PROJECT_HOOKS if args.project else home() / "hooks.json"
    base = root if args.project else home()
    rel = path.relative_to(base)
    try:
        text = safefs.read_text(base, rel, 1 << 20)
    except FileNotFoundError:
        text = "{}"
    data = json.loads(text) if text.strip() else {}
    read(path, json.dumps(data))  # refuse to edit a file that is not a hooks file
    groups = data.setdefault("hooks", {}).setdefault(args.event, [])
    if args.action == "add":
        spec = {"type": "command", "command": args.hook_command, **({"timeout": args.timeout} if args.timeout else {})}
        groups.append({**({"matcher": args.matcher} if args.matcher else {}), "hooks": [spec]})
    else:
        before = sum(len(g.get("hooks", [])) for g in groups)
        for g in groups:
            g["hooks"] = [h for h in g.get("hooks", []) if h.get("command") != args.hook_command]
        groups[:] = [g for g in groups if g["hooks"]]
        if before == sum(len(g["hooks"]) for g in groups):
            print(f"prime-agent hooks: no {args.event} hook runs {args.hook_command!r} in {path}", file=sys.stderr)
            return 1
        if not groups:
            del data["hooks"][args.event]
    HooksFile.model_validate(data)
    base.mkdir(parents=True, exist_ok=True)
    safefs.write_bytes(base, rel, (json.dumps(data, indent=2) + "\n").encode())
    print(f"{'added to' if args.action == 'add' else 'removed from'} {path}"
          + ("; the project's hooks run once trusted: prime-agent hooks trust" if args.project else ""))
    return 0
