"""Commands that work through the daemon: `sessions`, `send`, `attach`, `kernel`, and `run --daemon`.

Each starts the daemon when it is not running. `attach` follows a session's events until Ctrl-C,
which detaches and leaves the session running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from agent.config import Config
from daemon.client import Client, DaemonError, connect
from tui.commands.run import EXIT_CODES
from tui.commands.show import Printer, print_json



def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except DaemonError as e:
        print(f"prime-agent: {e.message}", file=sys.stderr)
        return 2 if e.status in (400, 404, 409, 422) else 1
    except KeyboardInterrupt:
        return 130


async def _sessions(args: argparse.Namespace) -> int:
    async with await connect() as client:
        rows = await client.sessions()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for s in rows:
        age = time.strftime("%Y-%m-%d %H:%M", time.localtime(s["created"]))
        title = s["title"] or ""
        print(f"{s['id']}  {s['state']:<8} {s['turns']:>3} turns  {age}  {s['model']:<20} {s['cwd']}  {title}")
    if not rows:
        print("(no sessions)", file=sys.stderr)
    return 0


async def _send(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    async with await connect() as client:
        last = (await client.session(args.session))["last_seq"]
        accepted = await client.send(args.session, text, args.mode)
        if not args.wait:
            print(accepted["turn_id"] + (" (queued)" if accepted["queued"] else ""))
            return 0
        return await _follow(client, args.session, accepted["turn_id"], last, Printer().show, print_answer=True)


async def _attach(args: argparse.Namespace) -> int:
    show = print_json if args.json else Printer().show
    async with await connect() as client:
        info = await client.session(args.session)
        print(f"[attached to {info['id']} ({info['state']}, {info['cwd']}); Ctrl-C detaches, the session goes on]",
              file=sys.stderr)
        after = args.after if args.after is not None else (None if args.all else info["last_seq"])
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, task.cancel)
        try:
            async for event in client.events(args.session, after):
                show(event)
        except asyncio.CancelledError:
            print(f"\n[detached from {args.session}]", file=sys.stderr)
    return 0


async def _kernel(args: argparse.Namespace) -> int:
    async with await connect() as client:
        print((await client.kernel(args.session))["connection_file"])
    return 0


COMMANDS = {"sessions": _sessions, "send": _send, "attach": _attach, "kernel": _kernel}


async def run_via_daemon(config: Config, cwd: Path, task: str, show, print_answer: bool) -> int:
    """`prime-agent run --daemon`: the same run, in a daemon session that outlives this process."""
    async with await connect() as client:
        s = await client.create_session(cwd, model=config.model.name, base_url=config.model.base_url,
                                        budget=config.budget.model_dump())
        accepted = await client.send(s["id"], task)
        code = await _follow(client, s["id"], accepted["turn_id"], None, show, print_answer)
        print(f"[session {s['id']} stays in the daemon: prime-agent send {s['id']} \"...\" | attach {s['id']}]",
              file=sys.stderr)
        return code


async def _follow(client: Client, session_id: str, turn_id: str, after: int | None, show, print_answer: bool) -> int:
    """Show events until `turn_id` finishes. Ctrl-C interrupts the turn; a second one detaches."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    presses = 0
    pending: set[asyncio.Task] = set()

    def on_sigint() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            print("\n[interrupting: Ctrl-C again to detach]", file=sys.stderr)
            t = loop.create_task(client.interrupt(session_id, turn_id=turn_id))
            pending.add(t)
            t.add_done_callback(pending.discard)
        else:
            me.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        async for event in client.events(session_id, after):
            show(event)
            if event.type == "turn.finished" and event.turn_id == turn_id:
                break
    except asyncio.CancelledError:
        print(f"[detached: the turn goes on in session {session_id}]", file=sys.stderr)
        return EXIT_CODES["interrupted"]
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    outcome, answer, error = event.data["outcome"], event.data.get("answer"), event.data.get("error")
    if outcome == "completed":
        if print_answer:
            print(answer)
    else:
        print(f"prime-agent: turn {outcome}: {error}", file=sys.stderr)
    return EXIT_CODES[outcome]
