"""`prime-agent` itself, in a terminal: the command line reaches the app with what it was given."""

from __future__ import annotations

import fcntl
import os
import pty
import re
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


def test_continue_opens_the_session_last_used_here(prime_home: Path, project: Path):
    """Issue 52, acceptance: `prime-agent -c` opens the session last used in this directory, not an older
    `run` session the daemon took up after it ended (taking it up rewrote when it was last used)."""
    with OpenAIServer(agent_script) as server:
        env = {**os.environ, "PRIME_AGENT_MODEL": "fake", "OPENAI_BASE_URL": server.base_url, "TERM": "xterm-256color"}

        def prime_agent(*argv: str) -> subprocess.CompletedProcess:
            done = subprocess.run([PRIME_AGENT, *argv], cwd=project, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            return done

        try:
            prime_agent("daemon", "start")
            prime_agent("run", "an older task")  # its own process: the daemon takes it up at its next listing
            newer = prime_agent("run", "--daemon", "--keep", "a newer task")
            newer_id = re.search(r"\[session (\S+) stays in the daemon", newer.stderr).group(1)
            leader, follower = pty.openpty()
            fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
            app = subprocess.Popen([PRIME_AGENT, "-c"], cwd=project, env=env, stdin=follower, stdout=follower,
                                   stderr=follower, start_new_session=True)
            os.close(follower)
            seen = b""
            try:
                deadline = time.monotonic() + 90
                while b"[detached: session" not in seen:
                    assert time.monotonic() < deadline and app.poll() is None, seen[-2000:]
                    if b"echo: a newer task" in seen or b"echo: an older task" in seen:
                        os.write(leader, b"\x04")  # Ctrl-D once its history is on screen
                    if select.select([leader], [], [], 0.2)[0]:
                        try:
                            seen += os.read(leader, 65536)
                        except OSError:
                            break
                assert app.wait(timeout=60) == 0
            finally:
                if app.poll() is None:
                    app.kill()
                os.close(leader)
        finally:
            subprocess.run([PRIME_AGENT, "daemon", "stop"], capture_output=True, timeout=60, env=env)
    assert f"[detached: session {newer_id} ".encode() in seen
