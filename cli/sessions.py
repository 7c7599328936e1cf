"""Commands that work through the daemon: `sessions`, `send`, `attach`, `kernel`.

Each starts the daemon when it is not running. `sessions` lists every session, whichever front
made it (`prime-agent run` too); `sessions close ID` (or `--idle`: every session nothing runs in)
stops a session's turns and kernel, and leaves it listed: a prompt opens it again. `attach` follows
a session's events until Ctrl-C, which detaches and leaves the session running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from cli.follow import follow
from cli.show import Printer, print_json
from daemon.client import DaemonError, connect, own_key
from daemon.schemas import SessionInfo


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    if command == "sessions":
        p.add_argument("action", nargs="?", choices=["list", "close"], default="list",
                       help="list (the default), or close: stop a session's turns and kernel (it stays listed, "
                            "and a prompt opens it again)")
        p.add_argument("session", nargs="?", help="with close: the session to close")
        p.add_argument("--idle", action="store_true", help="with close: every session nothing runs or waits in")
        p.add_argument("--json", action="store_true")
    elif command == "send":
        p.add_argument("session")
        p.add_argument("text", help="the message; '-' reads it from standard input")
        p.add_argument("--mode", choices=["prompt", "steer", "follow_up"], default="prompt",
                       help="steer: reach the running turn at its next model call (default: a new turn, queued)")
        p.add_argument("--wait", action="store_true", help="show the turn's events and print its answer")
    elif command == "attach":
        p.add_argument("session")
        p.add_argument("--all", action="store_true", help="replay the whole history first")
        p.add_argument("--after", type=int, metavar="SEQ", help="replay events after this seq first")
        p.add_argument("--json", action="store_true", help="one JSON event per line")
    else:  # kernel
        p.add_argument("session")


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 2 if e.status in (400, 404, 409, 422) else 1
    except KeyboardInterrupt:
        return 130


async def _sessions(args: argparse.Namespace) -> int:
    if args.action == "close":
        return await _close(args)
    if args.session is not None or args.idle:
        print("prime-agent: a session id and --idle go with `sessions close`", file=sys.stderr)
        return 2
    async with await connect() as client:
        rows = await client.sessions()
    if args.json:
        print(json.dumps([s.model_dump() for s in rows], indent=2))
        return 0
    for s in rows:
        print(_row(s))
    if not rows:
        print("(no sessions)", file=sys.stderr)
    return 0


def _row(s: SessionInfo) -> str:
    age = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created))
    title = (s.title or "(untitled)").replace("\n", " ")
    sandbox = f"  [sandbox: {s.sandbox}]" if s.sandbox and s.sandbox != "workspace-write" else ""
    goal = f"  [goal {s.goal}]" if s.goal else ""
    where = f"  [in prime-agent run, pid {s.elsewhere}]" if s.elsewhere is not None else ""
    return f"{s.id}  {s.state:<8} {s.turns:>3} turns  {age}  {title}  ({s.model}, {s.cwd}){sandbox}{goal}{where}"


async def _close(args: argparse.Namespace) -> int:
    if (args.session is None) == (not args.idle):
        print("prime-agent: sessions close needs a session id, or --idle (every session nothing runs in)",
              file=sys.stderr)
        return 2
    async with await connect() as client:
        if args.session is not None:
            info = await client.close_session(args.session)
            print(f"closed {info.id}  {info.title or ''}".rstrip())
            return 0
        closed = 0
        for s in await client.sessions():
            if s.state not in ("idle", "dormant") or s.elsewhere is not None:
                continue
            try:
                info = await client.close_session(s.id, if_idle=True)
            except DaemonError as e:  # it became busy, or went, since the listing
                if e.status not in (404, 409):
                    raise
                continue
            print(f"closed {info.id}  {info.title or ''}".rstrip())
            closed += 1
        if not closed:
            print("(no idle sessions to close)", file=sys.stderr)
    return 0


async def _send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    async with await connect(key=own_key(Path.cwd())) as client:  # a daemon without the key takes this shell's
        last = (await client.session(args.session)).last_seq
        accepted = await client.send(args.session, text, args.mode)
        if not args.wait:
            print(accepted.turn_id + (" (queued)" if accepted.queued else ""))
            return 0
        printer = Printer()
        return await follow(client, args.session, accepted.turn_id, last, printer.show, printer.unseen)


async def _attach(args: argparse.Namespace) -> int:
    show = print_json if args.json else Printer().show
    async with await connect() as client:
        info = await client.session(args.session)
        sandbox = f", sandbox: {info.sandbox}" if info.sandbox and info.sandbox != "workspace-write" else ""
        print(f"[attached to {info.id} ({info.state}, {info.cwd}{sandbox}); Ctrl-C detaches, the session goes on]",
              file=sys.stderr)
        after = args.after if args.after is not None else (None if args.all else info.last_seq)
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, task.cancel)
        try:
            async for event in client.events(args.session, after):
                show(event)
        except asyncio.CancelledError:
            print(f"\n[detached from {args.session}]", file=sys.stderr)
    return 0


async def _kernel(args: argparse.Namespace) -> int:
    async with await connect() as client:
        print((await client.kernel(args.session)).connection_file)
    return 0


COMMANDS = {"sessions": _sessions, "send": _send, "attach": _attach, "kernel": _kernel}

