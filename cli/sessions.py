"""Commands that work through the daemon: `sessions`, `send`, `attach`, `kernel`.

Each starts the daemon when it is not running. `sessions` lists every session, whichever front
made it (`prime-agent run` too; `--cwd [DIR]`: those of a directory, this one without DIR);
`sessions close ID` (or `--idle`: every session nothing runs in) stops a session's turns and kernel,
and leaves it listed: a prompt opens it again. `sessions delete ID...` takes sessions out of the list
with their files; `sessions prune` removes the files of deleted sessions, sessions never prompted and,
with `--older-than DAYS`, those not used for that long. `attach` follows a session's events until
Ctrl-C, which detaches and leaves the session running (a closed session's history is shown, then it
returns). Wherever a session id goes, `last` names the session last used (in this directory, if one is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from agent.events import CellFinished, Event
from cli.follow import follow
from cli.show import Printer, print_json
from daemon.client import Client, DaemonError, connect, own_key
from daemon.schemas import SessionInfo
from tui.images import terminal_graphics


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    if command == "sessions":
        p.add_argument("action", nargs="?", choices=["list", "close", "delete", "prune"], default="list",
                       help="list (the default); close: stop a session's turns and kernel (it stays listed, and a "
                            "prompt opens it again); delete: out of the list, with its files; prune: remove the "
                            "files of deleted sessions, sessions never prompted, and with --older-than those "
                            "not used for DAYS")
        p.add_argument("session", nargs="*", help="with close (one) and delete (any number): the sessions ('last': "
                                                  "the one last used here)")
        p.add_argument("--idle", action="store_true", help="with close: every session nothing runs or waits in")
        p.add_argument("--cwd", nargs="?", const=".", metavar="DIR",
                       help="with list and prune: only the sessions of DIR or a directory below it (without DIR: "
                            "this one)")
        p.add_argument("--keep-files", action="store_true", help="with delete: leave its files on disk")
        p.add_argument("--older-than", type=float, metavar="DAYS",
                       help="with prune: also the sessions not used (prompted, a turn begun or ended) for DAYS")
        p.add_argument("--dry-run", action="store_true", help="with prune: say what would go, remove nothing")
        p.add_argument("--json", action="store_true")
    elif command == "send":
        p.add_argument("session", help="a session id ('last': the one last used here)")
        p.add_argument("text", help="the message; '-' reads it from standard input")
        p.add_argument("--mode", choices=["prompt", "steer", "follow_up"], default="prompt",
                       help="steer: reach the running turn at its next model call (default: a new turn, queued)")
        p.add_argument("--wait", action="store_true", help="show the turn's events and print its answer")
    elif command == "attach":
        p.add_argument("session", help="a session id ('last': the one last used here)")
        p.add_argument("--all", action="store_true", help="replay the whole history first")
        p.add_argument("--after", type=int, metavar="SEQ", help="replay events after this seq first")
        p.add_argument("--json", action="store_true", help="one JSON event per line")
    else:  # kernel
        p.add_argument("session", help="a session id ('last': the one last used here)")


async def session_id(client: Client, ref: str) -> str:
    """`ref` as a session id: `last` is the session last used in this directory, else anywhere."""
    if ref != "last":
        return ref
    sessions = [s for s in await client.sessions() if s.elsewhere is None]
    here = [s for s in sessions if Path(s.cwd) == Path.cwd().resolve()] or sessions
    if not here:
        raise DaemonError(404, "not_found", "no session yet: `last` names none")
    return max(here, key=lambda s: s.updated).id


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 2 if e.status in (400, 404, 409, 422) else 1
    except KeyboardInterrupt:
        return 130


async def _sessions(args: argparse.Namespace) -> int:
    misplaced = [flag for flag, given, actions in (
        ("a session id", bool(args.session), ("close", "delete")), ("--idle", args.idle, ("close",)),
        ("--cwd", args.cwd is not None, ("list", "prune")), ("--keep-files", args.keep_files, ("delete",)),
        ("--older-than", args.older_than is not None, ("prune",)), ("--dry-run", args.dry_run, ("prune",)),
    ) if given and args.action not in actions]
    if misplaced:
        print(f"prime-agent: {misplaced[0]} does not go with `sessions {args.action}`", file=sys.stderr)
        return 2
    if args.action != "list":
        return await {"close": _close, "delete": _delete, "prune": _prune}[args.action](args)
    async with await connect() as client:
        rows = await client.sessions(args.cwd)
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
    if len(args.session) > 1 or bool(args.session) == args.idle:
        print("prime-agent: sessions close needs a session id, or --idle (every session nothing runs in)",
              file=sys.stderr)
        return 2
    async with await connect() as client:
        if args.session:
            info = await client.close_session(await session_id(client, args.session[0]))
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


async def _delete(args: argparse.Namespace) -> int:
    if not args.session:
        print("prime-agent: sessions delete needs one or more session ids", file=sys.stderr)
        return 2
    async with await connect() as client:
        for ref in args.session:
            info = await client.session(await session_id(client, ref))
            await client.delete(info.id, files=not args.keep_files)
            kept = " (its files stay on disk: sessions prune removes them)" if args.keep_files else ""
            print(f"deleted {info.id}  {info.title or ''}".rstrip() + kept)
    return 0


async def _prune(args: argparse.Namespace) -> int:
    if args.older_than is not None and args.older_than <= 0:
        print("prime-agent: --older-than takes a number of days above 0", file=sys.stderr)
        return 2
    async with await connect() as client:
        pruned = await client.prune(args.older_than, args.cwd, args.dry_run)
    if args.json:
        print(pruned.model_dump_json(indent=2))
        return 0
    for s in pruned.sessions:
        title = (s.title or "(untitled)").replace("\n", " ")
        print(f"{s.id}  {s.why:<7} {s.turns:>3} turns  {s.bytes / 1e6:8.1f} MB  {title}  ({s.cwd})")
    verb = "would free" if args.dry_run else "freed"
    print(f"{len(pruned.sessions)} session(s) {'to remove' if args.dry_run else 'removed'}; {verb} "
          f"{pruned.bytes / 1e6:.1f} MB", file=sys.stderr)
    return 0


async def _send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    async with await connect(key=own_key(Path.cwd())) as client:  # a daemon without the key takes this shell's
        args.session = await session_id(client, args.session)
        last = (await client.session(args.session)).last_seq
        accepted = await client.send(args.session, text, args.mode)
        if not args.wait:
            print(accepted.turn_id + (" (queued)" if accepted.queued else ""))
            return 0
        printer = Printer()
        return await follow(client, args.session, accepted.turn_id, last, printer.show, printer.unseen)


async def _attach(args: argparse.Namespace) -> int:
    printer = Printer()
    graphics = None if args.json else terminal_graphics(widget=False)

    async def show(event: Event) -> None:
        """The event, and under a cell its figures (drawn where the terminal can, each saved and named)."""
        if args.json:
            print_json(event)
            return
        printer.show(event)
        if isinstance(event, CellFinished) and any(m.startswith("image/") for m in event.attachments):
            try:
                printer.figures(await client.cell_outputs(info.id, event.turn_id or "", event.cell_id),
                                event.cell_id, graphics)
            except DaemonError as e:
                print(f"[the cell's figures could not be fetched: {e.message}]", file=sys.stderr)

    async with await connect() as client:
        info = await client.session(await session_id(client, args.session))
        after = args.after if args.after is not None else (0 if args.all else info.last_seq)
        if info.state == "closed":  # nothing runs in it, nothing will until a prompt opens it: its history, then back
            if after < info.last_seq:
                async for event in client.events(info.id, after):
                    await show(event)
                    if event.seq >= info.last_seq:
                        break
            print(f"[{info.id} is closed: nothing runs in it. prime-agent send {info.id} \"...\" opens it again; "
                  f"prime-agent --resume {info.id} in the app; --all shows its history]", file=sys.stderr)
            return 0
        sandbox = f", sandbox: {info.sandbox}" if info.sandbox and info.sandbox != "workspace-write" else ""
        print(f"[attached to {info.id} ({info.state}, {info.cwd}{sandbox}); Ctrl-C detaches, the session goes on]",
              file=sys.stderr)
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, task.cancel)
        try:
            async for event in client.events(info.id, after):
                await show(event)
        except asyncio.CancelledError:
            print(f"\n[detached from {info.id}]", file=sys.stderr)
    return 0


async def _kernel(args: argparse.Namespace) -> int:
    async with await connect() as client:
        print((await client.kernel(await session_id(client, args.session))).connection_file)
    return 0


COMMANDS = {"sessions": _sessions, "send": _send, "attach": _attach, "kernel": _kernel}

