"""`prime-agent rl serve` as its own process, for tests that talk to it as a user's tools would."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def policy_server(*args: str) -> Iterator[str]:
    """The server started with `args`, once it accepts connections: its base URL; stopped on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "prime-agent"), "rl", "serve", "--port", str(port),
                               *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, server.stdout.read()
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(timeout=10)


def alone_and_together(base_url: str, model: str, questions: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """The greedy token ids of each question's reply (16 tokens), asked one at a time, then all at once."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="none")

    async def ask(question: str) -> list[int]:
        r = await client.chat.completions.create(model=model, max_tokens=16, temperature=0,
                                                 messages=[{"role": "user", "content": question}])
        return r.choices[0].model_extra["token_ids"]

    async def main():
        alone = [await ask(q) for q in questions]
        return alone, await asyncio.gather(*(ask(q) for q in questions))

    return asyncio.run(main())
