"""The daemon process: one asyncio loop hosting every session, served over a Unix socket and,
optionally, TCP with a bearer token.

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

import uvicorn

from agent.config import home, load_config
from agent.config_models import Config
from daemon.app import BodyLimit, TokenAuth, create_app
from agent.refine import GateFactory
from daemon.manager import SessionManager
from daemon.paths import lock_file, pid_file, socket_file, token

log = logging.getLogger(__name__)

WATCH_EVERY = 1.0
"""Seconds between two checks that the daemon's lock file and socket are still its own."""


class AlreadyRunning(RuntimeError):
    pass


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handlers: the daemon decides the order of shutdown."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def parse_tcp(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--tcp wants HOST:PORT (e.g. 127.0.0.1:7433), not {text!r}")
    return host.strip("[]"), int(port)


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
    sockets: list[socket.socket] = []
    watchdog: asyncio.Task | None = None
    try:
        await manager.start()
        path = socket_file()
        unix = _unix_socket(str(path))
        sockets.append(unix)
        ours[path] = _identity(os.stat(path))
        tcp_address = None
        if tcp:
            host, port = parse_tcp(tcp)
            tcp_sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
            sockets.append(tcp_sock)
            tcp_address = f"{host}:{tcp_sock.getsockname()[1]}"
        app = create_app(manager, socket=str(path), tcp=tcp_address, remote_unsandboxed=remote_unsandboxed)
        limit = config.daemon.max_body_bytes
        servers = [_server(BodyLimit(app, limit))]
        if tcp:
            servers.append(_server(TokenAuth(BodyLimit(app, limit), token())))
        tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets)]
        while not all(s.started for s in servers):
            if any(t.done() for t in tasks):
                await asyncio.gather(*tasks)
                raise RuntimeError("the daemon's listener did not start")
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        pid_path = pid_file()
        pid_path.write_text(str(os.getpid()))  # written last: its presence means the daemon is up
        ours[pid_path] = _identity(os.stat(pid_path))
        watchdog = asyncio.create_task(_watch({p: ours[p] for p in (lock_path, path)}, stop))
        ready = {"pid": os.getpid(), "socket": str(path), "tcp": tcp_address,
                 "remote_unsandboxed": bool(tcp) and remote_unsandboxed}
        log.info("daemon ready: %s", ready)
        if on_ready:
            on_ready(ready)
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        log.info("daemon stopping: interrupting turns, closing sessions")
        await manager.stop(config.daemon.drain_timeout)  # ends every event stream too
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if not manager.stopping:
            await manager.stop(0)
        for sock in sockets:
            sock.close()
        for file, identity in ours.items():
            if file != lock_path:
                _unlink_if(file, identity)
        os.close(lock)


def _server(app) -> _Server:
    return _Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                                  timeout_graceful_shutdown=5))


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
