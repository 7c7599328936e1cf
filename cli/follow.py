"""A turn's end as the command line reports it: the exit code of each outcome, and following a
daemon session's turn to its end (`run --daemon`, `send --wait`)."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.client import Client

EXIT_CODES = {"completed": 0, "error": 3, "budget_exhausted": 4, "timed_out": 5, "interrupted": 130}


async def follow(client: Client, session_id: str, turn_id: str, after: int | None, show, print_answer: bool) -> int:
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
