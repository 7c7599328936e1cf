"""A turn's end as the command line reports it: the exit code of each outcome, and following a
daemon session's turn to its end (`run --daemon`, `send --wait`)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from agent.events import TurnFinished
from agent.types import visible

if TYPE_CHECKING:
    from daemon.client import Client

PrintAnswer = Callable[[str | None], bool]
"""Whether a turn's answer is to be printed on stdout (no, with --json; nor when the terminal shows it already)."""
EXIT_CODES = {"completed": 0, "error": 3, "budget_exhausted": 4, "timed_out": 5, "interrupted": 130}


def on_ctrl_c(interrupt: Callable[[], Awaitable[object]], then: str,
              running: Callable[[], bool] = lambda: True) -> None:
    """The first Ctrl-C runs `interrupt()` if `running()`, saying that a second press will `then`;
    a second one (or the first, when nothing runs) cancels the task that called this."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    assert me is not None
    presses = 0
    pending: set[asyncio.Task] = set()

    def on_sigint() -> None:
        nonlocal presses
        presses += 1
        if presses == 1 and running():
            print(f"\n[interrupting: Ctrl-C again to {then}]", file=sys.stderr)
            t = loop.create_task(interrupt())
            pending.add(t)
            t.add_done_callback(pending.discard)
        else:
            me.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)


async def follow(client: Client, session_id: str, turn_id: str, after: int | None, show,
                 print_answer: PrintAnswer) -> int:
    """Show events until `turn_id` finishes. Ctrl-C interrupts the turn; a second one detaches."""
    loop = asyncio.get_running_loop()
    on_ctrl_c(lambda: client.interrupt(session_id, turn_id=turn_id), "detach")
    try:
        async for event in client.events(session_id, after):
            show(event)
            if isinstance(event, TurnFinished) and event.turn_id == turn_id:
                finished = event
                break
    except asyncio.CancelledError:
        print(f"[detached: the turn goes on in session {session_id}]", file=sys.stderr)
        return EXIT_CODES["interrupted"]
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return report(finished.outcome, finished.answer, finished.error, print_answer(finished.answer))


def report(outcome: str, answer: str | None, error: str | None, print_answer: bool) -> int:
    """A finished turn: its answer on stdout (when asked), or what ended it on stderr; its exit code."""
    if outcome == "completed":
        if print_answer:
            say(answer)
    else:
        print(visible(f"prime-agent: turn {outcome}: {error}"), file=sys.stderr)
    return EXIT_CODES[outcome]


def say(answer: str | None) -> None:
    """The answer on stdout: as it is into a pipe or a file, with its control characters as escapes
    (`visible`) on a terminal, where they would act instead of showing."""
    print(visible(str(answer)) if sys.stdout.isatty() else answer)
