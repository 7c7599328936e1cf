"""The daemon process: one asyncio loop hosting every session, served over a Unix socket and,
optionally, TCP (daemon/listeners.py: a bearer token, or the web page's login).

    await serve()                      # what `prime-agent daemon start --foreground` runs

SIGTERM (or SIGINT) drains: running turns are interrupted and recorded, queued ones are dropped
(and said so), event streams end, kernels stop; then the process exits. A second daemon for the
same home refuses to start (an flock on `run/daemon.lock`). A daemon whose lock file or socket is
gone, or is another file (its home deleted, moved or replaced), drains the same way within a few
seconds: no client could reach it any more, and a second daemon may already serve that home.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from agent.config import home, load_config
from agent.config_models import Config
from daemon.app import create_app
from agent.refine import GateFactory
from daemon.listeners import BodyLimit, TcpListener, start_server
from daemon.manager import SessionManager
from daemon.paths import lock_file, pid_file, socket_file, token

log = logging.getLogger(__name__)

WATCH_EVERY = 1.0
"""Seconds between two checks that the daemon's lock file and socket are still its own."""


class AlreadyRunning(RuntimeError):
    pass


async def serve(tcp: str | None = None, config: Config | None = None, stop: asyncio.Event | None = None,
                on_ready: Callable[[dict], None] | None = None, handle_signals: bool = True,
                gate_factory: GateFactory | None = None, remote_unsandboxed: bool = False) -> None:
    """Run the daemon until `stop` is set or a signal arrives. `on_ready` gets where it listens;
    `gate_factory` gives each session its regression gate (agent.refine.GateFactory);
    `remote_unsandboxed`: clients over TCP may loosen a sandbox and approve what runs outside one
    (--allow-remote-unsandboxed; by default only a client of the Unix socket may)."""
    lock_path = lock_file()
    lock = _lock(lock_path)
    # The files this daemon made, as (st_dev, st_ino): watched while it runs, removed at exit only
    # if they are still these (a second daemon may serve a new home at the same path by then).
    ours: dict[Path, tuple[int, int, int]] = {lock_path: _identity(os.fstat(lock))}
    config = config or load_config(home())
    stop = stop or asyncio.Event()
    manager = SessionManager(config, home(), gate_factory)
    unix: socket.socket | None = None
    tcp_listener = TcpListener(token(), config.daemon.max_body_bytes, remote_unsandboxed)
    watchdog: asyncio.Task | None = None
    try:
        await manager.start()
        path = socket_file()
        unix = _unix_socket(str(path))
        ours[path] = _identity(os.stat(path))
        app = create_app(manager, tcp_listener, socket=str(path))
        server, task = await start_server(BodyLimit(app, config.daemon.max_body_bytes), unix)
        if tcp:
            await tcp_listener.open(app, tcp, keep=True)
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        pid_path = pid_file()
        pid_path.write_text(str(os.getpid()))  # written last: its presence means the daemon is up
        ours[pid_path] = _identity(os.stat(pid_path))
        watchdog = asyncio.create_task(_watch({p: ours[p] for p in (lock_path, path)}, stop))
        ready = {"pid": os.getpid(), "socket": str(path), "tcp": tcp_listener.address,
                 "remote_unsandboxed": bool(tcp) and remote_unsandboxed}
        log.info("daemon ready: %s", ready)
        if on_ready:
            on_ready(ready)
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([stopped, task], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        log.info("daemon stopping: interrupting turns, closing sessions")
        await manager.stop(config.daemon.drain_timeout)  # ends every event stream too
        server.should_exit = True
        await asyncio.gather(task, tcp_listener.close(), return_exceptions=True)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if not manager.stopping:
            await manager.stop(0)
        await tcp_listener.close()
        if unix is not None:
            unix.close()
        for file, identity in ours.items():
            if file != lock_path:
                _unlink_if(file, identity)
        os.close(lock)


def _unix_socket(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a killed daemon's (we hold the lock, so no live daemon uses it)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(1024)
    return sock


async def _watch(files: dict[Path, tuple[int, int, int]], stop: asyncio.Event) -> None:
    """Set `stop` once one of `files` is gone or is another file than the one recorded."""
    while not stop.is_set():
        await asyncio.sleep(WATCH_EVERY)
        for file, identity in files.items():
            try:
                now = _identity(os.stat(file))
            except OSError:  # FileNotFoundError, or NotADirectoryError: a file where its directory was
                now = None
            if now != identity:
                log.warning("daemon stopping: %s %s; no client can reach this daemon any more",
                            file, "is gone" if now is None else "was replaced")
                stop.set()
                return


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """A file's identity: its inode, and when it last changed (a deleted home's inode numbers are
    soon reused: a new daemon's socket can have the number the old one's had)."""
    return st.st_dev, st.st_ino, st.st_ctime_ns


def _unlink_if(file: Path, identity: tuple[int, int, int]) -> None:
    """Remove `file` if it is still the one recorded. (One replaced between the check and the unlink
    would still go, as there is no unlink by inode; that window is microseconds wide.)"""
    with contextlib.suppress(OSError):
        if _identity(os.stat(file)) == identity:
            file.unlink()


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"a daemon already runs for {home()}") from None
    return fd
