"""The daemon process: one asyncio loop hosting every session, served over a Unix socket and,
optionally, TCP with a bearer token.

    await serve()                      # what `prime-agent daemon start --foreground` runs

SIGTERM (or SIGINT) drains: running turns are interrupted and recorded, queued ones are dropped
(and said so), event streams end, kernels stop; then the process exits. A second daemon for the
same home refuses to start (an flock on `run/daemon.lock`).
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

import uvicorn

from agent.config import Config, home, load_config
from daemon.app import BodyLimit, TokenAuth, create_app
from daemon.manager import GateFactory, SessionManager
from daemon.paths import lock_file, pid_file, socket_file, token

log = logging.getLogger(__name__)


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
                gate_factory: GateFactory | None = None) -> None:
    """Run the daemon until `stop` is set or a signal arrives. `on_ready` gets where it listens;
    `gate_factory` gives each session its regression gate (see daemon.manager.GateFactory)."""
    lock = _lock()
    config = config or load_config(home())
    stop = stop or asyncio.Event()
    manager = SessionManager(config, home(), gate_factory)
    sockets: list[socket.socket] = []
    try:
        await manager.start()
        path = socket_file()
        unix = _unix_socket(str(path))
        sockets.append(unix)
        tcp_address = None
        if tcp:
            host, port = parse_tcp(tcp)
            tcp_sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
            sockets.append(tcp_sock)
            tcp_address = f"{host}:{tcp_sock.getsockname()[1]}"
        app = create_app(manager, socket=str(path), tcp=tcp_address)
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
        pid_file().write_text(str(os.getpid()))  # written last: its presence means the daemon is up
        ready = {"pid": os.getpid(), "socket": str(path), "tcp": tcp_address}
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
        if not manager.stopping:
            await manager.stop(0)
        for sock in sockets:
            sock.close()
        pid_file().unlink(missing_ok=True)
        socket_file().unlink(missing_ok=True)
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


def _lock() -> int:
    fd = os.open(lock_file(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"a daemon already runs for {home()}") from None
    return fd
