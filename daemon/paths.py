"""Where the daemon keeps its process files: `$PRIME_AGENT_HOME/run/` (0700)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from agent.kernel.bridge import socket_path
from agent.kernel.homes import register_home
from agent.config import home


def run_dir() -> Path:
    """Made 0700, and its home registered: no kernel of another home can then reach it (agent/kernel/homes.py)."""
    d = home() / "run"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    register_home()
    return d


def socket_file() -> Path:
    """The API's Unix socket (a short private path when the full one is too long for a socket)."""
    return socket_path(run_dir(), "daemon.sock")


def lock_file() -> Path:
    """Held (flock) by the running daemon for as long as it lives."""
    return run_dir() / "daemon.lock"


def pid_file() -> Path:
    return run_dir() / "daemon.pid"


def log_file() -> Path:
    return run_dir() / "daemon.log"


def token() -> str:
    """The TCP listener's bearer token: generated once, kept 0600 in `run/token`."""
    path = run_dir() / "token"
    if path.is_file() and len(path.read_text().strip()) < 32:  # cut short by a crash, or emptied: never accept ""
        path.unlink()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()
