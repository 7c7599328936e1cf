"""`prime-agent schedule add | list | pause | resume | remove`: prompts the daemon fires on a clock.

With the daemon running, each goes through its API; with it stopped, list, pause, resume and remove
edit `$PRIME_AGENT_HOME/schedules.json`, which the daemon reads at its start (so `schedule pause
--all` makes sure nothing fires when it comes back). `add` starts the daemon: a schedule fires only there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from agent.config import ConfigError, home, load_config
from daemon.client import DaemonError, connect, daemon_pid
from daemon.schedules import Schedule, ScheduleStore, parse_duration


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="fire PROMPT into a session every DURATION or on a cron line")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", metavar="DURATION", help="30s, 5m, 1h30m, 1d")
    when.add_argument("--cron", metavar='"m h dom mon dow"', help="a cron line, local time")
    where = add.add_mutually_exclusive_group()
    where.add_argument("--session", metavar="ID", help="the session to fire into")
    where.add_argument("--cwd", metavar="DIR", help="a directory: its session is created at the first fire "
                       "(default: the current directory)")
    add.add_argument("--count", type=int, metavar="N", help="fire N times, then stop (default: no end)")
    add.add_argument("--heartbeat", action="store_true",
                     help="a short check-in (the prompt is optional); a session it woke goes back to sleep after")
    add.add_argument("--model", help="model for a session the schedule creates")
    add.add_argument("--base-url", help="endpoint for a session the schedule creates")
    add.add_argument("prompt", nargs="?", default="", help="the prompt to fire")
    ls = actions.add_parser("list", help="every schedule: when it fires next, how often it fired")
    ls.add_argument("--json", action="store_true")
    for verb, what in (("pause", "stop firing"), ("resume", "fire again (from the next time due; "
                                                              "nothing missed is replayed)")):
        a = actions.add_parser(verb, help=f"{what}; works with the daemon stopped too")
        which = a.add_mutually_exclusive_group(required=True)
        which.add_argument("id", nargs="?", help="the schedule")
        which.add_argument("--all", action="store_true", help="every schedule")
    rm = actions.add_parser("remove", help="delete a schedule")
    rm.add_argument("id")


def main(args: argparse.Namespace) -> int:
    try:
        if args.action == "add":
            return asyncio.run(_add(args))
        if daemon_pid() is None and args.action != "add":
            return _offline(args)
        return asyncio.run(_online(args))
    except (DaemonError, ValueError, ConfigError) as e:
        print(f"prime-agent: {getattr(e, 'message', e)}", file=sys.stderr)
        return 2 if not isinstance(e, DaemonError) or e.status in (400, 404, 409, 422) else 1


async def _add(args: argparse.Namespace) -> int:
    fields = {"prompt": args.prompt, "count": args.count, "heartbeat": args.heartbeat, "model": args.model,
              "base_url": args.base_url}
    if args.every:
        fields["every"] = parse_duration(args.every)
    else:
        fields["cron"] = args.cron
    if args.session:
        fields["session"] = args.session
    else:
        cwd = Path(args.cwd or ".").resolve()
        fields["cwd"] = str(cwd)
        model = load_config(cwd).model  # the session it creates uses the model this command line sees
        fields["model"] = fields["model"] or model.name or None
        fields["base_url"] = fields["base_url"] or model.base_url or None
    async with await connect() as client:
        s = await client.add_schedule(**fields)
    print(f"{s.id}: {_describe(s)}")
    return 0


async def _online(args: argparse.Namespace) -> int:
    async with await connect(autostart=False) as client:
        if args.action == "list":
            return _list(await client.schedules(), args.json)
        if args.action == "remove":
            await client.remove_schedule(args.id)
            print(f"removed {args.id}")
            return 0
        changed = await client.pause_schedule(None if args.all else args.id, args.action == "pause")
    for s in changed:
        print(f"{s.id}: {'paused' if s.paused else 'active'}")
    return 0


def _offline(args: argparse.Namespace) -> int:
    """The daemon is stopped: edit the store it reads at start."""
    store = ScheduleStore(home())
    if args.action == "list":
        return _list(store.read().schedules, args.json)
    with store.edit() as s:
        if args.action == "remove":
            kept = [x for x in s.schedules if x.id != args.id]
            if len(kept) == len(s.schedules):
                raise ValueError(f"no schedule {args.id!r}")
            s.schedules = kept
            chosen = []
        else:
            chosen = [x for x in s.schedules if (args.all and not x.done) or x.id == args.id]
            if not chosen and not args.all:
                raise ValueError(f"no schedule {args.id!r}")
            for x in chosen:
                x.paused = args.action == "pause"
                x.paused_why = "paused while the daemon was stopped" if x.paused else None
    for x in chosen:
        print(f"{x.id}: {'paused' if x.paused else 'active'}")
    if args.action == "remove":
        print(f"removed {args.id}")
    print(f"[the daemon is not running: {store.path} changed; it reads it when it starts]", file=sys.stderr)
    return 0


def _list(schedules: list[Schedule], as_json: bool) -> int:
    if as_json:
        print(json.dumps([s.model_dump() for s in schedules], indent=2))
        return 0
    if not schedules:
        print("no schedules", file=sys.stderr)
    for s in schedules:
        print(f"{s.id}  {_describe(s)}")
    return 0


def _describe(s: Schedule) -> str:
    when = f"every {s.every:g}s" if s.every is not None else f"cron {s.cron!r}"
    where = f"session {s.session}" if s.session else f"a new session in {s.cwd}"
    state = "done" if s.done else "paused" if s.paused else (
        f"next in {max(0, s.next_fire - time.time()):.0f}s" if s.next_fire else "active")
    counts = f"fired {s.fired}" + (f" of {s.count}" if s.count else "") + (
        f", skipped {s.skipped}" if s.skipped else "") + (f", missed {s.missed}" if s.missed else "")
    kind = "heartbeat" if s.heartbeat else repr(s.prompt[:40])
    return f"{when} -> {where}: {kind}; {state}; {counts}"
