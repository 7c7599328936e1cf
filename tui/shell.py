"""`!COMMAND` in the app: a command of yours, not the model's. It runs with your rights (no sandbox:
you typed it) in the session's workspace; its output is shown in the conversation and goes to the
model with your next message, as Claude Code's `!` does. Esc stops it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

TOLD = 16 << 10
"""Characters of its output the model is told (the head and the tail of a longer one)."""
SHOWN = 40
"""Lines of its output shown (the last ones)."""
TIMEOUT = 600.0
"""Seconds it may run before it is stopped."""


class Shell:
    def __init__(self, say: Callable[[str, str], Awaitable[None]]):
        self.say = say
        self.process: asyncio.subprocess.Process | None = None
        self.notes: list[str] = []
        """What ran since the last message, as the model is told it."""

    async def run(self, command: str, cwd: Path) -> None:
        if not command:
            await self.say("!COMMAND runs a command of yours in the session's workspace, e.g. !git status", "error")
            return
        if self.process is not None:
            await self.say("a command of yours runs already (Esc stops it)", "error")
            return
        started = time.monotonic()
        try:
            process = self.process = await asyncio.create_subprocess_shell(
                command, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            await self.say(f"$ {command}: could not run: {e.strerror or e}", "error")
            return
        try:
            out, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
        except TimeoutError:
            self.stop()
            out = b""
        finally:
            self.process = None
        text = out.decode(errors="replace").replace("\0", "")
        code = process.returncode
        ended = f"exit {code}" if code is not None and code >= 0 else "stopped"
        lines = text.rstrip("\n").splitlines()
        shown = ([f"... {len(lines) - SHOWN} lines above"] if len(lines) > SHOWN else []) + lines[-SHOWN:]
        await self.say("\n".join([f"$ {command}", *shown, f"[{ended}, {time.monotonic() - started:.1f}s; the model "
                                  "hears it with your next message]"]), "info")
        told = text if len(text) <= TOLD else f"{text[:TOLD // 2]}\n[... {len(text) - TOLD:,} characters cut ...]\n" \
                                              f"{text[-TOLD // 2:]}"
        self.notes.append(f"I ran `{command}` in the workspace ({ended}); its output:\n```\n{told.rstrip()}\n```")

    def stop(self) -> bool:
        """Stop the command running (its whole process group); False when none runs."""
        if self.process is None or self.process.returncode is not None:
            return False
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def told(self) -> str:
        """What the next message begins with: the commands run since the last one, and their output."""
        return "".join(note + "\n\n" for note in self.notes)

    def sent(self) -> None:
        self.notes.clear()
