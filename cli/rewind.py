"""`prime-agent rewind SESSION TURN [--code] [--conversation] [--harness] [--kernel]`: go back to the
checkpoint before a turn (through the daemon). With no part named, all four; `--list` shows the
turns to choose from, `--dry-run` what would change."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from cli.sessions import session_id
from daemon.client import DaemonError, connect

PARTS = ("code", "conversation", "harness", "kernel")


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("session", help="a session id ('last': the one last used here, as for refine and rate)")
    p.add_argument("turn", type=int, nargs="?", help="go back to before this turn began (1-based, as `sessions` "
                   "counts them; the turn after the last is the state the last one left)")
    p.add_argument("--code", action="store_true", help="the workspace's files")
    p.add_argument("--conversation", action="store_true", help="the model's context")
    p.add_argument("--harness", action="store_true", help="each harness scope (a new commit)")
    p.add_argument("--kernel", action="store_true", help="the kernel's namespace")
    p.add_argument("--after", action="store_true", help="the state when TURN ended, not before it began")
    p.add_argument("--force", action="store_true", help="overwrite files a person changed since the checkpoint")
    p.add_argument("--dry-run", action="store_true", help="only show what would change")
    p.add_argument("--list", action="store_true", help="list the turns to rewind to, with the files each changed")
    p.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    if args.turn is None and not args.list:
        print("prime-agent: rewind needs a TURN (or --list to see them)", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_list(args) if args.list else _rewind(args))
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 2 if e.status in (400, 404, 409, 422) else 1


async def _list(args: argparse.Namespace) -> int:
    async with await connect() as client:
        rows = await client.checkpoints(await session_id(client, args.session))
    if args.json:
        print(json.dumps([r.model_dump() for r in rows], indent=2))
        return 0
    for r in rows:
        when = time.strftime("%m-%d %H:%M:%S", time.localtime(r.ts))
        files = ", ".join(r.files[:6]) + (f" (+{len(r.files) - 6})" if len(r.files) > 6 else "")
        prompt = r.prompt.replace("\n", " ")[:60]
        mark = "" if r.checkpoint else "  (no checkpoint)"
        print(f"{r.turn:>3}  {r.turn_id:<6} {when}  {r.outcome or 'running':<16} {prompt:<60}  {files}{mark}")
    if not rows:
        print("(no turns yet)", file=sys.stderr)
    return 0


async def _rewind(args: argparse.Namespace) -> int:
    parts = [p for p in PARTS if getattr(args, p)] or None
    async with await connect() as client:
        args.session = await session_id(client, args.session)
        r = await client.rewind(args.session, args.turn, parts=parts, after=args.after, force=args.force,
                                dry_run=args.dry_run)
    if args.json:
        print(r.model_dump_json(indent=2))
        return 0
    where = f"{'the end of' if r.after else 'before'} turn {r.turn}"
    print(f"{'would rewind' if r.dry_run else 'rewound'} {args.session} to {where} ({', '.join(r.parts)})")
    for f in r.files:
        print(f"  {f.change:<9} {f.path}")
    if "code" in r.parts and not r.files:
        print("  (no file changes)")
    for s in r.not_restored:
        print(f"  left as is {s.path} ({s.reason})")
    for scope, commit in r.harness.items():
        print(f"  harness   {scope} scope -> {(commit or 'its first commit')[:12]}")
    if isinstance(r.kernel, dict) and r.kernel:
        status = r.kernel.get("status")
        print(f"  kernel    {status}" + (f": {r.kernel['why']}" if r.kernel.get("why") else ""))
    if r.conflicts:
        label = "would refuse (changed by a person since; --force overwrites)" if r.dry_run else "overwritten"
        print(f"  {label}: {', '.join(r.conflicts)}")
    return 0
