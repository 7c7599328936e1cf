"""A real daemon for each test: served in the test's own event loop over its Unix socket, with the
fake OpenAI server as the model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.events import Event
from agent.testing.openai_server import OpenAIServer, Reply
from daemon.client import Client, daemon_pid
from daemon.server import serve
from tests.conftest import make_config

MEMORY_PLAN = {
    "summary": "remember how this project runs its tests", "rationale": "the user asked for it",
    "expected_outcome": "tests run right the first time",
    "edits": [{"action": "create", "kind": "memory", "id": "test-command", "title": "How to run the tests",
               "content": "Run the tests with `python -m pytest -q`.", "scope": "project",
               "reason": "asked in this session"}],
}


def agent_script(request: dict[str, Any]) -> Reply:
    """The fake model: `run: CODE` in the prompt runs CODE in a cell, then answers with its output;
    any other prompt is echoed back as the answer; the refiner's planner gets MEMORY_PLAN."""
    messages = request["messages"]
    if messages[0]["content"].startswith("You refine the harness"):
        return Reply(content=json.dumps(MEMORY_PLAN))
    if messages[-1]["role"] == "tool":
        return Reply(content="ran: " + messages[-1]["content"])
    prompt = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    if m := re.search(r"run: (.*)", prompt, re.DOTALL):
        return Reply(code=[m.group(1)])
    return Reply(content="echo: " + prompt.rsplit("\n\n", 1)[-1])


@pytest.fixture(autouse=True)
def no_daemon_left_behind(prime_home: Path):
    """A test that started a daemon process (directly, or through a client) must not leave it running."""
    yield
    pid = daemon_pid()
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while daemon_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture
def model_server():
    with OpenAIServer(agent_script) as server:
        yield server


@pytest.fixture
async def daemon(prime_home: Path) -> AsyncIterator[Client]:
    async with running_daemon() as client:
        yield client


class running_daemon:
    """`async with running_daemon(**daemon_config) as client`: serve, and stop (draining) at exit.

    No warm kernels unless a test asks (`pool_size=`): a test's daemon starts its few sessions' kernels
    itself. With a pool, most of its kernels went unused (it refills after each take): ~150 a run, ~0.2 s
    of CPU each; tests/daemon, tests/tui and tests/cli took 290-300 CPU seconds with it, 249-267 without.
    The pool has tests of its own (tests/daemon/test_limits.py, tests/agent/test_kernel.py and
    test_sandbox.py), and the web page's daemon and every daemon the tests start as a process keep one."""

    def __init__(self, tcp: str | None = None, remote_unsandboxed: bool = False, **daemon: Any):
        self.tcp, self.remote_unsandboxed = tcp, remote_unsandboxed
        self.config = make_config(daemon={"pool_size": 0, **daemon})
        self.stop = asyncio.Event()
        self.ready: dict = {}

    async def __aenter__(self) -> Client:
        started = asyncio.Event()

        def on_ready(info: dict) -> None:
            self.ready = info
            started.set()

        self.task = asyncio.create_task(serve(self.tcp, self.config, self.stop, on_ready, handle_signals=False,
                                               remote_unsandboxed=self.remote_unsandboxed))
        waiter = asyncio.create_task(started.wait())
        await asyncio.wait([self.task, waiter], return_when=asyncio.FIRST_COMPLETED)
        if self.task.done():
            waiter.cancel()
            self.task.result()
        self.client = Client()
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        self.stop.set()
        await self.task


async def collect(client: Client, session_id: str, until_turn: str, after: int | None = None) -> list[Event]:
    """Events from `after` until `until_turn` finishes."""
    out = []
    async for e in client.events(session_id, after):
        out.append(e)
        if e.type == "turn.finished" and e.turn_id == until_turn:
            return out
    raise AssertionError("unreachable")
