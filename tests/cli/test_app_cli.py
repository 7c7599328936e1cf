"""`prime-agent` itself, in a terminal: the command line reaches the app with what it was given."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from agent.testing.openai_server import OpenAIServer
from tests.daemon.conftest import agent_script

PRIME_AGENT = str(Path(sys.executable).parent / "prime-agent")


def test_a_prompt_and_set_on_the_command_line_reach_the_app_and_ctrl_d_leaves(prime_home: Path, project: Path):
    """`prime-agent "hello there" --set model.action_format=text` opens the app, sends the prompt in
    text mode, and Ctrl-D on the empty prompt leaves it with the way back printed."""
    with OpenAIServer(agent_script) as server:
        env = {**os.environ, "PRIME_AGENT_MODEL": "fake", "OPENAI_BASE_URL": server.base_url, "TERM": "xterm-256color"}
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        app = subprocess.Popen([PRIME_AGENT, "hello there", "--set", "model.action_format=text"], cwd=project,
                               env=env, stdin=follower, stdout=follower, stderr=follower, start_new_session=True)
        os.close(follower)
        seen = b""

        def read_until(needle: bytes, timeout: float = 90) -> None:
            nonlocal seen
            deadline = time.monotonic() + timeout
            while needle not in seen:
                assert time.monotonic() < deadline and app.poll() is None, seen[-2000:]
                if select.select([leader], [], [], 0.2)[0]:
                    try:
                        seen += os.read(leader, 65536)
                    except OSError:  # the app closed the terminal
                        break

        try:
            read_until(b"echo: hello there")
            assert b"(from $PRIME_AGENT_MODEL)" in seen  # the welcome panel
            os.write(leader, b"\x04")  # Ctrl-D
            read_until(b"[detached: session")
            assert app.wait(timeout=60) == 0
        finally:
            if app.poll() is None:
                app.kill()
            os.close(leader)
            subprocess.run([PRIME_AGENT, "daemon", "stop"], capture_output=True, timeout=60, env=env)
        assert len(server.requests) == 1 and "tools" not in server.requests[0]  # text mode, from --set
